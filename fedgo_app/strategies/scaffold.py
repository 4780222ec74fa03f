"""SCAFFOLD (Karimireddy et al., 2020) in the app: the library's SCAFFOLD
(fedgo_flwr.strategies.scaffold, option II). Each `train` carries the server's control variate
c; a client corrects every local step by c - c_i, its c_i kept in the node's state, and sends
Delta c_i back; the server steps x + eta_g (mean y_i - x) and c + (1/N) sum Delta c_i, N being
the federation's partitions."""

from __future__ import annotations

from dataclasses import dataclass

from fedgo_app.server.record import RunRecord
from fedgo_app.strategies.base import CLIENT, FedAvgStrategy, ServerSetup
from fedgo_app.strategies.registry import StrategySpec
from fedgo_flwr.keys import POSITIVE, key
from fedgo_flwr.strategies.scaffold import SCAFFOLD as LibrarySCAFFOLD
from fedgo_flwr.strategies.scaffold import ControlVariates


@dataclass(frozen=True)
class SCAFFOLDKeys:
    """Run-config keys scaffold-*."""
    global_lr: float = key(1.0, "eta_g, the server's step on the mean client update (1: the "
                           "clients' average)", POSITIVE)


class SCAFFOLDApp(FedAvgStrategy, LibrarySCAFFOLD):
    """The library's SCAFFOLD (its `ControlVariates` clients, which the app's train handler
    runs when the train config names them); c goes out with the `train` messages, N is every
    partition of the federation."""

    def __init__(self, setup: ServerSetup, record: RunRecord):
        super().__init__(setup, record, **setup.cfg.keywords("scaffold"))


SCAFFOLD = StrategySpec("scaffold", SCAFFOLDApp, CLIENT, keys=SCAFFOLDKeys,
                        clients=lambda cfg: {"client_method": ControlVariates(
                            **cfg.keywords("scaffold"))})
