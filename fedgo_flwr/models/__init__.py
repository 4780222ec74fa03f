"""Model registries: name -> constructor(channels, num_classes, image_size)."""

from __future__ import annotations

from typing import Callable

from torch import nn

from fedgo_flwr.models.classifiers import CNN, ResNet18
from fedgo_flwr.models.feature import FeatureGenerator
from fedgo_flwr.models.gan import Critic, Discriminator, Generator

CLASSIFIERS: dict[str, Callable[..., nn.Module]] = {
    "cnn": CNN,
    "resnet18": ResNet18,
}


def create_classifier(name: str, channels: int, num_classes: int, image_size: int) -> nn.Module:
    if name not in CLASSIFIERS:
        raise KeyError(f"unknown model {name!r}; registered: {', '.join(sorted(CLASSIFIERS))}")
    return CLASSIFIERS[name](in_channels=channels, num_classes=num_classes, image_size=image_size)


__all__ = ["CLASSIFIERS", "CNN", "Critic", "Discriminator", "FeatureGenerator", "Generator",
           "ResNet18",
           "create_classifier"]
