"""Tables and plots from run records (never from logs).

    python -m fedgo_flwr.report RESULTS_DIR [RESULTS_DIR ...] [--plot FILE.png]
                                [--metric server_test_acc] [--by strategy]

prints, per (strategy, weighting, alpha), the mean and std over seeds of the last round's
server and ensemble test accuracy, of the server accuracy averaged over the last three
rounds, and the rounds to reach the paper's target (the highest multiple of 5 % that FedAvg
reaches in every seed), as a markdown table; --plot draws `--metric` against the round, one
line per value of `--by` (a config key) with a band of one std over seeds.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def load_records(*roots: Path) -> list[dict]:
    return [json.loads(p.read_text()) for root in roots
            for p in sorted(Path(root).glob("**/record.json"))]


def mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.mean(values):.2f} ± {100 * std:.2f}"


def label(rec: dict) -> str:
    """strategy, plus the weighting rule where it is not the strategy's own."""
    c = rec["config"]
    if c["strategy"] == "fedgo" and c.get("weighting", "odds") != "odds":
        return f"fedgo[{c['weighting']}]"
    return c["strategy"]


def fedavg_target(records: list[dict], metric: str = "server_test_acc") -> float | None:
    """The paper's target accuracy: the highest multiple of 5 % that FedAvg reaches in every
    seed (None without FedAvg records)."""
    best = [max(r[metric] for r in rec["rounds"]) for rec in records
            if rec["config"]["strategy"] == "fedavg"]
    if not best:
        return None
    target = 5 * math.floor(100 * min(best) / 5 + 1e-9) / 100
    return target if target > 0 else None


def rounds_to_target(records: list[dict], target: float, metric: str = "server_test_acc") -> str:
    """Mean ± std over seeds of the first round whose metric reaches the target."""
    reached = [next((r["round"] for r in rec["rounds"] if r[metric] >= target - 1e-9), None)
               for rec in records]
    hits = [t for t in reached if t is not None]
    if not hits:
        return "not reached"
    std = statistics.stdev(hits) if len(hits) > 1 else 0.0
    text = f"{statistics.mean(hits):.1f} ± {std:.1f}"
    return text if len(hits) == len(reached) else f"{text} ({len(hits)}/{len(reached)} seeds)"


def summary_table(records: list[dict]) -> str:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for rec in records:
        groups[(label(rec), rec["config"]["alpha"])].append(rec)
    targets = {alpha: fedavg_target([r for r in records if r["config"]["alpha"] == alpha])
               for _, alpha in groups}
    lines = ["| strategy | alpha | seeds | rounds | server test acc (%) | "
             "server acc, mean of last 3 rounds (%) | ensemble test acc (%) | "
             "rounds to target (target) |",
             "|---|---|---|---|---|---|---|---|"]
    for (name, alpha), recs in sorted(groups.items()):
        last = [r["rounds"][-1] for r in recs]
        server = [x["server_test_acc"] for x in last]
        last3 = [statistics.mean(x["server_test_acc"] for x in r["rounds"][-3:]) for r in recs]
        ensemble = [x["ensemble_test_acc"] for x in last if "ensemble_test_acc" in x]
        seeds = ",".join(str(r["config"]["seed"]) for r in recs)
        target = targets[alpha]
        to_target = (f"{rounds_to_target(recs, target)} ({100 * target:.0f}%)"
                     if target is not None else "-")
        lines.append(f"| {name} | {alpha:g} | {seeds} | {last[0]['round']} | "
                     f"{mean_std(server)} | {mean_std(last3)} | {mean_std(ensemble)} | "
                     f"{to_target} |")
    return "\n".join(lines)


def plot_rounds(records: list[dict], path: Path, metric: str = "server_test_acc",
                by=label, title: str = "") -> Path:
    """metric against round, one line per group with a band of one std over its records."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    groups: dict[str, list[dict]] = defaultdict(list)
    for rec in records:
        groups[by(rec)].append(rec)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, recs in sorted(groups.items()):
        rounds = sorted({r["round"] for rec in recs for r in rec["rounds"] if metric in r})
        values = np.array([[next(r[metric] for r in rec["rounds"] if r["round"] == t)
                            for t in rounds] for rec in recs]) * 100
        mean, std = values.mean(0), values.std(0)
        ax.plot(rounds, mean, label=f"{name} (n={len(recs)})", lw=1.8)
        ax.fill_between(rounds, mean - std, mean + std, alpha=0.2)
    ax.set_xlabel("round")
    ax.set_ylabel(metric.replace("_", " ") + " (%)")
    ax.set_title(title or metric)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="tables and plots from run records")
    parser.add_argument("dirs", nargs="+", type=Path)
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--metric", default="server_test_acc")
    parser.add_argument("--by", default=None, help="config key to group lines by")
    parser.add_argument("--title", default="")
    args = parser.parse_args(argv)
    records = load_records(*args.dirs)
    if not records:
        print(f"no record.json under {[str(d) for d in args.dirs]}")
        return 1
    print(summary_table(records))
    if args.plot:
        by = (lambda rec: str(rec["config"][args.by])) if args.by else label
        print(f"plot: {plot_rounds(records, args.plot, args.metric, by, args.title).resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
