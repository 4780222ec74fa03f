"""Performance benchmark: what one FedGO round costs, and what caching and batching save.

    python -m fedgo_lab.perf [--clients 20 100 500] [--server-epochs 1 10]
                             [--distill-size 3000] [--alpha 0.5] [--device auto]
                             [--out DIR] [--config KEY=VALUE ...]

Settings are the run config's defaults (`pyproject.toml`), one round, and the options above;
--config sets any other run-config key (TOML values, e.g. generator-steps=0 model="resnet18").

1. Server pseudo-labelling, with the same teachers, U and seed, two paths in one process:
   cached  odds on U once (pre-FL), pseudo-labels once per round for the views of U that the
           round's E_s epochs will meet, with the round's models run as one teacher
           (teachers.teacher_logits), then E_s epochs of distillation against them;
   naive   every minibatch of every epoch runs every client's classifier and discriminator on
           that batch and weights them there: Algorithm 2 transcribed literally.
   Prints labels/s of each, the speed-up, and the largest difference between the two students.
2. One FedGO round through the real ServerApp and ClientApp code on an in-process grid (the
   clients run one after another), for each K in --clients, each K in its own process so that
   its peak memory is its own: seconds per stage, peak memory, the discriminator training of a
   client against one round of its classifier training, and the pre-FL bytes against the bytes
   of one main-FL round. Its runs' records go to --out (by default a new temporary folder,
   whose path is printed).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from fedgo_app.config import Config
from fedgo_flwr.distill import (batch_images, distill, draw_batches, kl_to_targets,
                                pseudo_labels, view_pseudo_labels)
from fedgo_flwr.gan import log_odds
from fedgo_flwr.models import Discriminator, create_classifier
from fedgo_flwr.teachers import teacher_logits
from fedgo_flwr.train import descend, resolve_device
from fedgo_flwr.weighting import WeightRule, odds_weights
from fedgo_lab.cli import add_config_flag, config_from

MARKER = "PERF-JSON "
STAGES = ("client_training", "aggregation", "pseudo_labelling", "distillation", "evaluation")


# ---------------------------------------------------------------- 1. pseudo-labelling paths
def cached_distill(student, u, nets, discriminators, n_k, rule: WeightRule, *, epochs: int,
                   batch_size: int, lr: float, seed: int, device, views: int = 2) -> dict:
    """What the strategies do: odds once, pseudo-labels once, then distill."""
    batches = draw_batches(len(u), views, epochs=epochs, batch_size=batch_size, seed=seed)
    start = time.perf_counter()
    u_log_odds = torch.stack([torch.stack([log_odds(d, u, device=device, flip=v == 1)
                                           for v in range(views)]) for d in discriminators])
    odds_s = time.perf_counter() - start
    start = time.perf_counter()
    targets = view_pseudo_labels(
        lambda v, s: (teacher_logits(nets, u[s], device=device, flip=v == 1),
                      u_log_odds[:, v, s]), len(u), n_k, rule, batches, views=views)
    label_s = time.perf_counter() - start
    info = distill(student, u, targets, batches=batches, lr=lr, device=device)
    return {"odds_s": odds_s, "label_s": label_s, "distill_s": info["seconds"],
            "loss": info["distill_loss"]}


def naive_distill(student, u, nets, discriminators, n_k, rule: WeightRule, *, epochs: int,
                  batch_size: int, lr: float, seed: int, device, views: int = 2) -> dict:
    """The same distillation with every teacher and discriminator rerun on every minibatch;
    it draws the same batches and views as `cached_distill`, so the students must agree."""
    start = time.perf_counter()
    batches = draw_batches(len(u), views, epochs=epochs, batch_size=batch_size, seed=seed)
    for m in (*nets, *discriminators):
        m.to(device).eval()
    student.to(device).train()
    opt = torch.optim.Adam(student.parameters(), lr=lr)
    label_s = 0.0

    def batch_loss(batch: torch.Tensor) -> torch.Tensor:
        nonlocal label_s
        xb = batch_images(u, batch, device)
        t0 = time.perf_counter()
        with torch.no_grad():
            logits = torch.stack([net(xb) for net in nets]).float().cpu()
            phi = torch.stack([d.log_odds(xb) for d in discriminators]).float().cpu()
            targets = pseudo_labels(logits, rule(logits, phi, n_k)).to(device)
        label_s += time.perf_counter() - t0
        return kl_to_targets(student(xb), targets)

    loss = descend(opt, batches, batch_loss)
    student.eval()
    total = time.perf_counter() - start
    return {"odds_s": 0.0, "label_s": label_s, "distill_s": total - label_s, "loss": loss}


def max_difference(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a.state_dict().values(),
                                                           b.state_dict().values()))


def teachers_of(cfg: Config, num_teachers: int, image_shape, num_classes: int, seed: int):
    """Seeded stand-ins for the round's client models and discriminators (speed does not depend
    on what they learnt)."""
    c, h, _ = image_shape
    torch.manual_seed(seed)
    nets = [create_classifier(cfg.model, c, num_classes, h) for _ in range(num_teachers)]
    discriminators = [Discriminator(c, h, cfg.discriminator_width) for _ in range(num_teachers)]
    n_k = torch.randint(100, 3000, (num_teachers,)).float()
    return nets, discriminators, n_k


def pseudo_labelling_benchmark(cfg: Config, device, epochs: int) -> dict:
    from fedgo_app.data import dataset, server_data

    data = dataset(cfg)
    u, _, _ = server_data(cfg)
    k = max(1, math.floor(cfg.fraction_train * 20))
    nets, discriminators, n_k = teachers_of(cfg, k, data.image_shape, data.num_classes, cfg.seed)
    student = create_classifier(cfg.model, data.image_shape[0], data.num_classes,
                                data.image_shape[1])
    kwargs = dict(epochs=epochs, batch_size=cfg.server_batch_size, lr=cfg.server_lr,
                  seed=cfg.seed, device=device)
    fast_student, naive_student = copy.deepcopy(student), copy.deepcopy(student)
    fast = cached_distill(fast_student, u, nets, discriminators, n_k, odds_weights, **kwargs)
    naive = naive_distill(naive_student, u, nets, discriminators, n_k, odds_weights, **kwargs)
    forward = {}
    for stacked in (True, False):
        start = time.perf_counter()
        teacher_logits(nets, u, device=device, stacked=stacked)
        forward["stacked" if stacked else "loop"] = len(u) / (time.perf_counter() - start)
    return {"teachers": k, "u": len(u), "epochs": epochs, "fast": fast, "naive": naive,
            "max_student_difference": max_difference(fast_student, naive_student),
            "teacher_forward_samples_per_s": forward}


def print_pseudo_labelling(r: dict, device) -> None:
    labels = r["epochs"] * r["u"]  # pseudo-labels the distillation consumes
    fast, naive = r["fast"], r["naive"]
    print(f"\n## Server pseudo-labelling: |U| = {r['u']}, 2 views, {r['teachers']} teachers, "
          f"E_s = {r['epochs']}, batch 64, device {device}")
    print("| path | pseudo-labelling s | labels/s | distillation s | total s |")
    print("|---|---|---|---|---|")
    for name, p in (("cached + batched", fast), ("naive loop", naive)):
        print(f"| {name} | {p['label_s']:.2f} (+{p['odds_s']:.2f} odds, once per run) | "
              f"{labels / p['label_s']:.0f} | {p['distill_s']:.2f} | "
              f"{p['odds_s'] + p['label_s'] + p['distill_s']:.2f} |")
    with_odds = naive["label_s"] / (fast["label_s"] + fast["odds_s"])
    total = ((naive["label_s"] + naive["distill_s"])
             / (fast["label_s"] + fast["odds_s"] + fast["distill_s"]))
    print(f"speed-up of pseudo-labelling: {naive['label_s'] / fast['label_s']:.1f}x "
          f"({with_odds:.1f}x counting the one-off odds in this round); "
          f"of the whole server update: {total:.1f}x")
    print(f"largest |difference| between the two distilled students: "
          f"{r['max_student_difference']:.2e}")
    f = r["teacher_forward_samples_per_s"]
    print(f"teacher forward over {r['teachers']} models: stacked (torch.func.vmap) "
          f"{f['stacked']:.0f} samples/s, model by model {f['loop']:.0f} samples/s")


# ---------------------------------------------------------------- 2. one round at K clients
def one_round(cfg: Config, num_clients: int) -> dict:
    """One FedGO round (pre-FL included) on an in-process grid; runs in a child process."""
    from client_app.app import app as client_app
    from server_app.app import run

    from fedgo_lab.inprocess import InProcessGrid

    grid = InProcessGrid(client_app, cfg.to_run_config(), num_clients)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    record = json.loads(run(grid, cfg).read_text())
    wall = time.perf_counter() - start
    r1 = next(r for r in record["rounds"] if r["round"] == 1)
    b = record["bytes"]
    t = record["timings"]
    sampled = len(r1["clients"])
    return {
        "clients": num_clients, "sampled": sampled, "wall_s": wall,
        "pre_fl_s": {k: t.get(k, 0.0) for k in ("generator_training",
                                                 "discriminator_training", "odds")},
        "round_s": {k: r1["seconds"].get(k, 0.0) for k in STAGES},
        "round_cpu_s": r1.get("cpu_seconds", 0.0),
        "d_per_client_s": t["discriminator_training"] / num_clients,
        "classifier_per_client_s": r1["seconds"]["client_training"] / sampled,
        "pre_fl_bytes": b["pre_fl_down"] + b["pre_fl_up"],
        "round_bytes": r1["bytes"]["down"] + r1["bytes"]["up"],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "peak_cuda_mb": (torch.cuda.max_memory_allocated() / 2**20
                         if torch.cuda.is_available() else 0.0),
    }


def run_child(args: argparse.Namespace, num_clients: int, out: Path) -> dict:
    cmd = [sys.executable, "-m", "fedgo_lab.perf", "--one-round", str(num_clients),
           "--out", str(out), "--alpha", str(args.alpha),
           "--distill-size", str(args.distill_size), "--device", args.device,
           "--seed", str(args.seed), "--config", *args.config]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARKER)]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise RuntimeError(f"the round at K = {num_clients} failed (exit {proc.returncode})")
    return json.loads(lines[-1][len(MARKER):])


def print_rounds(rows: list[dict]) -> None:
    print("\n## One FedGO round (pre-FL included), in-process grid, clients one after another")
    print("| K | clients/round | G training s | D training s (all) | odds s | "
          + " | ".join(s.replace("_", " ") + " s" for s in STAGES)
          + " | round s | round CPU s | peak RSS MB | peak CUDA MB |")
    print("|---" * (9 + len(STAGES)) + "|")
    for r in rows:
        p, s = r["pre_fl_s"], r["round_s"]
        print(f"| {r['clients']} | {r['sampled']} | {p['generator_training']:.1f} | "
              f"{p['discriminator_training']:.1f} | {p['odds']:.1f} | "
              + " | ".join(f"{s[k]:.2f}" for k in STAGES)
              + f" | {sum(s.values()):.1f} | {r['round_cpu_s']:.1f} | {r['peak_rss_mb']:.0f} | "
              f"{r['peak_cuda_mb']:.0f} |")
    base = rows[0]
    for r in rows:
        ratio = r["d_per_client_s"] / r["classifier_per_client_s"]
        print(f"K = {r['clients']}: a client's discriminator training costs {ratio:.2f} rounds "
              f"of its classifier training ({r['d_per_client_s']:.2f} s vs "
              f"{r['classifier_per_client_s']:.2f} s); pre-FL bytes = "
              f"{r['pre_fl_bytes'] / r['round_bytes']:.2f} main-FL rounds "
              f"({r['pre_fl_bytes'] / 2**20:.1f} MiB vs {r['round_bytes'] / 2**20:.1f} MiB); "
              f"round time x{sum(r['round_s'].values()) / sum(base['round_s'].values()):.2f} "
              f"and pre-FL time x{sum(r['pre_fl_s'].values()) / sum(base['pre_fl_s'].values()):.2f}"
              f" of K = {base['clients']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedgo_lab.perf",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="*", default=[20, 100, 500],
                        help="K values for the one-round runs (none: skip them)")
    parser.add_argument("--server-epochs", type=int, nargs="*", default=[1, 10],
                        help="E_s values for the pseudo-labelling comparison (none: skip it)")
    parser.add_argument("--distill-size", type=int, default=3000, help="|U|, the distillation set")
    parser.add_argument("--alpha", type=float, default=0.5,
                        help="Dirichlet alpha (0.1 cannot give 500 non-empty partitions)")
    parser.add_argument("--device", default="auto", help="the server's device: auto, cpu, cuda")
    parser.add_argument("--seed", type=int, default=0, help="the run's seed")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="where the one-round runs' records go; default: a new folder under "
                        "the system's temporary folder")
    add_config_flag(parser)
    parser.add_argument("--one-round", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    cfg = config_from(parser, args.config, over={
        "num-server-rounds": 1, "alpha": args.alpha, "distill-size": args.distill_size,
        "server-device": args.device, "seed": args.seed})
    # made once the arguments are good, and handed to the rounds' own processes
    results = (args.out or Path(tempfile.mkdtemp(prefix="fedgo-perf-"))).resolve()
    cfg = cfg.replace(results_dir=str(results))
    if args.one_round is not None:
        out = one_round(cfg.replace(run_name=f"perf-K{args.one_round}"), args.one_round)
        print(MARKER + json.dumps(out))
        return 0

    device = resolve_device(args.device)
    print(f"# fedgo-flwr performance benchmark: device {device}, torch threads "
          f"{torch.get_num_threads()}, |U| = {args.distill_size}, seed {args.seed}")
    for epochs in args.server_epochs:
        print(f"[perf] pseudo-labelling comparison, E_s = {epochs} ...", flush=True)
        print_pseudo_labelling(pseudo_labelling_benchmark(cfg, device, epochs), device)
    rows, failed = [], []
    for k in args.clients:
        print(f"[perf] one round at K = {k} (own process) ...", flush=True)
        try:
            rows.append(run_child(args, k, results))
        except RuntimeError as err:  # one K failing (e.g. no valid partition) keeps the others
            print(f"[perf] {err}", flush=True)
            failed.append(k)
    if rows:
        print_rounds(rows)
        print(f"\nrecords of the rounds: {results}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
