"""FedGKD+ (Yao et al., 2021, as the FedGO paper runs it) in the app: the library's FedGKD
(fedgo_flwr.strategies.fedgkd). Each `train` carries the average of the last M global
models; the clients add (gamma / 2) KL from it at temperature tau to their cross-entropy; the
server distils the average toward the clients' uniform ensemble on U with the update every
ensemble strategy here shares (FedDF's), which is the "+"."""

from __future__ import annotations

from dataclasses import dataclass

from fedgo_app.server.record import RunRecord
from fedgo_app.strategies.base import ServerSetup
from fedgo_app.strategies.ensemble import ENSEMBLE_CLIENT, MARKS, READS, EnsembleApp
from fedgo_app.strategies.registry import StrategySpec
from fedgo_flwr.keys import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, key
from fedgo_flwr.strategies.fedgkd import FedGKD as LibraryFedGKD
from fedgo_flwr.strategies.fedgkd import HistoricalTeacher


@dataclass(frozen=True)
class FedGKDKeys:
    """Run-config keys fedgkd-*."""
    buffer_size: int = key(5, "M, the past global models averaged and sent (App. E.2)",
                           AT_LEAST_ONE)
    temperature: float = key(3.0, "tau, the clients' distillation temperature (App. E.2)",
                             POSITIVE)
    weight: float = key(0.001, "gamma; the clients' term is weighted gamma / 2 (App. E.2)",
                        NON_NEGATIVE)


class FedGKDApp(EnsembleApp, LibraryFedGKD):
    """The library's FedGKD+ (its `HistoricalTeacher` clients, which the app's train handler
    runs when the train config names them); the buffer's average goes out with the `train`
    messages."""

    def __init__(self, setup: ServerSetup, record: RunRecord):
        keys = setup.cfg.keys("fedgkd")
        super().__init__(setup, record, None, buffer_size=keys.buffer_size,
                         kd_temperature=keys.temperature, kd_weight=keys.weight)


def clients(cfg) -> dict:
    """FedGKD's clients under another strategy's server (client-method = fedgkd)."""
    keys = cfg.keys("fedgkd")
    return {"client_method": HistoricalTeacher(keys.buffer_size, keys.temperature, keys.weight)}


FEDGKD = StrategySpec("fedgkd", FedGKDApp, ENSEMBLE_CLIENT, keys=FedGKDKeys, reads=READS,
                      marks=MARKS, clients=clients)
