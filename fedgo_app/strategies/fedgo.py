"""FedGO (Algorithm 2) in the app: the library's `FedGO` (fedgo_flwr.strategies.fedgo), its
pre-FL stage and rounds, with the run config as its keywords, G from the app's generator
sources (`generator-source`), clients keyed by partition id, and the stage recorded by an
observer. A partition first seen after the pre-FL stage is sent G when it joins, and a D_k
that comes after the stage's wait joins the odds when it comes (the library's).

Beyond the paper, behind keys whose defaults are the paper's: a sample of U instead of G as
the discriminators' negatives (`discriminator-negatives`), Platt-calibrated odds without the
cap e (`discriminator-calibration`) and the odds screen (`discriminator-screen`)."""

from __future__ import annotations

from logging import WARNING

import torch
from flwr.app import Message
from flwr.common.logger import log

from fedgo_app.client_context import Local, config_of
from fedgo_app.server.record import RunRecord
from fedgo_app.strategies.base import ServerSetup
from fedgo_app.strategies.ensemble import ENSEMBLE_CLIENT, MARKS, READS, EnsembleApp
from fedgo_app.strategies.registry import StrategySpec
from fedgo_flwr.gan import log_odds
from fedgo_flwr.models import Discriminator
from fedgo_flwr.seeds import client_seed
from fedgo_flwr.strategies.fedgo import TRAIN_DISCRIMINATOR
from fedgo_flwr.teachers import top_teacher_logits
from fedgo_flwr.strategies.fedgo import FedGO as LibraryFedGO
from fedgo_flwr.strategies.fedgo import discriminator_update as discriminator_update_on
from fedgo_flwr.weighting import NEEDS_LABEL_COUNTS, WeightRule, weighting_rule


def fedgo_keywords(cfg) -> dict:
    """The run config as the library FedGO's own keywords."""
    return dict(latent_dim=cfg.latent_dim, generator_width=cfg.generator_width,
                gan_batch_size=cfg.gan_batch_size, discriminator_epochs=cfg.discriminator_epochs,
                discriminator_lr=cfg.discriminator_lr,
                discriminator_width=cfg.discriminator_width,
                calibration_fraction=cfg.calibration_fraction if cfg.calibrated_odds else 0.0,
                discriminator_negatives=cfg.discriminator_negatives,
                server_sample_size=cfg.server_sample_size,
                teachers_per_image=cfg.teachers_per_image,
                odds_screen=(cfg.discriminator_screen_z if cfg.discriminator_screen == "odds"
                             else None))


class FedGOApp(EnsembleApp, LibraryFedGO):
    has_discriminators = True

    def __init__(self, setup: ServerSetup, record: RunRecord):
        cfg = setup.cfg
        self.needs_label_counts = cfg.weighting in NEEDS_LABEL_COUNTS
        super().__init__(setup, record, None if self.needs_label_counts else
                         weighting_rule(cfg.weighting, cfg.entropy_tau, cfg.odds_beta),
                         **fedgo_keywords(cfg))
        self.calibrated = cfg.calibrated_odds
        self.test_odds: dict[int, torch.Tensor] = {}  # partition -> log Phi_k on the test split

    # ------------------------------------------------------------------ pre-FL stage
    def pre_fl(self, grid, timeout: float) -> None:
        """The library's pre-FL stage, with G from the run's generator source (and the
        distillation set drawn from it, `distill-set = generated`)."""
        if self.cfg.discriminator_negatives == "generator":
            self.generator = self.source_generator()
        super().pre_fl(grid, timeout)
        left_out = sorted(set(self.clients.partition_ids) - set(self.log_odds))
        if left_out and self.cfg.require_all_clients:
            raise RuntimeError(f"pre-FL: partitions {left_out} sent no usable discriminator "
                               "(require-all-clients = true)")
        if left_out:
            log(WARNING, "pre-FL: partitions %s have no discriminator in the odds: they still "
                "train, and teach once theirs comes", left_out)

    # ------------------------------------------------------------------ the library's hooks
    scores = LibraryFedGO.scores
    teachers = LibraryFedGO.teachers

    def round_weighting(self, teachers) -> WeightRule:
        if not self.needs_label_counts:
            return self.weighting
        counts = self.clients.label_histograms([m.key for m in teachers])
        if counts is None:
            raise RuntimeError(f"weighting {self.cfg.weighting!r} needs every client's label "
                               "counts; a client of this round sent none")
        return weighting_rule(self.cfg.weighting, histograms=counts)

    def test_scores(self, teachers, nets, n_k):
        """With `teachers-per-image` (and no diagnostics, which score every rule on every
        teacher) the ensemble the round distils toward: each test image's top teachers by
        the odds alone, as on U (the library's top_teacher_logits)."""
        if not 0 < self.teachers_per_image < len(nets) or self.cfg.diagnostics:
            return super().test_scores(teachers, nets, n_k)
        logits, log_odds, _ = top_teacher_logits(
            nets, self.setup.test_x, self.test_log_odds([m.key for m in teachers]), n_k,
            self.teachers_per_image, device=self.setup.device, amp=self.setup.amp)
        return logits, log_odds

    def test_log_odds(self, keys: list[int]) -> torch.Tensor:
        """log Phi_k on the test split (the ensemble's test score), once a D_k."""
        for k in keys:
            if k not in self.test_odds:
                d, cal = self.discriminators[k]
                self.test_odds[k] = log_odds(d, self.setup.test_x, device=self.setup.device,
                                             calibration=cal)
        return torch.stack([self.test_odds[k] for k in keys])


# ---------------------------------------------------------------------------- client side
def discriminator_update(message: Message, local: Local) -> Message:
    """Algorithm 3 on S_k (fedgo_flwr's client step), seeded by the partition id."""
    seed = client_seed(int(config_of(message)["seed"]), local.partition_id)
    return discriminator_update_on(message, local.x, device=local.device, seed=seed)


def new_local_discriminator(seed: int, image_shape, width: int) -> Discriminator:
    """D_k as client k initialises it (from its client seed)."""
    torch.manual_seed(seed)
    c, h, _ = image_shape
    return Discriminator(c, h, width)


FEDGO = StrategySpec("fedgo", FedGOApp, {**ENSEMBLE_CLIENT, TRAIN_DISCRIMINATOR: discriminator_update},
                     reads=(*READS, "weighting", "generator", "pre-fl"),
                     marks=(("weighting", "odds", "{}"), ("odds-beta", 1.0, "beta={:g}"),
                            ("discriminator-negatives", "generator", "D vs {}"),
                            ("discriminator-calibration", "none", "{}"),
                            ("discriminator-screen", "none", "{} screen"),
                            ("teachers-per-image", 0, "top {} teachers"), *MARKS))
