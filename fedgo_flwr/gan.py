"""Pre-FL stage training: the server's WGAN-GP generator (G1) and the clients' discriminators
(Algorithm 3)."""

from __future__ import annotations

import logging
import time
from typing import Callable

import torch
import torch.nn.functional as F

from fedgo_flwr.batches import minibatches, random_hflip, to_unit_range
from fedgo_flwr.models import Critic, Discriminator, Generator
from fedgo_flwr.train import apply_in_batches, minibatch_descent

log = logging.getLogger(__name__)


def _gradient_penalty(critic: Critic, real: torch.Tensor, fake: torch.Tensor,
                      gen: torch.Generator) -> torch.Tensor:
    eps = torch.rand(real.shape[0], 1, 1, 1, generator=gen).to(real.device)
    mixed = (eps * real + (1 - eps) * fake).requires_grad_(True)
    grad, = torch.autograd.grad(critic(mixed).sum(), mixed, create_graph=True)
    return ((grad.flatten(1).norm(dim=1) - 1) ** 2).mean()


def train_wgan_gp(generator: Generator, critic: Critic, u: torch.Tensor, *, steps: int,
                  critic_steps: int = 5, gp_weight: float = 10.0, lr: float = 2e-4,
                  batch_size: int = 64, flip: bool = True, seed: int = 0,
                  device: torch.device = torch.device("cpu"),
                  progress: Callable[[int, float, float], None] | None = None) -> dict:
    """WGAN-GP (Gulrajani et al.) on unlabeled uint8 images u: `steps` generator steps, each
    after `critic_steps` critic steps; Adam(lr, betas=(0, 0.9)) for both (paper, App. E.2)."""
    start = time.perf_counter()
    gen = torch.Generator().manual_seed(seed)
    generator.to(device).train()
    critic.to(device).train()
    opt_g = torch.optim.Adam(generator.parameters(), lr=lr, betas=(0.0, 0.9))
    opt_c = torch.optim.Adam(critic.parameters(), lr=lr, betas=(0.0, 0.9))
    batches = iter(())
    w_dist = g_loss = float("nan")
    for step in range(1, steps + 1):
        for _ in range(critic_steps):
            idx = next(batches, None)
            if idx is None or len(idx) < batch_size:
                batches = iter(minibatches(len(u), batch_size, gen))
                idx = next(batches)
            real = to_unit_range(u[idx]).to(device)
            if flip:
                real = random_hflip(real, gen)
            z = torch.randn(len(idx), generator.latent_dim, generator=gen).to(device)
            with torch.no_grad():
                fake = generator(z)
            c_real, c_fake = critic(real).mean(), critic(fake).mean()
            loss_c = c_fake - c_real + gp_weight * _gradient_penalty(critic, real, fake, gen)
            opt_c.zero_grad(set_to_none=True)
            loss_c.backward()
            opt_c.step()
            w_dist = (c_real - c_fake).item()
        z = torch.randn(batch_size, generator.latent_dim, generator=gen).to(device)
        loss_g = -critic(generator(z)).mean()
        opt_g.zero_grad(set_to_none=True)
        loss_g.backward()
        opt_g.step()
        g_loss = loss_g.item()
        if progress is not None:
            progress(step, w_dist, g_loss)
    generator.eval()
    return {"generator-steps": steps, "wasserstein-estimate": w_dist,
            "generator-loss": g_loss, "seconds": time.perf_counter() - start}


def train_discriminator(discriminator: Discriminator, generator: Generator, x: torch.Tensor, *,
                        epochs: int, lr: float = 2e-4, batch_size: int = 64, flip: bool = True,
                        seed: int = 0, device: torch.device = torch.device("cpu"),
                        after_epoch: Callable[[int], None] | None = None) -> dict:
    """Algorithm 3: vanilla GAN loss, real = the client's images, fake = samples of the fixed G.

    D = sigmoid(s) with s = sigmoid(logit), so binary cross-entropy is taken on s as the logit.
    after_epoch(e) is called after each epoch e (1-based), e.g. to snapshot D; it must leave D
    in training mode and draw nothing from torch's global RNG.
    """
    start = time.perf_counter()
    gen = torch.Generator().manual_seed(seed)
    discriminator.to(device).train()
    generator.to(device).eval()
    opt = torch.optim.Adam(discriminator.parameters(), lr=lr, betas=(0.5, 0.999))

    def batch_loss(idx: torch.Tensor) -> torch.Tensor:
        real = to_unit_range(x[idx]).to(device)
        if flip:
            real = random_hflip(real, gen)
        with torch.no_grad():
            fake = generator.sample(len(idx), gen)
        s_real, s_fake = discriminator.log_odds(real), discriminator.log_odds(fake)
        return (F.binary_cross_entropy_with_logits(s_real, torch.ones_like(s_real))
                + F.binary_cross_entropy_with_logits(s_fake, torch.zeros_like(s_fake)))

    loss = minibatch_descent(opt, len(x), epochs=epochs, batch_size=batch_size, gen=gen,
                             batch_loss=batch_loss, after_epoch=after_epoch)
    discriminator.eval()
    return {"discriminator-loss": loss,
            "discriminator-seconds": time.perf_counter() - start}


def log_odds(discriminator: Discriminator, x: torch.Tensor, *, device: torch.device,
             flip: bool = False) -> torch.Tensor:
    """log Phi_k(x) for uint8 images x."""
    discriminator.to(device).eval()
    return apply_in_batches(discriminator.log_odds, x, device=device, flip=flip)
