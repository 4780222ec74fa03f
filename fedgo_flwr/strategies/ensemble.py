"""What every ensemble-distillation strategy does after averaging (Algorithm 1, lines 8-13):
pseudo-label U once with a weighted ensemble of this round's client models, distill the
averaged model on it, and evaluate the ensemble itself on the test split.

Subclasses choose the weighting rule, the discriminator log-odds it sees (if any), and how
the student is trained on the pseudo-labels.
"""

from __future__ import annotations

import time

import torch

from fedgo_flwr.distill import draw_batches, ensemble_logits, view_pseudo_labels
from fedgo_flwr.strategies.base import ClientModel, FedAvgStrategy, ServerSetup
from fedgo_flwr.results import RunRecord
from fedgo_flwr.teachers import teacher_logits
from fedgo_flwr.train import accuracy_and_loss
from fedgo_flwr.weighting import WeightRule


class EnsembleDistillation(FedAvgStrategy):
    has_ensemble = True

    def __init__(self, setup: ServerSetup, record: RunRecord, weighting: WeightRule):
        super().__init__(setup, record)
        self.weighting = weighting
        self.views = 2 if self.cfg.flip else 1  # U as is, and mirrored

    # --- what subclasses provide
    def u_log_odds(self, models: list[ClientModel], view: int) -> torch.Tensor:
        """log Phi_k on view `view` of U, [K, |U|]; rules without discriminators ignore it."""
        return torch.zeros(len(models), len(self.setup.u))

    def test_log_odds(self, models: list[ClientModel]) -> torch.Tensor:
        return torch.zeros(len(models), len(self.setup.test_y))

    def distill_batches(self, server_round: int) -> list[torch.Tensor]:
        """This round's distillation minibatches (see draw_round_batches); none = no update."""
        raise NotImplementedError

    def draw_round_batches(self, server_round: int, *, epochs: int,
                           batch_size: int) -> list[torch.Tensor]:
        """`epochs` passes over U with random views, seeded by the run's seed and the round."""
        return draw_batches(len(self.setup.u), self.views, epochs=epochs,
                            batch_size=batch_size, seed=self.cfg.seed * 1_000 + server_round)

    def distill_student(self, server_round: int, student: torch.nn.Module,
                        targets: torch.Tensor, batches: list[torch.Tensor]) -> dict:
        """Train student on pseudo-labels [V, |U|, C] over `batches`; returns at least
        distill_loss and seconds."""
        raise NotImplementedError

    # --- the shared round
    def server_update(self, server_round: int, averaged: dict[str, torch.Tensor],
                      models: list[ClientModel]) -> dict[str, torch.Tensor]:
        dev, u = self.setup.device, self.setup.u
        entry = self.record.round(server_round)
        nets = []
        for m in models:
            net = self.setup.new_classifier()
            net.load_state_dict(m.state)
            nets.append(net)
        n_k = torch.tensor([m.num_examples for m in models], dtype=torch.float32)
        student = self.setup.new_classifier()
        student.load_state_dict(averaged)
        batches = self.distill_batches(server_round)
        if batches:
            start = time.perf_counter()
            targets = view_pseudo_labels(  # once per round, not once per epoch
                nets, u, n_k, self.weighting, lambda v: self.u_log_odds(models, v), batches,
                views=self.views, device=dev, amp=self.setup.amp)
            self.record.time("pseudo_labelling", time.perf_counter() - start, server_round)
            info = self.distill_student(server_round, student, targets, batches)
            self.record.time("distillation", info.pop("seconds"), server_round)
            entry.update(info)

        start = time.perf_counter()
        test_logits = teacher_logits(nets, self.setup.test_x, device=dev, amp=self.setup.amp)
        weights = self.weighting(test_logits, self.test_log_odds(models), n_k)
        acc, loss = accuracy_and_loss(ensemble_logits(test_logits, weights), self.setup.test_y)
        entry.update(ensemble_test_acc=acc, ensemble_test_loss=loss)
        self.record.time("evaluation", time.perf_counter() - start, server_round)
        return {k: v.detach().cpu() for k, v in student.state_dict().items()}
