"""The server update every ensemble-distillation strategy shares (FedGO's Algorithm 2, lines
8-13): FedAvg's n_k-weighted average theta_s^t, then the weighted ensemble of this round's
client models pseudo-labels the distillation set U once,

    y~(u) = softmax(sum_k w_k(u) f(u; theta_k^t)),

and theta_s^t is distilled toward it for E_s passes (KL(y~ || f(u; theta)), Adam, the learning
rate cosine-annealed over the T rounds). Strategies differ only in the weights w_k(u) and in
what they score U with (FedDF: 1/|A_t|; FedGO: the odds of the clients' discriminators;
DaFKD: its clients' domain discriminators, on a set its generator draws)."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from logging import INFO, WARNING

import torch
from flwr.app import ArrayRecord
from flwr.common.logger import log
from torch import nn

from fedgo_flwr.budget import budget_policy, disagreement
from fedgo_flwr.checks import check_images, check_model
from fedgo_flwr.distill import (ENSEMBLE_SPACES, VIEW_DRAWS, confident_batches, cosine_lr,
                                distill, draw_batches, view_pseudo_labels)
from fedgo_flwr.guard import AVERAGED, DISTILLED, Guard, judge
from fedgo_flwr.inputs import images_of
from fedgo_flwr.progress import Progress
from fedgo_flwr.seeds import round_seed
from fedgo_flwr.strategies.base import ClientModel, RoundReport, ServerUpdateFedAvg
from fedgo_flwr.teachers import PastTeachers, teacher_logits
from fedgo_flwr.train import OPTIMIZERS
from fedgo_flwr.weighting import WeightRule, past_member_shares, with_members

SCHEDULES = ("cosine", "constant")


class EnsembleDistillation(ServerUpdateFedAvg):
    """FedAvg followed by ensemble distillation of the average on an unlabeled set.

    Parameters
    ----------
    unlabeled_data : Tensor | Dataset | DataLoader
        The server's unlabeled set U, images [N, C, H, W]: uint8 pixels (taken to [-1, 1]) or
        floats as the model takes them (fedgo_flwr.inputs). Labels, if any, are ignored.
    weighting : Callable (default: set by the strategy)
        w_k(u): (logits [K, B, C], log-odds [K, B], n_k [K]) -> weights [K, B]
        (fedgo_flwr.weighting).
    distill_epochs : int (default: 10)
        E_s, passes over U per round (the paper's App. E.2).
    distill_batch_size : int (default: 64)
    distill_lr : float (default: 1e-3)
    distill_optimizer : str (default: "adam")
        "adam", or "sgd" with `distill_momentum`.
    distill_momentum : float (default: 0.9)
    distill_schedule : str (default: "cosine")
        "cosine" anneals the learning rate over the run's T rounds (`schedule_rounds`);
        "constant" keeps it.
    schedule_rounds : int | None (default: None)
        T of the cosine schedule: None is the `num_rounds` given to `start`; a run resumed
        after t rounds, started again for T - t, passes T.
    ensemble_space : str (default: "logits")
        Where the weights mix the clients: "logits" (Algorithm 2) or "probabilities"
        (Theorem 3.4).
    flip_views : bool (default: False)
        True: U is seen as is and mirrored (each pass takes a random view of each image), and
        FedGO's generator and discriminators learn on randomly mirrored images (the paper's
        augmentation, App. E.2). Off by default: a mirrored digit, letter or scan may mean
        something else; turn it on for images whose meaning survives a mirror.
    view_draw : str (default: "per-pass")
        "per-pass" draws each image's view anew in every pass; "per-round" draws it once a
        round, so the teachers label |U| images instead of up to 2|U| (fedgo_flwr.distill).
    teacher_floor : bool (default: False)
        Not in the papers: where the average is surer than the ensemble (a higher top
        probability), its own prediction is the pseudo-label (fedgo_flwr.distill.floored).
    confidence_threshold : float (default: 0.0)
        Not in the papers: distil only on the images whose pseudo-label's top probability is
        at least this (fedgo_flwr.distill.confident_batches); 0 keeps every image.
    distill_budget : str (default: "full")
        Not in the papers (fedgo_flwr.budget): "full" takes every step; "disagreement" takes
        the share of them that is the share of the met images where the average's class is
        not the pseudo-label's, so distillation fades as they agree. It cuts the steps before
        `confidence_threshold` drops images.
    budget_probe : int (default: 0)
        Not in the papers; with distill_budget "disagreement": measure the disagreement on
        the distillation's first this many images only and label only the steps the budget
        keeps; 0 measures it on every image the full distillation meets, labelling them all.
    past_teachers : int (default: 0)
        Not in the papers: the global models of the last P rounds (fedgo_flwr.teachers.
        PastTeachers) as more teachers, each holding 1/(K + P) of the weight everywhere, K
        being the round's teachers (fedgo_flwr.weighting.past_member_shares); 0 keeps the
        round's clients alone.
    averaged_share : float (default: 0.0)
        Not in the papers: the round's average as one more teacher holding this share of the
        weight everywhere (fedgo_flwr.weighting.with_members); 0 leaves it out.
    guard : Guard | None (default: None)
        Not in the papers: after distillation keep the distilled model only where it scores
        above the average (fedgo_flwr.guard: `ClientsGuard()`, clients that did not train
        judge; `LabelledGuard((x, y))`, the server's labelled images judge); None keeps the
        distilled model, as the papers do.
    distillation_sets : Callable[[int], Tensor] | None (default: None)
        The round's distillation set: None is `unlabeled_data` every round; a function of
        the round gives each round its own images (a set drawn from a generator, redrawn
        each round: fedgo_flwr.gan.draw_images).
    model_fn, seed, device, aggregate_fn, client_key, num_examples_fn, proximal_mu, observers
        As in `ServerUpdateFedAvg` (fedgo_flwr.strategies.base), and every keyword Flower's
        `FedAvg` takes.
    """

    carried = ("past",)  # past teachers (a checkpoint's: `state_dict`)

    def __init__(self, *, unlabeled_data=None, model_fn: Callable[[], nn.Module],
                 weighting: WeightRule, distill_epochs: int = 10, distill_batch_size: int = 64,
                 distill_lr: float = 1e-3, distill_optimizer: str = "adam",
                 distill_momentum: float = 0.9, distill_schedule: str = "cosine",
                 schedule_rounds: int | None = None,
                 ensemble_space: str = "logits", flip_views: bool = False,
                 view_draw: str = "per-pass", teacher_floor: bool = False,
                 confidence_threshold: float = 0.0, distill_budget: str = "full",
                 budget_probe: int = 0, past_teachers: int = 0, averaged_share: float = 0.0,
                 guard: Guard | None = None,
                 distillation_sets: Callable[[int], torch.Tensor] | None = None,
                 **kwargs) -> None:
        super().__init__(model_fn=model_fn, **kwargs)
        for name, value, allowed in (("distill_optimizer", distill_optimizer, OPTIMIZERS),
                                     ("distill_schedule", distill_schedule, SCHEDULES),
                                     ("ensemble_space", ensemble_space, ENSEMBLE_SPACES),
                                     ("view_draw", view_draw, VIEW_DRAWS)):
            if value not in allowed:
                raise ValueError(f"{name} is {value!r}; allowed: {', '.join(allowed)}")
        if not 0 <= confidence_threshold < 1:
            raise ValueError(f"confidence_threshold is {confidence_threshold}; allowed: [0, 1)")
        if not 0 <= averaged_share < 1:
            raise ValueError(f"averaged_share is {averaged_share}; allowed: [0, 1)")
        if guard is not None and not callable(getattr(guard, "scores", None)):
            raise TypeError(f"guard is a {type(guard).__name__}; allowed: None, "
                            "fedgo_flwr.guard.ClientsGuard(), LabelledGuard(data) or an object "
                            "with scores(strategy, server_round, candidates)")
        if distill_epochs < 0 or distill_batch_size < 1 or distill_lr <= 0:
            raise ValueError("distill_epochs >= 0, distill_batch_size >= 1 and distill_lr > 0 "
                             f"are needed; got {distill_epochs}, {distill_batch_size}, "
                             f"{distill_lr}")
        self.u = None if unlabeled_data is None else images_of(unlabeled_data)
        if self.u is not None:
            check_images(self.u)
            check_model(model_fn, self.u)
        self.weighting = weighting
        self.distill_epochs, self.distill_batch_size = distill_epochs, distill_batch_size
        self.distill_lr, self.distill_optimizer = distill_lr, distill_optimizer
        self.distill_momentum, self.distill_schedule = distill_momentum, distill_schedule
        self.schedule_rounds = schedule_rounds
        self.ensemble_space, self.views = ensemble_space, 2 if flip_views else 1
        self.view_draw, self.teacher_floor = view_draw, teacher_floor
        self.confidence_threshold = confidence_threshold
        self.budget = budget_policy(distill_budget, budget_probe)
        self.past_teachers = past_teachers
        self.past = PastTeachers(past_teachers)  # theta_s of the last rounds
        self.averaged_share, self.guard = averaged_share, guard
        self.distillation_sets = distillation_sets

    def summary(self) -> None:
        super().summary()
        log(INFO, "\t└──> Distillation: %d epoch(s) of batch %d, %s lr %g (%s), %s space, on "
            "%s", self.distill_epochs, self.distill_batch_size, self.distill_optimizer,
            self.distill_lr, self.distill_schedule, self.ensemble_space, self.device)

    def server_update(self, server_round: int, averaged: ArrayRecord,
                      models: list[ClientModel], report: RoundReport
                      ) -> tuple[ArrayRecord, dict[str, float]]:
        """Pseudo-label the distillation set once with the weighted ensemble of the round's
        teachers and distil the average toward it (then the guard, if any, keeps one of the
        two); returns the new global model and the round's distillation metrics."""
        self.past.begin_round()
        if (drawn := self.round_set(server_round, models)) is None:
            return averaged, {}
        teachers, u = drawn
        student = self.load(averaged.to_torch_state_dict())
        batches = self.distill_batches(server_round, u)
        met = sum(len(b) for b in batches)  # distill-kept: the share of them distilled on
        targets, batches, metrics = self.pseudo_labels(server_round, teachers, u, student,
                                                       batches, report)
        if self.confidence_threshold > 0:
            batches = confident_batches(batches, targets, self.confidence_threshold)
        info = report.details["distillation"] = self.distill_student(
            server_round, student, u, targets, batches)
        log(INFO, "round %d: distilled, KL %.4f (%.1fs)", server_round, info["distill_loss"],
            info["seconds"])
        report.seconds["distillation"] = info["seconds"]
        arrays = ArrayRecord(student.cpu().state_dict())  # not trained again: no copy
        if self.guard is not None:
            arrays, metrics["guard-kept-distilled"] = self.accept(server_round, averaged,
                                                                  arrays, report)
        if self.past.keep:  # a teacher from the next round on: the model it starts from
            self.past.remember(arrays.to_torch_state_dict())
        return arrays, {
            "distill-loss": info["distill_loss"], "distill-lr": info["distill_lr"],
            "distill-steps": info["distill_steps"], "distill-teachers": len(teachers),
            "distill-seconds": info["seconds"], "distill-kept": sum(map(len, batches)) / met,
            **metrics}

    def round_set(self, server_round: int, models: list[ClientModel]
                  ) -> tuple[list[ClientModel], torch.Tensor] | None:
        """The round's teachers and distillation set, or None (logged) where there is no
        teacher or nothing to distil on: the average is then kept."""
        teachers = self.teachers(models)
        u = self.distillation_set(server_round)
        if not teachers or u is None or not len(u) or self.distill_epochs == 0:
            log(WARNING, "round %d: no teacher or nothing to distil on; the average is kept",
                server_round)
            return None
        return teachers, u

    def pseudo_labels(self, server_round: int, teachers: list[ClientModel], u: torch.Tensor,
                      student: nn.Module, batches: list[torch.Tensor], report: RoundReport):
        """y~ on every image the batches meet, once a round, by the weighted ensemble of the
        teachers, the past global models and the average as members (`with_members`), the
        average's own label as the floor; with the disagreement budget only on the steps it
        keeps (`distill_budget`). Returns (targets, batches, metrics); what it used goes into
        report.details."""
        nets = self.teacher_nets(teachers)
        n_k = torch.tensor([m.num_examples for m in teachers], dtype=torch.float32)
        past = self.past.last(self.past_teachers)
        shares = past_member_shares(len(teachers), len(past)) + (
            [self.averaged_share] if self.averaged_share else [])
        rule = self.round_weighting(teachers)
        weighting = with_members(rule, shares) if shares else rule
        report.details.update(teachers=teachers, nets=nets, client_rule=rule,
                              weighting=weighting, past=past, past_states=list(self.past.states),
                              distillation_set=u)
        scores = partial(self.member_scores, teachers, nets, past, student, u)

        def label(batches: list[torch.Tensor], targets: torch.Tensor | None) -> torch.Tensor:
            return view_pseudo_labels(scores, len(u), n_k, weighting, batches,
                                      views=self.views, space=self.ensemble_space,
                                      floor=self.teacher_floor, targets=targets)

        start = time.perf_counter()
        metrics = {"past-teachers": len(past)} if self.past_teachers else {}
        targets, batches, kept = self.budget.pseudo_labels(  # the student is undistilled yet
            label, lambda t: disagreement(student, u, t, device=self.device,
                                          amp=self.device.type == "cuda"), batches)
        metrics.update(kept)
        report.seconds["pseudo_labelling"] = metrics["pseudo-label-seconds"] = \
            time.perf_counter() - start
        report.details["targets"] = targets
        log(INFO, "round %d: %d teachers pseudo-labelled %d images (%.1fs)", server_round,
            len(teachers), len(u), metrics["pseudo-label-seconds"])
        return targets, batches, metrics

    def member_scores(self, teachers: list[ClientModel], nets: list[nn.Module], past: list,
                      student: nn.Module, u: torch.Tensor, view: int, samples: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every member's logits on u[samples] in view `view` (1: flipped), rows in order: the
        clients', the past models', the average as member, the floor; and the clients'
        log-odds."""
        amp = self.device.type == "cuda"
        logits, log_odds = self.scores(teachers, nets, u, samples, view)
        rows = [logits]
        if past:
            rows.append(self.past.logits(past, u, self.load, samples=samples,
                                         device=self.device, flip=view == 1, amp=amp))
        own = (self.averaged_share > 0) + self.teacher_floor  # rows of the average's logits
        if own:
            rows += [teacher_logits([student], u[samples], device=self.device,
                                    flip=view == 1, amp=amp)] * own
        return torch.cat(rows), log_odds

    def distill_batches(self, server_round: int, u: torch.Tensor) -> list[torch.Tensor]:
        """This round's distillation minibatches: E_s shuffled passes over the set, each
        image in a view (`view_draw`), seeded by the seed and the round."""
        return draw_batches(len(u), self.views, epochs=self.distill_epochs,
                            batch_size=self.distill_batch_size,
                            seed=round_seed(self.seed, server_round), view_draw=self.view_draw)

    def distill_student(self, server_round: int, student: nn.Module, u: torch.Tensor,
                        targets: torch.Tensor, batches: list[torch.Tensor]) -> dict:
        """One optimiser step per batch on KL(y~ || student); returns distill_loss,
        distill_steps, distill_lr and seconds."""
        lr = self.server_lr(server_round)
        bar = Progress(f"round {server_round}: distillation", len(batches), estimate_after=60)
        info = distill(student, u, targets, batches=bar.over(batches), lr=lr,
                       device=self.device,
                       amp=self.device.type == "cuda", optimizer=self.distill_optimizer,
                       momentum=self.distill_momentum)
        return {"distill_steps": len(batches), **info, "distill_lr": lr}

    def accept(self, server_round: int, averaged: ArrayRecord, distilled: ArrayRecord,
               report: RoundReport) -> tuple[ArrayRecord, int]:
        """The guard's choice between the average and the distilled model (1: distilled)."""
        start = time.perf_counter()
        report.details["candidates"] = {AVERAGED: averaged, DISTILLED: distilled}
        arrays, report.details["guard"] = judge(self.guard, self, server_round, averaged,
                                                distilled)
        report.seconds["guard"] = time.perf_counter() - start
        return arrays, int(report.details["guard"]["kept"] == DISTILLED)

    # --- what a strategy changes
    def teachers(self, models: list[ClientModel]) -> list[ClientModel]:
        """The round's models the ensemble weights (FedGO: those with a discriminator)."""
        return models

    def teacher_nets(self, teachers: list[ClientModel]) -> list[nn.Module]:
        """The teachers as models (of the global model's architecture)."""
        return [self.load(m.state) for m in teachers]

    def round_weighting(self, teachers: list[ClientModel]) -> WeightRule:
        """The rule w_k(u) of this round's teachers (`weighting`; a rule that reads the
        teachers' label counts gets theirs bound here)."""
        return self.weighting

    def distillation_set(self, server_round: int) -> torch.Tensor | None:
        """The images distilled on this round (U, or `distillation_sets`'s; DaFKD draws its
        own)."""
        if self.distillation_sets is not None:
            return images_of(self.distillation_sets(server_round))
        return self.u

    def scores(self, teachers: list[ClientModel], nets: list[nn.Module], u: torch.Tensor,
               samples: torch.Tensor, view: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The teachers' logits [K, S, C] and log-odds log Phi_k [K, S] on these samples of
        view `view` of the distillation set u (1: mirrored); without discriminators the
        log-odds are 0."""
        logits = teacher_logits(nets, u[samples], device=self.device, flip=view == 1,
                                amp=self.device.type == "cuda")
        return logits, torch.zeros(logits.shape[:2])

    def server_lr(self, server_round: int) -> float:
        if self.distill_schedule == "constant":
            return self.distill_lr
        horizon = self.schedule_rounds or self.num_rounds
        return cosine_lr(self.distill_lr, server_round, max(horizon, server_round))
