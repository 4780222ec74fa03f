"""Tensors into minibatches: the pixel range the models see, random flips, batch indices.
Shared by client training, the server's distillation and the GAN training."""

from __future__ import annotations

import torch


def to_unit_range(x: torch.Tensor) -> torch.Tensor:
    """uint8 pixels -> float in [-1, 1] (paper, App. E.2)."""
    return x.float().div_(127.5).sub_(1.0)


def random_hflip(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Flip each image horizontally with probability 1/2."""
    mask = torch.rand(x.shape[0], generator=generator, device="cpu") < 0.5
    mask = mask.to(x.device).view(-1, *([1] * (x.dim() - 1)))
    return torch.where(mask, x.flip(-1), x)


def minibatches(n: int, batch_size: int, generator: torch.Generator | None = None,
                shuffle: bool = True):
    """Index tensors of consecutive minibatches over n items (last one may be short)."""
    order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
    return order.split(batch_size)
