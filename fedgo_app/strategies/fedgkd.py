"""FedGKD+ (Yao et al., 2021, as the FedGO paper runs it) in the app: the library's FedGKD
(fedgo_flwr.strategies.fedgkd). Each `train` carries the average of the last M global
models; the clients add (gamma / 2) KL from it at temperature tau to their cross-entropy; the
server distils the average toward the clients' uniform ensemble on U with the update every
ensemble strategy here shares (FedDF's), which is the "+"."""

from __future__ import annotations

from dataclasses import dataclass

from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from fedgo_app.server.record import RunRecord
from fedgo_app.strategies.base import ServerSetup
from fedgo_app.strategies.clients import library_step
from fedgo_app.strategies.ensemble import ENSEMBLE_CLIENT, MARKS, READS, EnsembleApp
from fedgo_app.strategies.registry import StrategySpec
from fedgo_flwr.keys import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, key
from fedgo_flwr.strategies.fedgkd import FedGKD as LibraryFedGKD
from fedgo_flwr.strategies.fedgkd import historical_update


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
    """The library's FedGKD+; the app sends the buffer's average with its `train` messages."""
    mixes_architectures = False  # one buffer of one architecture's models
    carried = ("buffer",)

    def __init__(self, setup: ServerSetup, record: RunRecord):
        keys = setup.cfg.keys("fedgkd")
        super().__init__(setup, record, None, buffer_size=keys.buffer_size,
                         kd_temperature=keys.temperature, kd_weight=keys.weight)

    def train_content(self, server_round: int, arrays: ArrayRecord) -> RecordDict:
        content = super().train_content(server_round, arrays)
        for name, record in self.historical(arrays).items():
            content[name] = record
        return content

    def train_config(self, server_round: int) -> ConfigRecord:
        conf = super().train_config(server_round)
        conf.update(self.kd)
        return conf


FEDGKD = StrategySpec("fedgkd", FedGKDApp,
                      {**ENSEMBLE_CLIENT, "train": library_step(historical_update)},
                      keys=FedGKDKeys, reads=READS, marks=MARKS)
