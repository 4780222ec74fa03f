"""What FedGen and FedBPG share: a FedAvg whose clients train with the library's own loop,
on a message type of the method's own (so that a user's plain `train` handler is untouched),
and upload their label counter c_k with their model (FedGen's Algorithm 1, line 11; FedBPG's
|D_k^y|), from which the server builds the label prior p^(y) and each client's share of each
label, lambda_k^y = c_k^y / sum_i c_i^y.

A train reply is used only when its model fits the global model, its n_k is a positive
number and its `label-counts` are C non-negative integers summing to n_k; any other reply is
left out of the round, with the reason in the server's log."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from logging import INFO, WARNING

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords
from torch import nn

from fedgo_flwr.seeds import client_seed, round_seed
from fedgo_flwr.strategies.ensemble import ClientModel, examples_problem, state_problem
from fedgo_flwr.train import resolve_device, train_classifier

LABEL_COUNTS = "label-counts"  # the reply's metric: c_k, C integers summing to n_k
# What a client's local training reads from the message's config, and its value where absent.
TRAINING = {"local-epochs": 1, "batch-size": 64, "lr": 1e-3, "flip": True, "random-crop": 0,
            "optimizer": "adam", "momentum": 0.9}


def label_counts(y: torch.Tensor, num_classes: int) -> list[int]:
    """c_k: how many of the labels y [N] are each of the C classes."""
    return torch.bincount(y.long(), minlength=num_classes).tolist()


def label_counts_problem(metrics, num_classes: int,
                         examples_key: str = "num-examples") -> str | None:
    """Why a train reply's `label-counts` (the client's label counter c_k, which FedGen and
    FedBPG weight clients by) are unusable: not num_classes non-negative integers summing to
    the reply's n_k; None when usable."""
    counts, n = metrics.get(LABEL_COUNTS), metrics[examples_key]
    ok = (isinstance(counts, list) and len(counts) == num_classes
          and all(isinstance(c, int) and c >= 0 for c in counts) and sum(counts) == n)
    return None if ok else (f"label-counts {counts!r} are not {num_classes} "
                            f"non-negative integers summing to n_k = {n}")


def label_prior(counts: torch.Tensor) -> torch.Tensor:
    """p^(y), [C]: the round's label counts [K, C] summed over the clients, normalised."""
    counts = counts.to(torch.float64)
    return (counts.sum(0) / counts.sum()).float()


def num_classes_of(model: nn.Module, example: torch.Tensor, head: bool = False) -> int:
    """C: the width of the model's logits (in evaluation mode) for `example`, an input or,
    with `head`, a latent z for `model.head`."""
    model.eval()
    with torch.no_grad():
        return int((model.head if head else model)(example).shape[-1])


@dataclass
class CountedModel(ClientModel):
    """theta_k^t of one usable reply with its label counts c_k, and the method's own metrics
    that are not averaged by n_k as Flower averages the others (FedBPG's fusion-alpha)."""
    label_counts: list[int] = field(default_factory=list)
    reported: dict[str, float] = field(default_factory=dict)


class LabelCountFedAvg(FedAvg):
    """FedAvg whose train messages are of type `train_type` and whose train replies carry
    the clients' label counts; a method adds its server update after the average
    (`server_update`) and what its train messages carry (`train_payload`).

    Parameters
    ----------
    model_fn : Callable[[], nn.Module]
        Builds the global model (the architecture of `initial_arrays`).
    num_classes : int
        C, the length of every client's label counts.
    seed : int (default: 0)
        Seeds the server's generator and its draws, and the clients' training where the
        caller's train config has no "seed".
    device : str | torch.device | None (default: None)
        Where the server trains: None picks CUDA when visible, else the CPU.
    **kwargs
        Every keyword Flower's `FedAvg` takes (fraction_train, min_available_nodes, ...).
    """

    train_type = "train"
    reported: tuple[str, ...] = ()  # reply metrics the method takes out of Flower's averaging

    def __init__(self, *, model_fn: Callable[[], nn.Module], num_classes: int, seed: int = 0,
                 device: str | torch.device | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        if num_classes < 2:
            raise ValueError(f"num_classes is {num_classes}; a classifier needs at least 2")
        self.model_fn, self.num_classes, self.seed = model_fn, num_classes, seed
        self.device = resolve_device(str(device)) if device is not None else resolve_device()
        self.template = model_fn().state_dict()
        self.num_rounds = 1  # set by start()

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3,
              timeout: float = 3600, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
              ) -> Result:
        """Flower's `Strategy.start`, once `initial_arrays` are known to fit `model_fn`."""
        if problem := state_problem(initial_arrays, self.template):
            raise ValueError(f"initial_arrays do not fit model_fn's model: {problem}")
        self.num_rounds = num_rounds
        return super().start(grid=grid, initial_arrays=initial_arrays, num_rounds=num_rounds,
                             timeout=timeout, train_config=train_config,
                             evaluate_config=evaluate_config, evaluate_fn=evaluate_fn)

    # --- what the clients receive
    def train_payload(self, server_round: int) -> tuple[dict[str, ArrayRecord], dict]:
        """(ArrayRecords, config entries) a train message carries besides FedAvg's."""
        return {}, {}

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> list[Message]:
        """FedAvg's sampling; the messages as `train_type`, with the method's payload, C and
        the round's seed (where the caller's config has none)."""
        extra, settings = self.train_payload(server_round)
        return self.retyped(super().configure_train(server_round, arrays, config, grid),
                            self.train_type, extra, {"num-classes": self.num_classes,
                                                     **settings},
                            {"seed": round_seed(self.seed, server_round)})

    def retyped(self, messages: Iterable[Message], message_type: str,
                arrays: dict[str, ArrayRecord], settings: dict, defaults: dict
                ) -> list[Message]:
        """FedAvg's `messages` as `message_type`, with more ArrayRecords, and `defaults`
        under and `settings` over the caller's config."""
        messages = list(messages)
        if not messages:
            return []
        content, key = messages[0].content, self.configrecord_key
        config = ConfigRecord({**defaults, **content.config_records[key], **settings})
        record = RecordDict({**content.array_records, **arrays, key: config})
        return [Message(record, dst_node_id=m.metadata.dst_node_id, message_type=message_type)
                for m in messages]

    # --- the round
    def reply_problem(self, reply: Message) -> str | None:
        """Why a train reply cannot be used, or None."""
        content = reply.content
        if len(content.metric_records) != 1:
            return f"{len(content.metric_records)} MetricRecords, expected one"
        (metrics,) = content.metric_records.values()
        if self.arrayrecord_key not in content.array_records:
            return f"no ArrayRecord {self.arrayrecord_key!r}"
        return (examples_problem(metrics, self.weighted_by_key)
                or label_counts_problem(metrics, self.num_classes, self.weighted_by_key)
                or state_problem(content.array_records[self.arrayrecord_key], self.template))

    def client_models(self, replies: Iterable[Message]) -> list[CountedModel]:
        """The usable train replies; each other is logged with why it is left out."""
        models, seen = [], set()
        for reply in replies:
            node = reply.metadata.src_node_id
            why = ("failed: " + str(reply.error.reason) if reply.has_error()
                   else "duplicate reply" if node in seen else self.reply_problem(reply))
            if why:
                log(WARNING, "train reply of node %d left out: %s", node, why)
                continue
            seen.add(node)
            (name, metrics), = reply.content.metric_records.items()
            own = (LABEL_COUNTS, *self.reported)
            content = RecordDict({
                self.arrayrecord_key: reply.content.array_records[self.arrayrecord_key],
                name: MetricRecord({k: v for k, v in metrics.items() if k not in own})})
            models.append(CountedModel(
                node, int(metrics[self.weighted_by_key]), content,
                label_counts=list(metrics[LABEL_COUNTS]),
                reported={k: metrics[k] for k in self.reported if k in metrics}))
        return models

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """omega-bar = sum_k n_k theta_k / sum_k n_k over the usable replies, then the
        method's server update; the round's metrics are the clients' (averaged by n_k, as
        Flower's FedAvg averages them) and the server update's."""
        models = self.client_models(replies)
        log(INFO, "aggregate_train: %d usable client model(s)", len(models))
        if not models:
            return None, None
        contents = [m.content for m in models]
        averaged = aggregate_arrayrecords(contents, self.weighted_by_key)
        metrics = self.train_metrics_aggr_fn(contents, self.weighted_by_key)
        arrays, info = self.server_update(server_round, averaged, models)
        for key, value in info.items():
            metrics[key] = value
        return arrays, metrics

    def server_update(self, server_round: int, averaged: ArrayRecord,
                      models: list[CountedModel]) -> tuple[ArrayRecord, dict[str, float]]:
        """What the server does after averaging: (the new global model, round metrics)."""
        return averaged, {}

    def counts(self, models: list[CountedModel]) -> torch.Tensor:
        """The round's label counts, [K, C]."""
        return torch.tensor([m.label_counts for m in models], dtype=torch.float64)

    def load(self, state: dict[str, torch.Tensor]) -> nn.Module:
        model = self.model_fn()
        model.load_state_dict(state)
        return model


# ---------------------------------------------------------------------------- client side
def message_seed(message: Message) -> int:
    """This client's seed: the config's "seed" (0 without) made distinct by its node id."""
    conf = message.content.config_records["config"]
    return client_seed(int(conf.get("seed", 0)), message.metadata.dst_node_id % 100_000)


def train_as_configured(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                        conf: ConfigRecord, *, seed: int, device: torch.device,
                        extra_loss: Callable[[nn.Module], torch.Tensor] | None = None
                        ) -> dict[str, float]:
    """ClientUpdate: `model` trained on (x, y) with the config's "local-epochs", "batch-size",
    "lr", "flip", "random-crop", "optimizer" and "momentum" (TRAINING's values where
    absent), `extra_loss(model)` added to every minibatch's loss."""
    s = {k: conf.get(k, default) for k, default in TRAINING.items()}
    return train_classifier(model, x, y, epochs=int(s["local-epochs"]),
                            batch_size=int(s["batch-size"]), lr=float(s["lr"]),
                            flip=bool(s["flip"]), crop=int(s["random-crop"]),
                            optimizer=str(s["optimizer"]), momentum=float(s["momentum"]),
                            seed=seed, device=device, extra_loss=extra_loss)


def trained_reply(message: Message, model: nn.Module, y: torch.Tensor, result: dict,
                  num_classes: int) -> Message:
    """The reply to a train message: ArrayRecord "arrays" (the trained model) and MetricRecord
    "metrics" (num-examples, the training's metrics and label-counts)."""
    metrics = {"num-examples": len(y), **result, LABEL_COUNTS: label_counts(y, num_classes)}
    return Message(RecordDict({"arrays": ArrayRecord(model.cpu().state_dict()),
                               "metrics": MetricRecord(metrics)}), reply_to=message)
