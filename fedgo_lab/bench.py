"""Benchmark plans: a grid of real `flwr run`s described by a YAML plan, resumable, summarised
as a markdown table and plots.

    python -m fedgo_lab.bench conf/bench/fmnist-fair.yaml [--out DIR] [--dry-run]
                                                          [--max-minutes M] [--repo DIR]

A plan (see conf/bench/) has the keys
  name        names the default output folder, results/bench/<name>
  preset      a TOML preset (partial run config), relative to the repository root (the
              current directory, or --repo DIR: where pyproject.toml declares the app)
  config      run-config keys set in every cell, over the preset
  federation  the simulation federation, e.g. {num-supernodes: 20, client-resources-num-cpus: 1}
  alphas      Dirichlet alphas;  seeds: seeds
  cells       a strategy name, or a mapping of run-config keys with an optional `name` and
              `preset` (a TOML preset of the cell's own, under its keys and over `config`);
              a string value may hold {seed} and {alpha}, filled in per run, and a cell's
              generator-file is relative to the repository (a G2 file per seed)
  central     optional: epochs of the central-training reference (fedgo_lab.central), one
              run per seed on the pooled client data, named central-s<seed>
Every cell x alpha x seed is one `flwr run` through the local SuperLink and Ray, named
<cell>-a<alpha>-s<seed>; its record lands in <out>/<run name>/record.json and its log in
<out>/logs/. Every cell's config is validated before anything runs. A cell whose record
exists with the same config is not run again, so an interrupted plan resumes (keys added to
the app since, at their defaults, count as the same), and a run stopped part-way goes on from
its newest checkpoint (delete its folder to start it afresh); a record or checkpoint made with
another config stops the plan rather than mixing results. With --max-minutes M a long plan
advances in chunks: no run starts after M minutes, nor a run expected to end after them
(expected: the wall time of the latest of the plan's finished records of the same cell, plus a
minute to start; a cell with none yet starts whenever time is left), which waits for the next
invocation while shorter runs after it go ahead. At the end <out>/table.md and one plot per
alpha and metric are written from the records there.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from fedgo_app.config import Config, ConfigError
from fedgo_app.server import checkpoint
from fedgo_lab.central import central_run_config, train_central
from fedgo_lab.cli import add_out_flag, add_repo_flag, add_tracking_flags, repo_of, tracking
from fedgo_lab.report import (CENTRAL, FOCUS, by_alpha, label, load_records, plot_rounds,
                              seed_differences, summary_table)

PLAN_KEYS = ("name", "preset", "config", "federation", "alphas", "seeds", "cells", "central")
# Where a record may differ from the cell that made it and still stand for it.
# where a run's outputs go, not what it computes (a watched run is the same run)
PLACEMENT_KEYS = ("results-dir", "run-name", "resume-from", "tensorboard-dir", "mlflow-uri",
                  "mlflow-experiment")
PROGRESS = re.compile(r"(round \d+ \||pre-FL: (generator step \d+0/|sending|odds)|ERROR|rejected)")
PLOT_METRICS = ("server_test_acc", "ensemble_test_acc")
START_SECONDS = 60  # a `flwr run` beyond its record's wall time: SuperLink, Ray, the FAB


class PlanError(ValueError):
    """The plan file is malformed."""


@dataclass(frozen=True)
class Cell:
    run_name: str
    run_config: dict  # the full resolved run config, as its record will hold it
    central: Config | None = None  # the central-training reference's config, not a flwr run


def load_plan(path: Path) -> dict:
    plan = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(plan, dict):
        raise PlanError(f"{path}: a plan is a mapping with keys {', '.join(PLAN_KEYS)}")
    unknown = sorted(set(plan) - set(PLAN_KEYS))
    if unknown:
        raise PlanError(f"{path}: unknown plan key(s) {unknown}; allowed: {', '.join(PLAN_KEYS)}")
    for key in ("cells", "seeds", "alphas"):
        if not isinstance(plan.get(key), list) or not plan[key]:
            raise PlanError(f"{path}: '{key}' must be a non-empty list")
    if "num-supernodes" not in (plan.get("federation") or {}):
        raise PlanError(f"{path}: 'federation' must set num-supernodes (the number of clients K)")
    central = plan.get("central", 0)
    if not isinstance(central, int) or isinstance(central, bool) or central < 0:
        raise PlanError(f"{path}: 'central' is the reference's number of epochs (>= 1), "
                        f"got {central!r}")
    return plan


def read_preset(path: str | None, repo: Path) -> dict:
    return tomllib.loads((repo / path).read_text()) if path else {}


def per_run(value, seed: int, alpha: float):
    """A cell's string value with {seed} and {alpha} filled in (a generator file per seed)."""
    if isinstance(value, str) and ("{seed}" in value or "{alpha}" in value):
        return value.replace("{seed}", str(seed)).replace("{alpha}", f"{alpha:g}")
    return value


def cells_of(plan: dict, out: Path, repo: Path | None = None) -> list[Cell]:
    """Every cell x alpha x seed with its resolved, validated run config; presets are read
    relative to `repo` (default: the current directory)."""
    repo = repo or Path.cwd()
    base = {**read_preset(plan.get("preset"), repo), **(plan.get("config") or {})}
    cells = []
    for seed in plan["seeds"]:
        for alpha in plan["alphas"]:
            for spec in plan["cells"]:
                if isinstance(spec, str):
                    spec = {"strategy": spec}
                if not isinstance(spec, dict):
                    raise PlanError(f"a cell is a strategy name or a mapping, got {spec!r}")
                keys = {k: per_run(v, seed, alpha) for k, v in spec.items()
                        if k not in ("name", "preset")}
                if keys.get("generator-file"):  # a file of the repository's, e.g. results/
                    keys["generator-file"] = str(repo / keys["generator-file"])
                name = spec.get("name") or "-".join(
                    str(keys[k]) for k in ("strategy", "weighting") if k in keys) or "cell"
                run_name = f"{name}-a{alpha:g}-s{seed}"
                merged = {**base, **read_preset(spec.get("preset"), repo), **keys, "alpha": alpha,
                          "seed": seed, "results-dir": str(out), "run-name": run_name}
                try:
                    cfg = Config.from_run_config(merged)
                except ConfigError as err:
                    raise PlanError(f"cell {run_name}: {err}") from err
                cells.append(Cell(run_name, cfg.to_run_config()))
    epochs = plan.get("central", 0)
    for seed in plan["seeds"] if epochs else ():
        run_name = f"{CENTRAL}-s{seed}"
        cfg = Config.from_run_config({**base, "seed": seed, "results-dir": str(out),
                                      "run-name": run_name})
        cells.append(Cell(run_name, central_run_config(cfg, epochs), cfg))
    names = [c.run_name for c in cells]
    if len(set(names)) != len(names):
        raise PlanError("two cells share a name: give them distinct `name`s")
    return cells


def finished(cell: Cell, out: Path) -> bool:
    path = out / cell.run_name / "record.json"
    if not path.exists():
        return False
    check_same_config(json.loads(path.read_text())["config"], cell, path)
    return True


def going_on(cell: Cell, out: Path) -> Cell:
    """The cell, set to go on from its newest checkpoint where a run of it stopped part-way
    (checkpoints in its folder, no record): it ends as the uninterrupted run would
    (tests/test_resilience.py). Delete the folder to start it afresh; a resume-from given
    stands."""
    folder = out / cell.run_name
    newest = checkpoint.newest(folder)
    if (cell.central is not None or newest is None or cell.run_config.get("resume-from")
            or (folder / "record.json").exists()):
        return cell
    check_same_config(checkpoint.load(newest)[1]["record"]["data"]["config"], cell, newest)
    return replace(cell, run_config={**cell.run_config, "resume-from": str(newest)})


def check_same_config(recorded: dict, cell: Cell, path: Path) -> None:
    """Fail unless `recorded` (a record's or checkpoint's config) is the cell's."""
    defaults = Config().to_run_config()

    def same(key: str) -> bool:
        if key in PLACEMENT_KEYS:
            return True
        if key not in recorded:  # a key added since the record was made, at its default,
            return cell.run_config.get(key) == defaults.get(key)  # cannot have changed it
        return recorded[key] == cell.run_config.get(key)

    differ = sorted(k for k in set(recorded) | set(cell.run_config) if not same(k))
    if differ:
        raise PlanError(f"{path} was made with another config (keys {differ}); move its run "
                        "folder away or choose another --out")


def toml_text(run_config: dict) -> str:
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        return json.dumps(v) if isinstance(v, str) else repr(v)

    return "".join(f"{k} = {value(v)}\n" for k, v in run_config.items())


def flwr_command() -> str:
    local = Path(sys.executable).with_name("flwr")
    return str(local) if local.exists() else "flwr"


def kind(run_name: str) -> str:
    """The cell a run belongs to, whatever its alpha and seed: fedgo-a0.1-s2 -> fedgo."""
    return re.sub(r"(-a[0-9.e-]+)?-s\d+$", "", run_name)


def expected_seconds(cells: list[Cell], out: Path) -> dict[str, float]:
    """Per cell kind, the wall time of its latest finished record (the code as it is now, as
    near as the records know), plus the start."""
    latest: dict[str, tuple[str, float]] = {}
    for cell in cells:
        path = out / cell.run_name / "record.json"
        if not path.exists():
            continue
        record = json.loads(path.read_text())
        made, wall = record.get("started_at", ""), record.get("timings", {}).get("wall")
        if wall and made >= latest.get(kind(cell.run_name), ("", 0.0))[0]:
            latest[kind(cell.run_name)] = (made, wall)
    return {k: wall + START_SECONDS for k, (_, wall) in latest.items()}


def local_superlinks(flwr_home: Path) -> list[int]:
    """PIDs of the local SuperLinks that `flwr` started for this FLWR_HOME."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "flower-superlink" in cmd and str(flwr_home) in cmd:
                pids.append(int(entry.name))
    return pids


def flwr_home() -> Path:
    return Path(os.environ.get("FLWR_HOME") or Path.home() / ".flwr")


def stop_started_superlink(repo: Path, running_before: list[int]) -> None:
    """`flwr run` starts a local SuperLink when none runs and leaves it running: stop the one
    this plan's runs started (by PID, scripts/stop-superlink.sh), never one that ran before."""
    home = flwr_home()
    if not running_before and local_superlinks(home):
        done = subprocess.run(["bash", str(repo / "scripts" / "stop-superlink.sh")],
                              env={**os.environ, "FLWR_HOME": str(home)}, capture_output=True,
                              text=True, timeout=120)
        print((done.stdout + done.stderr).strip(), flush=True)


def run_cell(cell: Cell, federation: dict, out: Path, tag: str, repo: Path) -> None:
    """One real `flwr run` of the app in `repo`, its progress lines echoed, its status
    checked."""
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{cell.run_name}.log"
    fed = " ".join(f"{k}={v}" for k, v in federation.items())
    # `flwr run` launches `flower-superlink` from PATH: put this interpreter's scripts first so an
    # unactivated virtual environment (`.venv/bin/python -m ...`) still finds its own.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = {**os.environ, "PATH": path, "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(toml_text(cell.run_config))
    try:
        cmd = [flwr_command(), "run", str(repo), "--stream", "--federation-config", fed,
               "-c", f.name]
        run_id = None
        with open(log_path, "w") as log, subprocess.Popen(
                cmd, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True) as proc:
            for line in proc.stdout:
                log.write(line)
                started = re.search(r"Successfully started run (\d+)", line)
                run_id = started.group(1) if started else run_id
                if PROGRESS.search(line):
                    print(f"{tag} {line.split(':', 1)[-1].strip()}", flush=True)
    finally:
        os.unlink(f.name)
    status = "did not start"
    if run_id:
        listing = subprocess.run([flwr_command(), "list", "--run-id", run_id, "--format",
                                  "json"], cwd=repo, env=env, capture_output=True, text=True)
        try:
            status = json.loads(listing.stdout)["runs"][0]["status"]
        except (ValueError, KeyError, IndexError):
            status = f"unknown ({listing.stdout[-300:]}{listing.stderr[-300:]})"
    if status != "finished:completed" or not (out / cell.run_name / "record.json").exists():
        raise RuntimeError(f"{cell.run_name}: flwr run {status}; see {log_path}")


def write_report(out: Path, alphas: list) -> str:
    records = [r for r in load_records(out) if r["config"]["alpha"] in (*alphas, None)]
    table = summary_table(records)
    if any(label(r) == FOCUS for r in records):
        table += (f"\n\nLast-round server test accuracy of {FOCUS} and its difference to each "
                  "other row (points), seed by seed:\n\n" + seed_differences(records))
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(table + "\n")
    for alpha, subset in by_alpha(records).items():
        for metric in PLOT_METRICS:
            if any(metric in x for r in subset for x in r["rounds"]):
                plot_rounds(subset, out / f"{metric}-a{alpha:g}.png", metric,
                            title=metric.replace("_", " "))
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedgo_lab.bench",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("plan", type=Path, help="the plan, a YAML file (see conf/bench/)")
    add_out_flag(parser, "records, logs, the table and plots go", "results/bench/<plan name>")
    parser.add_argument("--dry-run", action="store_true", help="list the cells and stop")
    parser.add_argument("--max-minutes", type=float, default=None, metavar="M",
                        help="start no run after this many minutes, nor one expected to end "
                        "after them (the plan resumes later)")
    add_tracking_flags(parser)
    add_repo_flag(parser)
    args = parser.parse_args(argv)
    repo = repo_of(parser, args)
    try:
        plan = load_plan(args.plan)
        out = (args.out or repo / "results" / "bench" / plan.get("name", args.plan.stem)).resolve()
        watch = tracking(args, plan.get("name", args.plan.stem))
        cells = [replace(c, run_config={**c.run_config, **watch}) if c.central is None else c
                 for c in cells_of(plan, out, repo)]
        todo = [going_on(c, out) for c in cells if not finished(c, out)]
    except (PlanError, OSError, yaml.YAMLError, tomllib.TOMLDecodeError) as err:
        print(f"[bench] bad plan: {err}", file=sys.stderr)
        return 2
    print(f"[bench] {args.plan}: {len(cells)} cells, {len(cells) - len(todo)} finished, "
          f"{len(todo)} to run -> {out}", flush=True)
    if args.dry_run:
        going = {c.run_name: c.run_config.get("resume-from") for c in todo}
        for c in cells:
            state = "todo" if c.run_name in going else "done"
            resume = f" (goes on from {going[c.run_name]})" if going.get(c.run_name) else ""
            print(f"  {state}  {c.run_name}{resume}")
        return 0
    running_before = local_superlinks(flwr_home())
    try:
        run_plan(args, plan, todo, cells, out, repo)
    finally:
        stop_started_superlink(repo, running_before)
    table = write_report(out, plan["alphas"])
    print(f"\n{table}\n\n[bench] table and plots in {out}")
    return 0


def run_plan(args, plan: dict, todo: list[Cell], cells: list[Cell], out: Path,
             repo: Path) -> None:
    """The cells still to do, one after another, within --max-minutes."""
    start, budget = time.perf_counter(), 60 * (args.max_minutes or float("inf"))
    expected, ran, deferred = expected_seconds(cells, out), 0, []
    for i, cell in enumerate(todo, 1):
        left = budget - (time.perf_counter() - start)
        if left <= 0:
            print(f"[bench] {args.max_minutes:g} min passed: {len(todo) - i + 1 + len(deferred)} "
                  "run(s) left for the next invocation", flush=True)
            break
        tag = f"[bench {i}/{len(todo)} {cell.run_name}]"
        need = expected.get(kind(cell.run_name), 0.0)
        if need > left:
            print(f"{tag} deferred: expected {need / 60:.0f} min, {left / 60:.0f} min left",
                  flush=True)
            deferred.append(cell)
            continue
        resume = cell.run_config.get("resume-from")
        print(f"{tag} started" + (f", going on from {resume}" if resume else ""), flush=True)
        cell_start = time.perf_counter()
        if cell.central is not None:
            train_central(cell.central, cell.run_config["central-epochs"], out)
        else:
            run_cell(cell, plan["federation"], out, tag, repo)
        ran += 1
        took = time.perf_counter() - cell_start
        # the best guess for the next run of its kind (a new cell has no record yet)
        expected[kind(cell.run_name)] = took
        per_cell = (time.perf_counter() - start) / ran
        print(f"{tag} finished in {took:.0f} s; about "
              f"{per_cell * (len(todo) - i + len(deferred)) / 60:.0f} min left", flush=True)
    else:
        if deferred:
            print(f"[bench] {len(deferred)} run(s) deferred to the next invocation: "
                  f"{', '.join(c.run_name for c in deferred)}", flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
