"""The aggregation seam: how the round's usable client models become one model, the model FedAvg
keeps and every ensemble strategy (FedDF, FedGO, ...) starts its distillation from.

    mean          theta = sum_k n_k / sum_i n_i theta_k (FedAvg; the papers' choice)
    median        coordinate-wise median (Flower's FedMedian; unweighted)
    trimmed-mean  coordinate-wise mean after cutting `aggregator-trim` of each tail (FedTrimmedAvg)
    krum          the one model with the smallest sum of squared distances to its n - f - 2
                  nearest (Krum), f = `aggregator-byzantine`
    multi-krum    the n_k-weighted mean of the `aggregator-select` models Krum scores best
                  (MultiKrum; 0 selects n - f)
    bulyan        Multi-Krum's n - 2f best, then per coordinate the mean of the n - 4f values
                  nearest their median (Bulyan; needs n >= 4f + 3 replies)

The robust rules are Flower's own (flwr.serverapp.strategy: FedMedian's median, FedTrimmedAvg's
trim_mean, MultiKrum's select_multikrum, Bulyan's aggregate_n_closest_weights, the weighted
aggregate_arrayrecords), on the round's models in the form of the replies they came in;
integer buffers (BatchNorm's counters) are rounded back to their dtype. A rule that cannot
aggregate this many models (Bulyan with fewer than 4f + 3) returns None: the round keeps the
previous model and says so.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from logging import WARNING

import numpy as np
import torch
from flwr.app import ArrayRecord, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp.strategy.bulyan import aggregate_n_closest_weights
from flwr.serverapp.strategy.fedtrimmedavg import trim_mean
from flwr.serverapp.strategy.multikrum import select_multikrum
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

AGGREGATORS = ("mean", "median", "trimmed-mean", "krum", "multi-krum", "bulyan")


@dataclass(frozen=True)
class Aggregation:
    """The rule and its parameters (run-config keys aggregator, aggregator-*)."""
    rule: str = "mean"
    byzantine: int = 0  # f: how many Byzantine models among a round's the rule tolerates
    select: int = 0  # Multi-Krum's m; 0 = n - f
    trim: float = 0.2  # the trimmed mean's cut of each tail


@dataclass
class Aggregate:
    """The round's aggregate, and which models it selected (Krum's rules; None: all count)."""
    state: dict[str, torch.Tensor]
    selected: list[int] | None = None


def mean(states: list[dict[str, torch.Tensor]], num_examples: list[int],
         template: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """sum_k n_k / sum_i n_i * theta_k, in float64, cast back to each tensor's dtype (integer
    buffers such as BatchNorm's num_batches_tracked stay integers)."""
    total = sum(num_examples)
    return {name: cast_like(sum(s[name].double() * (n / total)
                                for s, n in zip(states, num_examples)), ref)
            for name, ref in template.items()}


def mean_of_replies(contents: list[RecordDict], weighted_by_key: str) -> ArrayRecord:
    """FedAvg's average of the replies' models (the library's default `aggregate_fn`): `mean`
    in float64 over each reply's one ArrayRecord, weighted by its `weighted_by_key` metric.
    Flower's `aggregate_arrayrecords` sums in float32; the benchmarks' records were made
    with this mean."""
    states, weights = models_of(contents, weighted_by_key)
    return ArrayRecord(mean(states, weights, states[0]))


class Aggregator:
    """An `aggregate_fn` of the library's strategies by a rule of AGGREGATORS (`how`): the
    replies' models combined by `aggregate`, or None where the rule cannot combine this many
    (the global model then stays for the round). `selected`: the positions, among the last
    call's replies, of the models Krum's rules kept (None: every model counts)."""

    def __init__(self, how: Aggregation = Aggregation()):
        if how.rule not in AGGREGATORS:
            raise ValueError(f"aggregator is {how.rule!r}; allowed: {', '.join(AGGREGATORS)}")
        self.how, self.selected = how, None

    def __call__(self, contents: list[RecordDict], weighted_by_key: str) -> ArrayRecord | None:
        states, weights = models_of(contents, weighted_by_key)
        result = aggregate(states, weights, states[0], self.how)
        self.selected = result.selected if result is not None else None
        return ArrayRecord(result.state) if result is not None else None


def models_of(contents: list[RecordDict], weighted_by_key: str
              ) -> tuple[list[dict[str, torch.Tensor]], list[float]]:
    """Each reply's model (its one ArrayRecord) and averaging weight."""
    return ([next(iter(c.array_records.values())).to_torch_state_dict() for c in contents],
            [reply_weight(c, weighted_by_key) for c in contents])


def reply_weight(content: RecordDict, weighted_by_key: str) -> float:
    """A reply's averaging weight: its one MetricRecord's `weighted_by_key` (n_k; FedDisco's
    p_k)."""
    return next(iter(content.metric_records.values()))[weighted_by_key]


def cast_like(value: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    return (value if ref.is_floating_point() else value.round()).to(ref.dtype)


def aggregate(states: list[dict[str, torch.Tensor]], num_examples: list[int],
              template: dict[str, torch.Tensor], how: Aggregation = Aggregation()
              ) -> Aggregate | None:
    """The round's aggregate of these client models by `how`, or None (logged) when the rule
    cannot aggregate this many."""
    n, f = len(states), how.byzantine
    if how.rule == "mean":
        return Aggregate(mean(states, num_examples, template))
    if how.rule == "bulyan" and n < 4 * f + 3:
        log(WARNING, "aggregator bulyan needs at least 4f + 3 = %d models (f = %d), the round "
            "has %d", 4 * f + 3, f, n)
        return None
    # each model as the content of the reply it came in, the form Flower's rules take
    contents = [RecordDict({"arrays": ArrayRecord(OrderedDict(s)),
                            "metrics": MetricRecord({"num-examples": int(k)})})
                for s, k in zip(states, num_examples)]
    layers = lambda chosen: [np.stack(z) for z in zip(  # noqa: E731 - per tensor, [n, ...]
        *(c["arrays"].to_numpy_ndarrays() for c in chosen))]
    selected = None
    if how.rule in ("krum", "multi-krum", "bulyan"):
        m = {"krum": 1, "multi-krum": how.select or max(1, n - f), "bulyan": n - 2 * f}[how.rule]
        chosen = select_multikrum(contents, num_malicious_nodes=f, num_nodes_to_select=m)
        selected = sorted(next(i for i, c in enumerate(contents) if c is x) for x in chosen)
    if how.rule in ("krum", "multi-krum"):
        out = aggregate_arrayrecords(chosen, "num-examples").to_numpy_ndarrays()
    elif how.rule == "bulyan":  # as Flower's Bulyan.aggregate_train does after its selection
        stacked = layers(chosen)
        out = aggregate_n_closest_weights([np.median(x, axis=0) for x in stacked],
                                          [list(w) for w in zip(*stacked)], n - 4 * f)
    elif how.rule == "median":  # FedMedian
        out = [np.median(x, axis=0) for x in layers(contents)]
    else:  # trimmed-mean: FedTrimmedAvg
        out = [trim_mean(x, how.trim) for x in layers(contents)]
    return Aggregate({name: cast_like(torch.from_numpy(np.asarray(x)).double(), ref)
                      for (name, ref), x in zip(template.items(), out)}, selected)
