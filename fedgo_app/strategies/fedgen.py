"""FedGen (Zhu et al., 2021) in the app: the library's FedGen (fedgo_flwr/strategies/fedgen.py:
the feature generator G_w trained on the clients' heads, its choices where the paper is
silent), and its clients' loss and label counts, with the run config (fedgen-*) as its
keywords and G_w's training recorded. The latent layer is the classifier's own (512 wide for
the CNN), not the paper's 32-wide MLP.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedgo_flwr.keys import AT_LEAST_ONE, FRACTION, NON_NEGATIVE, POSITIVE, key
from fedgo_app.server.record import RunRecord
from fedgo_app.strategies.base import CLIENT, FedAvgStrategy, ServerSetup
from fedgo_app.strategies.clients import library_step
from fedgo_app.strategies.registry import StrategySpec
from fedgo_flwr.strategies.fedgen import FedGen as LibraryFedGen
from fedgo_flwr.strategies.fedgen import TRAIN_FEDGEN, generated_feature_update


@dataclass(frozen=True)
class FedGenKeys:
    """Run-config keys fedgen-*."""
    generator_steps: int = key(50, "the server's Adam steps on its feature generator G_w a "
                               "round (weight decay 1e-2)", NON_NEGATIVE)
    generator_lr: float = key(3e-4, "G_w's learning rate (times fedgen-decay a round)",
                              POSITIVE)
    generator_batch_size: int = key(32, "G_w's batch size", AT_LEAST_ONE)
    noise_dim: int = key(32, "G_w's noise width", AT_LEAST_ONE)
    hidden_dim: int = key(256, "G_w's hidden width (its output is the classifier's latent "
                          "layer)", AT_LEAST_ONE)
    diversity_weight: float = key(1.0, "weight of G_w's diversity term", NON_NEGATIVE)
    alpha: float = key(10.0, "clients add alpha decay^t CE(head(G_w(y, eps)), y), y from the "
                       "label prior", NON_NEGATIVE)
    decay: float = key(0.98, "per-round decay of alpha and of G_w's learning rate", FRACTION)


# ---------------------------------------------------------------------------- server side
class FedGenApp(FedAvgStrategy, LibraryFedGen):
    """The library's FedGen (its server update: p^(y), lambda_k^y and G_w trained on the
    round's predictors) over the app's FedAvg, with an observer recording G_w's
    training."""
    mixes_architectures = False  # G_w generates features of one architecture's latent space

    def __init__(self, setup: ServerSetup, record: RunRecord):
        setup.latent_dim("fedgen")  # a model without a latent layer is refused, saying why
        super().__init__(setup, record, num_classes=setup.num_classes,
                         **setup.cfg.keywords("fedgen"))
        self.observers.append(self.record_generator)

    def record_generator(self, report) -> None:
        """G_w's training of the round, into the run record."""
        self.record.time("generator_training", report.seconds["generator_training"],
                         report.server_round)
        self.record.round(report.server_round).update(report.details["generator"])


# Its clients: the library's step (eq. 5), seeded by the partition.
FEDGEN = StrategySpec("fedgen", FedGenApp,
                      {**CLIENT, TRAIN_FEDGEN: library_step(generated_feature_update)},
                      keys=FedGenKeys)
