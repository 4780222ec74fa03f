"""What the strategies' messages hold, both ways: the train config's keys the library's client
loop reads, a plain train message made a method's own (`retyped`), a client's seed, and the
reply of a method's client step (`model_reply`)."""

from __future__ import annotations

from collections.abc import Iterable

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from torch import nn

from fedgo_flwr.seeds import client_seed
from fedgo_flwr.train import OPTIMIZERS

METHOD_KEY = "client-method"  # the train config's entry naming the clients' method
# what the library's client loop must be told (`client_training`), and what else it reads,
# with its defaults
CLIENT_TRAINING = ("lr", "local-epochs", "optimizer")
OPTIONAL_TRAINING = ("batch-size (64)", "momentum (0.9)", "flip (false)", "random-crop (0)",
                     "train-loss-key ('train-loss')")


def training_problem(strategy: str, keys: Iterable[str], train_config: ConfigRecord) -> None:
    """Raise unless train_config tells the library's client loop, which replaces the user's
    train handler, how to train as the user's does (`keys`: what it must be told)."""
    needed = dict.fromkeys(keys)
    missing = [k for k in needed if k not in train_config]
    if missing:
        raise ValueError(
            f"{strategy}'s clients train with the library's loop in place of your train "
            f"handler, reading {', '.join(needed)} from train_config (and, where given, "
            f"{', '.join(OPTIONAL_TRAINING)}); it lacks {', '.join(missing)}: pass what your "
            "own training uses, e.g. start(..., train_config=ConfigRecord({'lr': 0.05, "
            "'local-epochs': 1, 'optimizer': 'sgd'}))")
    if "optimizer" in needed and train_config["optimizer"] not in OPTIMIZERS:
        raise ValueError(f"train_config's optimizer is {train_config['optimizer']!r}; "
                         f"allowed: {', '.join(OPTIMIZERS)}")


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


def loss_named(result: dict, message: Message) -> dict:
    """The training's metrics with its loss under the config's "train-loss-key" (the name the
    user's own train handler reports it by)."""
    name = str(message.content.config_records["config"].get("train-loss-key", "train-loss"))
    return {(name if k == "train-loss" else k): v for k, v in result.items()}


def model_reply(message: Message, model: nn.Module, num_examples: int, result: dict,
                arrays: dict[str, ArrayRecord] | None = None,
                metrics: dict | None = None) -> Message:
    """The reply of a method's own client step: ArrayRecord "arrays" (the trained model) and
    any more `arrays`, MetricRecord "metrics" (num-examples, the training's `result` with its
    loss named by the config's "train-loss-key", and any more `metrics`)."""
    return Message(RecordDict({
        "arrays": ArrayRecord(model.cpu().state_dict()), **(arrays or {}),
        "metrics": MetricRecord({"num-examples": num_examples, **loss_named(result, message),
                                 **(metrics or {})})}), reply_to=message)
