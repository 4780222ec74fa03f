"""What every strategy of the library shares on top of Flower's `FedAvg`: `start` as Flower
documents it, after the method's pre-FL stage; train replies checked one by one, a malformed
one left out of its round with the reason logged (Flower's `FedAvg` would end the run); the
usable ones averaged by n_k as FedAvg averages them (or combined by `aggregate_fn`); then the
method's server update. A method names the arrays and metrics its replies carry besides
FedAvg's, and the message type its clients answer."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from logging import INFO, WARNING

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords
from torch import nn

from fedgo_flwr.seeds import client_seed
from fedgo_flwr.train import resolve_device


@dataclass
class ClientModel:
    """theta_k^t of one usable train reply: its node, n_k, the model and the metrics FedAvg
    averages (`content`), every metric it sent, and the other arrays the strategy asked for
    (DaFKD's discriminator head and generator)."""
    node_id: int
    num_examples: int
    content: RecordDict
    metrics: dict = field(default_factory=dict)
    extras: dict[str, ArrayRecord] = field(default_factory=dict)

    @property
    def state(self) -> dict[str, torch.Tensor]:
        return next(iter(self.content.array_records.values())).to_torch_state_dict()


def state_problem(arrays: ArrayRecord | None, template: dict[str, torch.Tensor]) -> str | None:
    """Why `arrays` cannot be loaded as a model shaped like `template`, or None."""
    if arrays is None:
        return "no ArrayRecord"
    state = arrays.to_torch_state_dict()
    if set(state) != set(template):
        missing, unexpected = sorted(set(template) - set(state)), sorted(set(state) - set(template))
        return (f"array names differ from the model's (missing {missing[:3]}, unexpected "
                f"{unexpected[:3]})")
    for name, t in template.items():
        if state[name].shape != t.shape:
            return f"{name} has shape {tuple(state[name].shape)}, expected {tuple(t.shape)}"
        if state[name].is_floating_point() and not torch.isfinite(state[name]).all():
            return f"{name} holds NaN or infinite values"
    return None


def examples_problem(metrics: MetricRecord | None, key: str) -> str | None:
    value = None if metrics is None else metrics.get(key)
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return f"metric {key!r} is {value!r}, not a positive number"
    return None


def retyped(messages: Iterable[Message], message_type: str, arrays: dict[str, ArrayRecord],
            settings: dict, config_key: str = "config", defaults: dict | None = None
            ) -> list[Message]:
    """FedAvg's `messages` as `message_type` (a method's own, so that a user's plain handler
    is untouched), with more ArrayRecords, and `defaults` under and `settings` over the
    caller's config."""
    out = []
    for m in messages:
        content = m.content
        config = ConfigRecord({**(defaults or {}), **content.config_records[config_key],
                               **settings})
        out.append(Message(RecordDict({**content.array_records, **arrays, config_key: config}),
                           dst_node_id=m.metadata.dst_node_id, message_type=message_type))
    return out


def message_seed(message: Message) -> int:
    """This client's seed: the config's "seed" (0 without) made distinct by its node id."""
    conf = message.content.config_records["config"]
    return client_seed(int(conf.get("seed", 0)), message.metadata.dst_node_id % 100_000)


class ServerUpdateFedAvg(FedAvg):
    """Flower's FedAvg, then a method's server update on the average.

    Parameters
    ----------
    model_fn : Callable[[], nn.Module]
        Builds the global model (the architecture of `initial_arrays`).
    seed : int (default: 0)
        Seeds what the server draws (distillation batches, generators).
    device : str | torch.device | None (default: None)
        Where the server computes: None picks CUDA when visible, else the CPU.
    aggregate_fn : Callable[[list[RecordDict], str], ArrayRecord] | None (default: None)
        How the round's usable client models are combined, given their replies' contents and
        `weighted_by_key`: None is FedAvg's n_k-weighted mean (Flower's
        `aggregate_arrayrecords`); a robust rule of your own goes here.
    **kwargs
        Every keyword Flower's `FedAvg` takes (fraction_train, min_available_nodes, ...).
    """

    reported: tuple[str, ...] = ()  # reply metrics kept out of Flower's averaging

    def __init__(self, *, model_fn: Callable[[], nn.Module], seed: int = 0,
                 device: str | torch.device | None = None,
                 aggregate_fn: Callable[[list[RecordDict], str], ArrayRecord] | None = None,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.model_fn, self.seed = model_fn, seed
        self.device = resolve_device(str(device)) if device is not None else resolve_device()
        self.aggregate_fn = aggregate_fn or aggregate_arrayrecords
        self.num_rounds = 1  # set by start(): a schedule's T

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
        """Flower's `Strategy.start`, after the method's pre-FL stage (`pre_fl`)."""
        if problem := state_problem(initial_arrays, self.template):
            raise ValueError(f"initial_arrays do not fit model_fn's model: {problem}")
        self.num_rounds = num_rounds
        self.pre_fl(grid, timeout)
        return super().start(grid=grid, initial_arrays=initial_arrays, num_rounds=num_rounds,
                             timeout=timeout, train_config=train_config,
                             evaluate_config=evaluate_config, evaluate_fn=evaluate_fn)

    def pre_fl(self, grid: Grid, timeout: float) -> None:
        """What runs before round 1 (FedGO: generator out, discriminators back)."""

    # --- the round
    def extra_arrays(self, server_round: int) -> tuple[str, ...]:
        """The ArrayRecords a train reply carries besides the model (DaFKD's)."""
        return ()

    def reply_problem(self, reply: Message, extras: tuple[str, ...] = ()) -> str | None:
        """Why a train reply cannot be used, or None; a method adds checks of its own."""
        content = reply.content
        if len(content.metric_records) != 1:
            return f"{len(content.metric_records)} MetricRecords, expected one"
        (metrics,) = content.metric_records.values()
        missing = [k for k in (self.arrayrecord_key, *extras) if k not in content.array_records]
        if missing:
            return f"no ArrayRecord {missing}"
        return (examples_problem(metrics, self.weighted_by_key)
                or state_problem(content.array_records[self.arrayrecord_key], self.template))

    def client_models(self, server_round: int, replies: Iterable[Message]
                      ) -> list[ClientModel]:
        """The usable train replies; each other is logged with why it is left out."""
        models, seen, extras = [], set(), self.extra_arrays(server_round)
        for reply in replies:
            node = reply.metadata.src_node_id
            why = ("failed: " + str(reply.error.reason) if reply.has_error()
                   else "duplicate reply" if node in seen else self.reply_problem(reply, extras))
            if why:
                log(WARNING, "train reply of node %d left out: %s", node, why)
                continue
            seen.add(node)
            content = reply.content
            (name, metrics), = content.metric_records.items()
            averaged = MetricRecord({k: v for k, v in metrics.items() if k not in self.reported})
            model = RecordDict({self.arrayrecord_key: content.array_records[self.arrayrecord_key],
                                name: averaged})
            models.append(ClientModel(node, int(metrics[self.weighted_by_key]), model,
                                      dict(metrics), {k: content.array_records[k] for k in extras}))
        return models

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """theta_s^t = sum_k n_k theta_k^t / sum_k n_k (or `aggregate_fn`), then the server
        update; the round's metrics: the clients' (averaged by n_k) and the update's."""
        models = self.client_models(server_round, replies)
        log(INFO, "aggregate_train: %d usable client model(s)", len(models))
        if not models:
            return None, None
        contents = [m.content for m in models]
        averaged = self.aggregate_fn(contents, self.weighted_by_key)
        metrics = self.train_metrics_aggr_fn(contents, self.weighted_by_key)
        arrays, info = self.server_update(server_round, averaged, models)
        for key, value in info.items():
            metrics[key] = value
        return arrays, metrics

    def server_update(self, server_round: int, averaged: ArrayRecord,
                      models: list[ClientModel]) -> tuple[ArrayRecord, dict[str, float]]:
        """What the server does after averaging: (the new global model, round metrics)."""
        return averaged, {}

    def load(self, state: dict[str, torch.Tensor]) -> nn.Module:
        """The global model's architecture with these weights."""
        model = self.model_fn()
        model.load_state_dict(state)
        return model
