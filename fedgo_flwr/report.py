"""Tables from run records (never from logs).

    python -m fedgo_flwr.report RESULTS_DIR [RESULTS_DIR ...]

prints, per (strategy, alpha), the mean and std over seeds of the last round's server and
ensemble test accuracy, as a markdown table.
"""

from __future__ import annotations

import json
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


def summary_table(records: list[dict]) -> str:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for rec in records:
        c = rec["config"]
        groups[(c["strategy"], c["alpha"])].append(rec)
    lines = ["| strategy | alpha | seeds | rounds | server test acc (%) | ensemble test acc (%) |",
             "|---|---|---|---|---|---|"]
    for (strategy, alpha), recs in sorted(groups.items()):
        last = [r["rounds"][-1] for r in recs]
        server = [x["server_test_acc"] for x in last]
        ensemble = [x["ensemble_test_acc"] for x in last if "ensemble_test_acc" in x]
        seeds = ",".join(str(r["config"]["seed"]) for r in recs)
        lines.append(f"| {strategy} | {alpha:g} | {seeds} | {last[0]['round']} | "
                     f"{mean_std(server)} | {mean_std(ensemble)} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    records = load_records(*map(Path, argv))
    if not records:
        print(f"no record.json under {argv}")
        return 1
    print(summary_table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
