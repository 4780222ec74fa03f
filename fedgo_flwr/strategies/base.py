"""What every strategy of the library shares on top of Flower's `FedAvg`: `start` as Flower
documents it, after the method's pre-FL stage; train replies checked one by one, a malformed
one left out of its round with the reason logged (Flower's `FedAvg` would end the run); the
usable ones averaged by n_k as FedAvg averages them (or combined by `aggregate_fn`); then the
method's server update. A method names the arrays and metrics its replies carry besides
FedAvg's, and the message type its clients answer.

The seams an app plugs into, each a constructor argument: reproducible sampling over stable
client keys (`client_key`, fedgo_flwr.sampling), the n_k a reply is weighted by
(`num_examples_fn`), the combination (`aggregate_fn`), the clients' method under any server
(`client_method`: SCAFFOLD's, FedUV's, FedGKD's; FedProx's by `proximal_mu`) and round
observers (`observers`, each given a `RoundReport`). An app that keeps its own directory of
clients overrides the round's small hooks, not the round: who is sampled (`candidates`), what
each client is sent (`arrays_for`) and its reply must fit (`template_of`), whom a reply
answers for (`node_of`) and how the usable models combine (`combine`)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from functools import cached_property
from logging import INFO, WARNING

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result
from flwr.serverapp.strategy.strategy_utils import sample_nodes
from torch import nn

from fedgo_flwr.aggregation import mean_of_replies
from fedgo_flwr.checks import check_keywords
from fedgo_flwr.observers import tell, watched
from fedgo_flwr.replies import payload_bytes, state_problem, train_reply_problem
from fedgo_flwr.sampling import ClientKeys, sample_clients
from fedgo_flwr.seeds import round_seed
from fedgo_flwr.strategies.messages import METHOD_KEY, training_problem
from fedgo_flwr.strategies.resume import carried_state, in_run_rounds, load_carried
from fedgo_flwr.strategies.rounds import FAILED, ClientModel, FailedRounds, RoundReport
from fedgo_flwr.train import resolve_device


class ServerUpdateFedAvg(FedAvg):
    """Flower's FedAvg, then a method's server update on the average.

    Parameters
    ----------
    model_fn : Callable[[], nn.Module]
        Builds the global model (the architecture of `initial_arrays`).
    seed : int (default: 0)
        Seeds what the server draws: the clients of each round (fedgo_flwr.sampling: the
        same clients a round for one seed), distillation batches, generators.
    device : str | torch.device | None (default: None)
        Where the server computes: None picks CUDA when visible, else the CPU.
    aggregate_fn : Callable[[list[RecordDict], str], ArrayRecord] | None (default: None)
        How the round's usable client models are combined, given their replies' contents and
        `weighted_by_key`: None is FedAvg's n_k-weighted mean, summed in float64
        (fedgo_flwr.aggregation.mean_of_replies); a robust rule of your own goes here
        (returning None keeps the global model for the round: too few models for it, say).
    client_key : Callable[[int], Hashable] | str | None (default: None)
        What a client is known by, for sampling and the order of the round's models: None,
        its node id; "partition-id", the partition id each node reports once from its
        `node_config` (`fedgo_flwr.client.register` answers); or a function of the node id.
    num_examples_fn : Callable[[key, int], int] | None (default: None)
        n_k, given the client's key and the `num-examples` its reply reports: None takes the
        report as it is; a policy of your own (a cap, a count known beforehand) goes here.
    proximal_mu : float (default: 0.0)
        Above 0, sent as "proximal-mu" in every train config, as Flower's `FedProx` sends
        it: the clients add FedProx's term (`fedgo_flwr.client.proximal_term`), under this
        strategy's server.
    client_method : fedgo_flwr.strategies.client_methods.ClientMethod | None (default: None)
        What the clients do beyond plain local training, under this strategy's server:
        `ControlVariates()` (SCAFFOLD's), `UniformVariance()` (FedUV's) or
        `HistoricalTeacher()` (FedGKD's); None, the user's train handler as it is. Its
        clients train with the library's loop (`fedgo_flwr.client.register` adds it): `start`
        then needs "lr", "local-epochs" and "optimizer" in train_config.
    observers : Iterable[Callable[[RoundReport], None]] (default: ())
        Called with each round's `RoundReport` once the round is aggregated (and the pre-FL
        stage's, round 0); one with `started(strategy)`, `evaluated(round, metrics)` or
        `finished()` hears those too (fedgo_flwr.observers: TensorBoard, MLflow).
    max_failed_rounds : int | None (default: 3)
        A round whose replies are all unusable logs the first client's error; after this
        many such rounds in a row `start` raises with it (a run that cannot learn should not
        end with empty metrics). None never raises.
    **kwargs
        Every keyword Flower's `FedAvg` takes (fraction_train, min_available_nodes, ...).
    """

    reported: tuple[str, ...] = ()  # reply metrics kept out of Flower's averaging
    # train-config keys the method's own client step reads in place of the user's train
    # handler (DaFKD, FedGen, FedBPG): `start` refuses a train_config without them
    client_training: tuple[str, ...] = ()
    own_client_step = False  # its clients train with a step of its own that takes no
    # `client_method` (FedGen's, FedTGP's; DaFKD's step takes one)
    train_type = "train"  # the train messages' type (a method's own: "train.dafkd", ...)
    # What the method carries from one round to the next (modules, optimisers and schedulers
    # by their state_dict, anything else as is): what `state_dict` holds beside the model.
    carried: tuple[str, ...] = ()

    def __init__(self, *, model_fn: Callable[[], nn.Module], seed: int = 0,
                 device: str | torch.device | None = None,
                 aggregate_fn: Callable[[list[RecordDict], str], ArrayRecord] | None = None,
                 client_key: Callable[[int], Hashable] | str | None = None,
                 num_examples_fn: Callable[[object, int], int] | None = None,
                 proximal_mu: float = 0.0, client_method=None,
                 observers: Iterable[Callable[[RoundReport], None]] = (),
                 max_failed_rounds: int | None = 3, **kwargs) -> None:
        check_keywords(self, ServerUpdateFedAvg, kwargs, FedAvg)
        super().__init__(**kwargs)
        if not (isinstance(proximal_mu, (int, float)) and proximal_mu >= 0):
            raise ValueError(f"proximal_mu is {proximal_mu!r}; allowed: a number >= 0")
        self.failures = FailedRounds(max_failed_rounds)
        self.model_fn, self.seed = model_fn, seed
        self.device = resolve_device(str(device)) if device is not None else resolve_device()
        self.aggregate_fn = aggregate_fn or mean_of_replies
        self.client_keys = ClientKeys(client_key)
        self.num_examples_fn = num_examples_fn
        self.proximal_mu = float(proximal_mu)
        self.client_method = client_method
        if self.own_client_step and (client_method is not None or self.proximal_mu):
            raise ValueError(f"{type(self).__name__}'s clients train with a step of its own, "
                             "which takes no client_method or proximal_mu")
        if client_method is not None:
            client_method.bind(self)
        self.observers = list(observers)
        self.sampled: dict[int, object] = {}  # node id -> key, this round's A_t
        self.num_rounds = 1  # set by start(): a schedule's T
        self.rounds_done = 0  # rounds before this `start` (a resumed run's: load_state_dict)
        self.current_round = 0  # the run's round being configured or aggregated (0: pre-FL)
        self.last_round = 0  # the run's round last aggregated
        self.grid: Grid | None = None  # `start`'s

    @cached_property
    def template(self) -> dict[str, torch.Tensor]:
        """The global model's arrays (names, shapes): what a reply's model must match."""
        with torch.random.fork_rng(devices=[]):  # leaves the caller's random state as it was
            return self.model_fn().state_dict()

    # --- the run
    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3,
              timeout: float = 3600, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
              ) -> Result:
        """Flower's `Strategy.start`, after the method's pre-FL stage (`pre_fl`); after
        `load_state_dict`, the run's next `num_rounds` rounds (evaluate_fn given the run's
        round), without the stage or evaluating again the model it resumes from."""
        if problem := state_problem(initial_arrays, self.template):
            raise ValueError(f"initial_arrays do not fit model_fn's model: {problem}")
        self.check_training(train_config or ConfigRecord())
        self.num_rounds = self.rounds_done + num_rounds
        self.grid = grid  # what the pre-FL stage, the guard and late stages send through
        tell(self.observers, "started", self)  # trackers: the settings, then every round
        try:
            if not self.rounds_done:  # (a resumed run's stage came before its checkpoint)
                self.pre_fl(grid, timeout)
            return super().start(grid=grid, initial_arrays=initial_arrays,
                                 num_rounds=num_rounds, timeout=timeout,
                                 train_config=train_config, evaluate_config=evaluate_config,
                                 evaluate_fn=watched(self.observers, in_run_rounds(
                                     evaluate_fn, self.rounds_done)))
        finally:
            tell(self.observers, "finished")

    def run_round(self, flower_round: int) -> int:
        """The run's round (`current_round`) of Flower's round of this `start`."""
        self.current_round = self.rounds_done + flower_round
        return self.current_round

    def check_training(self, train_config: ConfigRecord) -> None:
        """Where the method's client step replaces the user's train handler, it trains as the
        user's does only if train_config says how: refuse one that does not."""
        training_problem(type(self).__name__, (*self.client_training, *(
            self.client_method.client_training if self.client_method else ())), train_config)

    def pre_fl(self, grid: Grid, timeout: float) -> None:
        """What runs before round 1 (FedGO: generator out, discriminators back)."""

    # --- the round
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """FedAvg's, with A_t drawn by the seed and the round over the clients' keys
        (fedgo_flwr.sampling); each message of type `train_type` (or the clients' method's),
        with the round's client seed "seed" in the config unless the caller's `train_config`
        has one, and `train_payload` (`server_round`: Flower's, as `run_round` takes it)."""
        server_round = self.run_round(server_round)
        self.grid = grid
        if self.fraction_train == 0.0:
            return []
        pool, absent = self.candidates(grid)
        chosen = sample_clients(pool, self.fraction_train, self.seed, server_round,
                                self.min_train_nodes, absent)
        self.sampled = {pool[k]: k for k in chosen}
        log(INFO, "configure_train: sampled clients %s (of %d)", chosen, len(pool))
        # the round's client seed where the caller gives none (a copy of the caller's record)
        extra, settings = self.train_payload(server_round, arrays)
        config = ConfigRecord({"seed": round_seed(self.seed, server_round), **config,
                               "server-round": server_round, **settings})
        kind = (self.client_method.message_type
                if self.client_method is not None and self.train_type == "train"
                else self.train_type)
        return [Message(RecordDict({self.arrayrecord_key: self.arrays_for(k, arrays), **extra,
                                    self.configrecord_key: config}),
                        dst_node_id=n, message_type=kind) for n, k in self.sampled.items()]

    def candidates(self, grid: Grid) -> tuple[dict, set]:
        """The clients a round samples from, {key: node id}, and the keys it skips while
        still counting them in K (`sample_clients`' `absent`): every connected node's key,
        none skipped. An app that keeps its own directory of clients overrides it."""
        _, nodes = sample_nodes(grid, self.min_available_nodes, 0)
        return {k: n for n, k in self.client_keys.keys(grid, nodes).items()}, set()

    def arrays_for(self, key: object, arrays: ArrayRecord) -> ArrayRecord:
        """The model client `key` is sent: the global one (or its architecture's part)."""
        return arrays

    def template_of(self, key: object) -> dict[str, torch.Tensor]:
        """The arrays (names, shapes) of client `key`'s model: the global model's."""
        return self.template

    def train_payload(self, server_round: int, arrays: ArrayRecord
                      ) -> tuple[dict[str, ArrayRecord], dict]:
        """What every train message carries besides the model `arrays` and the caller's
        config: (ArrayRecords, config entries). FedAvg's: "proximal-mu" where set and what
        the clients' method sends; a strategy adds its own to `super()`'s (DaFKD's G and
        head, FedGen's G_w, ...)."""
        extra, settings = {}, {}
        if self.proximal_mu:
            settings["proximal-mu"] = self.proximal_mu
        if self.client_method is not None:
            extra, more = self.client_method.payload(server_round, arrays)
            settings.update({METHOD_KEY: self.client_method.name, **more})
        return extra, settings

    def notify(self, report) -> None:  # each observer, given a round's or pre-FL's report
        for observe in self.observers:
            observe(report)

    def method_step(self, server_round: int, report: RoundReport) -> None:
        """The clients' method's server step on the round's average (SCAFFOLD's x and c),
        before the server update starts from it; its metrics join the round's."""
        if self.client_method is not None:
            report.averaged, stepped = self.client_method.server_step(
                server_round, report.averaged, report.clients)
            report.metrics.update(stepped)

    def known_clients(self) -> set:
        """Every client key the federation has shown so far (SCAFFOLD's N)."""
        self.known = getattr(self, "known", set()) | set(
            self.client_keys.keys(self.grid, self.grid.get_node_ids()).values())
        return self.known

    def key_of(self, node_id: int) -> object:
        """The client's stable key (the node id where none is known)."""
        return self.sampled.get(node_id, node_id)

    def extra_arrays(self, server_round: int) -> dict[str, dict[str, torch.Tensor] | None]:
        """The ArrayRecords a train reply carries besides the model: name -> the arrays
        (names, shapes) it must have (DaFKD's head and G), or None where the method checks
        it itself (FedTGP's prototypes), and the clients' method's."""
        return self.client_method.reply_templates() if self.client_method else {}

    def node_of(self, reply: Message) -> int:
        """The node a reply answers for (an app's grid may attribute errors of its own)."""
        return reply.metadata.src_node_id

    def reply_problem(self, reply: Message, extras: dict | None = None) -> str | None:
        """Why a train reply cannot be used, or None: one MetricRecord with a positive n_k,
        the model fitting `template_of` its client, each of `extras` (`extra_arrays`) there
        and fitting its template; a method adds checks of its own."""
        return train_reply_problem(reply.content, self.arrayrecord_key,
                                   self.template_of(self.key_of(self.node_of(reply))),
                                   extras or {}, self.weighted_by_key)

    def client_models(self, server_round: int, replies: Iterable[Message]
                      ) -> list[ClientModel]:
        """The usable train replies; each other is logged with why it is left out (those
        of error replies start with `FAILED`)."""
        models, seen, extras = [], set(), self.extra_arrays(server_round)
        self.left_out: dict[int, str] = {}
        for reply in replies:
            node = self.node_of(reply)
            key = self.key_of(node)
            why = (FAILED + str(reply.error.reason) if reply.has_error()
                   else "not sampled this round" if node not in self.sampled
                   else "duplicate reply" if node in seen else self.reply_problem(reply, extras))
            if why:
                log(WARNING, "train reply of node %d%s left out: %s", node,
                    f" (client {key})" if key != node else "", why)
                self.left_out.setdefault(node, why)
                continue
            seen.add(node)
            content = reply.content
            (name, metrics), = content.metric_records.items()
            n_k = int(metrics[self.weighted_by_key])
            if self.num_examples_fn is not None:
                n_k = int(self.num_examples_fn(key, n_k))
            averaged = MetricRecord({k: v for k, v in metrics.items() if k not in self.reported}
                                    | {self.weighted_by_key: n_k})
            model = RecordDict({self.arrayrecord_key: content.array_records[self.arrayrecord_key],
                                name: averaged})
            models.append(ClientModel(node, n_k, model, dict(metrics),
                                      {k: content.array_records[k] for k in extras}, key))
        return sorted(models, key=lambda m: m.key)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """theta_s^t = sum_k n_k theta_k^t / sum_k n_k (or `aggregate_fn`), then the server
        update; the round's metrics: the clients' (by n_k) and the update's (`server_round`:
        Flower's)."""
        server_round = self.last_round = self.run_round(server_round)
        replies = list(replies)
        models = self.client_models(server_round, replies)
        log(INFO, "aggregate_train: %d usable client model(s)", len(models))
        self.failures.count(server_round, len(replies), len(models), self.left_out)
        report = RoundReport(server_round, dict(self.sampled), models, self.left_out, None,
                             None, {}, bytes={"up": payload_bytes(replies)})
        if models:
            report.averaged = self.combine(server_round, models)
        if report.averaged is not None:
            metrics = self.train_metrics_aggr_fn([m.content for m in models],
                                                 self.weighted_by_key)
            self.method_step(server_round, report)
            report.arrays, info = self.server_update(server_round, report.averaged, models,
                                                     report)
            info = {**report.metrics, **info}
            for key, value in info.items():
                metrics[key] = value
            report.metrics = dict(metrics)
        self.notify(report)
        return (report.arrays, metrics) if report.averaged is not None else (None, None)

    def combine(self, server_round: int, models: list[ClientModel]) -> ArrayRecord | None:
        """The usable models combined by `aggregate_fn` (None: the global model stays)."""
        return self.aggregate_fn([m.content for m in models], self.weighted_by_key)

    def server_update(self, server_round: int, averaged: ArrayRecord,
                      models: list[ClientModel], report: RoundReport
                      ) -> tuple[ArrayRecord, dict[str, float]]:
        """What the server does after averaging: (the new global model, round metrics); what
        observers should see besides goes into `report.details` and `report.seconds`."""
        return averaged, {}

    # --- checkpoints (fedgo_flwr.strategies.resume)
    def state_dict(self) -> dict:
        """What a run resumed after the last round needs besides the global model: that
        round, what the method carries (`carried`), the clients' method's state."""
        return carried_state(self)

    def load_state_dict(self, state: dict) -> None:
        """Go on from a `state_dict()`: the next `start` (given the global model of that
        round) runs the rounds after it."""
        load_carried(self, state)

    def load(self, state: dict[str, torch.Tensor]) -> nn.Module:
        """The global model's architecture with these weights."""
        model = self.model_fn()
        model.load_state_dict(state)
        return model

