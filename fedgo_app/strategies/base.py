"""FedAvg as every strategy here starts: the library's `ServerUpdateFedAvg`, whose round
(sampling, the train messages, the reply checks, the combination, the server update, the
observers) Flower's `start` runs over a `RoundGrid`, with what this app adds through its
hooks, each a small object: who takes part (`Membership`: discovery, seeded sampling over
partition ids, absent and rejoining partitions: `candidates`, `node_of`, n_k), the global
model of each architecture (`Architectures`: `arrays_for`, `template_of`, `combine`), the run's
aggregator (the library's `aggregate_fn`: fedgo_flwr.aggregation.Aggregator) and the simulated
colluders (fedgo_app.attacks: `client_models`), central and personal evaluation (`Evaluation`),
and the run record (an observer) and checkpoints.

Subclasses are the library's strategies with the run config as keywords; what the app adds
to a pre-FL stage comes before the library's (`pre_fl`), and a checkpoint holds the
library's `state_dict` with what the app adds to it.
"""

from __future__ import annotations

import time
from logging import INFO, WARNING
from typing import Iterable

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedgo_app.attacks import COLLUDING, colluded_models
from fedgo_app.server.architectures import Architectures
from fedgo_app.server.clients import MIN_CLIENTS, ClientDirectory, config_record
from fedgo_app.server.evaluation import Evaluation
from fedgo_app.server.membership import Membership, RoundGrid
from fedgo_app.server.record import RunRecord, reply_tally
from fedgo_app.server.setup import ServerSetup
from fedgo_app.strategies.clients import CLIENT
from fedgo_app.strategies.registry import StrategySpec
from fedgo_flwr.aggregation import Aggregator
from fedgo_flwr.keys import ConfigError
from fedgo_flwr.replies import payload_bytes
from fedgo_flwr.strategies.base import ServerUpdateFedAvg
from fedgo_flwr.strategies.rounds import ClientModel, RoundReport


__all__ = ["CLIENT", "FEDAVG", "FedAvgStrategy", "RoundGrid", "ServerSetup"]


class FedAvgStrategy(ServerUpdateFedAvg):
    """FedAvg (McMahan et al.), the baseline every other strategy extends: the library's
    `ServerUpdateFedAvg` with the app's sampling, bookkeeping and records; Flower's `start`
    runs its rounds."""

    has_ensemble = False
    # Clients of different architectures (fedgo_flwr/architectures.py): FedAvg and FedProx
    # average each architecture among its own clients; a strategy that cannot says why.
    mixes_architectures = True
    needs_label_counts = False  # clients send their label counts at discovery (FedGO's
    # class-count rule; the diagnostics' label oracle asks for them too)

    def __init__(self, setup: ServerSetup, record: RunRecord, **keywords):
        """`keywords`: more of the library strategy's (an ensemble strategy's)."""
        cfg = setup.cfg
        super().__init__(model_fn=setup.new_classifier, seed=cfg.seed, device=setup.device,
                         fraction_train=cfg.fraction_train, min_train_nodes=MIN_CLIENTS,
                         min_available_nodes=1, client_key=self.partition_of,
                         aggregate_fn=Aggregator(cfg.aggregation),
                         num_examples_fn=lambda pid, n: self.membership.sample_size(pid, n),
                         observers=[self.record_round], **setup.client_keywords, **keywords)
        # Flower's client-side evaluation is off: personal-test-fraction asks the clients in
        # `evaluate_round`, by partition. (Said after the constructor, which would warn.)
        self.fraction_evaluate, self.min_evaluate_nodes = 0.0, 0
        self.setup, self.cfg, self.record = setup, cfg, record
        self.membership = Membership(setup, record)
        self.architectures = Architectures(setup)
        self.evaluation = Evaluation(setup, record, self.architectures, self.membership,
                                     self.personal_config)
        self._sent_at = 0.0
        self._sent_state: dict[str, torch.Tensor] = {}
        self.sampled: dict[int, int] = {}  # node id -> partition id of this round

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

    # --- before round 1 (the pre-FL stage is the library's `pre_fl`, once `discover` knows
    # the clients; a resumed run skips it: its checkpoint holds what the stage made)
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

    # --- the rounds: Flower's `start` runs the library's over a RoundGrid (server_app.run)
    def train_config(self) -> ConfigRecord:
        """How the clients train (`start`'s train_config; the library adds the round and
        its client seed)."""
        cfg = self.cfg
        return config_record(local_epochs=cfg.local_epochs, batch_size=cfg.batch_size,
                             lr=cfg.lr, flip=cfg.flip, random_crop=cfg.random_crop,
                             optimizer=cfg.optimizer, momentum=cfg.momentum)

    def known_clients(self) -> set:
        """Every partition of the federation (SCAFFOLD's N)."""
        return set(self.clients.partition_ids)

    def candidates(self, grid: Grid) -> tuple[dict, set]:
        """Every partition found, the absent ones skipped (fedgo_app.server.membership)."""
        return ({p: self.clients.by_partition[p].node_id for p in self.clients.partition_ids},
                set(self.absent))

    def node_of(self, reply: Message) -> int:
        return self.mailbox.node_of(reply)

    def arrays_for(self, key: int, arrays: ArrayRecord) -> ArrayRecord:
        return self._sent[self.architectures.of(key)] if self.architectures.heterogeneous \
            else arrays

    def template_of(self, key: int) -> dict[str, torch.Tensor]:
        return self._templates[self.architectures.of(key)]

    def configure_train(self, flower_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """The partitions that answer again rejoin, then the library's round."""
        server_round = self.run_round(flower_round)
        self.membership.refresh(grid, server_round, self.architectures.names)
        self._sent_state = arrays.to_torch_state_dict()  # theta_g, for colluding liars
        self._sent = {a: ArrayRecord(g) for a, g in
                      self.architectures.globals_of(self._sent_state).items()}
        messages = list(super().configure_train(flower_round, arrays, config, grid))
        pids = sorted(self.sampled.values())
        entry = self.record.round(server_round)
        entry["clients"] = pids
        if self.absent:
            entry.setdefault("replies", {})["absent"] = sorted(self.absent)
            log(WARNING, "round %d: partitions %s are absent from sampling", server_round,
                sorted(self.absent))
        self.count(server_round, "down", messages)
        log(INFO, "round %d: training on partitions %s", server_round, pids)
        self._sent_at, self._cpu_at = time.perf_counter(), time.process_time()
        return messages

    def count(self, server_round: int, way: str, messages: list[Message]) -> None:
        """The bytes the round sends (`way` "down") or its replies carry ("up"), by
        architecture too in a mixed federation."""
        self.record.sent("main_fl", way, payload_bytes(messages), server_round)
        if self.architectures.heterogeneous:
            entry = self.record.round(server_round)
            by_arch = entry.setdefault("bytes_by_architecture", {
                a: {"down": 0} for a in self.architectures.names})  # (down comes first)
            self.architectures.count(by_arch, way, messages, lambda m: self.sampled.get(
                m.metadata.dst_node_id if way == "down" else self.mailbox.node_of(m)))

    def aggregate_train(self, flower_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The library's round, timed and counted; partitions that missed the round are
        absent until they answer again (`record_round`)."""
        server_round = self.run_round(flower_round)
        replies = list(replies)
        self.record.time("client_training", time.perf_counter() - self._sent_at, server_round)
        self.count(server_round, "up", replies)
        self._templates = self.architectures.templates()
        return super().aggregate_train(flower_round, replies)

    def client_models(self, server_round: int, replies: Iterable[Message]) -> list[ClientModel]:
        """The library's usable replies, the colluders' (ALIE, IPM) as they would send them."""
        models = super().client_models(server_round, replies)
        if self.cfg.attack not in COLLUDING:
            return models
        liars = set(self.record.data["clients"]["byzantine"]["partitions"])
        return colluded_models(self.cfg, models, liars,
                               self.architectures.globals_of(self._sent_state),
                               self.architectures.of)

    def combine(self, server_round: int, models: list[ClientModel]) -> ArrayRecord | None:
        """The library's combination (`aggregate_fn`: the run's aggregator) of each
        architecture's models, joined; what the rule kept goes into the round's record."""
        start = time.perf_counter()
        averaged, info = self.architectures.combine(models, lambda group: (
            super(FedAvgStrategy, self).combine(server_round, group), self.aggregate_fn.selected),
            self.architectures.globals_of(self._sent_state),
            f"round {server_round}", self.cfg.aggregator)
        if info:
            self.record.round(server_round)["aggregation"] = info
        if averaged is not None:
            self.record.time("aggregation", time.perf_counter() - start, server_round)
        return averaged

    def record_round(self, report: RoundReport) -> None:
        """The round's replies tallied by partition (missing: no reply in time; failed: an
        error reply, the node or its ClientApp failed; rejected: one the checks left out),
        its train loss weighted as the models are averaged (by n_k; FedDisco's by p_k) and
        the clients' own compute (their sum, apart from waiting and transfer); who missed it
        is absent from sampling. (The pre-FL stage's report, round 0, is its strategy's to
        record.)"""
        if report.server_round == 0:
            return
        pid, usable = report.sampled, {m.node_id for m in report.clients}
        left = {str(pid[n]): why for n, why in report.left_out.items()
                if n in pid and n not in usable}  # (not a usable reply's duplicate)
        tally = reply_tally(pid.values(), [m.key for m in report.clients], left)
        if tally["missing"]:
            log(WARNING, "no reply in time from partitions %s", tally["missing"])
        self.record.round(report.server_round).setdefault("replies", {}).update(tally)
        self.absent.update([*tally["missing"], *map(int, tally["failed"])])
        if not report.clients:
            return
        reported = [(m.weight(self.weighted_by_key), m.metrics["train-loss"])
                    for m in report.clients
                    if isinstance(m.metrics.get("train-loss"), (int, float))]
        entry = self.record.round(report.server_round)
        entry["train_loss"] = (sum(w * loss for w, loss in reported)  # weighted as averaged
                               / sum(w for w, _ in reported)) if reported else float("nan")
        entry["client_seconds"] = sum(float(m.metrics.get("train-seconds", 0.0))
                                      for m in report.clients)

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
