"""DaFKD (Wang et al., CVPR 2023) in the app: the library's DaFKD
(fedgo_flwr/strategies/dafkd.py, with where it follows the paper's summary and where DaFKD's
public code) with the run config as its keywords. Its distillation is the server update every
ensemble strategy shares (temperature 1, `server-epochs` passes, no labelled data, where the
public code distils at temperature 10), so DaFKD, FedDF and FedGO differ only where the
methods differ; its generator is FedGO's shape (`latent-dim`, `generator-width`), trained in
the first `dafkd-gan-rounds` rounds, and the server's unlabeled set U is not used.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fedgo_flwr.keys import NON_NEGATIVE, key
from fedgo_app.server.record import RunRecord
from fedgo_app.strategies.base import CLIENT, ServerSetup
from fedgo_app.strategies.clients import library_step
from fedgo_app.strategies.ensemble import MARKS, READS, EnsembleApp
from fedgo_app.strategies.registry import StrategySpec
from fedgo_flwr.strategies.dafkd import HEAD, TRAIN_DAFKD, domain_scores
from fedgo_flwr.strategies.dafkd import DaFKD as LibraryDaFKD
from fedgo_flwr.strategies.dafkd import domain_aware_update as domain_aware_update_on


@dataclass(frozen=True)
class DaFKDKeys:
    """Run-config keys dafkd-*."""
    gan_rounds: int = key(5, "rounds in which the clients also train the generator (FedGO's "
                          "latent-dim, generator-width, gan-lr); it is sent down every round",
                          NON_NEGATIVE)


# ---------------------------------------------------------------------------- server side
class DaFKDApp(EnsembleApp, LibraryDaFKD):
    """The library's DaFKD (its server update: the heads and G averaged, the round's set
    drawn from G, the domain-aware weights) over the app's FedAvg; its clients run the
    library's step."""
    mixes_architectures = False  # one discriminator head on one latent space
    draws_distillation_set = False  # its own, from its collaboratively trained G, every round
    has_discriminators = True

    def __init__(self, setup: ServerSetup, record: RunRecord):
        cfg = setup.cfg
        setup.latent_dim("dafkd")  # a model without a latent layer is refused, saying why
        super().__init__(setup, record, None, gan_rounds=cfg.keys("dafkd").gan_rounds,
                         latent_dim=cfg.latent_dim, generator_width=cfg.generator_width,
                         gan_lr=cfg.gan_lr)

    distillation_set = LibraryDaFKD.distillation_set
    scores = LibraryDaFKD.scores

    def test_scores(self, teachers, nets: list[nn.Module], n_k: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each client's class logits [K, N, C] and logit D_k(x) [K, N] on the test split,
        D_k's head the one its reply carried."""
        return domain_scores(nets, [m.extras[HEAD].to_torch_state_dict() for m in teachers],
                             self.setup.test_x, flip=False, device=self.setup.device,
                             amp=self.setup.amp)


# DaFKD's local step (fedgo_flwr's) on S_k with this client's architecture
DAFKD = StrategySpec("dafkd", DaFKDApp,
                     {**CLIENT, TRAIN_DAFKD: library_step(domain_aware_update_on, state=True)},
                     keys=DaFKDKeys, reads=(*READS, "generator"), marks=MARKS)
