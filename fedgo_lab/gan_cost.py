"""What FedGO's pre-FL generator costs: seconds per 1,000 WGAN-GP generator steps (each with its
5 critic steps) of the library's `Generator` and `Critic` at the library's defaults (widths 64,
batch 64, latent 128), for images of each size, on this machine's device.

    python -m fedgo_lab.gan_cost [--sizes 1x8x8 1x28x28 3x32x32 3x64x64 3x96x96]
                                 [--steps 20] [--width 64] [--device cpu]

Times `--steps` steps after 2 warm-up steps and scales them to 1,000; prints a table and the
time the paper's 100,000 steps would take.
"""

from __future__ import annotations

import argparse
import time

import torch

from fedgo_flwr.gan import train_wgan_gp
from fedgo_flwr.models import Critic, Generator
from fedgo_flwr.progress import duration
from fedgo_flwr.train import resolve_device

SIZES = ("1x8x8", "1x28x28", "3x32x32", "3x64x64", "3x96x96")


def seconds_per_step(shape: tuple[int, int, int], steps: int, width: int,
                     device: torch.device) -> float:
    c, h, w = shape
    u = torch.randint(0, 256, (512, c, h, w), dtype=torch.uint8)
    torch.manual_seed(0)
    generator, critic = Generator(128, c, (h, w), width), Critic(c, (h, w), width)
    train_wgan_gp(generator, critic, u, steps=2, device=device)  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    train_wgan_gp(generator, critic, u, steps=steps, device=device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fedgo_lab.gan_cost",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES),
                        help="image shapes CxHxW (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps a size")
    parser.add_argument("--width", type=int, default=64, help="generator_width (and critic's)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if visible)")
    args = parser.parse_args(argv)
    device = resolve_device(args.device) if args.device else resolve_device()
    print(f"device {device}, {torch.get_num_threads()} threads, width {args.width}, "
          f"{args.steps} timed steps a size")
    print("| images | s / 1,000 generator steps | 100,000 steps (the paper's) |")
    print("|---|---|---|")
    for size in args.sizes:
        shape = tuple(int(v) for v in size.split("x"))
        if len(shape) != 3:
            parser.error(f"--sizes takes CxHxW, not {size!r}")
        per_step = seconds_per_step(shape, args.steps, args.width, device)
        print(f"| {size} | {1000 * per_step:,.0f} | {duration(100_000 * per_step)} |",
              flush=True)


if __name__ == "__main__":
    main()
