"""What a strategy checks when it is built, before any expensive stage: the server's images
against what the generator makes, the user's model, generator and discriminator against
their protocols, keywords meant for another strategy. Each failure raises with a message
that names the constructor keyword or the user's object and says how to fix it."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
from torch import nn

from fedgo_flwr.batches import to_unit_range

FLOAT_TYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_images(x: torch.Tensor, name: str = "unlabeled_data") -> None:
    """Images [N, C, H, W], uint8 pixels or float32 (float16, bfloat16) values: refuse
    channels-last layouts and other dtypes, saying what to do."""
    shape = tuple(x.shape)
    if x.dim() != 4:
        raise ValueError(f"{name} must be images [N, C, H, W]; got shape {shape}")
    if shape[1] > 4 and shape[3] in (1, 3, 4):
        raise ValueError(f"{name} has shape {shape}, which looks channels-last [N, H, W, C]; "
                         "give [N, C, H, W] (x.permute(0, 3, 1, 2))")
    if x.dtype != torch.uint8 and x.dtype not in FLOAT_TYPES:
        raise ValueError(f"{name} is {x.dtype}; give uint8 pixels (taken to [-1, 1]) or "
                         "float32 values (x.float())")


def check_unit_range(x: torch.Tensor, what: str, name: str = "unlabeled_data") -> None:
    """Float images must lie in [-1, 1], where the generator's tanh puts its images."""
    if x.is_floating_point() and len(x):
        lo, hi = float(x.min()), float(x.max())
        if lo < -1.0001 or hi > 1.0001:
            raise ValueError(f"{name} holds floats in [{lo:g}, {hi:g}], and {what} makes "
                             "images in [-1, 1]: give uint8 pixels, or scale the floats to "
                             "[-1, 1] (e.g. x / 127.5 - 1 for pixels)")


def _run(module: nn.Module, x: torch.Tensor, what: str, call=None,
         source: str = "unlabeled_data's images") -> torch.Tensor:
    try:
        with torch.no_grad():
            return (call or module)(x)
    except Exception as err:  # any failure of the user's code is reported the same way
        raise ValueError(f"{what} cannot take {source}, of shape {tuple(x.shape[1:])} "
                         f"({' '.join(str(err).split())[:200]})") from None


def check_model(model_fn: Callable[[], nn.Module], u: torch.Tensor,
                source: str = "unlabeled_data's images") -> int:
    """model_fn's model on two images of U (`source`) gives logits [2, classes]; the class
    count."""
    with torch.random.fork_rng(devices=[]):  # leaves the caller's random state as it was
        model = model_fn()
    if not isinstance(model, nn.Module):
        raise TypeError(f"model_fn returned a {type(model).__name__}, not a torch nn.Module")
    out = _run(model.eval(), to_unit_range(u[:2]), "model_fn's model", source=source)
    if out.dim() != 2 or out.shape[0] != len(u[:2]) or out.shape[1] < 2:
        raise ValueError(f"model_fn's model gives outputs of shape {tuple(out.shape)} for "
                         f"{len(u[:2])} of {source}; expected logits [batch, classes] with 2 "
                         "classes or more")
    return int(out.shape[1])


def check_generator(generator: nn.Module, u: torch.Tensor) -> None:
    """The generator protocol: `latent_dim`; z [n, latent_dim] -> images of U's shape in
    [-1, 1]."""
    if not isinstance(generator, nn.Module) or not isinstance(
            getattr(generator, "latent_dim", None), int):
        raise TypeError(f"generator is a {type(generator).__name__}; allowed: an nn.Module "
                        "with an int attribute latent_dim that maps z [n, latent_dim] to "
                        "images [n, C, H, W] in [-1, 1] (fedgo_flwr.models.Generator is one)")
    was_training = generator.training
    with torch.random.fork_rng(devices=[]):
        out = _run(generator.eval(), torch.randn(2, generator.latent_dim), "the generator")
    generator.train(was_training)
    if tuple(out.shape[1:]) != tuple(u.shape[1:]):
        raise ValueError(f"the generator makes images of shape {tuple(out.shape[1:])}, "
                         f"unlabeled_data's are {tuple(u.shape[1:])}")
    if out.min() < -1.0001 or out.max() > 1.0001:
        raise ValueError(f"the generator makes values in [{float(out.min()):g}, "
                         f"{float(out.max()):g}]; the protocol is [-1, 1] (end in tanh)")
    check_unit_range(u, "the generator")


def check_discriminator(discriminator: nn.Module, u: torch.Tensor) -> dict:
    """The discriminator protocol: `logit(x)` -> one score an image; returns its state."""
    if not callable(getattr(discriminator, "logit", None)):
        raise TypeError(f"discriminator_fn built a {type(discriminator).__name__} without "
                        "logit(x) -> [n]: the protocol of fedgo_flwr.models.gan")
    x = to_unit_range(u[:2])
    was_training = discriminator.training
    out = _run(discriminator.eval(), x, "the discriminator", discriminator.logit)
    discriminator.train(was_training)
    if tuple(out.shape) != (len(x),):
        raise ValueError(f"the discriminator's logit(x) has shape {tuple(out.shape)} for "
                         f"{len(x)} images; expected [{len(x)}]")
    return discriminator.state_dict()


def keyword_owners(cls: type, name: str) -> list[str]:
    """The library's strategies (cls and its subclasses) whose constructor takes `name`."""
    owners, stack = [], [cls]
    while stack:
        c = stack.pop()
        stack.extend(c.__subclasses__())
        if c.__module__.startswith("fedgo_flwr") and name in inspect.signature(
                c.__init__).parameters:
            owners.append(c.__name__)
    return sorted(set(owners))


def check_keywords(strategy: object, base: type, kwargs: dict, flower: type) -> None:
    """Keywords that neither this strategy nor Flower's `flower` takes: name who takes them."""
    taken = inspect.signature(flower.__init__).parameters
    unknown = [k for k in kwargs if k not in taken]
    if not unknown:
        return
    lines = []
    for k in unknown:
        owners = keyword_owners(base, k)
        lines.append(f"{k} ({', '.join(owners)} take{'s' if len(owners) == 1 else ''} it)"
                     if owners else f"{k} (no strategy of fedgo_flwr takes it)")
    raise TypeError(f"{type(strategy).__name__} does not take " + "; ".join(lines))
