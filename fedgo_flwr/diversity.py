"""The generators' diversity term (mode seeking, Mao et al. 2019), in the form of FedGen's
public code, which FedBPG's Eq. 3 takes up: exp(-mean_ij d_noise(i, j) d_out(i, j)), with
d_noise the mean squared and d_out the mean absolute difference per coordinate. Per-coordinate
means keep the exponent near 1 for images as for features; with the norms that Eq. 3 prints,
28x28 images give products near 100 and exp(-100) leaves no gradient."""

from __future__ import annotations

import torch


def diversity_loss(noise: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Small when distinct noises give distinct outputs; 1 when every output is the same."""
    noise, out = noise.flatten(1), out.flatten(1)
    d_noise = (noise.unsqueeze(0) - noise.unsqueeze(1)).pow(2).mean(-1)
    d_out = (out.unsqueeze(0) - out.unsqueeze(1)).abs().mean(-1)
    return torch.exp(-(d_noise * d_out).mean())
