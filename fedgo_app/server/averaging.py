"""The round's average theta_s^t: each architecture's usable models combined by the run's
aggregator (fedgo_flwr.aggregation: the n_k mean or a robust rule), after the simulated
colluding clients replace their models (fedgo_app.attacks)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from logging import WARNING

import torch
from flwr.common.logger import log

from fedgo_app.attacks import COLLUDING, colluded
from fedgo_app.server.architectures import Architectures
from fedgo_app.server.record import RunRecord
from fedgo_flwr.aggregation import aggregate, mean


@dataclass
class PartitionModel:
    """theta_k^t of one client in this round, known by its partition id (the library's
    `ClientModel` knows it by node id and key)."""
    partition_id: int
    num_examples: int
    state: dict[str, torch.Tensor]
    metrics: dict
    extras: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)  # other arrays sent


def weighted_average(models: list[PartitionModel], template: dict[str, torch.Tensor]) -> dict:
    """theta_s^t = sum_k n_k / sum_i n_i * theta_k^t (aggregation.mean)."""
    return mean([m.state for m in models], [m.num_examples for m in models], template)


class Averaging:
    """Averages a round's models architecture by architecture."""

    def __init__(self, cfg, record: RunRecord, architectures: Architectures):
        self.cfg, self.record, self.architectures = cfg, record, architectures

    def liars(self) -> set[int]:
        return set(self.record.data["clients"]["byzantine"]["partitions"])

    def colluded(self, group: list[PartitionModel], previous: dict) -> list[PartitionModel]:
        """The group with the colluders' models as they would send them (the simulation
        stands in for the colluders, who know the honest models and theta_g)."""
        if self.cfg.attack not in COLLUDING:
            return group
        liars = self.liars()
        states = colluded(self.cfg.attack, self.cfg.attack_scale, [m.state for m in group],
                          [m.partition_id in liars for m in group], previous)
        return [replace(m, state=s) for m, s in zip(group, states)]

    def __call__(self, server_round: int, models: list[PartitionModel], previous: dict[str, dict],
                 templates: dict[str, dict]) -> tuple[dict[str, dict] | None, list[PartitionModel]]:
        """({architecture: its average} or None when the round changes nothing, the models as
        aggregated); an architecture without a usable average keeps its previous model."""
        averaged, used = {}, {}
        entry = self.record.round(server_round)
        aggregation = entry.get("aggregation", {})
        for a in self.architectures.names:
            group = self.colluded([m for m in models if self.architectures.of(m.partition_id)
                                   == a], previous[a])
            used.update((m.partition_id, m) for m in group)
            result = aggregate([m.state for m in group], [m.num_examples for m in group],
                               templates[a], self.cfg.aggregation) if group else None
            if result is None:
                self.kept_previous(server_round, a, len(group), aggregation)
                entry["aggregation"] = aggregation
                if not self.architectures.heterogeneous:
                    return None, models
                averaged[a] = previous[a]
                continue
            if result.selected is not None:  # who Krum's rules kept
                aggregation.setdefault("selected", []).extend(
                    group[i].partition_id for i in result.selected)
                entry["aggregation"] = aggregation
            averaged[a] = result.state
        return averaged, [used.get(m.partition_id, m) for m in models]

    def kept_previous(self, server_round: int, architecture: str, usable: int,
                      aggregation: dict) -> None:
        why = (f"{usable} usable models are too few for aggregator {self.cfg.aggregator}"
               if usable else "no usable model")
        log(WARNING, "round %d: %s%s; its global model is unchanged", server_round, why,
            f" of {architecture}" if self.architectures.heterogeneous else "")
        aggregation.setdefault("kept_previous", []).append(architecture)

