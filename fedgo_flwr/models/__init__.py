"""Model registries: name -> constructor(channels, num_classes, image_size).

`model` is a registered name or a user's classifier by import path, "package.module:Callable",
called as Callable(channels, num_classes, image_size) and returning an nn.Module of logits.
FedGen and DaFKD work in feature space and need the model to have `features(x)` (the latent
layer), `head(z)` (logits from it) and `latent_dim`."""

from __future__ import annotations

import importlib
from typing import Callable

import torch
from torch import nn

from fedgo_flwr.keys import ConfigError
from fedgo_flwr.models.classifiers import CNN, MLP, VGG11BN, ResNet18, ResNet50
from fedgo_flwr.models.feature import FeatureGenerator
from fedgo_flwr.models.gan import (ConditionalGenerator, Critic, Discriminator, Generator,
                                   image_sides)

CLASSIFIERS: dict[str, Callable[..., nn.Module]] = {
    "cnn": CNN,
    "mlp": MLP,
    "resnet18": ResNet18,
    "resnet50": ResNet50,
    "vgg11-bn": VGG11BN,
}
FEATURE_SPACE = ("features", "head", "latent_dim")


def is_import_path(name: str) -> bool:
    module, _, attr = name.partition(":")
    return bool(module and attr)


def model_name_problem(name: str) -> str | None:
    """Why `model` names no classifier, or None (import paths are resolved when used)."""
    if name in CLASSIFIERS or is_import_path(name):
        return None
    return (f"run-config key 'model' is {name!r}; allowed: {', '.join(CLASSIFIERS)}, or your "
            "own classifier as \"package.module:Callable\"")


def user_classifier(name: str) -> Callable[..., nn.Module]:
    module, _, attr = name.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise ConfigError(
            f"run-config key 'model' is {name!r}, which cannot be imported ({err}); the module "
            "must be importable where the server and the clients run (installed, or a file of "
            "the app's folder)") from None


def create_classifier(name: str, channels: int, num_classes: int, image_size: int) -> nn.Module:
    if name in CLASSIFIERS:
        return CLASSIFIERS[name](in_channels=channels, num_classes=num_classes,
                                 image_size=image_size)
    why = model_name_problem(name)
    if why:
        raise ConfigError(why)
    model = user_classifier(name)(channels, num_classes, image_size)
    if not isinstance(model, nn.Module):
        raise ConfigError(f"run-config key 'model' is {name!r}, which returned a "
                          f"{type(model).__name__}, not a torch nn.Module")
    return model


def classifier_fits(name: str, image_shape: tuple[int, int, int], num_classes: int,
                    dataset: str) -> None:
    """Fail at once, naming both sides, when the classifier cannot take the dataset's images
    or does not give one logit per class."""
    c, h, w = image_shape
    model = create_classifier(name, c, num_classes, h).eval()
    try:
        with torch.no_grad():
            out = model(torch.zeros(2, c, h, w))
    except RuntimeError as err:
        raise ConfigError(f"model {name!r} cannot take the {c}x{h}x{w} images of dataset "
                          f"{dataset!r} ({' '.join(str(err).split())[:200]}): set run-config "
                          "key 'image-size', or choose another 'model'") from None
    if tuple(out.shape) != (2, num_classes):
        raise ConfigError(f"model {name!r} gives outputs of shape {tuple(out.shape)[1:]} for "
                          f"dataset {dataset!r}, which has {num_classes} classes")


def require_feature_space(model: nn.Module, strategy: str, name: str) -> None:
    """FedGen and DaFKD read the latent layer: refuse a model without it, saying what to add."""
    missing = [a for a in FEATURE_SPACE if not hasattr(model, a)]
    if missing:
        raise ConfigError(
            f"strategy {strategy!r} works on the classifier's latent layer, and model {name!r} "
            f"lacks {', '.join(missing)}: give it features(x) -> z, head(z) -> logits (forward "
            "= head(features(x))) and latent_dim = z's width")


__all__ = ["CLASSIFIERS", "CNN", "ConditionalGenerator", "Critic", "Discriminator",
           "FeatureGenerator", "Generator", "ResNet18", "ResNet50", "VGG11BN",
           "classifier_fits", "create_classifier", "image_sides", "model_name_problem",
           "require_feature_space"]
