"""Generator G and WGAN-GP critic (Gulrajani et al.), and the clients' discriminator D_k, for
images of any height, width and channel count.

Your own modules can stand in for them (FedGO's `generator` and `discriminator_fn`, the
client's `register(generator_fn=..., discriminator_fn=...)`) under these protocols:

- a generator is an nn.Module with an int attribute `latent_dim`; called on z [n, latent_dim]
  (standard normal) it returns images [n, C, H, W] of U's shape with values in [-1, 1];
- a discriminator is an nn.Module with `logit(x)` -> one score a image [n] for images x
  [n, C, H, W] in [-1, 1]; D(x) = sigmoid(sigmoid(logit)) as the library's (see
  `Discriminator`), or with calibration the Platt-scaled logit.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def image_sides(image_size: int | tuple[int, int]) -> tuple[int, int]:
    """(H, W) of a side or a (height, width) pair."""
    h, w = (image_size, image_size) if isinstance(image_size, int) else image_size
    if not (isinstance(h, int) and isinstance(w, int) and h >= 1 and w >= 1):
        raise ValueError(f"image_size is {image_size!r}; allowed: a side >= 1 or (height, width)")
    return h, w


class Generator(nn.Module):
    """DCGAN-style WGAN-GP generator: z -> a 4x4 map, doubled by transposed convolutions until
    it covers the image, tanh to [-1, 1].

    After each doubling the map is cropped to the size the remaining doublings take to the
    image (ceil(H / 2^r) x ceil(W / 2^r)): for 28x28 images the 8x8 map becomes 7x7, as in
    the official WGAN-GP MNIST model; 32x32 takes three doublings from 4 * dim channels,
    64x64 four from 8 * dim. Channels halve at each doubling down to `dim` (at most 8 * dim).
    """

    def __init__(self, latent_dim: int = 128, channels: int = 1,
                 image_size: int | tuple[int, int] = 28, dim: int = 64):
        super().__init__()
        h, w = image_sides(image_size)
        self.latent_dim, self.dim, self.channels = latent_dim, dim, channels
        self.image_size = image_size if isinstance(image_size, int) else (h, w)
        self.sides = (h, w)
        self.doublings = max(1, math.ceil(math.log2(max(h, w) / 4)))
        width = [dim * 2 ** min(self.doublings - 1 - i, 3) for i in range(self.doublings)]
        self.first = width[0]
        self.fc = nn.Sequential(nn.Linear(latent_dim, 4 * 4 * self.first),
                                nn.BatchNorm1d(4 * 4 * self.first), nn.ReLU(True))
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.ConvTranspose2d(c_in, c_out, 4, 2, 1), nn.BatchNorm2d(c_out),
                          nn.ReLU(True)) for c_in, c_out in zip(width, width[1:]))
        self.out = nn.ConvTranspose2d(dim, channels, 4, 2, 1)

    def crop(self, x: torch.Tensor, remaining: int) -> torch.Tensor:
        h, w = (-(-side // 2 ** remaining) for side in self.sides)
        return x[:, :, :h, :w]

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        x = self.crop(self.fc(z).view(-1, self.first, 4, 4), self.doublings)
        for i, block in enumerate(self.blocks, start=1):
            x = self.crop(block(x), self.doublings - i)
        return torch.tanh(self.crop(self.out(x), 0))

    def sample(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        device = next(self.parameters()).device
        z = torch.randn(n, self.latent_dim, generator=generator).to(device)
        return self(z)


class ConditionalGenerator(nn.Module):
    """G(z, y), label-conditional (FedBPG's data-space generator): the generator above fed the
    noise and the label's one-hot vector side by side."""

    def __init__(self, noise_dim: int, num_classes: int, channels: int = 1,
                 image_size: int | tuple[int, int] = 28, dim: int = 64):
        super().__init__()
        self.noise_dim, self.num_classes = noise_dim, num_classes
        self.net = Generator(noise_dim + num_classes, channels, image_size, dim)

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([z, nn.functional.one_hot(y, self.num_classes).to(z.dtype)],
                                  dim=1))


class Critic(nn.Module):
    """WGAN-GP critic: strided convolutions, no normalisation (the gradient penalty needs none)."""

    def __init__(self, channels: int = 1, image_size: int | tuple[int, int] = 28, dim: int = 64):
        super().__init__()
        h, w = image_sides(image_size)
        self.net = nn.Sequential(
            nn.Conv2d(channels, dim, 5, 2, 2), nn.LeakyReLU(0.2, True),
            nn.Conv2d(dim, 2 * dim, 5, 2, 2), nn.LeakyReLU(0.2, True),
            nn.Conv2d(2 * dim, 4 * dim, 5, 2, 2), nn.LeakyReLU(0.2, True),
        )
        h, w = (-(-(-(-side // 2) // 2) // 2) for side in (h, w))  # three ceil-halvings
        self.fc = nn.Linear(4 * dim * h * w, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.net(x).flatten(1)).squeeze(1)


class Discriminator(nn.Module):
    """Client discriminator D_k: 4-layer DCGAN-MNIST-style CNN (paper, App. E.2).

    Its output is a composition of two sigmoids, D = sigmoid(sigmoid(logit)), so the odds
    Phi = D / (1 - D) = exp(sigmoid(logit)) lie in (1, e): one client cannot dominate the
    weights through an overconfident discriminator.
    """

    def __init__(self, channels: int = 1, image_size: int | tuple[int, int] = 28, dim: int = 64):
        super().__init__()
        h, w = image_sides(image_size)
        if min(h, w) < 8:
            raise ValueError(f"the library's Discriminator takes images of at least 8x8 pixels, "
                             f"not {h}x{w}: pad or resize them, or give a discriminator of "
                             "your own (discriminator_fn)")
        side = (h // 8, w // 8)  # each (4, 2, 1) convolution floor-halves the map
        self.net = nn.Sequential(
            nn.Conv2d(channels, dim, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, True),
            nn.Conv2d(dim, 2 * dim, 4, 2, 1, bias=False), nn.BatchNorm2d(2 * dim),
            nn.LeakyReLU(0.2, True),
            nn.Conv2d(2 * dim, 4 * dim, 4, 2, 1, bias=False), nn.BatchNorm2d(4 * dim),
            nn.LeakyReLU(0.2, True),
            nn.Conv2d(4 * dim, 1, side, 1, 0, bias=False),  # the remaining map -> one logit
        )

    def logit(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).flatten()

    def log_odds(self, x: torch.Tensor) -> torch.Tensor:
        """log Phi(D(x)) = sigmoid(logit), in (0, 1)."""
        return torch.sigmoid(self.logit(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """D(x) = sigmoid(sigmoid(logit)), in (1/2, e/(1+e))."""
        return torch.sigmoid(self.log_odds(x))
