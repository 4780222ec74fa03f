"""Server ensemble distillation (Algorithm 2, lines 8-13): pseudo-label U once per round with
the weighted ensemble of the round's client models, then train the averaged model on it."""

from __future__ import annotations

import copy
import math
import time

import torch
import torch.nn.functional as F
from torch import nn

from fedgo_flwr.batches import minibatches, to_unit_range
from fedgo_flwr.teachers import server_autocast, teacher_logits
from fedgo_flwr.train import channels_last, classifier_optimizer, descend, evaluate


# Where the weights mix the clients: Algorithm 2 weights logits; Theorem 3.4's ensemble
# sum_k w_k h_k mixes the clients' predicted probabilities.
ENSEMBLE_SPACES = ("logits", "probabilities")
# What the server distils on: its unlabeled data U, or images drawn from the generator G.
DISTILL_SETS = ("server-data", "generated")
# The student trains in the channels-last memory format (train.channels_last: 1.3x the CNN's
# images/s on the CPU, the same result up to float noise); False keeps the contiguous format,
# the numerics before it (tests/test_distill.py compares the two).
CHANNELS_LAST = True
# Who decides whether the distilled model replaces the averaged one: nobody (the papers),
# clients that did not train this round, on their own labelled data, or the server on labelled
# images of its own (the data FedDF as published validates on; a row that says so).
GUARDS = ("none", "clients", "labelled-val")
# How the distillation's minibatches take a view of each image (as is or mirrored): a new
# random view in every pass (per-pass: up to both views of an image are met, and labelled, in
# a round) or one random view per image for the whole round (per-round: the teachers label
# |U| images a round, half the work at E_s >= 2; every view is still met across rounds).
VIEW_DRAWS = ("per-pass", "per-round")


def ensemble_log_probs(client_logits: torch.Tensor, weights: torch.Tensor,
                       space: str = "logits") -> torch.Tensor:
    """log y~(u), [B, C], from weights [K, B] and client logits [K, B, C]:
    logits:        y~(u) = softmax(sum_k w_k(u) f(u; theta_k))        (Algorithm 2)
    probabilities: y~(u) = sum_k w_k(u) softmax(f(u; theta_k))        (Theorem 3.4)"""
    w = weights.unsqueeze(-1)
    if space == "logits":
        return torch.log_softmax((w * client_logits).sum(0), dim=-1)
    if space == "probabilities":
        log_w = torch.log(w.clamp_min(torch.finfo(w.dtype).tiny))
        return torch.logsumexp(log_w + torch.log_softmax(client_logits, -1), dim=0)
    raise ValueError(f"ensemble space {space!r}; allowed: {', '.join(ENSEMBLE_SPACES)}")


def pseudo_labels(client_logits: torch.Tensor, weights: torch.Tensor,
                  space: str = "logits") -> torch.Tensor:
    """y~(u) of the weighted ensemble (see ensemble_log_probs)."""
    return ensemble_log_probs(client_logits, weights, space).exp()


def view_pseudo_labels(scores_of_view, num_u: int, n_k: torch.Tensor, rule,
                       batches: list[torch.Tensor], *, views: int, space: str = "logits",
                       floor: bool = False, targets: torch.Tensor | None = None
                       ) -> torch.Tensor | None:
    """Pseudo-labels [V, |U|, C] of the views of U (0 as is, 1 mirrored) that the round's
    distillation `batches` meet (see draw_batches); the rest stay NaN. The teachers run once
    per round on those images only: scores_of_view(v, samples) gives their logits [K, S, C]
    and log Phi_k [K, S] on these samples of view v, which `rule` turns into weights. With one
    pass over U each image meets one random view, so labelling only what is met halves the
    work against labelling both views. With `floor` the logits' last row is the server
    model's, not a teacher: where it is surer than the ensemble it keeps its own label
    (see floored). Given an earlier call's `targets`, only what they lack is labelled, in
    place (the teachers' labels do not depend on when they are computed)."""
    met = torch.zeros(views * num_u, dtype=torch.bool)
    if batches:
        met[torch.cat(batches)] = True
    if targets is not None:
        met &= targets[..., 0].isnan().flatten()
    for v, samples in enumerate(met.view(views, num_u)):
        samples = samples.nonzero().squeeze(1)
        if len(samples) == 0:
            continue
        logits, log_odds = scores_of_view(v, samples)
        if targets is None:
            targets = torch.full((views, num_u, logits.shape[-1]), float("nan"))
        own = None
        if floor:
            logits, own = logits[:-1], logits[-1]
        log_probs = ensemble_log_probs(logits, rule(logits, log_odds, n_k), space)
        targets[v, samples] = (log_probs if own is None else floored(log_probs, own)).exp()
    return targets


# Beyond the papers (issue 46): two ways to stop distillation pulling a server model that has
# become a better classifier than its teacher toward the teacher. Both read no label.
def floored(ensemble_log_probs: torch.Tensor, own_logits: torch.Tensor) -> torch.Tensor:
    """The server model as the floor of its teacher: log y~ [S, C] where the ensemble's top
    probability is at least the server model's own, the server model's log-probabilities
    (its own label, which distillation leaves where it is) where it is surer."""
    own = torch.log_softmax(own_logits, -1)
    surer = own.max(-1).values > ensemble_log_probs.max(-1).values
    return torch.where(surer[:, None], own, ensemble_log_probs)


def confident_batches(batches: list[torch.Tensor], targets: torch.Tensor,
                      threshold: float) -> list[torch.Tensor]:
    """The distillation batches (draw_batches) without the images whose pseudo-label's top
    probability is under `threshold`: the student learns only where the teacher is sure
    (fewer images a step, the same steps; a batch left empty is dropped)."""
    top = targets.flatten(0, 1).max(-1).values
    kept = [b[top[b] >= threshold] for b in batches]
    return [b for b in kept if len(b)]


def kl_to_targets(student_logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """KL(y~ || softmax(student)), averaged over the batch."""
    return F.kl_div(F.log_softmax(student_logits, -1), targets, reduction="batchmean")


def cosine_lr(base_lr: float, server_round: int, num_rounds: int) -> float:
    """Server learning rate for round t (1-based), cosine-annealed over the T rounds."""
    return 0.5 * base_lr * (1 + math.cos(math.pi * (server_round - 1) / num_rounds))


def draw_batches(n: int, views: int, *, epochs: int, batch_size: int,
                 seed: int, view_draw: str = "per-pass") -> list[torch.Tensor]:
    """The minibatches of `epochs` shuffled passes over U, each sample with a random view (0 as
    is, 1 mirrored: on-the-fly flipping), drawn anew in every pass or once for the round
    (`view_draw`, see VIEW_DRAWS), before the round so that the teachers label only what the
    distillation will meet. An entry is view * n + sample."""
    if view_draw not in VIEW_DRAWS:
        raise ValueError(f"view draw {view_draw!r}; allowed: {', '.join(VIEW_DRAWS)}")
    gen = torch.Generator().manual_seed(seed)
    if view_draw == "per-round":
        view = torch.randint(views, (n,), generator=gen)
        return [view[idx] * n + idx for _ in range(epochs)
                for idx in minibatches(n, batch_size, gen)]
    return [torch.randint(views, (len(idx),), generator=gen) * n + idx
            for _ in range(epochs) for idx in minibatches(n, batch_size, gen)]


def batch_images(u: torch.Tensor, batch: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The images of a batch of draw_batches in [-1, 1], mirrored where its view is 1."""
    sample, view = batch % len(u), batch // len(u)
    xb = to_unit_range(u[sample]).to(device)
    return torch.where((view == 1).to(device).view(-1, 1, 1, 1), xb.flip(-1), xb)


def batch_loss_fn(student: nn.Module, u: torch.Tensor, targets: torch.Tensor,
                  device: torch.device, amp: bool = False):
    """KL loss of a batch of draw_batches, each image against its view's pseudo-label."""
    flat_targets = targets.flatten(0, 1)

    def batch_loss(batch: torch.Tensor) -> torch.Tensor:
        with server_autocast(device, amp):
            out = student(batch_images(u, batch, device))
        return kl_to_targets(out.float(), flat_targets[batch].to(device))

    return batch_loss


def distill(student: nn.Module, u: torch.Tensor, targets: torch.Tensor, *,
            batches: list[torch.Tensor], lr: float, device: torch.device,
            amp: bool = False, optimizer: str = "adam",
            momentum: float = 0.9) -> dict[str, float]:
    """FedGO's server update: one Adam(lr) step per batch of draw_batches (E_s passes over U)
    against the fixed pseudo-labels targets [V, |U|, C] of view_pseudo_labels; u is uint8."""
    start = time.perf_counter()
    with channels_last(student.train(), device, CHANNELS_LAST):
        opt = classifier_optimizer(student.parameters(), lr, optimizer, momentum)
        loss = descend(opt, batches, batch_loss_fn(student, u, targets, device, amp))
    student.eval()
    return {"distill_loss": loss, "seconds": time.perf_counter() - start}


class BestCheckpoint:
    """FedDF's early stopping on a labelled validation split (None: no stopping): the student
    validated before training and every `eval_every` steps; training stops after `patience`
    steps without a better accuracy, and the best weights are restored at the end."""

    def __init__(self, student: nn.Module, validation: tuple[torch.Tensor, torch.Tensor] | None,
                 device: torch.device, eval_every: int, patience: int):
        self.student, self.validation, self.device = student, validation, device
        self.eval_every, self.patience = eval_every, patience
        self.acc = self.validate() if validation is not None else float("nan")
        self.step, self.state = 0, copy.deepcopy(student.state_dict())

    def validate(self) -> float:
        acc = evaluate(self.student, *self.validation, device=self.device)[0]
        self.student.train()
        return acc

    def stop(self, step: int) -> bool:
        return self.validation is not None and step - self.step >= self.patience

    def after(self, step: int) -> None:
        """After training step `step`: validate when due, keep the weights if better."""
        if self.validation is not None and step % self.eval_every == 0:
            acc = self.validate()
            if acc > self.acc:
                self.acc, self.step = acc, step
                self.state = copy.deepcopy(self.student.state_dict())

    def restore(self) -> None:
        if self.validation is not None:
            self.student.load_state_dict(self.state)


def distill_early_stopping(student: nn.Module, u: torch.Tensor, targets: torch.Tensor, *,
                           batches: list[torch.Tensor], lr: float, device: torch.device,
                           validation: tuple[torch.Tensor, torch.Tensor] | None = None,
                           eval_every: int = 100, patience: int = 1000,
                           clip_norm: float = 5.0, amp: bool = False, optimizer: str = "adam",
                           momentum: float = 0.9) -> dict[str, float]:
    """FedDF's server update: up to one Adam step per batch of draw_batches (the step budget),
    the learning rate cosine-annealed over the budget and the gradient norm clipped at
    `clip_norm`. With a labelled validation split, the student is validated before training
    and every `eval_every` steps, training stops after `patience` steps without a better
    validation accuracy, and the best checkpoint is restored (`BestCheckpoint`)."""
    start = time.perf_counter()
    student.to(device).train()
    opt = classifier_optimizer(student.parameters(), lr, optimizer, momentum)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, len(batches)))
    batch_loss = batch_loss_fn(student, u, targets, device, amp)
    best = BestCheckpoint(student, validation, device, eval_every, patience)
    step, total = 0, 0.0
    for batch in batches:
        if best.stop(step):
            break
        loss = batch_loss(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), clip_norm)
        opt.step()
        schedule.step()
        step += 1
        total += loss.item()
        best.after(step)
    best.restore()
    student.eval()
    return {"distill_loss": total / step if step else float("nan"), "distill_steps": step,
            "best_step": best.step, "val_acc": best.acc,
            "seconds": time.perf_counter() - start}
