"""FedDF (Lin et al., 2020): ensemble distillation with UNIFORM weights. The student starts
from this round's n_k-weighted average; the teacher is the plain mean of the client logits;
KL(teacher || student) at temperature 1.

By default FedDF distils exactly as every other ensemble strategy here (E_s passes over U, the
shared optimiser and schedule, no labelled data), as the FedGO paper trains its baselines
(App. F.6.2). `feddf-published = true` gives FedDF's own server update instead: Adam with
cosine annealing over a step budget restarted every round, batch 128, gradient norm clipped at
5, and, with `val-size` > 0, early stopping on that many LABELLED server images, keeping the
best checkpoint."""

from __future__ import annotations

import math
from dataclasses import dataclass
from logging import INFO

import torch
from flwr.common.logger import log

from fedgo_flwr.config import check
from fedgo_flwr.distill import distill_early_stopping
from fedgo_flwr.results import RunRecord
from fedgo_flwr.strategies.base import CLIENT, ServerSetup
from fedgo_flwr.strategies.ensemble import EnsembleDistillation
from fedgo_flwr.strategies.registry import StrategySpec
from fedgo_flwr.weighting import uniform_weights


@dataclass(frozen=True)
class FedDFKeys:
    """Run-config keys feddf-*: FedDF's server update as published, instead of the shared one."""
    published: bool = False
    steps: int = 500  # step budget (1e4 in the paper)
    batch_size: int = 128
    eval_every: int = 100
    patience: int = 1000  # steps without a better validation accuracy
    clip_norm: float = 5.0

    def validate(self, cfg) -> None:
        check("feddf-published", not self.published or cfg.strategy == "feddf",
              f"is true, but strategy is {cfg.strategy!r}: it switches FedDF (strategy = "
              "\"feddf\") to its published server update")
        check("val-size", cfg.val_size == 0 or self.published,
              "is > 0, but only FedDF's published server update reads labelled server data: "
              "set feddf-published = true (and strategy = \"feddf\") or val-size = 0")
        for key in ("batch-size", "eval-every", "patience"):
            check(f"feddf-{key}", getattr(self, key.replace("-", "_")) >= 1, "must be >= 1")
        check("feddf-steps", self.steps >= 0, "must be >= 0")
        check("feddf-clip-norm", self.clip_norm > 0, "must be > 0")


class FedDF(EnsembleDistillation):
    def __init__(self, setup: ServerSetup, record: RunRecord):
        super().__init__(setup, record, uniform_weights)
        self.keys = keys = setup.cfg.keys("feddf")
        if keys.published:
            log(INFO, "FedDF as published: %d steps of batch %d a round, %s", keys.steps,
                keys.batch_size, f"early stopping on {len(setup.val_y)} labelled images"
                if len(setup.val_y) else "no early stopping (val-size = 0)")

    def distill_batches(self, server_round: int) -> list[torch.Tensor]:
        """Published: the step budget, feddf-steps minibatches of shuffled passes over U."""
        keys, n = self.keys, len(self.u)
        if not keys.published:
            return super().distill_batches(server_round)
        epochs = math.ceil(keys.steps / math.ceil(n / keys.batch_size)) if n else 0
        return self.draw_round_batches(server_round, epochs=epochs,
                                       batch_size=keys.batch_size)[:keys.steps]

    def distill_student(self, server_round: int, student: torch.nn.Module,
                        targets: torch.Tensor, batches: list[torch.Tensor]) -> dict:
        keys, lr = self.keys, self.cfg.server_lr
        if not keys.published:
            return super().distill_student(server_round, student, targets, batches)
        validation = (self.setup.val_x, self.setup.val_y) if len(self.setup.val_y) else None
        info = distill_early_stopping(
            student, self.u, targets, batches=batches, lr=lr, device=self.setup.device,
            validation=validation, eval_every=keys.eval_every, patience=keys.patience,
            clip_norm=keys.clip_norm, amp=self.setup.amp)
        return {**info, "distill_lr": lr}


FEDDF = StrategySpec("feddf", FedDF, CLIENT, keys=FedDFKeys)
