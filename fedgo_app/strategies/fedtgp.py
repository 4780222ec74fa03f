"""FedTGP (Zhang et al., 2024) in the app: the library's FedTGP
(fedgo_flwr.strategies.fedtgp). The clients add lambda MSE(z, P_y) to their cross-entropy
once the server has prototypes, and send their class prototypes with their models; the
server averages the models as FedAvg (the server model, as the FedGO paper scores it) and
trains the global prototypes on the round's client prototypes with the adaptive-margin
contrastive loss."""

from __future__ import annotations

from dataclasses import dataclass

from fedgo_app.server.record import RunRecord
from fedgo_app.strategies.base import CLIENT, FedAvgStrategy, ServerSetup
from fedgo_app.strategies.clients import library_step
from fedgo_app.strategies.registry import StrategySpec
from fedgo_flwr.keys import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, key
from fedgo_flwr.strategies.fedtgp import TRAIN_FEDTGP, prototype_update
from fedgo_flwr.strategies.fedtgp import FedTGP as LibraryFedTGP


@dataclass(frozen=True)
class FedTGPKeys:
    """Run-config keys fedtgp-*."""
    prototype_weight: float = key(0.001, "lambda, the clients' prototype term's weight (App. "
                                  "E.2)", NON_NEGATIVE)
    margin_threshold: float = key(100.0, "tau, the adaptive margin's cap (App. E.2)",
                                  NON_NEGATIVE)
    server_epochs: int = key(1000, "passes of the global prototypes' training over the "
                             "round's client prototypes (App. E.2)", NON_NEGATIVE)
    server_batch_size: int = key(10, "their batch size (App. E.2)", AT_LEAST_ONE)
    server_lr: float = key(0.005, "their SGD learning rate (App. E.2)", POSITIVE)


class FedTGPApp(FedAvgStrategy, LibraryFedTGP):
    """The library's FedTGP; the app sends P with its `train` messages."""
    mixes_architectures = False  # one prototype width

    def __init__(self, setup: ServerSetup, record: RunRecord):
        self.feature_dim = setup.latent_dim("fedtgp")  # refused without features and head
        super().__init__(setup, record, num_classes=setup.num_classes,
                         feature_dim=self.feature_dim, **setup.cfg.keywords("fedtgp"))


FEDTGP = StrategySpec("fedtgp", FedTGPApp,
                      {**CLIENT, TRAIN_FEDTGP: library_step(prototype_update)}, keys=FedTGPKeys)
