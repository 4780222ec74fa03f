"""An off-the-shelf generator (FedGO's G2) where none can be downloaded: WGAN-GP trained, before
any run, on training images that neither the clients nor the run's server hold, written in the
portable generator-file format for `generator-source = "load"`.

    python -m fedgo_lab.pretrain_generator G.pt --preset conf/fmnist-fair.toml --config seed=0

The paper's G2 is StyleGAN-XL pretrained on ImageNet, a generator of a related domain that never
saw the federation's data. Offline there is none for Fashion-MNIST, so the stand-in learns from
the server's half of the training split (data.split_indices) outside U and outside the labelled
validation split of the same seed: images of the clients' domain that no run of that seed
distils on or trains with. That makes it a favourable G2 (in-domain, as good as G1's recipe):
what a well-matched off-the-shelf generator gives, not what an ImageNet one gives. It trains
with the run's GAN keys (generator-steps, critic-steps, gan-lr, ...) on `--images` of those
images (default: as many as U holds, so G1 and this G2 differ only in which images they saw).
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path

import numpy as np
import torch

from fedgo_app import data
from fedgo_app.generators import fit_wgan_gp, new_generator, save_generator_file
from fedgo_lab.cli import add_config_flag, config_from


def pretraining_indices(cfg, size: int) -> np.ndarray:
    """`size` seeded indices of the server's half of the training split outside U and outside
    the validation split: images no run of this seed reads."""
    _, server = data.split_indices(cfg)
    held = np.setdiff1d(server, np.union1d(data.distillation_indices(cfg),
                                            data.validation_indices(cfg)))
    if size > len(held):
        raise ValueError(f"--images {size}: only {len(held)} images of the server's half lie "
                         "outside U and the validation split")
    return np.sort(np.random.default_rng(cfg.seed + 2).choice(held, size, replace=False))


def pretrain(cfg, dest: Path, size: int) -> Path:
    images = data.dataset(cfg).train_x[torch.from_numpy(pretraining_indices(cfg, size))]
    torch.manual_seed(cfg.seed)
    generator = new_generator(cfg, images.shape[1:])
    info = fit_wgan_gp(cfg, generator, images, torch.device("cpu"),
                       lambda line: print(f"[pretrain] {line}", flush=True))
    print(f"[pretrain] {len(images)} images, {cfg.generator_steps} steps, "
          f"{info['seconds']:.0f} s")
    return save_generator_file(dest, generator.cpu().eval(), images.shape[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedgo_lab.pretrain_generator",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path, help="the generator file to write")
    parser.add_argument("--preset", type=Path, help="a TOML preset (partial run config)")
    parser.add_argument("--images", type=int, default=0,
                        help="how many images to train on (default: as many as U holds)")
    add_config_flag(parser)
    args = parser.parse_args(argv)
    preset = tomllib.loads(args.preset.read_text()) if args.preset else {}
    cfg = config_from(parser, args.config, under=preset)
    size = args.images or len(data.distillation_indices(cfg))
    try:
        path = pretrain(cfg, args.dest, size)
    except ValueError as err:
        parser.error(str(err))
    print(f"[pretrain] wrote {path}; use it with generator-source = \"load\" generator-file = "
          f"\"{path.resolve()}\"")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
