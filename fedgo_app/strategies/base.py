"""FedAvg as every strategy here starts: the library's `ServerUpdateFedAvg` (Flower's `start`
runs the rounds, over a `RoundGrid`) with what this app adds around it, each a small object:
who takes part (`Membership`: discovery, seeded sampling over partition ids, absent and
rejoining partitions), the global model of each architecture (`Architectures`), the replies
tallied by partition and checked by the library's checks (`server.replies.collect`), the
average with the simulated colluders (`Averaging`), central and personal evaluation
(`Evaluation`), the run record and checkpoints.

Subclasses add a server update after the averaging (`update_average`: the library strategy's
`server_update`), a pre-FL stage (`prepare`), more to the train config (`train_config`),
checks of their own replies (`why_left_out`, `train_extras`), and name what they carry from
round to round (`carried`, checkpointed); they keep the rest.
"""

from __future__ import annotations

import time
from logging import INFO, WARNING
from typing import Iterable

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedgo_app.server.architectures import Architectures
from fedgo_app.server.averaging import Averaging, PartitionModel, weighted_average
from fedgo_app.server.clients import MIN_CLIENTS, ClientDirectory, config_record
from fedgo_app.server.evaluation import Evaluation
from fedgo_app.server.membership import Membership, RoundGrid
from fedgo_app.server.record import RunRecord
from fedgo_app.server.replies import collect, reply_problem
from fedgo_app.server.setup import ServerSetup
from fedgo_app.strategies.clients import CLIENT
from fedgo_app.strategies.registry import StrategySpec
from fedgo_flwr.keys import ConfigError
from fedgo_flwr.replies import payload_bytes
from fedgo_flwr.sampling import sample_clients
from fedgo_flwr.seeds import round_seed
from fedgo_flwr.strategies.base import ClientModel
from fedgo_flwr.strategies.base import RoundReport, ServerUpdateFedAvg
from fedgo_flwr.strategies.label_counts import label_counts_problem


__all__ = ["CLIENT", "FEDAVG", "PartitionModel", "FedAvgStrategy", "RoundGrid", "ServerSetup",
           "weighted_average"]


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
                         min_available_nodes=1, client_key=self.partition_of,
                         **setup.client_keywords, **keywords)
        # Flower's client-side evaluation is off: personal-test-fraction asks the clients in
        # `evaluate_round`, by partition. (Said after the constructor, which would warn.)
        self.fraction_evaluate, self.min_evaluate_nodes = 0.0, 0
        self.setup, self.cfg, self.record = setup, cfg, record
        self.offset = 0  # rounds done before this `start` (a resumed run's)
        self.current_round = 0  # the round being configured or aggregated (0: pre-FL)
        self.membership = Membership(setup, record)
        self.architectures = Architectures(setup)
        self.evaluation = Evaluation(setup, record, self.architectures, self.membership,
                                     self.personal_config)
        self.averaging = Averaging(cfg, record, self.architectures)
        self._sent_at = 0.0
        self._sent_state: dict[str, torch.Tensor] = {}
        self.sampled: dict[int, int] = {}  # node id -> partition id of this round
        self.grid = None  # the round's grid (a RoundGrid), as the library's strategies keep it

    @property
    def clients(self) -> ClientDirectory | None:
        return self.membership.clients

    @property
    def absent(self) -> set[int]:
        return self.membership.absent

    @property
    def mailbox(self):
        return self.membership.mailbox

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
        """Learn the clients (partition id, node id, n_k, architecture) before the first
        round; a mixed federation's global model is every architecture's, joined."""
        clients = self.membership.discover(grid, self.asks_label_counts)
        mixed = self.architectures.found(clients)
        if mixed is not None:
            self.template = self.architectures.joined_template()
            self.record.data["clients"]["architectures"] = mixed
            if why := self.mixed_problem():
                raise ConfigError(f"the clients run {', '.join(self.architectures.names)}: "
                                  f"{why}")

    def personal_config(self, server_round: int) -> ConfigRecord | None:
        """The config of the clients' personal test (personal-test-fraction); FedAvg's:
        none."""
        return None

    def check_training(self, train_config: ConfigRecord) -> None:
        """Nothing for `start` to ask of its caller: the app's clients train as the run config
        says (clients.py), in the train config `train_config` below builds."""

    def mixed_problem(self) -> str | None:
        """Why this run cannot mix architectures, or None."""
        if not self.mixes_architectures:
            return (f"strategy {self.cfg.strategy!r} works in one model's feature space and "
                    "cannot mix architectures; use fedavg, fedprox, feddf or fedgo")
        if self.client_method is not None:
            return (f"client-method {self.cfg.client_method!r} keeps state shaped like one "
                    "model (c, the buffer) and cannot mix architectures")
        return None

    def initial_model(self) -> ArrayRecord:
        """theta_s^0 of every architecture, each from the seed alone."""
        return self.architectures.initial_model()

    @property
    def asks_label_counts(self) -> bool:
        return self.needs_label_counts or (self.cfg.diagnostics and self.has_ensemble)

    def exchange(self, messages: Iterable[Message], expected: dict[int, int], what: str,
                 server_round: int) -> list[Message]:
        """Send and wait up to round-timeout, each reply logged by partition as it comes."""
        return self.membership.exchange(messages, expected, what, server_round)

    # --- the rounds: Flower's `start` runs them over a RoundGrid (server_app.run)
    def train_config(self, server_round: int) -> ConfigRecord:
        cfg = self.cfg
        conf = config_record(server_round=server_round, local_epochs=cfg.local_epochs,
                             batch_size=cfg.batch_size, lr=cfg.lr, flip=cfg.flip,
                             random_crop=cfg.random_crop, optimizer=cfg.optimizer,
                             momentum=cfg.momentum, seed=round_seed(cfg.seed, server_round))
        return conf

    def train_content(self, server_round: int, arrays: ArrayRecord) -> RecordDict:
        """What every sampled client receives: the global model, the train config and the
        library strategy's `train_payload` (FedProx's mu, the clients' method's, DaFKD's G
        and head, ...)."""
        extra, settings = self.train_payload(server_round, arrays)
        config = self.train_config(server_round)
        config.update(settings)
        return RecordDict({"arrays": arrays, **extra, "config": config})

    def known_clients(self) -> set:
        """Every partition of the federation (SCAFFOLD's N)."""
        return set(self.clients.partition_ids)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Flower's round `server_round` of this `start` is the run's round offset + it: the
        partitions present are sampled by the seed, each gets its architecture's model."""
        server_round = self.current_round = server_round + self.offset
        self.grid = grid
        self.membership.refresh(grid, server_round, self.architectures.names)
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
        arch = self.architectures
        contents = {a: self.train_content(server_round, ArrayRecord(g) if arch.heterogeneous
                                          else arrays)
                    for a, g in arch.globals_of(self._sent_state).items()}
        self.count_down(server_round, contents, pids)
        log(INFO, "round %d: training on partitions %s", server_round, pids)
        self._sent_at, self._cpu_at = time.perf_counter(), time.process_time()
        return [Message(contents[arch.of(p)], dst_node_id=n, message_type="train")
                for n, p in self.sampled.items()]

    def count_down(self, server_round: int, contents: dict[str, RecordDict],
                   pids: list[int]) -> None:
        """The bytes the round sends (by architecture in a mixed federation)."""
        down = {a: payload_bytes([c]) * sum(self.architectures.of(p) == a for p in pids)
                for a, c in contents.items()}
        self.record.sent("main_fl", "down", sum(down.values()), server_round)
        if self.architectures.heterogeneous:
            self.record.round(server_round)["bytes_by_architecture"] = {
                a: {"down": n} for a, n in down.items()}

    def count_up(self, server_round: int, replies: list[Message]) -> None:
        """The bytes the round's replies carry (by architecture in a mixed federation)."""
        self.record.sent("main_fl", "up", payload_bytes(replies), server_round)
        if self.architectures.heterogeneous:
            by_arch = self.record.round(server_round).setdefault("bytes_by_architecture", {})
            self.architectures.count_up(by_arch, replies, lambda reply: self.sampled.get(
                self.mailbox.node_of(reply)))

    def why_left_out(self, reply: Message, array_key: str, template: dict[str, torch.Tensor],
                     extras: dict[str, dict[str, torch.Tensor]] | None = None) -> str | None:
        """Why a reply cannot be used, or None; strategies add checks of what they send."""
        return reply_problem(reply, array_key, template, extras) or (
            label_counts_problem(reply.content.metric_records["metrics"], self.setup.num_classes)
            if self.label_counts_in_replies else None)

    def train_extras(self, server_round: int) -> dict[str, dict[str, torch.Tensor]]:
        """The arrays a train reply carries besides the model (name -> template): those of
        the clients' method (FedAvg's carry none)."""
        return self.client_method.reply_templates() if self.client_method else {}

    def collect(self, replies: Iterable[Message], array_key: str, template, expected: dict,
                extras: dict[str, dict[str, torch.Tensor]] | None = None
                ) -> tuple[list[PartitionModel], dict]:
        """The usable replies (`template`: the arrays' names and shapes, or a function of the
        partition id giving them; `extras`: more arrays each must carry) and their tally
        (fedgo_app.server.replies.collect), n_k as `Membership.sample_size` weighs it."""
        def problem(reply: Message, pid: int) -> str | None:
            return self.why_left_out(reply, array_key, template(pid) if callable(template)
                                     else template, extras)

        return collect(replies, expected, self.mailbox.node_of, problem, array_key,
                       self.membership.sample_size)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The usable replies averaged (each architecture's among its own), then the server
        update; partitions that missed the round are absent until they answer again."""
        server_round = self.current_round = server_round + self.offset
        replies = list(replies)
        self.record.time("client_training", time.perf_counter() - self._sent_at, server_round)
        self.count_up(server_round, replies)
        templates = self.architectures.templates()
        models, tally = self.collect(replies, "arrays",
                                     lambda pid: templates[self.architectures.of(pid)],
                                     self.sampled, self.train_extras(server_round))
        self.record.round(server_round).setdefault("replies", {}).update(tally)
        self.absent.update([*tally["missing"], *map(int, tally["failed"])])
        if not models:
            log(WARNING, "round %d: no usable client model; the server model is unchanged",
                server_round)
            return None, None
        start = time.perf_counter()
        averaged, models = self.averaging(server_round, models,
                                          self.architectures.globals_of(self._sent_state),
                                          templates)
        if averaged is None:
            return None, None
        self.record.time("aggregation", time.perf_counter() - start, server_round)
        state = (self.architectures.joined(self.update_architectures(server_round, averaged,
                                                                     models))
                 if self.architectures.heterogeneous else
                 self.update_average(server_round, averaged[self.architectures.names[0]],
                                     models))
        return ArrayRecord(state), MetricRecord({"train-loss": self.record_train(server_round,
                                                                                 models)})

    def record_train(self, server_round: int, models: list[PartitionModel]) -> float:
        """The round's n_k-weighted train loss and the clients' own compute (their sum, apart
        from waiting and transfer), recorded; the loss returned."""
        reported = [m for m in models if isinstance(m.metrics.get("train-loss"), (int, float))]
        loss = (sum(m.num_examples * m.metrics["train-loss"] for m in reported)
                / sum(m.num_examples for m in reported)) if reported else float("nan")
        entry = self.record.round(server_round)
        entry["train_loss"] = loss
        entry["client_seconds"] = sum(float(m.metrics.get("train-seconds", 0.0)) for m in models)
        return loss

    def update_average(self, server_round: int, averaged: dict[str, torch.Tensor],
                       models: list[PartitionModel]) -> dict[str, torch.Tensor]:
        """The library strategy's server update (`server_update`: FedAvg keeps the average)
        on the round as the library sees it; its observers (the record) see it after."""
        report = self.library_report(server_round, averaged, models)
        self.method_step(server_round, report)  # the clients' method's step comes first
        report.arrays, metrics = self.server_update(
            server_round, report.averaged, report.clients, report)
        report.metrics.update(metrics)
        self.notify(report)
        return report.arrays.to_torch_state_dict()

    def library_report(self, server_round: int, averaged: dict[str, torch.Tensor] | None,
                       models: list[PartitionModel]) -> RoundReport:
        """The round as the library sees it: each model known by its partition id."""
        clients = [ClientModel(self.clients.by_partition[m.partition_id].node_id,
                                m.num_examples, RecordDict({"arrays": ArrayRecord(m.state)}),
                                m.metrics, {k: ArrayRecord(v) for k, v in m.extras.items()},
                                m.partition_id) for m in models]
        return RoundReport(server_round, dict(self.sampled), clients, {},
                           None if averaged is None else ArrayRecord(averaged), None, {})

    def update_architectures(self, server_round: int, averaged: dict[str, dict],
                             models: list[PartitionModel]) -> dict[str, dict]:
        """A mixed federation's server update ({architecture: its average}); FedAvg keeps
        each architecture's average."""
        return averaged

    # --- checkpoints
    def state_dict(self) -> dict:
        """What carries across rounds (see `carried`, and the clients' method's)."""
        state = {name: (value.state_dict() if hasattr(value, "state_dict") else value)
                 for name in self.carried for value in [getattr(self, name)]}
        if self.client_method is not None:
            state["client_method"] = self.client_method.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        if self.client_method is not None:
            self.client_method.load_state_dict(state["client_method"])
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
        metrics = self.evaluation.global_model(server_round, arrays)
        self.evaluation.personal(server_round, arrays)
        if server_round == self.current_round > 0:  # the round's CPU seconds in this process
            # (the clients' too on an in-process grid): far less sensitive to other load than
            # the wall seconds
            self.record.round(server_round)["cpu_seconds"] = time.process_time() - self._cpu_at
        return metrics

    def test_metrics(self, state: dict[str, torch.Tensor], architecture: str = "",
                     on: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[float, float]:
        return self.evaluation.test_metrics(state, architecture, on)


FEDAVG = StrategySpec("fedavg", FedAvgStrategy, CLIENT)
