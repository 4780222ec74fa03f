"""FedDisco (Ye et al., 2023) in the app: the library's FedDisco
(fedgo_flwr.strategies.feddisco). The clients train as FedAvg's and report their label counts
once, at discovery; each round's models are averaged with p_k = ReLU(n_k / n - a d_k + b),
normalised, in place of n_k (d_k the discrepancy of client k's label distribution from the
uniform one), and so is the round's train loss."""

from __future__ import annotations

from dataclasses import dataclass

from fedgo_app.server.record import RunRecord
from fedgo_app.strategies.base import CLIENT, FedAvgStrategy, ServerSetup
from fedgo_app.strategies.registry import StrategySpec
from fedgo_flwr.keys import NON_NEGATIVE, OneOf, key
from fedgo_flwr.strategies.feddisco import METRICS, QUERY_LABEL_COUNTS, label_counts_reply
from fedgo_flwr.strategies.feddisco import FedDisco as LibraryFedDisco


@dataclass(frozen=True)
class FedDiscoKeys:
    """Run-config keys feddisco-*."""
    a: float = key(0.5, "a, the weight of the discrepancy d_k (App. E.2)", NON_NEGATIVE)
    b: float = key(0.1, "b, the bias added to each client's share (App. E.2)")
    metric: str = key("kl", "d_k: kl (KL to the uniform distribution, normalised over the "
                      "round's clients) or l2", OneOf(METRICS))


class FedDiscoApp(FedAvgStrategy, LibraryFedDisco):
    """The library's FedDisco weights over the app's averaging."""
    needs_label_counts = True  # the clients send c_k at discovery

    def __init__(self, setup: ServerSetup, record: RunRecord):
        keys = setup.cfg.keys("feddisco")
        super().__init__(setup, record, num_classes=setup.num_classes,
                         discrepancy_weight=keys.a, bias=keys.b, metric=keys.metric)

    def discover(self, grid) -> None:
        """The clients, and c_k as they reported it at discovery (the library asks a client
        that comes without it)."""
        super().discover(grid)
        self.counts = {p: list(c.label_histogram) for p, c in self.clients.by_partition.items()
                       if c.label_histogram is not None}


def label_counts(message, local):
    """The library's label-count query, on S_k."""
    return label_counts_reply(message, (local.x, local.y))


FEDDISCO = StrategySpec("feddisco", FedDiscoApp, {**CLIENT, QUERY_LABEL_COUNTS: label_counts},
                        keys=FedDiscoKeys)
