"""Server ensemble distillation (Algorithm 2, lines 8-13): pseudo-label U once per round with
the weighted ensemble of the round's client models, then train the averaged model on it."""

from __future__ import annotations

import copy
import math
import time

import torch
import torch.nn.functional as F
from torch import nn

from fedgo_flwr.data import minibatches, to_unit_range
from fedgo_flwr.teachers import server_autocast, teacher_logits
from fedgo_flwr.train import evaluate, minibatch_descent


def ensemble_logits(client_logits: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum_k w_k(u) f(u; theta_k): weights [K, B] multiply the logits [K, B, C]."""
    return (weights.unsqueeze(-1) * client_logits).sum(0)


def pseudo_labels(client_logits: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """y~(u) = softmax(sum_k w_k(u) f(u; theta_k))."""
    return torch.softmax(ensemble_logits(client_logits, weights), dim=-1)


def view_pseudo_labels(nets: list[nn.Module], u: torch.Tensor, n_k: torch.Tensor, rule,
                       log_odds_of_view, *, views: int, device: torch.device,
                       amp: bool = False) -> torch.Tensor:
    """Pseudo-labels of every view of U (0 as is, 1 mirrored), [V, |U|, C]: the teachers run
    once per view, and `rule` weights them with log Phi_k of that view, log_odds_of_view(v)."""
    targets = []
    for v in range(views):
        logits = teacher_logits(nets, u, device=device, flip=v == 1, amp=amp)
        targets.append(pseudo_labels(logits, rule(logits, log_odds_of_view(v), n_k)))
    return torch.stack(targets)


def kl_to_targets(student_logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """KL(y~ || softmax(student)), averaged over the batch."""
    return F.kl_div(F.log_softmax(student_logits, -1), targets, reduction="batchmean")


def cosine_lr(base_lr: float, server_round: int, num_rounds: int) -> float:
    """Server learning rate for round t (1-based), cosine-annealed over the T rounds."""
    return 0.5 * base_lr * (1 + math.cos(math.pi * (server_round - 1) / num_rounds))


def random_views(u: torch.Tensor, idx: torch.Tensor, views: int, gen: torch.Generator,
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Minibatch u[idx] in [-1, 1] where each sample takes a random view (0 plain, 1 mirrored),
    and the views drawn."""
    xb = to_unit_range(u[idx]).to(device)
    view = torch.randint(views, (len(idx),), generator=gen)
    flipped = (view == 1).to(device).view(-1, 1, 1, 1)
    return torch.where(flipped, xb.flip(-1), xb), view


def view_batch_loss(student: nn.Module, u: torch.Tensor, targets: torch.Tensor,
                    gen: torch.Generator, device: torch.device, amp: bool = False):
    """KL loss of a minibatch of U where each sample takes a random view and meets that view's
    pseudo-label: on-the-fly random flipping, with the teachers run once per round instead of
    once per epoch."""

    def batch_loss(idx: torch.Tensor) -> torch.Tensor:
        xb, view = random_views(u, idx, targets.shape[0], gen, device)
        with server_autocast(device, amp):
            out = student(xb)
        return kl_to_targets(out.float(), targets[view, idx].to(device))

    return batch_loss


def distill(student: nn.Module, u: torch.Tensor, targets: torch.Tensor, *, epochs: int,
            batch_size: int, lr: float, seed: int, device: torch.device,
            amp: bool = False) -> dict[str, float]:
    """FedGO's server update: `epochs` passes of Adam(lr) over U against fixed pseudo-labels.

    u is uint8 images; targets is [V, N, C], one set of pseudo-labels per view of U (V = 2
    when flipping: the plain and the mirrored image).
    """
    start = time.perf_counter()
    gen = torch.Generator().manual_seed(seed)
    student.to(device).train()
    opt = torch.optim.Adam(student.parameters(), lr=lr)
    loss = minibatch_descent(opt, len(u), epochs=epochs, batch_size=batch_size, gen=gen,
                             batch_loss=view_batch_loss(student, u, targets, gen, device, amp))
    student.eval()
    return {"distill_loss": loss, "seconds": time.perf_counter() - start}


def distill_early_stopping(student: nn.Module, u: torch.Tensor, targets: torch.Tensor, *,
                           max_steps: int, batch_size: int, lr: float, seed: int,
                           device: torch.device,
                           validation: tuple[torch.Tensor, torch.Tensor] | None = None,
                           eval_every: int = 100, patience: int = 1000,
                           clip_norm: float = 5.0, amp: bool = False) -> dict[str, float]:
    """FedDF's server update: up to `max_steps` Adam steps with the learning rate
    cosine-annealed over the steps and the gradient norm clipped at `clip_norm`. With a
    labelled validation split, the student is validated before training and every
    `eval_every` steps, training stops after `patience` steps without a better validation
    accuracy, and the best checkpoint is restored."""
    start = time.perf_counter()
    gen = torch.Generator().manual_seed(seed)
    student.to(device).train()
    opt = torch.optim.Adam(student.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max_steps)
    batch_loss = view_batch_loss(student, u, targets, gen, device, amp)

    def val_acc() -> float:
        acc = evaluate(student, *validation, device=device)[0]
        student.train()
        return acc

    best_acc = val_acc() if validation is not None else float("nan")
    best_step, best_state = 0, copy.deepcopy(student.state_dict())
    step, total = 0, 0.0

    def finished() -> bool:
        return step >= max_steps or (validation is not None and step - best_step >= patience)

    while not finished():
        for idx in minibatches(len(u), batch_size, gen):
            loss = batch_loss(idx)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(student.parameters(), clip_norm)
            opt.step()
            schedule.step()
            step += 1
            total += loss.item()
            if validation is not None and step % eval_every == 0:
                acc = val_acc()
                if acc > best_acc:
                    best_acc, best_step = acc, step
                    best_state = copy.deepcopy(student.state_dict())
            if finished():
                break
    if validation is not None:
        student.load_state_dict(best_state)
    student.eval()
    return {"distill_loss": total / step if step else float("nan"), "distill_steps": step,
            "best_step": best_step, "val_acc": best_acc,
            "seconds": time.perf_counter() - start}
