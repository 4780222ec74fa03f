"""SCAFFOLD (Karimireddy et al., 2020) in the app: the library's SCAFFOLD
(fedgo_flwr.strategies.scaffold, option II). Each `train` carries the server's control variate
c; a client corrects every local step by c - c_i, its c_i kept in the node's state, and sends
Delta c_i back; the server steps x + eta_g (mean y_i - x) and c + (1/N) sum Delta c_i, N being
the federation's partitions."""

from __future__ import annotations

from dataclasses import dataclass

from flwr.app import ArrayRecord, RecordDict

from fedgo_app.server.record import RunRecord
from fedgo_app.strategies.base import CLIENT, FedAvgStrategy, ServerSetup
from fedgo_app.strategies.clients import library_step
from fedgo_app.strategies.registry import StrategySpec
from fedgo_flwr.keys import POSITIVE, key
from fedgo_flwr.strategies.scaffold import CONTROL, CONTROL_DELTA, controlled_update
from fedgo_flwr.strategies.scaffold import SCAFFOLD as LibrarySCAFFOLD


@dataclass(frozen=True)
class SCAFFOLDKeys:
    """Run-config keys scaffold-*."""
    global_lr: float = key(1.0, "eta_g, the server's step on the mean client update (1: the "
                           "clients' average)", POSITIVE)


class SCAFFOLDApp(FedAvgStrategy, LibrarySCAFFOLD):
    """The library's SCAFFOLD; the app sends c with its `train` messages."""
    mixes_architectures = False  # one c for one architecture's parameters
    carried = ("control",)

    def __init__(self, setup: ServerSetup, record: RunRecord):
        super().__init__(setup, record, global_lr=setup.cfg.keys("scaffold").global_lr)

    def train_content(self, server_round: int, arrays: ArrayRecord) -> RecordDict:
        content = super().train_content(server_round, arrays)
        self.sent = arrays.to_torch_state_dict()  # x, the server's step's origin
        self.known = set(self.clients.partition_ids)  # N: every partition of the federation
        content[CONTROL] = ArrayRecord(self.control)
        return content

    def train_extras(self, server_round: int):
        return {CONTROL_DELTA: self.control}


# SCAFFOLD's local step (fedgo_flwr's), c_i in the node's state
SCAFFOLD = StrategySpec("scaffold", SCAFFOLDApp,
                        {**CLIENT, "train": library_step(controlled_update, state=True)},
                        keys=SCAFFOLDKeys)
