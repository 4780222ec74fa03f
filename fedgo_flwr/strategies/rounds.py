"""What a round of the library's strategies is made of, for the server update and the
observers: each usable client model (`ClientModel`) and the whole round (`RoundReport`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from flwr.app import ArrayRecord, RecordDict

from fedgo_flwr.aggregation import reply_weight
from fedgo_flwr.replies import FAILED  # noqa: F401 (the round's reasons, with the round)


@dataclass
class ClientModel:
    """theta_k^t of one usable train reply: its node, n_k, the model and the metrics FedAvg
    averages (`content`), every metric it sent, the other arrays the strategy asked for
    (DaFKD's discriminator head and generator) and the client's stable key (`client_key`;
    the node id by default)."""
    node_id: int
    num_examples: int
    content: RecordDict
    metrics: dict = field(default_factory=dict)
    extras: dict[str, ArrayRecord] = field(default_factory=dict)
    key: object = None

    @property
    def state(self) -> dict[str, torch.Tensor]:
        return next(iter(self.content.array_records.values())).to_torch_state_dict()

    def weight(self, weighted_by_key: str) -> float:
        """The weight the model is averaged with (n_k; FedDisco's p_k)."""
        return reply_weight(self.content, weighted_by_key)


@dataclass
class RoundReport:
    """What one round computed, for the strategy's `observers` (records, diagnostics): the
    clients sampled (node id -> key), the usable models (in key order) and why each other
    reply was left out, the average and the new global model (None: the round changed
    nothing), the round's metrics, and what the server update adds (`details`: the ensemble
    strategies' teachers, weighting rule, pseudo-labels, candidates and the guard's choice),
    seconds by stage and bytes each way."""
    server_round: int
    sampled: dict[int, object]
    clients: list[ClientModel]
    left_out: dict[int, str]
    averaged: ArrayRecord | None
    arrays: ArrayRecord | None
    metrics: dict
    details: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)
    bytes: dict = field(default_factory=dict)
