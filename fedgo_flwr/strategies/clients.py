"""Who the clients are (partition id -> node id, n_k), and what a well-formed reply is.

Flower node ids are random; everything the server decides (sampling, weights, records) is
keyed by the partition id that each node reports, so one seed reproduces a run.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.constant import ErrorCode
from flwr.common.logger import log
from flwr.serverapp import Grid
from logging import INFO, WARNING

QUERY_INFO = "query"
# Error replies the SuperLink makes itself (the node went away, or the message expired): the
# node did not answer, nothing is known about its partition.
NO_ANSWER = frozenset({ErrorCode.NODE_UNAVAILABLE, ErrorCode.MESSAGE_UNAVAILABLE,
                       ErrorCode.REPLY_MESSAGE_UNAVAILABLE})


@dataclass(frozen=True)
class Client:
    partition_id: int
    node_id: int
    num_examples: int
    label_histogram: tuple[int, ...] | None = None  # sent only for diagnostics


class ClientDirectory:
    def __init__(self, clients: list[Client], num_partitions: int):
        self.by_partition = {c.partition_id: c for c in sorted(clients, key=lambda c: c.partition_id)}
        self.num_partitions = num_partitions

    def __len__(self) -> int:
        return len(self.by_partition)

    @property
    def partition_ids(self) -> list[int]:
        return list(self.by_partition)

    def label_histograms(self, partition_ids: list[int]) -> torch.Tensor | None:
        """[K, C] label counts of these partitions, or None unless every one reported them."""
        hists = [self.by_partition[p].label_histogram for p in partition_ids]
        if not hists or any(h is None for h in hists):
            return None
        return torch.tensor(hists, dtype=torch.long)

    def partition_of(self, node_id: int) -> int | None:
        for c in self.by_partition.values():
            if c.node_id == node_id:
                return c.partition_id
        return None


def discover_clients(mailbox: Mailbox, timeout: float, poll: float = 2.0,
                     label_histograms: bool = False,
                     require_all: bool = True) -> ClientDirectory:
    """Ask every connected node for its partition id, partition count and n_k (and, for the
    diagnostics alone, its label histogram), until all partitions 0..K-1 have answered
    (deployment nodes may connect late) or `timeout` passes; then, unless `require_all`,
    go on with the partitions that answered. A node that goes away after it is listed is
    one that did not answer."""
    grid = mailbox.grid
    deadline = time.monotonic() + timeout
    clients: dict[int, Client] = {}
    asked: set[int] = set()
    num_partitions: int | None = None
    while True:
        new = [n for n in grid.get_node_ids() if n not in asked]
        asked.update(new)
        failed = {}
        for node, answer in query_nodes(mailbox, new, max(deadline - time.monotonic(), 1.0),
                                        label_histograms).items():
            if isinstance(answer, str):
                failed[node] = answer
                continue
            pid, k, n, hist = answer
            if num_partitions is None:
                num_partitions = k
            if k != num_partitions:
                raise RuntimeError(f"nodes disagree on num-partitions ({k} vs {num_partitions})")
            if pid in clients:
                raise RuntimeError(f"partition-id {pid} is claimed by nodes "
                                   f"{clients[pid].node_id} and {node}: fix --node-config")
            clients[pid] = Client(pid, node, n, hist)
        if failed:
            # Loading a partition is deterministic: a node that failed once is not asked again,
            # so waiting for it would only run into the timeout.
            node, reason = next(iter(failed.items()))
            raise RuntimeError(f"{len(failed)} node(s) could not load their partition, e.g. "
                               f"node {node}: {reason}")
        if num_partitions is not None and len(clients) == num_partitions:
            break
        if time.monotonic() > deadline:
            missing = sorted(set(range(num_partitions or 0)) - set(clients))
            what = (f"partitions {missing} of {num_partitions} did not answer within "
                    f"{timeout:.0f}s (join-timeout)" if clients else
                    f"no node answered within {timeout:.0f}s (join-timeout); nodes connected: "
                    f"{len(asked)}")
            if require_all or not clients:
                raise TimeoutError(what + ("; require-all-clients = true" if clients else ""))
            log(WARNING, "%s; going on with the %d that did", what, len(clients))
            break
        time.sleep(poll)
    log(INFO, "%d clients: n_k = %s", len(clients), [c.num_examples for c in clients.values()])
    return ClientDirectory(list(clients.values()), num_partitions)


def query_nodes(mailbox: Mailbox, nodes: list[int], timeout: float,
                label_histograms: bool = False
                ) -> dict[int, tuple[int, int, int, tuple[int, ...] | None] | str]:
    """node id -> (partition id, num-partitions, n_k, label histogram or None) for each node
    that answered the query in time, or the reason its answer is unusable (its ClientApp
    failed, or the reply is malformed). Nodes that did not answer are left out."""
    ask = RecordDict({"config": config_record(label_histogram=label_histograms)})
    msgs = [Message(ask, dst_node_id=n, message_type=QUERY_INFO) for n in nodes]
    answers: dict[int, tuple | str] = {}
    for reply in (mailbox.send_and_receive(msgs, timeout=timeout) if msgs else []):
        node = mailbox.node_of(reply)
        if reply.has_error():
            if reply.error.code not in NO_ANSWER:
                answers[node] = reply.error.reason
            continue
        info = reply.content.metric_records.get("info")
        try:
            pid, k, n = (int(info[key]) for key in ("partition-id", "num-partitions", "num-examples"))
            hist = tuple(int(c) for c in info["label-histogram"]) if label_histograms else None
        except (TypeError, KeyError, ValueError):
            answers[node] = f"malformed info reply {info}"
            continue
        answers[node] = (pid, k, n, hist)
    return answers


class Mailbox:
    """Grid.send_and_receive that attributes each reply to the node it answers for and, for
    a round, keeps the ids of the messages its wait left unanswered, so a reply that arrives
    after its round's wait ended is still seen, as late, when the next round starts (and never
    used)."""

    def __init__(self, grid: Grid, poll: float = 1.0):
        self.grid, self.poll = grid, poll
        self.pending: dict[str, tuple[int, int]] = {}  # message id -> (node id, round)
        self.destination: dict[str, int] = {}  # message id -> node, of the last wait's messages

    def node_of(self, reply: Message) -> int:
        """The node a reply answers for: an error reply the SuperLink makes for a node that
        went offline comes from the SuperLink itself."""
        return self.destination.get(reply.metadata.reply_to_message_id,
                                    reply.metadata.src_node_id)

    def send_and_receive(self, messages: list[Message], timeout: float,
                         server_round: int | None = None) -> list[Message]:
        messages = list(messages)
        waiting = dict(zip(self.grid.push_messages(messages), (m.metadata.dst_node_id
                                                                 for m in messages)))
        self.destination = dict(waiting)  # its replies are attributed before the next wait
        deadline, replies = time.monotonic() + timeout, []
        while waiting:
            got = list(self.grid.pull_messages(list(waiting)))
            for reply in got:
                waiting.pop(reply.metadata.reply_to_message_id, None)
            replies += got
            if not waiting or time.monotonic() >= deadline:
                break
            time.sleep(self.poll)
        if server_round is not None:
            self.pending.update({mid: (node, server_round) for mid, node in waiting.items()})
        return replies

    def late_replies(self) -> list[tuple[int, int]]:
        """(node id, round) of each reply that came after its wait ended, since last asked."""
        if not self.pending:
            return []
        late = []
        for reply in self.grid.pull_messages(list(self.pending)):
            sent = self.pending.pop(reply.metadata.reply_to_message_id, None)
            if sent is not None and not reply.has_error():
                late.append(sent)
        return late


def sample_partitions(partition_ids: list[int], fraction: float, seed: int,
                      server_round: int, absent: frozenset[int] = frozenset()) -> list[int]:
    """A_t: floor(C * K) partitions (at least one), drawn by (seed, round) alone from those
    not `absent` (all of them but the absent ones when fewer are left)."""
    m = max(1, math.floor(fraction * len(partition_ids)))
    present = [p for p in partition_ids if p not in absent]
    rng = torch.Generator().manual_seed(seed * 100_003 + server_round)
    pick = torch.randperm(len(present), generator=rng)[:m]
    return sorted(present[i] for i in pick.tolist())


def reply_problem(reply: Message, array_key: str, template: dict[str, torch.Tensor]) -> str | None:
    """Why a train reply cannot be used, or None: it must carry `array_key` with exactly the
    template's tensor names and shapes, all finite, and metrics with num-examples > 0."""
    if reply.has_error():
        return f"error reply: {reply.error.reason}"
    why = arrays_problem(reply, array_key, template)
    if why:
        return why
    metrics = reply.content.metric_records.get("metrics")
    n = metrics.get("num-examples") if isinstance(metrics, MetricRecord) else None
    if not isinstance(n, (int, float)) or not n > 0:
        return f"num-examples missing or not positive ({n!r})"
    return None


def arrays_problem(reply: Message, array_key: str,
                   template: dict[str, torch.Tensor]) -> str | None:
    """Why the reply's ArrayRecord `array_key` does not fit `template` (names, shapes, finite
    values), or None."""
    arrays = reply.content.array_records.get(array_key)
    if not isinstance(arrays, ArrayRecord):
        return f"no ArrayRecord '{array_key}'"
    if set(arrays) != set(template):
        return (f"'{array_key}': tensor names differ from the model's "
                f"({sorted(set(arrays) ^ set(template))[:3]}...)")
    for name, ref in template.items():
        if tuple(arrays[name].shape) != tuple(ref.shape):
            return f"tensor '{name}' has shape {arrays[name].shape}, expected {tuple(ref.shape)}"
        if ref.is_floating_point() and not torch.isfinite(torch.from_numpy(arrays[name].numpy())).all():
            return f"tensor '{name}' has non-finite values"
    return None


def payload_bytes(contents: list[Message | RecordDict]) -> int:
    """Bytes of every ArrayRecord in these messages (error replies carry none) or contents;
    replies are counted as they arrived, before any is checked."""
    total = 0
    for item in contents:
        if isinstance(item, Message):
            if item.has_error():
                continue
            item = item.content
        total += sum(a.count_bytes() for a in item.array_records.values())
    return total


def round_seed(seed: int, server_round: int) -> int:
    """The seed of one round's client training and distillation batches."""
    return seed * 1_000 + server_round


def client_seed(stage_seed: int, partition_id: int) -> int:
    """The server's seed for a stage or round, made distinct per client."""
    return stage_seed * 1_000 + partition_id


def config_record(**values) -> ConfigRecord:
    return ConfigRecord({k.replace("_", "-"): v for k, v in values.items()})
