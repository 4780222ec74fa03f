"""FedDisco (Ye et al., "FedDisco: Federated Learning with Discrepancy-Aware Collaboration",
ICML 2023), one of the FedGO paper's Table 3 baselines (App. E.2: a = 0.5, b = 0.1).

FedAvg whose aggregation weights use each client's discrepancy d_k between its label
distribution D_k and the global one T besides its share of the data:

    p_k = ReLU(n_k / sum_i n_i - a d_k + b),   normalised over the round's clients.

The clients train with your own `train` handler: FedDisco asks each client once, by message
type `query.label_counts` (`fedgo_flwr.client.register` answers from `data_fn`), for its
label counts c_k, and keeps them by client key.

What the paper leaves open, and what this module does (following the authors' code's
defaults): T is uniform over the C classes unless `target` is given; d_k is KL(D_k || T),
divided by its sum over the round's clients (`metric="kl"`), or the L2 distance ("l2"); a
round whose weights all vanish falls back on n_k; the clients' train metrics are averaged
with the same weights. A client whose counts cannot be had trains and is averaged by n_k.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from logging import WARNING

import torch
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from torch import nn

from fedgo_flwr.inputs import labelled
from fedgo_flwr.strategies.base import ClientModel, ServerUpdateFedAvg
from fedgo_flwr.strategies.label_counts import LABEL_COUNTS, label_counts, label_counts_problem

QUERY_LABEL_COUNTS = "query.label_counts"
METRICS = ("kl", "l2")


def discrepancies(counts: torch.Tensor, target: torch.Tensor, metric: str) -> torch.Tensor:
    """d_k of each row of counts [K, C] from the target distribution [C]."""
    local = counts / counts.sum(1, keepdim=True)
    if metric == "l2":
        return (local - target).norm(dim=1)
    kl = torch.where(local > 0, local * (local / target).log(), torch.zeros_like(local)).sum(1)
    return kl / kl.sum() if kl.sum() > 0 else torch.zeros_like(kl)


def disco_weights(num_examples: torch.Tensor, d: torch.Tensor, a: float, b: float
                  ) -> torch.Tensor:
    """ReLU(n_k / n - a d_k + b), normalised; n_k / n where every weight vanishes."""
    share = num_examples / num_examples.sum()
    w = (share - a * d + b).clamp(min=0)
    return w / w.sum() if w.sum() > 0 else share


class FedDisco(ServerUpdateFedAvg):
    """FedDisco: FedAvg with discrepancy-aware aggregation weights.

    Parameters
    ----------
    model_fn : Callable[[], nn.Module]
        Builds the global model.
    num_classes : int
        C, the length of the clients' label counts.
    discrepancy_weight : float (default: 0.5)
        a (App. E.2 of the FedGO paper).
    bias : float (default: 0.1)
        b.
    metric : str (default: "kl")
        d_k: "kl" (KL(D_k || T), normalised over the round's clients) or "l2".
    target : Sequence[float] | None (default: None)
        T, the global label distribution; None is uniform.
    seed, device, aggregate_fn, client_key, observers, max_failed_rounds
        As in `ServerUpdateFedAvg`, and every keyword Flower's `FedAvg` takes.
    """

    def __init__(self, *, model_fn: Callable[[], nn.Module], num_classes: int,
                 discrepancy_weight: float = 0.5, bias: float = 0.1, metric: str = "kl",
                 target: Sequence[float] | None = None, **kwargs) -> None:
        super().__init__(model_fn=model_fn, **kwargs)
        if metric not in METRICS:
            raise ValueError(f"metric is {metric!r}; allowed: {', '.join(METRICS)}")
        if num_classes < 2:
            raise ValueError(f"num_classes is {num_classes}; a classifier needs at least 2")
        t = torch.full((num_classes,), 1.0 / num_classes) if target is None else (
            torch.as_tensor(target, dtype=torch.float64))
        if len(t) != num_classes or (t <= 0).any():
            raise ValueError(f"target must hold {num_classes} positive shares; got {target!r}")
        self.num_classes, self.metric, self.target = num_classes, metric, (t / t.sum()).float()
        self.a, self.b = float(discrepancy_weight), float(bias)
        self.counts: dict = {}  # client key -> c_k

    def configure_train(self, server_round: int, arrays, config: ConfigRecord, grid: Grid):
        """FedAvg's, after asking the round's new clients once for their label counts."""
        messages = list(super().configure_train(server_round, arrays, config, grid))
        new = [n for n, k in self.sampled.items() if k not in self.counts]
        if new:
            self.ask_counts(grid, new)
        return messages

    def ask_counts(self, grid: Grid, nodes: list[int], timeout: float = 120.0) -> None:
        query = RecordDict({"config": ConfigRecord({"num-classes": self.num_classes})})
        replies = grid.send_and_receive(
            [Message(query, dst_node_id=n, message_type=QUERY_LABEL_COUNTS) for n in nodes],
            timeout=timeout)
        for reply in replies:
            node = reply.metadata.src_node_id
            metrics = None if reply.has_error() else reply.content.metric_records.get("metrics")
            why = (reply.error.reason if reply.has_error() else "no MetricRecord"
                   if metrics is None else label_counts_problem(metrics, self.num_classes))
            if why:
                log(WARNING, "node %d: no label counts (%s); averaged by n_k", node, why)
            else:
                self.counts[self.key_of(node)] = list(metrics[LABEL_COUNTS])

    def client_models(self, server_round: int, replies) -> list[ClientModel]:
        """The usable replies, each weighted by p_k (kept in `weighted_by_key`) in place of
        n_k wherever every client's counts are known."""
        models = super().client_models(server_round, replies)
        if not models or any(m.key not in self.counts for m in models):
            return models
        p = self.weights_of([self.counts[m.key] for m in models],
                            [m.num_examples for m in models])
        for m, w in zip(models, p.tolist()):
            next(iter(m.content.metric_records.values()))[self.weighted_by_key] = w
        return models

    def weights_of(self, counts, num_examples) -> torch.Tensor:
        """p_k of the round's clients from their label counts c_k [K, C] and n_k [K]."""
        counts = torch.as_tensor(counts, dtype=torch.float32)
        n = torch.as_tensor(num_examples, dtype=torch.float32)
        return disco_weights(n, discrepancies(counts, self.target, self.metric), self.a, self.b)


# ---------------------------------------------------------------------------- client side
def label_counts_reply(message: Message, data) -> Message:
    """The client's answer to `query.label_counts`: c_k of its labelled `data` and n_k."""
    _, y = labelled(data)
    classes = int(message.content.config_records["config"]["num-classes"])
    return Message(RecordDict({"metrics": MetricRecord(
        {LABEL_COUNTS: label_counts(y, classes), "num-examples": len(y)})}),
        reply_to=message)
