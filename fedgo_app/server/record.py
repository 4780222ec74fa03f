"""One self-describing record per run: config, per-round metrics, timings and bytes sent."""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

from fedgo_flwr.replies import FAILED

# Columns of the per-round table: record key -> (header, format).
COLUMNS = {
    "round": ("round", "{:>5d}"),
    "server_test_acc": ("server acc", "{:>10.4f}"),
    "server_test_loss": ("server loss", "{:>11.4f}"),
    "ensemble_test_acc": ("ens. acc", "{:>8.4f}"),
    "ensemble_test_loss": ("ens. loss", "{:>9.4f}"),
    "distill_loss": ("distill KL", "{:>10.4f}"),
    "round_seconds": ("seconds", "{:>7.1f}"),
}


class RunRecord:
    def __init__(self, config: dict, run_name: str):
        self.run_name = run_name
        self.started = time.perf_counter()
        self.data: dict = {
            "run_name": run_name,
            "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "config": dict(config),
            "clients": {},
            "pre_fl": {},
            "rounds": [],
            "timings": defaultdict(float),
            "bytes": defaultdict(int),
        }

    def snapshot(self) -> dict:
        """The record so far as plain data, with the seconds elapsed (for a checkpoint)."""
        return {"data": json.loads(json.dumps(self.data, default=_plain)),
                "elapsed": time.perf_counter() - self.started}

    @classmethod
    def restore(cls, snapshot: dict) -> "RunRecord":
        """The record a checkpoint held; its wall time goes on from the elapsed seconds."""
        data = snapshot["data"]
        record = cls(data["config"], data["run_name"])
        record.data = {**data, "timings": defaultdict(float, data["timings"]),
                       "bytes": defaultdict(int, data["bytes"])}
        record.started -= snapshot["elapsed"]
        return record

    @property
    def rounds(self) -> list[dict]:
        return self.data["rounds"]

    def round(self, server_round: int) -> dict:
        """The entry of this round, created on first use."""
        for entry in reversed(self.rounds):
            if entry["round"] == server_round:
                return entry
        self.rounds.append({"round": server_round, "seconds": {}, "bytes": {}})
        return self.rounds[-1]

    def time(self, stage: str, seconds: float, server_round: int | None = None) -> None:
        """Add seconds to a stage, in total and (for main-FL stages) in the round's entry."""
        self.data["timings"][stage] += seconds
        if server_round is not None:
            entry = self.round(server_round)["seconds"]
            entry[stage] = entry.get(stage, 0.0) + seconds

    def sent(self, stage: str, direction: str, nbytes: int, server_round: int | None = None) -> None:
        """Count bytes of model/discriminator/generator arrays; direction is 'down' or 'up'."""
        self.data["bytes"][f"{stage}_{direction}"] += int(nbytes)
        if server_round is not None:
            entry = self.round(server_round)["bytes"]
            entry[direction] = entry.get(direction, 0) + int(nbytes)

    def client_seconds(self, stage: str, seconds: float) -> None:
        """Add the clients' summed compute seconds of a pre-FL stage (main-FL rounds keep
        theirs in the round's entry)."""
        spent = self.data["pre_fl"].setdefault("client_seconds", {})
        spent[stage] = spent.get(stage, 0.0) + float(seconds)

    def finish(self, results_dir: Path) -> Path:
        self.data["timings"]["wall"] = time.perf_counter() - self.started
        for r in self.rounds:
            r["round_seconds"] = sum(r["seconds"].values())
        path = Path(results_dir) / self.run_name / "record.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.data, indent=2, default=_plain))
        return path


def _plain(obj):
    if isinstance(obj, defaultdict):
        return dict(obj)
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"not JSON-serialisable: {type(obj)}")


def reply_tally(asked, usable, left: dict[str, str]) -> dict:
    """The record's tally of a round's replies by partition: `asked` and `usable` partition
    ids, `left` {partition: why left out}: failed (an error reply: the node or its ClientApp
    failed), rejected (the checks left it out), missing (no reply in time)."""
    failed = {p: why for p, why in left.items() if why.startswith(FAILED)}
    answered = {*map(int, left), *usable}
    return {"asked": len(asked), "missing": sorted(p for p in asked if p not in answered),
            "failed": failed, "rejected": {p: w for p, w in left.items() if p not in failed},
            "usable": len(usable)}


def round_line(entry: dict) -> str:
    """One progress line for a finished round."""
    parts = [f"round {entry['round']}"]
    for key in ("server_test_acc", "ensemble_test_acc", "distill_loss"):
        if key in entry:
            parts.append(f"{COLUMNS[key][0]} {entry[key]:.4f}")
    if entry.get("seconds"):
        parts.append(f"{sum(entry['seconds'].values()):.1f}s")
    return " | ".join(parts)


def format_table(rounds: list[dict]) -> str:
    """The per-round summary as a plain-text table (only the columns the rounds have)."""
    keys = [k for k in COLUMNS if any(k in r for r in rounds)]
    lines = ["  ".join(COLUMNS[k][0] for k in keys)]
    for r in rounds:
        cells = []
        for k in keys:
            v = r.get(k)
            width = len(COLUMNS[k][0])
            if v is None or (isinstance(v, float) and math.isnan(v)):
                cells.append("-".rjust(width))
            else:
                cells.append(COLUMNS[k][1].format(v).rjust(width))
        lines.append("  ".join(cells))
    return "\n".join(lines)
