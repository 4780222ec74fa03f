"""Re-run cells of a bench plan in process, on this machine's device, and compare each with its
recorded run: wall time and the server accuracy of the last three rounds.

    python -m fedgo_lab.rerun conf/bench/fmnist-lead.yaml fedgo-a0.1-s0 fedavg-a0.1-s0 \\
        --against docs/records/fmnist-lead [--out DIR] [--config KEY=VALUE ...]

In process means the in-process grid (fedgo_lab.inprocess): the real ServerApp and ClientApp
code with no SuperLink and no Ray, the clients one after another, so the tool runs wherever
PyTorch and Flower import (a GPU host without Ray, say). The records it writes are ordinary run
records (in --out, default results/rerun/<plan name>); --config overrides keys of every cell
(e.g. num-server-rounds=1 for a quick check). What it answers: does the same configuration
reach the same accuracy on this device, and how much faster is it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import yaml

from fedgo_flwr.config import Config, ConfigError
from fedgo_flwr.train import resolve_device
from fedgo_lab.bench import PlanError, cells_of, load_plan
from fedgo_lab.cli import add_config_flag, add_out_flag, add_repo_flag, config_values, repo_of
from fedgo_lab.report import last3_mean


def last3(record: dict) -> float:
    """The server's test accuracy averaged over the last three rounds, in %."""
    return 100 * last3_mean(record)


def rerun(cfg: Config, num_clients: int) -> tuple[dict, float]:
    """One cell's config through the real apps on the in-process grid: its record and wall
    seconds."""
    from client_app.app import app as client_app
    from fedgo_lab.inprocess import InProcessGrid
    from server_app.app import run

    start = time.perf_counter()
    path = run(InProcessGrid(client_app, cfg.to_run_config(), num_clients), cfg)
    return json.loads(path.read_text()), time.perf_counter() - start


def table(rows: list[dict], device: str) -> str:
    lines = [f"| run | {device} in process s | recorded s | speed-up | last 3 here (%) | "
             "recorded (%) | difference (points) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['run']} | {r['wall_s']:.1f} | {r['recorded_wall_s']:.1f} | "
                     f"{r['recorded_wall_s'] / r['wall_s']:.1f}x | {r['last3']:.2f} | "
                     f"{r['recorded_last3']:.2f} | {r['last3'] - r['recorded_last3']:+.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedgo_lab.rerun",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("plan", type=Path, help="the plan, a YAML file (see conf/bench/)")
    parser.add_argument("cells", nargs="+", help="run names of the plan, e.g. fedgo-a0.1-s0")
    parser.add_argument("--against", type=Path, required=True, metavar="DIR",
                        help="the recorded runs: DIR/<run name>/record.json")
    add_out_flag(parser, "the re-runs' records go", "results/rerun/<plan name>")
    add_config_flag(parser, "over every cell's")
    add_repo_flag(parser)
    args = parser.parse_args(argv)
    repo = repo_of(parser, args)
    overrides = config_values(parser, args.config)
    try:
        plan = load_plan(args.plan)
        out = (args.out or repo / "results" / "rerun" / plan.get("name", args.plan.stem)).resolve()
        cells = {c.run_name: c for c in cells_of(plan, out, repo)}
    except (PlanError, OSError, yaml.YAMLError) as err:
        parser.error(f"bad plan: {err}")
    unknown = [c for c in args.cells if c not in cells]
    if unknown:
        parser.error(f"not cells of {args.plan}: {unknown}; its cells: {sorted(cells)}")
    recorded = {}
    for name in args.cells:
        path = args.against / name / "record.json"
        if cells[name].central is not None:
            parser.error(f"{name} is a central-training cell, not a federated run")
        if not path.is_file():
            parser.error(f"no recorded run {path}")
        recorded[name] = json.loads(path.read_text())
    configs = {}  # every cell's config is checked before the first one runs
    for name in args.cells:
        try:
            configs[name] = Config.from_run_config({**cells[name].run_config, **overrides})
        except ConfigError as err:
            parser.error(f"--config: {err}")
    device = resolve_device()
    label = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    rows = []
    for i, name in enumerate(args.cells, 1):
        print(f"[rerun {i}/{len(args.cells)} {name}] on {label} ...", flush=True)
        record, wall = rerun(configs[name], plan["federation"]["num-supernodes"])
        rows.append({"run": name, "wall_s": wall, "last3": last3(record),
                     "recorded_wall_s": recorded[name]["timings"]["wall"],
                     "recorded_last3": last3(recorded[name]),
                     "stages_s": record["timings"]})
        print(f"[rerun {i}/{len(args.cells)} {name}] {wall:.1f} s, last 3 rounds "
              f"{rows[-1]['last3']:.2f} % (recorded {rows[-1]['recorded_last3']:.2f} %)",
              flush=True)
    text = table(rows, label)
    (out / "rerun.json").write_text(json.dumps({"device": label, "rows": rows}, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
