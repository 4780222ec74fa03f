"""FedAvg as every strategy here starts: the library's `ServerUpdateFedAvg` with reproducible
sampling over partition ids, replies checked one by one, n_k-weighted averaging, central
evaluation, a run record, and the bookkeeping of nodes that go missing (Flower's `start` runs
the rounds, over a `RoundGrid`); and its clients (query, train, evaluate), whose handlers the
other strategies reuse.

Subclasses add a server update after the averaging (`update_average`), a pre-FL stage
(`prepare`), more to the train config (`train_config`), checks of their own replies
(`why_left_out`, `train_extras`), and name what they carry from round to round (`carried`,
checkpointed); they keep the rest.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from logging import INFO, WARNING
from typing import Any, Callable, Iterable

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from torch import nn

from fedgo_flwr.aggregation import aggregate, mean
from fedgo_flwr.architectures import join, split
from fedgo_app.attacks import COLLUDING, byzantine_partitions, colluded
from fedgo_app.client_context import Local, config_of, reply
from fedgo_flwr.keys import ConfigError
from fedgo_flwr.models import create_classifier, require_feature_space
from fedgo_flwr.seeds import client_seed, round_seed
from fedgo_flwr.strategies.base import ClientModel as LibraryModel
from fedgo_flwr.strategies.base import RoundReport, ServerUpdateFedAvg
from fedgo_app.server.clients import (MIN_CLIENTS, Client, ClientDirectory, classes_problem,
                                       config_record, discover_clients, query_nodes)
from fedgo_flwr.sampling import PARTITION_ID, QUERY_PARTITION, partition_reply, sample_clients
from fedgo_app.server.mailbox import Mailbox
from fedgo_app.server.record import RunRecord, round_line
from fedgo_app.server.replies import reply_problem
from fedgo_flwr.replies import payload_bytes
from fedgo_flwr.guard import EVALUATE_CANDIDATES, scores_problem
from fedgo_flwr.guard import evaluate_candidates as evaluate_library_candidates
from fedgo_app.strategies.registry import StrategySpec
from fedgo_flwr.strategies.label_counts import label_counts_problem
from fedgo_flwr.teachers import server_autocast
from fedgo_flwr.train import evaluate, train_classifier

# The run's fedgo_app.config.Config, not imported: the config imports this module.
Config = Any


# How long a round's start waits for absent or newly connected nodes to answer a query.
PROBE_SECONDS = 10.0


@dataclass
class ServerSetup:
    """What the server holds: its unlabeled set U, the test split, and where it computes."""
    cfg: Config
    u: torch.Tensor  # uint8 [N, C, H, W], no labels
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    device: torch.device
    val_x: torch.Tensor = torch.empty(0, dtype=torch.uint8)  # labelled validation split, if any
    val_y: torch.Tensor = torch.empty(0, dtype=torch.long)
    classes: tuple[str, ...] = ()  # class names; a node reporting others is refused

    @property
    def amp(self) -> bool:
        return self.cfg.server_amp and self.device.type == "cuda"

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.u.shape[1:])  # type: ignore[return-value]

    def new_classifier(self, architecture: str = "",
                       state: dict[str, torch.Tensor] | None = None) -> nn.Module:
        """A classifier of `architecture` (default: the run's `model`), with these weights
        when given."""
        c, h, _ = self.image_shape
        model = create_classifier(architecture or self.cfg.model, c, self.num_classes, h)
        if state is not None:
            model.load_state_dict(state)
        return model

    def latent_dim(self, strategy: str) -> int:
        """The width of the classifier's latent layer, for a strategy that works on it (a
        model without `features`, `head` and `latent_dim` is refused, saying what to add)."""
        net = self.new_classifier()
        require_feature_space(net, strategy, self.cfg.model)
        return net.latent_dim


@dataclass
class ClientModel:
    """theta_k^t of one client in this round."""
    partition_id: int
    num_examples: int
    state: dict[str, torch.Tensor]
    metrics: dict
    extras: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)  # other arrays sent


def weighted_average(models: list[ClientModel], template: dict[str, torch.Tensor]) -> dict:
    """theta_s^t = sum_k n_k / sum_i n_i * theta_k^t (aggregation.mean)."""
    return mean([m.state for m in models], [m.num_examples for m in models], template)


class FedAvgStrategy(ServerUpdateFedAvg):
    """FedAvg (McMahan et al.), the baseline every other strategy extends: the library's
    `ServerUpdateFedAvg` with the app's sampling, bookkeeping and records; Flower's `start`
    runs its rounds."""

    has_ensemble = False
    # Clients of different architectures (fedgo_flwr/architectures.py): FedAvg and FedProx
    # average each architecture among its own clients; a strategy that cannot says why.
    mixes_architectures = True
    label_counts_in_replies = False  # train replies carry the client's label counts c_k,
    # consistent with its n_k (FedGen's and FedBPG's per-label client weights)
    needs_label_counts = False  # clients send their label counts at discovery (FedGO's
    # class-count rule; the diagnostics' label oracle asks for them too)
    # Attributes that carry from one round to the next (modules, optimisers and schedulers by
    # their state_dict, anything else as is): what a checkpoint holds beside the global model.
    carried: tuple[str, ...] = ()

    def __init__(self, setup: ServerSetup, record: RunRecord, **keywords):
        """`keywords`: more of the library strategy's (an ensemble strategy's)."""
        cfg = setup.cfg
        super().__init__(model_fn=setup.new_classifier, seed=cfg.seed, device=setup.device,
                         fraction_train=cfg.fraction_train, min_train_nodes=MIN_CLIENTS,
                         min_available_nodes=1, client_key=self.partition_of, **keywords)
        # Flower's client-side evaluation is off: personal-test-fraction asks the clients in
        # `evaluate_round`, by partition. (Said after the constructor, which would warn.)
        self.fraction_evaluate, self.min_evaluate_nodes = 0.0, 0
        self.setup, self.cfg, self.record = setup, cfg, record
        self.offset = 0  # rounds done before this `start` (a resumed run's)
        self.current_round = 0  # the round being configured or aggregated (0: pre-FL)
        self.clients: ClientDirectory | None = None
        self.architectures: list[str] = [cfg.model]  # found at discovery
        self.mailbox: Mailbox | None = None
        self.absent: set[int] = set()  # partitions that missed their last round
        self._sent_at = 0.0
        self._sent_state: dict[str, torch.Tensor] = {}
        self.sampled: dict[int, int] = {}  # node id -> partition id of this round
        self.grid = None  # the round's grid (a RoundGrid), as the library's strategies keep it

    def partition_of(self, node_id: int) -> int | None:
        """A client's key: its partition id (None: a node not known)."""
        return self.clients.partition_of(node_id) if self.clients is not None else None

    # --- pre-FL
    def pre_fl(self, grid: Grid, timeout: float) -> None:
        """`start`'s pre-FL stage, skipped by a resumed run (its checkpoint holds what the
        stage made)."""
        if not self.offset:
            self.prepare(grid)

    def prepare(self, grid: Grid) -> None:
        """The pre-FL stage, once `discover` knows the clients; FedAvg has none."""

    def discover(self, grid: Grid) -> None:
        """Learn the clients (partition id, node id, n_k) before the first round."""
        cfg = self.cfg
        self.mailbox = Mailbox(grid)
        self.clients = discover_clients(self.mailbox, timeout=cfg.join_timeout,
                                        reply_timeout=cfg.round_timeout,
                                        label_histograms=self.asks_label_counts,
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
        self.architectures = sorted({self.architecture(p) for p in self.clients.partition_ids})
        if self.heterogeneous:  # the global model is every architecture's, joined
            with torch.random.fork_rng(devices=[]):
                self.template = self.joined({a: self.setup.new_classifier(a).state_dict()
                                             for a in self.architectures})
            self.record.data["clients"]["architectures"] = {
                str(p): self.architecture(p) for p in self.clients.partition_ids}
            log(INFO, "architectures: %s", ", ".join(
                f"{a} ({sum(self.architecture(p) == a for p in self.clients.partition_ids)} "
                "clients)" for a in self.architectures))
            if why := self.mixed_problem():
                raise ConfigError(f"the clients run {', '.join(self.architectures)}: {why}")
        if self.asks_label_counts:
            self.record.data["clients"]["label_histograms"] = {
                str(p): list(c.label_histogram) for p, c in self.clients.by_partition.items()}

    # --- architectures (one global model per architecture in a mixed federation)
    def architecture(self, pid: int) -> str:
        return self.clients.by_partition[pid].model or self.cfg.model

    @property
    def heterogeneous(self) -> bool:
        return len(self.architectures) > 1

    def mixed_problem(self) -> str | None:
        """Why this run cannot mix architectures, or None."""
        if not self.mixes_architectures:
            return (f"strategy {self.cfg.strategy!r} works in one model's feature space and "
                    "cannot mix architectures; use fedavg, fedprox, feddf or fedgo")
        return None

    def globals_of(self, state: dict) -> dict[str, dict]:
        """{architecture: its global model} of the joined global state."""
        return split(state, self.architectures) if self.heterogeneous else {
            self.architectures[0]: state}

    def joined(self, states: dict[str, dict]) -> dict:
        return join(states) if self.heterogeneous else next(iter(states.values()))

    def initial_model(self) -> ArrayRecord:
        """theta_s^0 of every architecture, each from the seed alone."""
        states = {}
        for a in self.architectures:
            torch.manual_seed(self.cfg.seed)
            states[a] = self.setup.new_classifier(a).state_dict()
        return ArrayRecord(self.joined(states))

    @property
    def asks_label_counts(self) -> bool:
        return self.needs_label_counts or (self.cfg.diagnostics and self.has_ensemble)

    # --- the rounds: Flower's `start` runs them over a RoundGrid (server_app.run)
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

    def refresh(self, grid: Grid, server_round: int) -> None:
        """Before sampling: count the replies that came after their round's wait (a round's
        model is not used once its round is over; FedGO's late discriminators are the
        library's to take), and take back partitions that answer again. A partition is absent
        from sampling after it misses a round; it rejoins when a late reply of it arrives, or
        when its node, or a new node reporting its partition id, answers a query."""
        for node, late_round, _ in self.mailbox.late_replies():
            pid = self.clients.partition_of(node)
            if pid is None:
                continue
            self.record.round(late_round).setdefault("replies", {}).setdefault(
                "late", []).append(pid)
            log(INFO, "late reply of partition %d (round %d): counted, not used", pid,
                late_round)
            self.rejoin(pid, server_round)
        online = set(grid.get_node_ids())
        known = {c.node_id for c in self.clients.by_partition.values()}
        probe = sorted(n for n in online if n not in known or self.clients.partition_of(n) in
                       self.absent)
        if not probe:
            return
        for node, answer in query_nodes(self.mailbox, probe, PROBE_SECONDS,
                                        self.asks_label_counts).items():
            if (isinstance(answer, str) or answer[1] != self.clients.num_partitions
                    or classes_problem(answer[4], self.setup.classes)):
                continue
            pid, _, n, _, _, model = answer
            old = self.clients.by_partition.get(pid)  # a rejoin cannot raise n_k
            if (old and model != old.model) or (model or self.cfg.model) not in self.architectures:
                log(WARNING, "node %d answers for partition %d with architecture %r, not the "
                    "one it had or one of the run's (%s): left out", node, pid, model,
                    ", ".join(self.architectures))
                continue
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

    def train_config(self, server_round: int) -> ConfigRecord:
        cfg = self.cfg
        conf = config_record(server_round=server_round, local_epochs=cfg.local_epochs,
                             batch_size=cfg.batch_size, lr=cfg.lr, flip=cfg.flip,
                             random_crop=cfg.random_crop, optimizer=cfg.optimizer,
                             momentum=cfg.momentum, seed=round_seed(cfg.seed, server_round))
        if self.proximal_mu:  # FedProx's clients (the library's keyword)
            conf["proximal-mu"] = self.proximal_mu
        return conf

    def train_content(self, server_round: int, arrays: ArrayRecord) -> RecordDict:
        """What every sampled client receives: the global model and the train config."""
        return RecordDict({"arrays": arrays, "config": self.train_config(server_round)})

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Flower's round `server_round` of this `start` is the run's round offset + it."""
        server_round = self.current_round = server_round + self.offset
        self.grid = grid
        self.refresh(grid, server_round)
        pids = sample_clients(self.clients.partition_ids, self.cfg.fraction_train,
                             self.cfg.seed, server_round, MIN_CLIENTS, self.absent)
        self.sampled = {self.clients.by_partition[p].node_id: p for p in pids}
        entry = self.record.round(server_round)
        entry["clients"] = pids
        if self.absent:
            entry.setdefault("replies", {})["absent"] = sorted(self.absent)
            log(WARNING, "round %d: partitions %s are absent from sampling", server_round,
                sorted(self.absent))
        self._sent_state = arrays.to_torch_state_dict()  # theta_g, for colluding liars
        # each client gets its architecture's global model
        contents = ({a: self.train_content(server_round, ArrayRecord(g))
                     for a, g in self.globals_of(self._sent_state).items()}
                    if self.heterogeneous else
                    {self.architectures[0]: self.train_content(server_round, arrays)})
        down = {a: payload_bytes([c]) * sum(self.architecture(p) == a for p in pids)
                for a, c in contents.items()}
        self.record.sent("main_fl", "down", sum(down.values()), server_round)
        if self.heterogeneous:
            entry["bytes_by_architecture"] = {a: {"down": n} for a, n in down.items()}
        log(INFO, "round %d: training on partitions %s", server_round, pids)
        self._sent_at = time.perf_counter()
        return [Message(contents[self.architecture(p)], dst_node_id=n, message_type="train")
                for n, p in self.sampled.items()]

    def why_left_out(self, reply: Message, array_key: str, template: dict[str, torch.Tensor],
                     extras: dict[str, dict[str, torch.Tensor]] | None = None) -> str | None:
        """Why a reply cannot be used, or None; strategies add checks of what they send."""
        return reply_problem(reply, array_key, template, extras) or (
            label_counts_problem(reply.content.metric_records["metrics"], self.setup.num_classes)
            if self.label_counts_in_replies else None)

    def train_extras(self, server_round: int) -> dict[str, dict[str, torch.Tensor]]:
        """The arrays a train reply carries besides the model (name -> template); FedAvg's
        carry none."""
        return {}

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

    def collect(self, replies: Iterable[Message], array_key: str,
                template: dict[str, torch.Tensor] | Callable[[int], dict[str, torch.Tensor]],
                expected: dict[int, int],
                extras: dict[str, dict[str, torch.Tensor]] | None = None
                ) -> tuple[list[ClientModel], dict]:
        """The usable replies as ClientModels (`template`: the arrays' names and shapes, or a
        function of the partition id giving them; `extras`, name -> template: more arrays
        each must carry, kept in ClientModel.extras), and the tally of the partitions asked:
        missing (no reply in time), failed (an error reply: the node or its ClientApp
        failed) and rejected (a reply that fails the checks), the last two with the reason;
        each is logged."""
        models, seen = [], set()
        tally = {"asked": len(expected), "missing": [], "failed": {}, "rejected": {}}
        for reply in replies:
            node = self.mailbox.node_of(reply)
            pid = expected.get(node)
            why = ("not asked this round" if pid is None else "duplicate reply" if pid in seen
                   else self.why_left_out(reply, array_key, template(pid) if callable(template)
                                          else template, extras))
            if why:
                log(WARNING, "rejected reply from node %d (partition %s): %s", node, pid, why)
                if pid is not None and pid not in seen:
                    seen.add(pid)
                    tally["failed" if reply.has_error() else "rejected"][str(pid)] = why
                continue
            seen.add(pid)
            metrics = dict(reply.content.metric_records["metrics"])
            arrays = {k: a.to_torch_state_dict() for k, a in reply.content.array_records.items()}
            models.append(ClientModel(pid, self.sample_size(pid, int(metrics["num-examples"])),
                                      arrays.pop(array_key), metrics, arrays))
        no_reply = sorted(set(expected.values()) - seen)
        if no_reply:
            log(WARNING, "no reply in time from partitions %s", no_reply)
        tally.update(missing=no_reply, usable=len(models))
        return sorted(models, key=lambda m: m.partition_id), tally

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        server_round = self.current_round = server_round + self.offset
        replies = list(replies)
        self.record.time("client_training", time.perf_counter() - self._sent_at, server_round)
        self.record.sent("main_fl", "up", payload_bytes(replies), server_round)
        if self.heterogeneous:
            by_arch = self.record.round(server_round).setdefault("bytes_by_architecture", {})
            for reply in replies:
                pid = self.sampled.get(self.mailbox.node_of(reply))
                if pid is not None:
                    up = by_arch.setdefault(self.architecture(pid), {})
                    up["up"] = up.get("up", 0) + payload_bytes([reply])
        templates = {a: self.setup.new_classifier(a).state_dict() for a in self.architectures}
        models, tally = self.collect(replies, "arrays",
                                     lambda pid: templates[self.architecture(pid)],
                                     self.sampled, self.train_extras(server_round))
        self.record.round(server_round).setdefault("replies", {}).update(tally)
        # Dropped from sampling until they answer again.
        self.absent.update([*tally["missing"], *map(int, tally["failed"])])
        if not models:
            log(WARNING, "round %d: no usable client model; the server model is unchanged",
                server_round)
            return None, None
        start = time.perf_counter()
        previous, averaged = self.globals_of(self._sent_state), {}
        aggregation = self.record.round(server_round).get("aggregation", {})
        for a in self.architectures:
            group = [m for m in models if self.architecture(m.partition_id) == a]
            if self.cfg.attack in COLLUDING:  # the simulation stands in for the colluders
                liars = set(self.record.data["clients"]["byzantine"]["partitions"])
                states = colluded(self.cfg.attack, self.cfg.attack_scale,
                                  [m.state for m in group],
                                  [m.partition_id in liars for m in group], previous[a])
                group = [replace(m, state=s_) for m, s_ in zip(group, states)]
                models = [next((g for g in group if g.partition_id == m.partition_id), m)
                          for m in models]
            result = aggregate([m.state for m in group], [m.num_examples for m in group],
                               templates[a], self.cfg.aggregation) if group else None
            if result is None:
                why = (f"{len(group)} usable models are too few for aggregator "
                       f"{self.cfg.aggregator}" if group else "no usable model")
                log(WARNING, "round %d: %s%s; its global model is unchanged", server_round,
                    why, f" of {a}" if self.heterogeneous else "")
                aggregation.setdefault("kept_previous", []).append(a)
                self.record.round(server_round)["aggregation"] = aggregation
                if not self.heterogeneous:
                    return None, None
                averaged[a] = previous[a]
                continue
            if result.selected is not None:  # who Krum's rules kept
                aggregation.setdefault("selected", []).extend(
                    group[i].partition_id for i in result.selected)
                self.record.round(server_round)["aggregation"] = aggregation
            averaged[a] = result.state
        self.record.time("aggregation", time.perf_counter() - start, server_round)
        state = (self.joined(self.update_architectures(server_round, averaged, models))
                 if self.heterogeneous else
                 self.update_average(server_round, averaged[self.architectures[0]], models))
        reported = [m for m in models if isinstance(m.metrics.get("train-loss"), (int, float))]
        loss = (sum(m.num_examples * m.metrics["train-loss"] for m in reported)
                / sum(m.num_examples for m in reported)) if reported else float("nan")
        entry = self.record.round(server_round)
        entry["train_loss"] = loss
        # The clients' own compute (their sum), apart from waiting and transfer.
        entry["client_seconds"] = sum(float(m.metrics.get("train-seconds", 0.0)) for m in models)
        return ArrayRecord(state), MetricRecord({"train-loss": loss})

    def update_average(self, server_round: int, averaged: dict[str, torch.Tensor],
                       models: list[ClientModel]) -> dict[str, torch.Tensor]:
        """The library strategy's server update (`server_update`: FedAvg keeps the average)
        on the round as the library sees it; its observers (the record) see it after."""
        report = self.library_report(server_round, averaged, models)
        report.arrays, report.metrics = self.server_update(
            server_round, report.averaged, report.clients, report)
        for observe in self.observers:
            observe(report)
        return report.arrays.to_torch_state_dict()

    def library_report(self, server_round: int, averaged: dict[str, torch.Tensor] | None,
                       models: list[ClientModel]) -> RoundReport:
        """The round as the library sees it: each model known by its partition id."""
        clients = [LibraryModel(self.clients.by_partition[m.partition_id].node_id,
                                m.num_examples, RecordDict({"arrays": ArrayRecord(m.state)}),
                                m.metrics, {k: ArrayRecord(v) for k, v in m.extras.items()},
                                m.partition_id) for m in models]
        return RoundReport(server_round, dict(self.sampled), clients, {},
                           None if averaged is None else ArrayRecord(averaged), None, {})

    def update_architectures(self, server_round: int, averaged: dict[str, dict],
                             models: list[ClientModel]) -> dict[str, dict]:
        """A mixed federation's server update ({architecture: its average}); FedAvg keeps
        each architecture's average."""
        return averaged

    # --- checkpoints
    def state_dict(self) -> dict:
        """What carries across rounds (see `carried`)."""
        return {name: (value.state_dict() if hasattr(value, "state_dict") else value)
                for name in self.carried for value in [getattr(self, name)]}

    def load_state_dict(self, state: dict) -> None:
        for name in self.carried:
            current = getattr(self, name)
            if hasattr(current, "load_state_dict"):
                current.load_state_dict(state[name])
            else:
                setattr(self, name, state[name])

    # --- central evaluation (after each round, and for round 0)
    def evaluate_round(self, server_round: int, arrays: ArrayRecord) -> MetricRecord:
        """The global model on the test split and, with personal-test-fraction, on the
        clients' own (Flower's `evaluate_fn`, given the run's round)."""
        metrics = self.evaluate_global(server_round, arrays)
        self.evaluate_personal(server_round, arrays)
        return metrics

    def test_metrics(self, state: dict[str, torch.Tensor], architecture: str = "",
                     on: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[float, float]:
        """Accuracy and loss of the classifier with these weights on the test split, or on
        the labelled images `on` (x, y)."""
        model = self.setup.new_classifier(architecture, state)
        x, y = on if on is not None else (self.setup.test_x, self.setup.test_y)
        with server_autocast(self.setup.device, self.setup.amp):
            return evaluate(model, x, y, device=self.setup.device)

    def evaluate_global(self, server_round: int, arrays: ArrayRecord) -> MetricRecord:
        start = time.perf_counter()
        entry = self.record.round(server_round)
        if self.heterogeneous:  # each architecture's global model; the row gives their mean
            scores = {a: self.test_metrics(g, a)
                      for a, g in self.globals_of(arrays.to_torch_state_dict()).items()}
            entry["architectures"] = {a: {"server_test_acc": acc, "server_test_loss": loss}
                                      for a, (acc, loss) in scores.items()}
            acc = sum(acc for acc, _ in scores.values()) / len(scores)
            loss = sum(loss for _, loss in scores.values()) / len(scores)
        else:
            acc, loss = self.test_metrics(arrays.to_torch_state_dict())
        entry.update(server_test_acc=acc, server_test_loss=loss)
        self.record.time("evaluation", time.perf_counter() - start, server_round or None)
        log(INFO, "%s", round_line(entry))
        return MetricRecord({"server-test-acc": acc, "server-test-loss": loss})


    def evaluate_personal(self, server_round: int, arrays: ArrayRecord) -> None:
        """personal-test-fraction > 0: every present client scores the global model (of its
        architecture; a personalising strategy's clients, their own) on its personal test
        split; the n_k-weighted accuracy and loss are the round's personalised_test_acc and
        _loss. Malformed scores are rejected with their reason."""
        if self.cfg.personal_test_fraction <= 0:
            return
        start = time.perf_counter()
        pids = [p for p in self.clients.partition_ids if p not in self.absent]
        expected = {self.clients.by_partition[p].node_id: p for p in pids}
        state = arrays.to_torch_state_dict()
        contents = {a: RecordDict({"arrays": ArrayRecord(g) if self.heterogeneous else arrays})
                    for a, g in self.globals_of(state).items()}
        self.record.sent("personal", "down", sum(payload_bytes([contents[self.architecture(p)]])
                                                 for p in pids), server_round)
        replies = self.exchange(
            [Message(contents[self.architecture(p)], dst_node_id=n, message_type="evaluate")
             for n, p in expected.items()], expected, f"round {server_round}: personal test",
            server_round)
        scores = {}
        for r in replies:
            pid = expected.get(self.mailbox.node_of(r))
            why = "not asked" if pid is None else scores_problem(r, ["eval"])
            metrics = None if why else r.content.metric_records["metrics"]
            if metrics is not None and not math.isfinite(metrics.get("eval-loss", math.nan)):
                why = f"eval-loss {metrics.get('eval-loss')!r} is not a finite number"
            if why:
                log(WARNING, "personal test score of node %d (partition %s) rejected: %s",
                    self.mailbox.node_of(r), pid, why)
                continue
            scores[pid] = (metrics["num-examples"], metrics["eval-acc"], metrics["eval-loss"])
        entry = self.record.round(server_round)
        if scores:
            total = sum(n for n, _, _ in scores.values())
            entry["personalised_test_acc"] = sum(n * a for n, a, _ in scores.values()) / total
            entry["personalised_test_loss"] = sum(n * l for n, _, l in scores.values()) / total
            entry["personalised"] = {"clients": len(scores),
                                     "min_acc": min(a for _, a, _ in scores.values()),
                                     "max_acc": max(a for _, a, _ in scores.values())}
            log(INFO, "round %d: personalised test accuracy %.4f (%d clients)", server_round,
                entry["personalised_test_acc"], len(scores))
        self.record.time("personal_evaluation", time.perf_counter() - start, server_round)


class RoundGrid:
    """The grid Flower's `start` sends through: the strategy's mailbox, each reply logged by
    partition as it comes, and replies that miss their wait kept for the next round."""

    def __init__(self, strategy: FedAvgStrategy):
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


# ---------------------------------------------------------------------------- client side
def info(message: Message, local: Local) -> Message:
    """Partition id, partition count and n_k (the server keys clients by these), the class
    names (the server refuses a node whose classes are not its own) and the architecture it
    runs; the label histogram only when the server's config asks (diagnostics)."""
    reply_ = {"partition-id": local.partition_id, "num-partitions": local.num_partitions,
              "num-examples": len(local.y)}
    if config_of(message).get("label-histogram"):
        reply_["label-histogram"] = torch.bincount(local.y, minlength=local.num_classes).tolist()
    answer = reply(message, reply_, key="info")
    answer.content.config_records["classes"] = ConfigRecord({"names": list(local.classes)})
    answer.content.config_records["model"] = ConfigRecord({"name": local.model})
    return answer


def local_update(message: Message, local: Local, model: nn.Module,
                 extra_loss: Callable[[nn.Module], torch.Tensor] | None = None) -> Message:
    """ClientUpdate: `model` trained on S_k as the train config says, with a strategy's
    `extra_loss(model)` added to each minibatch's loss; replies theta_k and n_k."""
    conf = config_of(message)
    result = train_classifier(model, local.x, local.y, epochs=int(conf["local-epochs"]),
                              batch_size=int(conf["batch-size"]), lr=float(conf["lr"]),
                              flip=bool(conf["flip"]), crop=int(conf["random-crop"]),
                              optimizer=str(conf["optimizer"]),
                              momentum=float(conf["momentum"]),
                              seed=client_seed(int(conf["seed"]), local.partition_id),
                              device=local.device, extra_loss=extra_loss)
    return reply(message, {"num-examples": len(local.y), **result},
                 arrays=ArrayRecord(model.cpu().state_dict()))


def train(message: Message, local: Local) -> Message:
    return local_update(message, local, local.classifier(message))


def evaluate_local(message: Message, local: Local) -> Message:
    """The global classifier's loss and accuracy on the client's personal test split
    (personal-test-fraction), or on S_k without one."""
    x, y = (local.test_x, local.test_y) if len(local.test_y) else (local.x, local.y)
    acc, loss = evaluate(local.classifier(message), x, y, device=local.device)
    return reply(message, {"num-examples": len(y), "eval-acc": acc, "eval-loss": loss})


def evaluate_candidates(message: Message, local: Local) -> Message:
    """The guard's question (fedgo_flwr.guard): each classifier the server sent scored on
    S_k, in this client's architecture."""
    c, h, _ = local.image_shape
    return evaluate_library_candidates(
        message, lambda: create_classifier(local.model or local.cfg.model, c,
                                           local.num_classes, h),
        (local.x, local.y), device=local.device)


def partition(message: Message, local: Local) -> Message:
    """The library's partition query (`client_key="partition-id"`)."""
    return partition_reply(message, {PARTITION_ID: local.partition_id})


CLIENT = {"query": info, "train": train, "evaluate": evaluate_local,
          EVALUATE_CANDIDATES: evaluate_candidates, QUERY_PARTITION: partition}
FEDAVG = StrategySpec("fedavg", FedAvgStrategy, CLIENT)
