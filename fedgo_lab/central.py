"""The central-training reference (the paper's upper bound): the same classifier trained on the
whole client pool, as if every client's data sat on one machine.

    python -m fedgo_lab.central --epochs 20 [--seed 0] [--config KEY=VALUE ...] [--out DIR]
                                [--repo DIR]

Client training's settings (Adam `lr`, `batch-size`, `flip`) and the run's seed, split and test
images; the pool does not depend on alpha. Writes <out>/central-s<seed>/record.json in the run
record's shape, one entry per epoch (as 'round'), with config.strategy = "central".
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from fedgo_app.config import Config
from fedgo_app.data import dataset, server_data, split_indices
from fedgo_flwr.models import create_classifier
from fedgo_flwr.seeds import round_seed
from fedgo_flwr.train import evaluate, resolve_device, train_classifier
from fedgo_lab.cli import add_config_flag, add_out_flag, add_repo_flag, config_from, repo_of
from fedgo_lab.report import CENTRAL


def central_run_config(cfg: Config, epochs: int) -> dict:
    """The config a central record holds: the run config, marked as the reference."""
    return {**cfg.to_run_config(), "strategy": CENTRAL, "alpha": None, "central-epochs": epochs}


def train_central(cfg: Config, epochs: int, out: Path) -> Path:
    """Train on the pooled client data for `epochs`, evaluating after each; returns the record."""
    start = time.perf_counter()
    device = resolve_device(cfg.server_device)
    data = dataset(cfg)
    pool, _ = split_indices(cfg)
    idx = torch.from_numpy(pool)
    x, y = data.train_x[idx], data.train_y[idx]
    _, test_x, test_y = server_data(cfg)
    torch.manual_seed(cfg.seed)  # theta^0, as the ServerApp makes it
    c, h, _ = data.image_shape
    model = create_classifier(cfg.model, c, data.num_classes, h)
    acc, loss = evaluate(model, test_x, test_y, device=device)
    rounds = [{"round": 0, "server_test_acc": acc, "server_test_loss": loss}]
    for epoch in range(1, epochs + 1):
        info = train_classifier(model, x, y, epochs=1, batch_size=cfg.batch_size, lr=cfg.lr,
                                flip=cfg.flip, crop=cfg.random_crop, optimizer=cfg.optimizer,
                                momentum=cfg.momentum,
                                seed=round_seed(cfg.seed, epoch), device=device)
        acc, loss = evaluate(model, test_x, test_y, device=device)
        rounds.append({"round": epoch, "server_test_acc": acc, "server_test_loss": loss,
                       "train_loss": info["train-loss"]})
        print(f"[central] seed {cfg.seed} epoch {epoch}/{epochs}: test acc {100 * acc:.2f} %",
              flush=True)
    record = {"run_name": f"{CENTRAL}-s{cfg.seed}",
              "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "config": central_run_config(cfg, epochs),
              "clients": {"pooled_examples": len(y)}, "rounds": rounds,
              "timings": {"wall": time.perf_counter() - start}}
    path = Path(out) / record["run_name"] / "record.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedgo_lab.central",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=20, help="epochs over the pooled data")
    parser.add_argument("--seed", type=int, default=0, help="the run's seed (split, model, order)")
    add_config_flag(parser)
    add_out_flag(parser, "central-s<seed>/record.json goes", "results/central")
    add_repo_flag(parser)
    args = parser.parse_args(argv)
    repo = repo_of(parser, args)
    if args.epochs < 1:
        parser.error("--epochs must be >= 1")
    out = args.out or repo / "results" / "central"
    cfg = config_from(parser, args.config, over={"seed": args.seed})
    print(f"[central] record: {train_central(cfg, args.epochs, out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
