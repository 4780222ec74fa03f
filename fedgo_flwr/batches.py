"""Tensors into minibatches: the pixel range the models see, random flips and crops, batch
indices.
Shared by client training, the server's distillation and the GAN training."""

from __future__ import annotations

import torch


def to_unit_range(x: torch.Tensor) -> torch.Tensor:
    """uint8 pixels -> float in [-1, 1] (paper, App. E.2); float images are taken as they are
    (a library user's own inputs, fedgo_flwr/inputs.py)."""
    if x.is_floating_point():
        return x.float()
    return x.float().div_(127.5).sub_(1.0)


def random_hflip(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Flip each image horizontally with probability 1/2."""
    mask = torch.rand(x.shape[0], generator=generator, device="cpu") < 0.5
    mask = mask.to(x.device).view(-1, *([1] * (x.dim() - 1)))
    return torch.where(mask, x.flip(-1), x)


def random_crop(x: torch.Tensor, padding: int,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """Each image [-1, 1] padded by `padding` black pixels (-1) on every side and cropped back
    to its size at a random offset (the paper's CIFAR augmentation, padding 4)."""
    n, _, h, w = x.shape
    padded = torch.nn.functional.pad(x, (padding,) * 4, value=-1.0)
    top, left = (torch.randint(2 * padding + 1, (2, n), generator=generator)
                 .to(x.device).unbind(0))
    rows = (top[:, None] + torch.arange(h, device=x.device))[:, None, :, None]
    cols = (left[:, None] + torch.arange(w, device=x.device))[:, None, None, :]
    batch = torch.arange(n, device=x.device)[:, None, None, None]
    channel = torch.arange(x.shape[1], device=x.device)[None, :, None, None]
    return padded[batch, channel, rows, cols]


def augment(x: torch.Tensor, generator: torch.Generator | None, *, flip: bool,
            crop: int) -> torch.Tensor:
    """A training minibatch's augmentation: a random crop with `crop` padding (none at 0),
    then a random horizontal flip (when `flip`)."""
    if crop:
        x = random_crop(x, crop, generator)
    return random_hflip(x, generator) if flip else x


def minibatches(n: int, batch_size: int, generator: torch.Generator | None = None,
                shuffle: bool = True):
    """Index tensors of consecutive minibatches over n items (last one may be short)."""
    order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
    return order.split(batch_size)
