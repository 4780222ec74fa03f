"""What a round of the library's strategies is made of, for the server update and the
observers: each usable client model (`ClientModel`) and the whole round (`RoundReport`); and
the count of rounds without a usable reply (`FailedRounds`, `max_failed_rounds`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from logging import WARNING

import torch
from flwr.app import ArrayRecord, RecordDict
from flwr.common.logger import log

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


class FailedRounds:
    """Rounds in a row whose replies were all unusable (`max_failed_rounds`): the first
    reason logged, and raised after `limit` of them (None: never), so that a run that cannot
    learn does not end with empty metrics."""

    def __init__(self, limit: int | None = 3):
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise ValueError(f"max_failed_rounds is {limit!r}; allowed: >= 1 or None")
        self.limit, self.in_a_row = limit, 0

    def count(self, server_round: int, replies: int, usable: int, left_out: dict) -> None:
        """After a round of `replies` replies, `usable` of them usable (`left_out`: why
        each other was left out)."""
        if usable:
            self.in_a_row = 0
        if usable or not replies:  # a round that reached no client says nothing of them
            return
        self.in_a_row += 1
        first = next(iter(left_out.values()))
        log(WARNING, "round %d: none of the %d replies is usable (%d such round(s) in a "
            "row); the first: %s", server_round, replies, self.in_a_row, first)
        if self.limit and self.in_a_row >= self.limit:
            raise RuntimeError(f"{self.in_a_row} rounds in a row without a usable client "
                               f"reply (max_failed_rounds); the first of round {server_round}: "
                               f"{first}")
