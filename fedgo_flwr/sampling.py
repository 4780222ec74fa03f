"""Reproducible client sampling: A_t, floor(C K) clients (at least `minimum`), drawn by the
run's seed and the round alone from clients known by a stable key, so that two runs with one
seed train the same clients each round whatever ids their nodes got. Flower's `FedAvg` draws
node ids with Python's unseeded `random.sample`.

A client's key is its node id unless the strategy is given `client_key`: a function of the
node id, or "partition-id", which asks each new node once (message type
`query.partition`, answered by `fedgo_flwr.client.register`) for the `partition-id` of its
`node_config`, as Flower's simulation and a SuperNode started with
`--node-config "partition-id=..."` have it."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable
from logging import WARNING

import torch
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

QUERY_PARTITION = "query.partition"  # the node's partition-id, asked once
PARTITION_ID = "partition-id"


def sample_clients(keys: Iterable, fraction: float, seed: int, server_round: int,
                   minimum: int = 2, absent: Iterable = ()) -> list:
    """A_t: floor(fraction * K) of the K `keys` (at least `minimum`), drawn by (seed, round)
    alone from those not `absent` (every one of those when fewer are left), sorted."""
    keys = sorted(keys)
    m = max(minimum, math.floor(fraction * len(keys)))
    skip = set(absent)
    present = [k for k in keys if k not in skip]
    rng = torch.Generator().manual_seed(seed * 100_003 + server_round)
    pick = torch.randperm(len(present), generator=rng)[:m]
    return sorted(present[i] for i in pick.tolist())


class ClientKeys:
    """node id -> the client's stable key: the node id itself, a function's answer, or the
    partition id each new node reports once ("partition-id")."""

    def __init__(self, client_key: Callable[[int], Hashable] | str | None = None):
        if isinstance(client_key, str) and client_key != PARTITION_ID:
            raise ValueError(f"client_key is {client_key!r}; allowed: None (the node id), "
                             f"{PARTITION_ID!r} or a function of the node id")
        self.client_key = client_key
        self.partitions: dict[int, int] = {}  # node id -> its reported partition id

    def keys(self, grid: Grid, nodes: Iterable[int], timeout: float = 60.0) -> dict[int, object]:
        """{node id: key} of these nodes (a node whose partition id cannot be had is left
        out, with the reason logged)."""
        nodes = list(nodes)
        if self.client_key is None:
            return {n: n for n in nodes}
        if callable(self.client_key):  # a node it gives no key (None) is left out
            return {n: k for n in nodes if (k := self.client_key(n)) is not None}
        new = [n for n in nodes if n not in self.partitions]
        if new:
            self.ask(grid, new, timeout)
        return {n: self.partitions[n] for n in nodes if n in self.partitions}

    def ask(self, grid: Grid, nodes: list[int], timeout: float) -> None:
        query = RecordDict({"config": ConfigRecord({})})
        replies = grid.send_and_receive(
            [Message(query, dst_node_id=n, message_type=QUERY_PARTITION) for n in nodes],
            timeout=timeout)
        taken = {}
        for reply in replies:
            node = reply.metadata.src_node_id
            metrics = None if reply.has_error() else reply.content.metric_records.get("metrics")
            value = None if metrics is None else metrics.get(PARTITION_ID)
            if not isinstance(value, int) or value < 0:
                why = reply.error.reason if reply.has_error() else f"partition-id {value!r}"
                log(WARNING, "node %d left out of sampling: no partition id (%s)", node, why)
            elif value in taken.values() or value in self.partitions.values():
                log(WARNING, "node %d reports partition %d, which another node has: left out",
                    node, value)
            else:
                taken[node] = value
        self.partitions.update(taken)


def partition_reply(message: Message, node_config) -> Message:
    """The client's answer to `query.partition`: its node_config's partition-id."""
    return Message(RecordDict({"metrics": MetricRecord(
        {PARTITION_ID: int(node_config[PARTITION_ID])})}), reply_to=message)
