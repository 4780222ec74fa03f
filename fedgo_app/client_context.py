"""The client side: what a client handler sees (the run's config and this node's partition
S_k) and how it replies. Handlers are `handler(message, local) -> reply`, registered with their
strategy; the ClientApp builds the `Local` of each message."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from torch import nn

from fedgo_flwr.architectures import architecture_of
from fedgo_app.data import client_data, dataset
from fedgo_app.data.folder import load_site
from fedgo_flwr.models import create_classifier
from fedgo_flwr.seeds import client_seed
from fedgo_flwr.train import resolve_device

# The run's fedgo_app.config.Config, not imported: the config imports the registries, which
# import this module (no import circle, not even one for annotations).
Config = Any


@dataclass
class Local:
    cfg: Config
    partition_id: int
    num_partitions: int
    x: torch.Tensor  # uint8 images of S_k
    y: torch.Tensor
    classes: tuple[str, ...]  # class names in label order (the server checks them)
    device: torch.device
    model: str = ""  # this client's architecture (fedgo_flwr/architectures.py)
    # its personal test split (personal-test-fraction), held out of x, y
    test_x: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.uint8))
    test_y: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long))
    # what this node keeps from one message of the run to the next (Flower's context.state):
    # a personalising strategy's own model
    state: RecordDict = field(default_factory=RecordDict)

    @classmethod
    def of(cls, context: Context, cfg: Config) -> "Local":
        """This node's view of the run `cfg` (built from `context.run_config`): its partition
        of the run's dataset, or, with `--node-config dataset-path=...`, its own folder."""
        try:
            pid = int(context.node_config["partition-id"])
            k = int(context.node_config["num-partitions"])
        except KeyError as missing:
            raise RuntimeError(f"node config lacks {missing}: start the SuperNode with "
                               "--node-config \"partition-id=<i> num-partitions=<K>\"") from None
        model = str(context.node_config.get("model") or architecture_of(
            cfg.client_models, cfg.model, pid, k, cfg.seed))
        own = context.node_config.get("dataset-path")
        if own:
            x, y, classes = load_site(Path(str(own)), cfg.image_size)
        else:
            x, y = client_data(cfg, pid, k)
            classes = dataset(cfg).classes
        x, y, test_x, test_y = personal_split(x, y, cfg.personal_test_fraction,
                                              client_seed(cfg.seed, pid))
        return cls(cfg, pid, k, x, y, tuple(classes), resolve_device(), model, test_x, test_y,
                   context.state)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.x.shape[1:])  # type: ignore[return-value]

    def classifier(self, message: Message, key: str = "arrays") -> nn.Module:
        """The classifier the server sent (ArrayRecord `key`)."""
        return self.load_classifier(message.content.array_records[key])

    def load_classifier(self, arrays: ArrayRecord) -> nn.Module:
        """This client's architecture with these weights."""
        c, h, _ = self.image_shape
        model = create_classifier(self.model or self.cfg.model, c, self.num_classes, h)
        model.load_state_dict(arrays.to_torch_state_dict())
        return model


def personal_split(x: torch.Tensor, y: torch.Tensor, fraction: float, seed: int
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(train x, train y, test x, test y): a seeded `fraction` of S_k held out as the client's
    personal test split (at least one image each side when fraction > 0)."""
    if fraction <= 0 or len(y) < 2:
        return x, y, x[:0], y[:0]
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n = min(len(y) - 1, max(1, round(fraction * len(y))))
    test, train = order[:n].sort().values, order[n:].sort().values
    return x[train], y[train], x[test], y[test]


def config_of(message: Message) -> ConfigRecord:
    """The message's ConfigRecord 'config' (empty when it has none)."""
    return message.content.config_records.get("config") or ConfigRecord()


def reply(message: Message, metrics: dict, key: str = "metrics",
          **arrays: ArrayRecord) -> Message:
    """The reply to `message`: metrics as MetricRecord `key`, and the named ArrayRecords."""
    return Message(RecordDict({**arrays, key: MetricRecord(metrics)}), reply_to=message)
