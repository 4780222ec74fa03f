"""FedUV (Son et al., 2024) in the app: the library's FedUV (fedgo_flwr.strategies.feduv).
The clients add alpha times the classifier-variance term and lambda times the encoder-
uniformity term to their cross-entropy on every minibatch; the server averages as FedAvg."""

from __future__ import annotations

from dataclasses import dataclass

from fedgo_app.server.record import RunRecord
from fedgo_app.strategies.base import CLIENT, FedAvgStrategy, ServerSetup
from fedgo_app.strategies.registry import StrategySpec
from fedgo_flwr.keys import NON_NEGATIVE, key
from fedgo_flwr.strategies.feduv import FedUV as LibraryFedUV
from fedgo_flwr.strategies.feduv import UniformVariance


@dataclass(frozen=True)
class FedUVKeys:
    """Run-config keys feduv-*."""
    variance_weight: float = key(2.5, "alpha, the classifier variance term's weight (App. "
                                 "E.2)", NON_NEGATIVE)
    uniformity_weight: float = key(0.5, "lambda, the encoder uniformity term's weight (App. "
                                   "E.2)", NON_NEGATIVE)


class FedUVApp(FedAvgStrategy, LibraryFedUV):
    """The library's FedUV (its `UniformVariance` clients, which the app's train handler runs
    when the train config names them)."""

    def __init__(self, setup: ServerSetup, record: RunRecord):
        setup.latent_dim("feduv")  # a model without features and head is refused, saying why
        super().__init__(setup, record, **setup.cfg.keywords("feduv"))


FEDUV = StrategySpec("feduv", FedUVApp, CLIENT, keys=FedUVKeys, clients=lambda cfg: {
    "client_method": UniformVariance(**cfg.keywords("feduv"))})
