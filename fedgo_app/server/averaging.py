"""The round's average theta_s^t: each architecture's usable models combined by the run's
aggregator (fedgo_flwr.aggregation: the n_k mean or a robust rule), after the simulated
colluding clients replace their models (fedgo_app.attacks)."""

from __future__ import annotations

from dataclasses import replace
from logging import WARNING

import torch
from flwr.app import ArrayRecord, RecordDict
from flwr.common.logger import log

from fedgo_app.attacks import COLLUDING, colluded
from fedgo_app.server.architectures import Architectures
from fedgo_app.server.record import RunRecord
from fedgo_flwr.aggregation import aggregate
from fedgo_flwr.strategies.rounds import ClientModel


def with_state(model: ClientModel, state: dict[str, torch.Tensor]) -> ClientModel:
    """`model` carrying other arrays (its metrics as they were)."""
    (key, _), = model.content.array_records.items()
    return replace(model, content=RecordDict({key: ArrayRecord(state),
                                              **model.content.metric_records}))


class Averaging:
    """Averages a round's models architecture by architecture."""

    def __init__(self, cfg, record: RunRecord, architectures: Architectures):
        self.cfg, self.record, self.architectures = cfg, record, architectures

    def liars(self) -> set[int]:
        return set(self.record.data["clients"]["byzantine"]["partitions"])

    def colluded(self, models: list[ClientModel], previous: dict[str, dict]
                 ) -> list[ClientModel]:
        """The round's models with the colluders' as they would send them (the simulation
        stands in for the colluders, who know the honest models of their architecture and
        its theta_g)."""
        if self.cfg.attack not in COLLUDING:
            return models
        liars, by_key = self.liars(), {}
        for a in self.architectures.names:
            group = [m for m in models if self.architectures.of(m.key) == a]
            states = colluded(self.cfg.attack, self.cfg.attack_scale, [m.state for m in group],
                              [m.key in liars for m in group], previous[a])
            by_key.update((m.key, with_state(m, s)) for m, s in zip(group, states))
        return [by_key[m.key] for m in models]

    def __call__(self, server_round: int, models: list[ClientModel], weighted_by_key: str,
                 previous: dict[str, dict], templates: dict[str, dict]
                 ) -> dict[str, dict] | None:
        """{architecture: its average} (each weighted by the reply's `weighted_by_key`), or
        None when the round changes nothing; an architecture without a usable average keeps
        its previous model."""
        averaged = {}
        entry = self.record.round(server_round)
        aggregation = entry.get("aggregation", {})
        for a in self.architectures.names:
            group = [m for m in models if self.architectures.of(m.key) == a]
            weights = [m.weight(weighted_by_key) for m in group]
            result = aggregate([m.state for m in group], weights, templates[a],
                               self.cfg.aggregation) if group else None
            if result is None:
                self.kept_previous(server_round, a, len(group), aggregation)
                entry["aggregation"] = aggregation
                if not self.architectures.heterogeneous:
                    return None
                averaged[a] = previous[a]
                continue
            if result.selected is not None:  # who Krum's rules kept
                aggregation.setdefault("selected", []).extend(
                    group[i].key for i in result.selected)
                entry["aggregation"] = aggregation
            averaged[a] = result.state
        return averaged

    def kept_previous(self, server_round: int, architecture: str, usable: int,
                      aggregation: dict) -> None:
        why = (f"{usable} usable models are too few for aggregator {self.cfg.aggregator}"
               if usable else "no usable model")
        log(WARNING, "round %d: %s%s; its global model is unchanged", server_round, why,
            f" of {architecture}" if self.architectures.heterogeneous else "")
        aggregation.setdefault("kept_previous", []).append(architecture)
