"""What watching a run costs: the same short run of the app with no tracker, with TensorBoard
and with MLflow (a local sqlite store), and each round's wall seconds from its record. By
default FedGO on the tests' tiny Fashion-MNIST (4 clients, the diagnostics on); with --real,
FedDF with the fair preset (conf/fmnist-fair.toml: 3 server passes over 3,000 images, the
diagnostics on) on the real Fashion-MNIST, 20 clients, 1 local epoch: a round of real size.

    python -m fedgo_lab.tracking_cost [--rounds 5] [--real] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import tomllib
from pathlib import Path

import torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedgo_lab.tracking_cost",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--real", action="store_true",
                        help="FedDF at the fair preset on the real Fashion-MNIST, 20 clients")
    parser.add_argument("--out", type=Path, default=None, help="default: a temporary folder")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from conftest import write_tiny_fmnist
    from client_app.app import app as client_app
    from fedgo_app.config import Config
    from fedgo_lab.inprocess import InProcessGrid
    from server_app.app import run
    torch.set_num_threads(1)
    out = args.out or Path(tempfile.mkdtemp(prefix="tracking-cost-"))
    if args.real:
        with open(Path(__file__).resolve().parents[1] / "conf" / "fmnist-fair.toml", "rb") as f:
            base, clients = Config.from_run_config(tomllib.load(f)).replace(
                strategy="feddf", local_epochs=1), 20
    else:
        write_tiny_fmnist(out / "data" / "FashionMNIST" / "raw")
        base, clients = Config().replace(
            data_dir=str(out / "data"), strategy="fedgo", fraction_train=0.5, local_epochs=1,
            server_epochs=1, generator_steps=2, discriminator_epochs=1, distill_size=0,
            test_size=0, generator_width=8, discriminator_width=8, alpha=0.5, model="mlp",
            diagnostics=True, generator_cache=False), 4
    base = base.replace(results_dir=str(out / "results"), num_server_rounds=args.rounds)
    variants = {"off": {}, "tensorboard": {"tensorboard_dir": str(out / "tb")},
                "mlflow": {"mlflow_uri": f"sqlite:///{out / 'mlflow.db'}"}}
    print(f"{args.rounds} rounds each, {clients} clients; the stage seconds of rounds "
          f"2-{args.rounds} (round 1 warms up)", flush=True)
    for name, keys in variants.items():
        cfg = base.replace(run_name=name, **keys)
        record = json.loads(run(InProcessGrid(client_app, cfg.to_run_config(), clients), cfg)
                            .read_text())
        seconds = [r["round_seconds"] for r in record["rounds"] if r["round"] > 1]
        print(f"{name:12s} mean {statistics.mean(seconds):.3f} s a round, "
              f"median {statistics.median(seconds):.3f}, wall {record['timings']['wall']:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
