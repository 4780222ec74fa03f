"""Client training throughput on this machine: images/s of the library's own local training
(fedgo_flwr.train.train_classifier) under what PyTorch offers on a CPU, and whether the result
moves.

    python -m fedgo_lab.throughput [--images 2000] [--epochs 2] [--threads 1 2]
                                   [--settings plain channels-last torch.compile]
                                   [--model cnn] [--repeats 2]

Each setting trains the same initial model on the same seeded images (uint8, Fashion-MNIST's
shape) for --epochs local epochs: intra-op threads (torch.set_num_threads; Ray gives each
client actor one CPU), the contiguous ("plain") against the channels-last memory format
(what train_classifier uses since this measurement), and torch.compile (its first epoch, the
compilation, timed apart; every setting gets the same untimed warm-up). Prints images/s
(best of --repeats), the speed-up over the plain model on the first thread count, and how far
the final training loss lies from the plain model's (Adam amplifies float-ordering noise in
the parameters, so the loss is the honest measure: differences of about 1e-3 are noise).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time

import torch

from fedgo_flwr.models import create_classifier
from fedgo_flwr.train import train_classifier

# name -> (channels-last, torch.compile)
VARIANTS = {"plain": (False, False), "channels-last": (True, False),
            "torch.compile": (False, True)}


def train_once(model: torch.nn.Module, x, y, epochs: int,
               channels_last: bool) -> tuple[float, float]:
    """Seconds and final training loss of `epochs` local epochs."""
    start = time.perf_counter()
    info = train_classifier(model, x, y, epochs=epochs, batch_size=64, lr=1e-3, flip=True,
                            seed=0, device=torch.device("cpu"), channels_last_format=channels_last)
    return time.perf_counter() - start, info["train-loss"]


def variant(initial: torch.nn.Module, compiled: bool) -> torch.nn.Module:
    model = copy.deepcopy(initial)
    return torch.compile(model) if compiled else model


def measure(args: argparse.Namespace) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (args.images, 1, 28, 28), dtype=torch.uint8, generator=gen)
    y = torch.randint(0, 10, (args.images,), generator=gen)
    torch.manual_seed(0)
    initial = create_classifier(args.model, 1, 10, 28)
    rows, reference = [], None
    for threads in args.threads:
        torch.set_num_threads(threads)
        for name in args.settings:
            channels_last, compiled = VARIANTS[name]
            # warm-up, untimed but for torch.compile, whose compilation happens here
            warm, _ = train_once(variant(initial, compiled), x[:128], y[:128], 1, channels_last)
            best, loss = float("inf"), float("nan")
            for _ in range(args.repeats):
                model = variant(initial, compiled)
                if compiled:  # a fresh compiled module recompiles: keep that out of the timing
                    train_once(model, x[:128], y[:128], 1, channels_last)
                    model = variant(initial, compiled)
                seconds, loss = train_once(model, x, y, args.epochs, channels_last)
                best = min(best, seconds)
            if reference is None:
                reference = (best, loss)
            rows.append({"threads": threads, "variant": name,
                         "images_per_s": args.images * args.epochs / best,
                         "speedup": reference[0] / best, "compile_s": warm if compiled else None,
                         "loss_difference": abs(loss - reference[1])})
            print(f"[throughput] {threads} thread(s), {name}: "
                  f"{rows[-1]['images_per_s']:.0f} images/s", flush=True)
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| threads | setting | images/s | speed-up | first-steps compile (s) | "
             "final loss difference |", "|---|---|---|---|---|---|"]
    for r in rows:
        compile_s = f"{r['compile_s']:.1f}" if r["compile_s"] is not None else "-"
        lines.append(f"| {r['threads']} | {r['variant']} | {r['images_per_s']:.0f} | "
                     f"{r['speedup']:.2f}x | {compile_s} | {r['loss_difference']:.1e} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedgo_lab.throughput",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2000, help="training images")
    parser.add_argument("--epochs", type=int, default=2, help="local epochs per measurement")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2],
                        help="intra-op thread counts")
    parser.add_argument("--settings", nargs="+", default=list(VARIANTS), choices=VARIANTS,
                        help="what to measure; the first is the reference")
    parser.add_argument("--model", default="cnn", help="a registered classifier")
    parser.add_argument("--repeats", type=int, default=2, help="measurements per setting")
    args = parser.parse_args(argv)
    if args.images < 128 or args.epochs < 1 or args.repeats < 1 or min(args.threads) < 1:
        parser.error("--images >= 128, --epochs, --repeats and --threads >= 1")
    print(f"# client training throughput: {args.model}, {args.images} images x {args.epochs} "
          f"epoch(s), batch 64, torch {torch.__version__}")
    print(markdown(measure(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
