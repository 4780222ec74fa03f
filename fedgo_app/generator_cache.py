"""Trained generators kept beside the results and reused across the runs of a plan.

A WGAN-GP generator (case G1) depends only on the server's unlabeled set U, the GAN settings
and the seed, not on the strategy, alpha or the clients: a plan of many runs trains it once per
seed. An entry is keyed by a hash of everything it depends on (U's bytes included) and is
reused only when its stored description matches that of the run and its tensors load into the
run's generator; anything else is retrained and overwritten.
"""

from __future__ import annotations

import hashlib
import json
import os
from logging import WARNING
from pathlib import Path

import torch
from flwr.common.logger import log

# Config keys a trained generator depends on (with U itself and the device type).
GENERATOR_KEYS = ("seed", "flip", "generator_steps", "critic_steps", "gp_weight", "gan_lr",
                  "gan_batch_size", "latent_dim", "generator_width")


def generator_description(cfg, u: torch.Tensor, device: torch.device, **overrides) -> dict:
    """What a generator trained for this run depends on; `overrides` replace config values
    (the sweep describes its snapshots at fewer steps this way)."""
    values = {key: getattr(cfg, key) for key in GENERATOR_KEYS}
    values.update(overrides)
    values.update(u_sha256=hashlib.sha256(u.contiguous().numpy().tobytes()).hexdigest(),
                  u_shape=list(u.shape), device_type=device.type)
    return values


def entry_path(root: Path, description: dict) -> Path:
    digest = hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:16]
    return Path(root) / f"generator-{digest}.pt"


def load_generator(root: Path, description: dict, generator: torch.nn.Module) -> dict | None:
    """Load the cached generator into `generator` and return its training summary, or None
    (nothing cached, or an entry that does not match or does not load: it is retrained)."""
    path = entry_path(root, description)
    if not path.exists():
        return None
    try:
        entry = torch.load(path, map_location="cpu", weights_only=True)
        if entry.get("description") != description:
            raise ValueError("it was trained with other settings")
        state = entry["state"]
        if not all(torch.isfinite(t).all() for t in state.values() if t.is_floating_point()):
            raise ValueError("it holds non-finite values")
        generator.load_state_dict(state)
    except Exception as err:  # a damaged or foreign file is retrained, never trusted
        log(WARNING, "pre-FL: cached generator %s not used (%s); training a new one", path, err)
        return None
    return dict(entry["info"])


def save_generator(root: Path, description: dict, generator: torch.nn.Module,
                   info: dict) -> Path:
    """Write atomically (a concurrent reader sees the old entry or the new one, never half)."""
    path = entry_path(root, description)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    state = {k: v.detach().cpu() for k, v in generator.state_dict().items()}
    torch.save({"description": description, "state": state, "info": dict(info)}, tmp)
    os.replace(tmp, path)
    return path
