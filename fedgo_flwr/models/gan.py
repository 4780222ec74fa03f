"""Generator G and WGAN-GP critic (Gulrajani et al.), and the clients' discriminator D_k."""

from __future__ import annotations

import torch
from torch import nn

from fedgo_flwr.keys import ConfigError


# The image sides the generator makes (and so FedGO's pre-FL stage and DaFKD support).
GENERATOR_SIDES = (28, 32, 64)


def generator_fits(side: int, dataset: str) -> None:
    """Fail at once, naming both sides, when G cannot make the dataset's images."""
    if side not in GENERATOR_SIDES:
        raise ConfigError(f"dataset {dataset!r} has {side}x{side} images and the generator "
                          f"makes {', '.join(map(str, GENERATOR_SIDES))}-pixel ones: set "
                          "run-config key 'image-size' to one of these")


class Generator(nn.Module):
    """DCGAN-style WGAN-GP generator: z -> 4x4 -> 8x8 -> 16x16 -> 32x32, tanh to [-1, 1].

    For 28x28 images the 8x8 map is cropped to 7x7, as in the official WGAN-GP MNIST model;
    for 64x64 one more doubling block (`block0`, from 8 * dim channels) comes first.
    """

    def __init__(self, latent_dim: int = 128, channels: int = 1, image_size: int = 28,
                 dim: int = 64):
        super().__init__()
        if image_size not in GENERATOR_SIDES:
            raise ValueError(f"the generator makes {', '.join(map(str, GENERATOR_SIDES))}-pixel "
                             f"images, not {image_size}: set run-config key 'image-size'")
        self.latent_dim, self.image_size = latent_dim, image_size
        first = 8 * dim if image_size == 64 else 4 * dim
        self.fc = nn.Sequential(nn.Linear(latent_dim, 4 * 4 * first),
                                nn.BatchNorm1d(4 * 4 * first), nn.ReLU(True))
        if image_size == 64:
            self.block0 = nn.Sequential(nn.ConvTranspose2d(8 * dim, 4 * dim, 4, 2, 1),
                                        nn.BatchNorm2d(4 * dim), nn.ReLU(True))
        self.block1 = nn.Sequential(nn.ConvTranspose2d(4 * dim, 2 * dim, 4, 2, 1),
                                    nn.BatchNorm2d(2 * dim), nn.ReLU(True))
        self.block2 = nn.Sequential(nn.ConvTranspose2d(2 * dim, dim, 4, 2, 1),
                                    nn.BatchNorm2d(dim), nn.ReLU(True))
        self.out = nn.ConvTranspose2d(dim, channels, 4, 2, 1)
        self.dim, self.first = dim, first

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        x = self.fc(z).view(-1, self.first, 4, 4)
        if self.image_size == 64:
            x = self.block0(x)
        x = self.block1(x)
        if self.image_size == 28:
            x = x[:, :, :7, :7]
        return torch.tanh(self.out(self.block2(x)))

    def sample(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        device = next(self.parameters()).device
        z = torch.randn(n, self.latent_dim, generator=generator).to(device)
        return self(z)


class ConditionalGenerator(nn.Module):
    """G(z, y), label-conditional (FedBPG's data-space generator): the generator above fed the
    noise and the label's one-hot vector side by side."""

    def __init__(self, noise_dim: int, num_classes: int, channels: int = 1,
                 image_size: int = 28, dim: int = 64):
        super().__init__()
        self.noise_dim, self.num_classes = noise_dim, num_classes
        self.net = Generator(noise_dim + num_classes, channels, image_size, dim)

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([z, nn.functional.one_hot(y, self.num_classes).to(z.dtype)],
                                  dim=1))


class Critic(nn.Module):
    """WGAN-GP critic: strided convolutions, no normalisation (the gradient penalty needs none)."""

    def __init__(self, channels: int = 1, image_size: int = 28, dim: int = 64):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(channels, dim, 5, 2, 2), nn.LeakyReLU(0.2, True),
            nn.Conv2d(dim, 2 * dim, 5, 2, 2), nn.LeakyReLU(0.2, True),
            nn.Conv2d(2 * dim, 4 * dim, 5, 2, 2), nn.LeakyReLU(0.2, True),
        )
        side = -(-(-(-image_size // 2) // 2) // 2)  # three ceil-halvings
        self.fc = nn.Linear(4 * dim * side * side, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.net(x).flatten(1)).squeeze(1)


class Discriminator(nn.Module):
    """Client discriminator D_k: 4-layer DCGAN-MNIST-style CNN (paper, App. E.2).

    Its output is a composition of two sigmoids, D = sigmoid(sigmoid(logit)), so the odds
    Phi = D / (1 - D) = exp(sigmoid(logit)) lie in (1, e): one client cannot dominate the
    weights through an overconfident discriminator.
    """

    def __init__(self, channels: int = 1, image_size: int = 28, dim: int = 64):
        super().__init__()
        side = image_size // 8  # each (4, 2, 1) convolution floor-halves the map
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
