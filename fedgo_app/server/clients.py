"""The server's view of its clients: who they are (partition id -> node id, n_k), how it
finds them before the first round, and which of them a round samples.

Flower node ids are random; everything the server decides (sampling, weights, records) is
keyed by the partition id that each node reports, so one seed reproduces a run.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from logging import INFO, WARNING

import torch
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.logger import log

from fedgo_app.server.mailbox import NO_ANSWER, Mailbox
from fedgo_flwr.replies import examples_problem

QUERY_INFO = "query"
# A round trains at least two clients (as Flower's own strategies do, min_train_nodes = 2):
# with Flower's default federation of 2 SuperNodes, C = 0.4 would otherwise train one, and an
# ensemble of one model is no ensemble.
MIN_CLIENTS = 2


@dataclass(frozen=True)
class Client:
    partition_id: int
    node_id: int
    num_examples: int
    label_histogram: tuple[int, ...] | None = None  # sent only for diagnostics
    model: str = ""  # its architecture, as it reports it


class ClientDirectory:
    def __init__(self, clients: list[Client], num_partitions: int,
                 refused: dict[str, str] | None = None):
        self.by_partition = {c.partition_id: c for c in sorted(clients, key=lambda c: c.partition_id)}
        self.num_partitions = num_partitions
        self.refused = refused or {}  # partition id -> why it is left out (its classes)
        # the median n_k at discovery: sample-size-cap's reference (robust while fewer than
        # half the clients inflate theirs)
        self.median_examples = statistics.median(
            c.num_examples for c in self.by_partition.values()) if clients else 0

    def __len__(self) -> int:
        return len(self.by_partition)

    @property
    def partition_ids(self) -> list[int]:
        return list(self.by_partition)

    @property
    def missing(self) -> list[int]:
        """The partitions no node answered for (a refused partition answered)."""
        return unanswered(self.num_partitions, self.by_partition, self.refused)

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


def classes_problem(node_classes: tuple[str, ...] | None,
                    server_classes: tuple[str, ...]) -> str | None:
    """Why a node's class names rule it out, or None: they must be the server's, in order
    (labels are indices into that list)."""
    if not server_classes or node_classes is None or tuple(node_classes) == server_classes:
        return None
    return (f"its classes [{', '.join(node_classes)}] are not the server's "
            f"[{', '.join(server_classes)}]")


def discover_clients(mailbox: Mailbox, timeout: float, poll: float = 2.0,
                     label_histograms: bool = False, require_all: bool = True,
                     classes: tuple[str, ...] = (), reply_timeout: float = 0.0
                     ) -> ClientDirectory:
    """Ask every connected node for its partition id, partition count, n_k and class names
    (and, for the diagnostics alone, its label histogram), until all partitions 0..K-1 have
    answered (deployment nodes may connect late) or `timeout` passes; then, unless
    `require_all`, go on with the partitions that answered. A node that is connected and asked
    has at least `reply_timeout` (a round's wait) to answer: on a busy machine its ClientApp
    may take longer to start than the join-timeout, and it is not a node that never came. A
    node whose classes are not the server's `classes` fails the run under `require_all`, else
    it is left out (`refused`). A node that goes away after it is listed is one that did not
    answer."""
    grid = mailbox.grid
    deadline = time.monotonic() + timeout
    clients: dict[int, Client] = {}
    refused: dict[str, str] = {}
    asked: set[int] = set()
    num_partitions: int | None = None
    while True:
        new = [n for n in grid.get_node_ids() if n not in asked]
        asked.update(new)
        failed = {}
        answers = query_nodes(mailbox, new,
                              max(deadline - time.monotonic(), reply_timeout, 1.0),
                              label_histograms)
        if num_partitions is None:  # the federation's K: what most nodes say
            ks = [a[1] for a in answers.values() if not isinstance(a, str)]
            num_partitions = max(set(ks), key=ks.count) if ks else None
        for node, answer in answers.items():
            if isinstance(answer, str) and not isinstance(answer, Malformed):
                failed[node] = answer
            elif client := admitted(node, answer, clients, num_partitions, classes,
                                    require_all, refused):
                clients[client.partition_id] = client
        if failed:
            # Loading a partition is deterministic: a node that failed once is not asked again,
            # so waiting for it would only run into the timeout.
            node, reason = next(iter(failed.items()))
            raise RuntimeError(f"{len(failed)} node(s) could not load their partition, e.g. "
                               f"node {node}: {reason}")
        if num_partitions is not None and len(clients) + len(refused) >= num_partitions:
            break
        if time.monotonic() > deadline:
            gave_up(timeout, num_partitions, clients, refused, len(asked), require_all)
            break
        time.sleep(poll)
    log(INFO, "%d clients, n_k by partition id: %s", len(clients),
        ", ".join(f"{p}: {clients[p].num_examples}" for p in sorted(clients)))
    return ClientDirectory(list(clients.values()), num_partitions, refused)


def admitted(node: int, answer, clients: dict[int, Client], num_partitions: int | None,
             classes: tuple[str, ...], require_all: bool, refused: dict[str, str]
             ) -> Client | None:
    """The client a node's answer makes, or None when the node is misconfigured or lying
    (a malformed reply, another K, a partition already claimed, other classes): logged and
    kept in `refused`, or under `require_all` the run fails saying what to fix."""
    why = answer if isinstance(answer, Malformed) else None
    if why is None and answer[1] != num_partitions:
        why = f"num-partitions {answer[1]}, the other nodes say {num_partitions}"
    if why is None and answer[0] in clients:
        why = (f"partition-id {answer[0]} is claimed by nodes "
               f"{clients[answer[0]].node_id} and {node}")
    if why:
        if require_all:
            raise RuntimeError(f"node {node}: {why}: fix --node-config, or set "
                               "require-all-clients = false to leave it out")
        log(WARNING, "node %d is left out: %s", node, why)
        refused[f"node {node}"] = str(why)
        return None
    pid, k, n, hist, names, model = answer
    if why := classes_problem(names, classes):
        if require_all:
            raise RuntimeError(f"node {node} (partition {pid}): {why}; give every "
                               "node the server's class folders, or set "
                               "require-all-clients = false to leave it out")
        log(WARNING, "node %d (partition %d) is left out: %s", node, pid, why)
        refused[str(pid)] = why
        return None
    return Client(pid, node, n, hist, model)


def gave_up(timeout: float, num_partitions: int | None, clients: dict[int, Client],
            refused: dict[str, str], connected: int, require_all: bool) -> None:
    """The join-timeout passed: fail under `require_all` (or with no client), else say who
    is missing and go on."""
    missing = unanswered(num_partitions or 0, clients, refused)
    what = (f"partitions {missing} of {num_partitions} did not answer within "
            f"{timeout:.0f}s (join-timeout)" if clients else
            f"no node answered within {timeout:.0f}s (join-timeout); nodes connected: "
            f"{connected}")
    if require_all or not clients:
        raise TimeoutError(what + ("; require-all-clients = true" if clients else ""))
    log(WARNING, "%s; going on with the %d that did", what, len(clients))


def unanswered(num_partitions: int, clients, refused: dict[str, str]) -> list[int]:
    """Partitions 0..K-1 neither among the clients nor refused (refused by partition id)."""
    return sorted(set(range(num_partitions)) - set(clients)
                  - {int(k) for k in refused if k.isdigit()})


class Malformed(str):
    """Why a node's info reply is unusable when the reply itself is malformed (the node is
    left out), as opposed to an error reply (its ClientApp failed: the run stops)."""


def query_nodes(mailbox: Mailbox, nodes: list[int], timeout: float,
                label_histograms: bool = False
                ) -> dict[int, tuple | str]:
    """node id -> (partition id, num-partitions, n_k, label histogram or None, class names
    or None, architecture or "") for each node
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
            values = [info[key] for key in ("partition-id", "num-partitions", "num-examples")]
            why = examples_problem(info, "num-examples") or next(
                (f"{v!r} is not a whole number" for v in values if not float(v).is_integer()),
                None)
            pid, k, n = map(int, values)
            hist = tuple(int(c) for c in info["label-histogram"]) if label_histograms else None
            why = why or (None if 0 <= pid < k else f"partition-id {pid} not in 0..{k - 1}")
        except (TypeError, KeyError, ValueError, OverflowError) as err:
            why = f"{type(err).__name__}: {err}"
        if why:
            answers[node] = Malformed(f"malformed info reply ({why})")
            continue
        names = reply.content.config_records.get("classes")
        model = reply.content.config_records.get("model")
        answers[node] = (pid, k, n, hist, tuple(names["names"]) if names else None,
                         str(model["name"]) if model else "")
    return answers


def config_record(**values) -> ConfigRecord:
    return ConfigRecord({k.replace("_", "-"): v for k, v in values.items()})
