"""Who takes part, round by round: the clients found before the first round, the partitions
absent from sampling after they miss a round, and their return (a late reply, or a node that
answers a query for their partition id); messages go through the run's mailbox, each reply
logged by partition as it comes."""

from __future__ import annotations

from logging import INFO, WARNING
from typing import Iterable

from flwr.app import Message
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedgo_app.attacks import byzantine_partitions
from fedgo_app.server.clients import (Client, ClientDirectory, classes_problem, discover_clients,
                                      query_nodes)
from fedgo_app.server.mailbox import Mailbox
from fedgo_app.server.record import RunRecord
from fedgo_app.server.setup import ServerSetup
from fedgo_flwr.keys import ConfigError

# How long a round's start waits for absent or newly connected nodes to answer a query.
PROBE_SECONDS = 10.0


class Membership:
    """The run's clients (`clients`, by partition id), the absent ones and the mailbox."""

    def __init__(self, setup: ServerSetup, record: RunRecord):
        self.setup, self.cfg, self.record = setup, setup.cfg, record
        self.clients: ClientDirectory | None = None
        self.mailbox: Mailbox | None = None
        self.absent: set[int] = set()  # partitions that missed their last round
        self.label_counts = False  # ask nodes for their label histograms

    def discover(self, grid: Grid, label_counts: bool) -> ClientDirectory:
        """Learn the clients (partition id, node id, n_k) before the first round; the record
        says who answered, who was refused and, under an attack, who lies."""
        cfg, self.label_counts = self.cfg, label_counts
        self.mailbox = Mailbox(grid)
        self.clients = discover_clients(self.mailbox, timeout=cfg.join_timeout,
                                        reply_timeout=cfg.round_timeout,
                                        label_histograms=label_counts,
                                        require_all=cfg.require_all_clients,
                                        classes=self.setup.classes)
        self.record.data["clients"] = {
            "num_partitions": self.clients.num_partitions,
            "num_examples": {str(p): c.num_examples for p, c in self.clients.by_partition.items()},
            "missing_at_start": self.clients.missing,
            "refused": self.clients.refused,
        }
        if cfg.attack != "none":  # the run's liars (their own clients know it too)
            try:
                liars = byzantine_partitions(cfg.byzantine_clients, cfg.byzantine_partitions,
                                             self.clients.num_partitions, cfg.seed)
            except ValueError as err:
                raise ConfigError(f"run-config key {err}") from None
            self.record.data["clients"]["byzantine"] = {"attack": cfg.attack,
                                                        "scale": cfg.attack_scale,
                                                        "partitions": liars}
            log(WARNING, "Byzantine clients: partitions %s (attack %s)", liars, cfg.attack)
        if label_counts:
            self.record.data["clients"]["label_histograms"] = {
                str(p): list(c.label_histogram) for p, c in self.clients.by_partition.items()}
        return self.clients

    def present(self) -> dict[int, int]:
        """node id -> partition id of every client not absent."""
        return {self.clients.by_partition[p].node_id: p for p in self.clients.partition_ids
                if p not in self.absent}

    def exchange(self, messages: Iterable[Message], expected: dict[int, int], what: str,
                 server_round: int) -> list[Message]:
        """Send and wait up to round-timeout, logging each reply by partition id as it comes
        (`expected`: node id -> partition id)."""
        count = 0

        def arrived(reply: Message) -> None:
            nonlocal count
            count += 1
            pid = expected.get(self.mailbox.node_of(reply), "?")
            log(INFO, "%s: partition %s %s (%d/%d)", what, pid,
                "failed" if reply.has_error() else "done", count, len(expected))

        return self.mailbox.send_and_receive(messages, timeout=self.cfg.round_timeout,
                                             server_round=server_round, arrived=arrived)

    def refresh(self, grid: Grid, server_round: int, architectures: list[str]) -> None:
        """Before sampling: count the replies that came after their round's wait (a round's
        model is not used once its round is over; FedGO's late discriminators are the
        library's to take), and take back partitions that answer again. A partition is absent
        from sampling after it misses a round; it rejoins when a late reply of it arrives, or
        when its node, or a new node reporting its partition id, answers a query running one
        of the run's `architectures`."""
        for node, late_round, _ in self.mailbox.late_replies():
            pid = self.clients.partition_of(node)
            if pid is None:
                continue
            self.record.round(late_round).setdefault("replies", {}).setdefault(
                "late", []).append(pid)
            log(INFO, "late reply of partition %d (round %d): counted, not used", pid,
                late_round)
            self.rejoin(pid, server_round)
        known = {c.node_id for c in self.clients.by_partition.values()}
        probe = sorted(n for n in grid.get_node_ids() if n not in known
                       or self.clients.partition_of(n) in self.absent)
        if probe:
            for node, answer in query_nodes(self.mailbox, probe, PROBE_SECONDS,
                                            self.label_counts).items():
                self.answered(node, answer, server_round, architectures)

    def answered(self, node: int, answer, server_round: int, architectures: list[str]) -> None:
        """A probed node's answer: it takes its partition back if it fits the run (a rejoin
        cannot raise n_k nor change the partition's architecture)."""
        if (isinstance(answer, str) or answer[1] != self.clients.num_partitions
                or classes_problem(answer[4], self.setup.classes)):
            return
        pid, _, n, _, _, model = answer
        old = self.clients.by_partition.get(pid)
        if (old and model != old.model) or (model or self.cfg.model) not in architectures:
            log(WARNING, "node %d answers for partition %d with architecture %r, not the "
                "one it had or one of the run's (%s): left out", node, pid, model,
                ", ".join(architectures))
            return
        self.clients.by_partition[pid] = Client(pid, node, min(n, old.num_examples) if old
                                                else n, old and old.label_histogram, model)
        self.rejoin(pid, server_round)

    def rejoin(self, pid: int, server_round: int) -> None:
        if pid in self.absent:
            self.absent.discard(pid)
            log(INFO, "round %d: partition %d answers again and rejoins sampling", server_round,
                pid)
        elif str(pid) not in self.record.data["clients"]["num_examples"]:
            log(INFO, "round %d: partition %d joins", server_round, pid)
        self.record.data["clients"]["num_examples"][str(pid)] = \
            self.clients.by_partition[pid].num_examples

    def sample_size(self, pid: int, reported: int) -> int:
        """n_k as a weight: never more than the partition reported at discovery (a reply
        cannot raise it round by round), and with `sample-size-cap` c > 0 at most c times the
        median n_k found at discovery."""
        known = self.clients.by_partition[pid].num_examples
        n = min(reported, known)
        if reported > known:
            log(WARNING, "partition %d reports n_k = %d, more than the %d it reported at "
                "discovery; weighted by %d", pid, reported, known, n)
        cap = self.cfg.sample_size_cap
        return min(n, max(1, int(cap * self.clients.median_examples))) if cap > 0 else n


class RoundGrid:
    """The grid Flower's `start` sends through: the strategy's mailbox, each reply logged by
    partition as it comes, and replies that miss their wait kept for the next round."""

    def __init__(self, strategy):
        """`strategy`: the app's FedAvgStrategy (its membership, round and exchange)."""
        self.strategy = strategy

    def get_node_ids(self) -> list[int]:
        return list(self.strategy.mailbox.grid.get_node_ids())

    # What the library's FedGO pushes and pulls itself (its pre-FL stage and late D_k).
    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        return list(self.strategy.mailbox.grid.push_messages(messages))

    def pull_messages(self, message_ids: list[str]) -> list[Message]:
        return list(self.strategy.mailbox.grid.pull_messages(message_ids))

    def send_and_receive(self, messages: Iterable[Message], timeout: float) -> list[Message]:
        messages, s = list(messages), self.strategy
        if not messages:
            return []
        expected = {m.metadata.dst_node_id: s.clients.partition_of(m.metadata.dst_node_id)
                    for m in messages}
        kind = messages[0].metadata.message_type
        what = "client training" if kind.split(".")[0] == "train" else kind  # DaFKD: train.dafkd
        stage = f"round {s.current_round}" if s.current_round else "pre-FL"
        return s.exchange(messages, expected, f"{stage}: {what}", s.current_round)
