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
from logging import INFO

import torch
from flwr.common.logger import log

from fedgo_flwr.distill import distill_early_stopping
from fedgo_flwr.results import RunRecord
from fedgo_flwr.strategies.base import ServerSetup
from fedgo_flwr.strategies.ensemble import EnsembleDistillation
from fedgo_flwr.weighting import uniform_weights


class FedDF(EnsembleDistillation):
    def __init__(self, setup: ServerSetup, record: RunRecord):
        super().__init__(setup, record, uniform_weights)
        cfg = setup.cfg
        if cfg.feddf_published:
            log(INFO, "FedDF as published: %d steps of batch %d a round, %s", cfg.feddf_steps,
                cfg.feddf_batch_size, f"early stopping on {len(setup.val_y)} labelled images"
                if len(setup.val_y) else "no early stopping (val-size = 0)")

    def distill_batches(self, server_round: int) -> list[torch.Tensor]:
        """Published: the step budget, feddf-steps minibatches of shuffled passes over U."""
        cfg, n = self.cfg, len(self.setup.u)
        if not cfg.feddf_published:
            return super().distill_batches(server_round)
        epochs = math.ceil(cfg.feddf_steps / math.ceil(n / cfg.feddf_batch_size)) if n else 0
        return self.draw_round_batches(server_round, epochs=epochs,
                                       batch_size=cfg.feddf_batch_size)[:cfg.feddf_steps]

    def distill_student(self, server_round: int, student: torch.nn.Module,
                        targets: torch.Tensor, batches: list[torch.Tensor]) -> dict:
        cfg = self.cfg
        if not cfg.feddf_published:
            return super().distill_student(server_round, student, targets, batches)
        validation = (self.setup.val_x, self.setup.val_y) if len(self.setup.val_y) else None
        info = distill_early_stopping(
            student, self.setup.u, targets, batches=batches, lr=cfg.server_lr,
            device=self.setup.device, validation=validation, eval_every=cfg.feddf_eval_every,
            patience=cfg.feddf_patience, clip_norm=cfg.feddf_clip_norm, amp=self.setup.amp)
        return {**info, "distill_lr": cfg.server_lr}
