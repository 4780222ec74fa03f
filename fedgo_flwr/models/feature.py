"""FedGen's conditional generator in feature space (Zhu et al. 2021, App. 9.2, Table 6)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class FeatureGenerator(nn.Module):
    """G_w(y, eps): [noise eps ~ N(0, I), one-hot y] -> hidden -> BatchNorm -> ReLU -> z, a
    feature for the classifier's `head` (its latent layer, `latent_dim` wide)."""

    def __init__(self, num_classes: int, latent_dim: int, noise_dim: int = 32,
                 hidden_dim: int = 256):
        super().__init__()
        self.num_classes, self.noise_dim = num_classes, noise_dim
        self.hidden = nn.Linear(noise_dim + num_classes, hidden_dim)
        self.norm = nn.BatchNorm1d(hidden_dim)
        self.out = nn.Linear(hidden_dim, latent_dim)

    def forward(self, y: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        onehot = F.one_hot(y, self.num_classes).to(eps.dtype)
        return self.out(F.relu(self.norm(self.hidden(torch.cat([eps, onehot], dim=1)))))

    def noise(self, n: int, gen: torch.Generator | None = None) -> torch.Tensor:
        return torch.randn(n, self.noise_dim, generator=gen)
