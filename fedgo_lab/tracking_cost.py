"""What watching a run costs: the same short FedGO run of the app (the tests' tiny
Fashion-MNIST, 4 clients, the diagnostics on) with no tracker, with TensorBoard and with
MLflow (a local sqlite store), and each round's wall seconds from its record.

    python -m fedgo_lab.tracking_cost [--rounds 5] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedgo_lab.tracking_cost",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
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
    write_tiny_fmnist(out / "data" / "FashionMNIST" / "raw")
    base = Config().replace(
        data_dir=str(out / "data"), results_dir=str(out / "results"), strategy="fedgo",
        num_server_rounds=args.rounds, fraction_train=0.5, local_epochs=1, server_epochs=1,
        generator_steps=2, discriminator_epochs=1, distill_size=0, test_size=0,
        generator_width=8, discriminator_width=8, alpha=0.5, model="mlp", diagnostics=True,
        generator_cache=False)
    variants = {"off": {}, "tensorboard": {"tensorboard_dir": str(out / "tb")},
                "mlflow": {"mlflow_uri": f"sqlite:///{out / 'mlflow.db'}"}}
    print(f"{args.rounds} rounds each; the seconds of the stages of rounds 2-{args.rounds} (round 1 warms up)")
    for name, keys in variants.items():
        cfg = base.replace(run_name=name, **keys)
        record = json.loads(run(InProcessGrid(client_app, cfg.to_run_config(), 4), cfg)
                            .read_text())
        seconds = [r["round_seconds"] for r in record["rounds"] if r["round"] > 1]
        print(f"{name:12s} mean {statistics.mean(seconds):.3f} s a round, "
              f"median {statistics.median(seconds):.3f}, wall {record['timings']['wall']:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
