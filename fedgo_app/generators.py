"""Where the generator G comes from (FedGO's Table 2, the G column), and the images it draws.

    train-on-u  (G1) WGAN-GP on the server's unlabeled set U (the paper's main tables); a
                generator trained before on the same U, settings and seed is reused from
                <results-dir>/generators (`generator-cache`).
    load        (G2) an off-the-shelf generator from `generator-file`, in the portable format
                below (`python -m fedgo_lab.export_generator` writes one from any trained G).
    fedgan      (G3) trained by the clients with FedGAN, a pre-FL stage with messages
                (fedgo_app/fedgan.py).

A generator file is a torch file holding a dict: format (FORMAT), architecture (a key of
ARCHITECTURES), arguments (its constructor's keyword arguments), image_shape [C, H, W],
value_range [low, high] of its outputs and state (its weights). Loading checks each against
the run and names both sides of any difference.
"""

from __future__ import annotations

from logging import INFO
from pathlib import Path
from typing import Callable

import torch
from flwr.common.logger import log

from fedgo_flwr.gan import train_wgan_gp
from fedgo_app.generator_cache import generator_description, load_generator, save_generator
from fedgo_flwr.keys import ConfigError
from fedgo_flwr.models import Critic, Generator

GENERATOR_SOURCES = ("train-on-u", "load", "fedgan")  # fedgan: fedgo_app/fedgan.py
FORMAT = "fedgo-generator/1"
ARCHITECTURES = {"wgan-gp": Generator}  # name -> class, called with the file's arguments
VALUE_RANGE = [-1.0, 1.0]  # what the classifiers and discriminators take (App. E.2)


def new_generator(cfg, image_shape) -> Generator:
    c, h, _ = image_shape
    return Generator(cfg.latent_dim, c, h, cfg.generator_width)


def generator_arguments(generator: Generator, channels: int) -> dict:
    return {"latent_dim": generator.latent_dim, "channels": channels,
            "image_size": generator.image_size, "dim": generator.dim}


def save_generator_file(path: Path, generator: Generator, channels: int) -> Path:
    """Write `generator` in the portable format."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    args = generator_arguments(generator, channels)
    torch.save({"format": FORMAT, "architecture": "wgan-gp", "arguments": args,
                "image_shape": [channels, generator.image_size, generator.image_size],
                "value_range": VALUE_RANGE,
                "state": {k: v.detach().cpu() for k, v in generator.state_dict().items()}},
               path)
    return path


def load_generator_file(path: Path, image_shape: tuple[int, int, int]) -> Generator:
    """The generator in `path`, checked against the run's images; every mismatch fails naming
    what the file says and what the run needs."""
    path = Path(path)
    where = f"run-config key 'generator-file' ({path})"
    if not path.is_file():
        raise ConfigError(f"{where}: no such file; write one with python -m "
                          "fedgo_lab.export_generator")
    try:
        entry = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # not a torch file, or one holding code
        raise ConfigError(f"{where}: not a generator file ({err})") from None
    if not isinstance(entry, dict) or entry.get("format") != FORMAT:
        found = entry.get("format") if isinstance(entry, dict) else type(entry).__name__
        raise ConfigError(f"{where}: format {found!r}, expected {FORMAT!r}")
    if entry.get("architecture") not in ARCHITECTURES:
        raise ConfigError(f"{where}: architecture {entry.get('architecture')!r}; known: "
                          f"{', '.join(ARCHITECTURES)}")
    if list(entry.get("image_shape", [])) != list(image_shape):
        raise ConfigError(f"{where}: the generator makes {entry.get('image_shape')} images, "
                          f"the dataset has {list(image_shape)} (channels, height, width)")
    if list(entry.get("value_range", [])) != VALUE_RANGE:
        raise ConfigError(f"{where}: the generator's outputs lie in {entry.get('value_range')}, "
                          f"the models take {VALUE_RANGE}")
    try:
        generator = ARCHITECTURES[entry["architecture"]](**entry["arguments"])
        generator.load_state_dict(entry["state"])
    except (TypeError, ValueError, RuntimeError, KeyError) as err:
        why = " ".join(str(err).split())[:300]
        raise ConfigError(f"{where}: its weights do not fit architecture "
                          f"{entry['architecture']!r} with {entry.get('arguments')} ({why})") \
            from None
    return generator.eval()


def obtain_generator(cfg, setup, record) -> Generator:
    """G from `generator-source`, on the CPU in evaluation mode; what was done is recorded
    under pre_fl.generator."""
    if cfg.generator_source == "load":
        generator = load_generator_file(Path(cfg.generator_file), setup.image_shape)
        record.data["pre_fl"]["generator"] = {"source": "load", "file": cfg.generator_file}
        log(INFO, "pre-FL: generator loaded from %s", cfg.generator_file)
        return generator
    return train_on_u(cfg, setup, record)


def train_on_u(cfg, setup, record) -> Generator:
    """(G1): WGAN-GP on the server's unlabeled data; 0 steps = randomly initialised G.
    A generator trained before on the same U with the same settings and seed is reused
    from <results-dir>/generators (`generator-cache`)."""
    u, dev = setup.u, setup.device
    torch.manual_seed(cfg.seed)
    generator = new_generator(cfg, setup.image_shape)
    cache = cfg.generator_cache and cfg.generator_steps > 0
    description = generator_description(cfg, u, dev)
    root = cfg.results_path / "generators"
    info = load_generator(root, description, generator) if cache else None
    if info is not None:
        log(INFO, "pre-FL: reusing the generator trained for %d steps (%s)",
            cfg.generator_steps, root)
        record.data["pre_fl"]["generator"] = {**info, "reused": True}
        if "curve" in info:  # (the caches written since it was recorded)
            generator.curve = info["curve"]
        return generator.cpu().eval()
    info = fit_wgan_gp(cfg, generator, u, dev, lambda line: log(INFO, "pre-FL: %s", line))
    record.time("generator_training", info.pop("seconds"))
    if cache:
        save_generator(root, description, generator, info)
    record.data["pre_fl"]["generator"] = {**info, "reused": False}
    generator.curve = info["curve"]  # for the pre-FL stage's report (and its observers)
    return generator.cpu().eval()


def fit_wgan_gp(cfg, generator: Generator, images: torch.Tensor, device: torch.device,
                say: Callable[[str], None]) -> dict:
    """G1's recipe: WGAN-GP of `generator` on uint8 `images` with the run's GAN keys and
    seed; `say` gets a progress line every tenth of the steps. Returns train_wgan_gp's info."""
    c, h, _ = images.shape[1:]
    every = max(1, cfg.generator_steps // 10)

    def progress(step: int, w_dist: float, g_loss: float) -> None:
        if step % every == 0 or step == cfg.generator_steps:
            say(f"generator step {step}/{cfg.generator_steps} | Wasserstein estimate "
                f"{w_dist:.3f}")

    return train_wgan_gp(generator, Critic(c, h, cfg.generator_width), images,
                         steps=cfg.generator_steps, critic_steps=cfg.critic_steps,
                         gp_weight=cfg.gp_weight, lr=cfg.gan_lr, batch_size=cfg.gan_batch_size,
                         flip=cfg.flip, seed=cfg.seed, device=device, progress=progress)
