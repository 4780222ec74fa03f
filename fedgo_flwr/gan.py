"""Pre-FL stage training: the server's WGAN-GP generator (G1) and the clients' discriminators
(Algorithm 3), with an option beyond the paper: other negatives than G (Platt's calibration
of D_k: fedgo_flwr.calibration)."""

from __future__ import annotations

import time
from logging import INFO
from typing import Callable

import torch
import torch.nn.functional as F
from flwr.common.logger import log
from torch import nn

from fedgo_flwr.batches import minibatches, random_hflip, to_unit_range
from fedgo_flwr.models import Critic, Discriminator, Generator
from fedgo_flwr.progress import Progress
from fedgo_flwr.train import apply_in_batches, minibatch_descent


def _gradient_penalty(critic: Critic, real: torch.Tensor, fake: torch.Tensor,
                      gen: torch.Generator) -> torch.Tensor:
    eps = torch.rand(real.shape[0], 1, 1, 1, generator=gen).to(real.device)
    mixed = (eps * real + (1 - eps) * fake).requires_grad_(True)
    grad, = torch.autograd.grad(critic(mixed).sum(), mixed, create_graph=True)
    return ((grad.flatten(1).norm(dim=1) - 1) ** 2).mean()


CURVE_POINTS = 50  # the generator's loss curve: about this many of its steps


def train_wgan_gp(generator: Generator, critic: Critic, u: torch.Tensor, *, steps: int,
                  critic_steps: int = 5, gp_weight: float = 10.0, lr: float = 2e-4,
                  batch_size: int = 64, flip: bool = False, seed: int = 0,
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
    every, curve = max(1, steps // CURVE_POINTS), {"step": [], "wasserstein-estimate": [],
                                                   "generator-loss": []}
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
        if step % every == 0 or step == steps:
            for name, value in zip(curve, (step, w_dist, g_loss)):
                curve[name].append(value)
        if progress is not None:
            progress(step, w_dist, g_loss)
    generator.eval()
    return {"generator-steps": steps, "wasserstein-estimate": w_dist,
            "generator-loss": g_loss, "curve": curve, "seconds": time.perf_counter() - start}


def wgan_generator(u: torch.Tensor, steps: int, *, latent_dim: int, width: int, seed: int,
                   device: torch.device, **settings) -> Generator:
    """G1 for U's image shape: WGAN-GP on U from the seed (`settings`: train_wgan_gp's),
    with its progress logged."""
    c, h, w = u.shape[1:]
    torch.manual_seed(seed)
    generator = Generator(latent_dim, c, (h, w), width)
    bar = Progress("pre-FL: generator", steps, hint=(
        "fewer generator_steps, a smaller generator_width, a GPU (device), or a trained "
        "generator of your own (generator)"))
    info = train_wgan_gp(generator, Critic(c, (h, w), width), u, steps=steps, seed=seed,
                         device=device, **settings,
                         progress=lambda t, w_dist, _: bar.step(
                             t, f"Wasserstein estimate {w_dist:.3f}"))
    log(INFO, "pre-FL: generator trained in %.1fs", info["seconds"])
    generator.curve = info["curve"]  # for the pre-FL stage's report
    return generator.cpu().eval()


# The choices of `discriminator-negatives` and `discriminator-calibration`.
NEGATIVES = ("generator", "server-sample")
SERVER_SAMPLE = "server-sample"  # an ArrayRecord of the server's images, sent instead of G
# config "generator" and "discriminator": the library's module, or the user's own, which
# the client builds with the function given to `register`
LIBRARY, OWN = "library", "own"

# Where a discriminator's fakes come from: `negatives(n, gen)` -> n images in [-1, 1].
Negatives = Callable[[int, torch.Generator], torch.Tensor]


def generator_negatives(generator: nn.Module) -> Negatives:
    """Samples of the fixed G (Algorithm 3), from seeded standard normal latents."""
    generator.eval()
    device = next(generator.parameters()).device
    return lambda n, gen: generator(torch.randn(n, generator.latent_dim, generator=gen)
                                    .to(device))


def image_negatives(images: torch.Tensor, *, flip: bool = False) -> Negatives:
    """Images drawn with replacement from uint8 `images` (a sample of the server's unlabeled
    set standing in for G; not in the paper), randomly flipped as the real ones are."""
    def draw(n: int, gen: torch.Generator) -> torch.Tensor:
        x = to_unit_range(images[torch.randint(len(images), (n,), generator=gen)])
        return random_hflip(x, gen) if flip else x
    return draw


def server_sample(u: torch.Tensor, size: int, seed: int) -> torch.Tensor:
    """The seeded sample of U sent instead of G (`discriminator_negatives="server-sample"`)."""
    order = torch.randperm(len(u), generator=torch.Generator().manual_seed(seed))
    return u[order[:size]].clone()


def received_negatives(message, image_shape: tuple[int, ...], flip: bool, device: torch.device,
                       generator_fn: Callable[[], nn.Module] | None = None) -> Negatives:
    """What D_k learns against, from FedGO's pre-FL message (a Flower `Message`): samples of
    the received G (the library's `Generator`, or the server's own module, which
    `generator_fn` builds here), or the server's sample of U."""
    conf, records = message.content.config_records["config"], message.content.array_records
    if SERVER_SAMPLE in records:
        images = records[SERVER_SAMPLE].to_torch_state_dict()["images"]
        if tuple(images.shape[1:]) != image_shape:
            raise ValueError(f"the server's sample has images of shape {tuple(images.shape[1:])}"
                             f", this client's are {image_shape}")
        return image_negatives(images, flip=flip)
    if conf.get("generator", LIBRARY) == LIBRARY:
        generator = Generator(int(conf["latent-dim"]), image_shape[0], tuple(image_shape[1:]),
                              int(conf["generator-width"]))
    elif generator_fn is None:
        raise ValueError("the server's generator is a module of its own, not the library's "
                         "Generator: pass generator_fn (the function that builds it) to "
                         "fedgo_flwr.client.register or discriminator_update")
    else:
        generator = generator_fn()
    generator.load_state_dict(records["generator"].to_torch_state_dict())
    return generator_negatives(generator.to(device))


def received_discriminator(conf, image_shape: tuple[int, ...],
                           discriminator_fn: Callable[[], nn.Module] | None) -> nn.Module:
    """D_k as the pre-FL message's config says: the library's `Discriminator` for the client's
    image shape, or the server's own architecture, which `discriminator_fn` builds."""
    if conf.get("discriminator", LIBRARY) == LIBRARY:
        return Discriminator(image_shape[0], tuple(image_shape[1:]),
                             int(conf["discriminator-width"]))
    if discriminator_fn is None:
        raise ValueError("the server's discriminator is a module of its own, not the library's "
                         "Discriminator: pass discriminator_fn (the function FedGO was given) to "
                         "fedgo_flwr.client.register or discriminator_update")
    return discriminator_fn()


def train_discriminator(discriminator: Discriminator, negatives: Negatives, x: torch.Tensor, *,
                        epochs: int, lr: float = 2e-4, batch_size: int = 64, flip: bool = False,
                        seed: int = 0, device: torch.device = torch.device("cpu"),
                        after_epoch: Callable[[int], None] | None = None) -> dict:
    """Algorithm 3: vanilla GAN loss, real = the client's images, fake = `negatives` (samples of
    the fixed G in the paper).

    D = sigmoid(s) with s = sigmoid(logit), so binary cross-entropy is taken on s as the logit.
    after_epoch(e) is called after each epoch e (1-based), e.g. to snapshot D; it must leave D
    in training mode and draw nothing from torch's global RNG.
    """
    start = time.perf_counter()
    gen = torch.Generator().manual_seed(seed)
    discriminator.to(device).train()
    opt = torch.optim.Adam(discriminator.parameters(), lr=lr, betas=(0.5, 0.999))

    def batch_loss(idx: torch.Tensor) -> torch.Tensor:
        real = to_unit_range(x[idx]).to(device)
        if flip:
            real = random_hflip(real, gen)
        with torch.no_grad():
            fake = negatives(len(idx), gen).to(device)
        l_real, l_fake = discriminator.logit(real), discriminator.logit(fake)
        with torch.no_grad():  # the pass's accuracy: real where the inner logit is > 0
            right[0] += int((l_real > 0).sum() + (l_fake <= 0).sum())
            right[1] += len(l_real) + len(l_fake)
        s_real, s_fake = torch.sigmoid(l_real), torch.sigmoid(l_fake)
        return (F.binary_cross_entropy_with_logits(s_real, torch.ones_like(s_real))
                + F.binary_cross_entropy_with_logits(s_fake, torch.zeros_like(s_fake)))

    def epoch_done(epoch: int) -> None:
        accuracy[0] = right[0] / max(1, right[1])
        right[:] = [0, 0]
        if after_epoch is not None:
            after_epoch(epoch)

    right, accuracy = [0, 0], [float("nan")]
    loss = minibatch_descent(opt, len(x), epochs=epochs, batch_size=batch_size, gen=gen,
                             batch_loss=batch_loss, after_epoch=epoch_done)
    discriminator.eval()
    return {"discriminator-loss": loss, "discriminator-train-acc": accuracy[0],
            "discriminator-seconds": time.perf_counter() - start}


def log_odds(discriminator: Discriminator, x: torch.Tensor, *, device: torch.device,
             flip: bool = False, calibration: tuple[float, float] | None = None) -> torch.Tensor:
    """log Phi_k(x) for uint8 images x: the paper's sigmoid(logit), in (0, 1), or with a
    calibration (a, b) the uncapped a * logit + b (fedgo_flwr.calibration)."""
    discriminator.to(device).eval()
    if calibration is None:
        return apply_in_batches(lambda v: torch.sigmoid(discriminator.logit(v)), x,
                                device=device, flip=flip)
    a, b = calibration
    return apply_in_batches(discriminator.logit, x, device=device, flip=flip) * a + b


class KeptDiscriminators(dict):
    """The server's D_k by client key, each (D_k, its calibration or None), built by
    `discriminator_fn`; a checkpoint holds their weights (`state_dict`)."""

    def __init__(self, discriminator_fn: Callable[[], nn.Module]):
        super().__init__()
        self.discriminator_fn = discriminator_fn

    def keep(self, key, weights: dict[str, torch.Tensor], calibration) -> nn.Module:
        d = self.discriminator_fn()
        d.load_state_dict(weights)
        self[key] = (d.eval(), calibration)
        return d

    def state_dict(self) -> dict:
        return {key: (d.state_dict(), calibration) for key, (d, calibration) in self.items()}

    def load_state_dict(self, state: dict) -> None:
        for key, (weights, calibration) in state.items():
            self.keep(key, weights, calibration)


def to_images(x: torch.Tensor) -> torch.Tensor:
    """Generator output in [-1, 1] as uint8 images, the form U has."""
    return ((x.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)


@torch.no_grad()
def draw_images(generator: Generator, n: int, seed: int, device: torch.device) -> torch.Tensor:
    """n images of G as uint8 [n, C, H, W], from seeded latents, drawn in batches of 512."""
    gen = torch.Generator().manual_seed(seed)
    generator.to(device).eval()
    parts = [to_images(generator(torch.randn(len(idx), generator.latent_dim,
                                             generator=gen).to(device)).cpu())
             for idx in torch.arange(n).split(512)]
    generator.cpu()
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8)
