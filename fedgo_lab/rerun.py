"""Run cells of a bench plan in process, on this machine's device, several at a time, and
compare each with its recorded run when there is one: wall time and the server accuracy of the
last three rounds.

    python -m fedgo_lab.rerun conf/bench/fmnist-lead.yaml [RUN ...] [--against DIR] \\
        [--out DIR] [--parallel N] [--threads N] [--max-minutes M] [--config KEY=VALUE ...]

In process means the in-process grid (fedgo_lab.inprocess): the real ServerApp and ClientApp
code with no SuperLink and no Ray, the clients one after another, so the tool runs wherever
PyTorch and Flower import (a GPU host without Ray, say). No RUN names means every federated
cell of the plan. The records it writes are ordinary run records (in --out, default
results/rerun/<plan name>) with the device that made them; like the bench runner it skips a
cell whose record is already there with the same config, so an interrupted call resumes, and
a run stopped part-way goes on from its newest checkpoint (delete its folder to start afresh).
--parallel N runs N cells at once in separate processes (a GPU is far from busy with one
small CNN run; 1, the default, runs them one after another in this process) with --threads
torch threads each (default: the cores shared among them); --max-minutes M
starts no run after M minutes; --config overrides keys of every cell (e.g. num-server-rounds=1
for a quick check). What it answers: does the same configuration
reach the same accuracy on this device, how much faster is it, and a whole plan's records on
a machine that has no Ray.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, ThreadPoolExecutor, wait
from pathlib import Path

import torch
import yaml

from fedgo_app.config import Config, ConfigError
from fedgo_flwr.train import device_name, resolve_device
from fedgo_lab.bench import Cell, PlanError, cells_of, finished, going_on, load_plan
from fedgo_lab.cli import (add_config_flag, add_out_flag, add_repo_flag, add_tracking_flags,
                           config_values, repo_of, tracking)
from fedgo_lab.report import last_mean


def last3(record: dict) -> float:
    """The server's test accuracy averaged over the last three rounds, in %."""
    return 100 * last_mean(record)


def device_label() -> str:
    return device_name(resolve_device())


def rerun(cfg: Config, num_clients: int) -> tuple[dict, float]:
    """One cell's config through the real apps on the in-process grid: its record (which
    names the device) and wall seconds."""
    from client_app.app import app as client_app
    from fedgo_lab.inprocess import InProcessGrid
    from server_app.app import run

    start = time.perf_counter()
    path = run(InProcessGrid(client_app, cfg.to_run_config(), num_clients), cfg)
    wall = time.perf_counter() - start
    record = {**json.loads(path.read_text()), "device": f"{device_label()}, in process"}
    path.write_text(json.dumps(record, indent=1))
    return record, wall


def worker(cfg: Config, num_clients: int, threads: int):
    """One cell in a worker process (its own CUDA context and threads), or in this one."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return rerun(cfg, num_clients)
    finally:
        torch.set_num_threads(before)


def table(rows: list[dict], device: str) -> str:
    compared = all("recorded_wall_s" in r for r in rows)
    head = f"| run | {device} in process s | last 3 here (%) |"
    if compared:
        head = (f"| run | {device} in process s | recorded s | speed-up | last 3 here (%) | "
                "recorded (%) | difference (points) |")
    lines = [head, "|" + "---|" * head.count(" |")]
    for r in rows:
        if compared:
            lines.append(f"| {r['run']} | {r['wall_s']:.1f} | {r['recorded_wall_s']:.1f} | "
                         f"{r['recorded_wall_s'] / r['wall_s']:.1f}x | {r['last3']:.2f} | "
                         f"{r['recorded_last3']:.2f} | {r['last3'] - r['recorded_last3']:+.2f} |")
        else:
            lines.append(f"| {r['run']} | {r['wall_s']:.1f} | {r['last3']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedgo_lab.rerun",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("plan", type=Path, help="the plan, a YAML file (see conf/bench/)")
    parser.add_argument("cells", nargs="*", help="run names of the plan, e.g. fedgo-a0.1-s0; "
                        "none: every federated cell")
    parser.add_argument("--against", type=Path, metavar="DIR",
                        help="recorded runs to compare with: DIR/<run name>/record.json")
    add_out_flag(parser, "the re-runs' records go", "results/rerun/<plan name>")
    parser.add_argument("--parallel", type=int, default=1, metavar="N",
                        help="cells run at once, each in its own process (default 1: one after "
                        "another in this process)")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="torch threads a cell (default: this machine's cores / --parallel; "
                        "fewer when something else shares the cores: more threads than cores "
                        "slowed two runs side by side on 2 cores four times)")
    parser.add_argument("--max-minutes", type=float, default=None, metavar="M",
                        help="start no run after this many minutes (the call resumes later)")
    add_config_flag(parser, "over every cell's")
    add_tracking_flags(parser)
    add_repo_flag(parser)
    args = parser.parse_args(argv)
    repo = repo_of(parser, args)
    overrides = config_values(parser, args.config)
    for flag, value in (("--parallel", args.parallel), ("--threads", args.threads)):
        if value is not None and value < 1:
            parser.error(f"{flag}: at least 1, got {value}")
    try:
        plan = load_plan(args.plan)
        out = (args.out or repo / "results" / "rerun" / plan.get("name", args.plan.stem)).resolve()
        cells = {c.run_name: c for c in cells_of(plan, out, repo)}
        overrides.update(tracking(args, plan.get("name", args.plan.stem)))
    except (PlanError, OSError, yaml.YAMLError) as err:
        parser.error(f"bad plan: {err}")
    names = args.cells or [n for n, c in cells.items() if c.central is None]
    unknown = [c for c in names if c not in cells]
    if unknown:
        parser.error(f"not cells of {args.plan}: {unknown}; its cells: {sorted(cells)}")
    recorded = {}
    for name in names:
        if cells[name].central is not None:
            parser.error(f"{name} is a central-training cell, not a federated run")
        if args.against is not None:
            path = args.against / name / "record.json"
            if not path.is_file():
                parser.error(f"no recorded run {path}")
            recorded[name] = json.loads(path.read_text())
    configs = {}  # every cell's config is checked before the first one runs
    for name in names:
        try:
            cfg = Config.from_run_config({**cells[name].run_config, **overrides})
            cell = Cell(name, cfg.to_run_config())
            if not finished(cell, out):  # a run stopped part-way goes on from its checkpoint
                configs[name] = Config.from_run_config(going_on(cell, out).run_config)
        except ConfigError as err:
            parser.error(f"--config: {err}")
        except PlanError as err:
            parser.error(str(err))
    todo = [n for n in names if n in configs]
    done = [n for n in names if n not in configs]
    for name in todo:
        if configs[name].resume_from:
            print(f"[rerun] {name} goes on from {configs[name].resume_from}", flush=True)
    label = device_label()
    print(f"[rerun] {len(todo)} of {len(names)} cells to run on {label}, {args.parallel} at a "
          f"time ({len(done)} already in {out})", flush=True)
    deadline = time.time() + 60 * (args.max_minutes if args.max_minutes is not None else 1e9)
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.parallel)
    num_clients = plan["federation"]["num-supernodes"]
    rows, pending = [], list(todo)  # pending: not yet started
    # one at a time needs no process of its own (a start-up of torch and Flower saved a cell)
    pool = ThreadPoolExecutor(1) if args.parallel == 1 else ProcessPoolExecutor(
        args.parallel, mp_context=multiprocessing.get_context("spawn"), max_tasks_per_child=1)
    with pool:
        running = {}
        while pending or running:
            # a cell is handed to a free process only while time remains, so it starts at once
            while pending and len(running) < args.parallel and time.time() <= deadline:
                name = pending.pop(0)
                running[pool.submit(worker, configs[name], num_clients, threads)] = name
            if not running:
                break
            finished_now, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished_now:
                name = running.pop(future)
                record, wall = future.result()
                row = {"run": name, "wall_s": wall, "last3": last3(record),
                       "stages_s": record["timings"]}
                if name in recorded:
                    row.update(recorded_wall_s=recorded[name]["timings"]["wall"],
                               recorded_last3=last3(recorded[name]))
                rows.append(row)
                print(f"[rerun {len(rows)}/{len(todo)} {name}] {wall:.1f} s, last 3 rounds "
                      f"{row['last3']:.2f} %", flush=True)
    if pending:
        print(f"[rerun] the time was up before {len(pending)} cells: {pending}; run the same "
              "command again to go on", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rerun.json").write_text(json.dumps({"device": label, "rows": rows}, indent=1))
    print(table(rows, label))
    return 0


if __name__ == "__main__":
    sys.exit(main())
