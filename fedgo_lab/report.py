"""Tables and plots from run records (never from logs).

    python -m fedgo_lab.report RESULTS_DIR [RESULTS_DIR ...] [--plot FILE.png]
                               [--metric server_test_acc] [--by KEY] [--title TEXT]
                               [--diagnostics] [--communication] [--gap] [--of LABEL]
                               [--horizon N] [--lasting N] [--windows N]
                               [--update docs/results/fair.md]

prints, per row (a strategy as its spec names it from the record's config, e.g.
`fedgo[beta=4]`) and alpha, the mean and std over seeds of the last round's server and
ensemble test accuracy, of the server accuracy averaged over the last three rounds, and the
rounds to reach the paper's target (the highest multiple of 5 % that FedAvg reaches in every
seed), as a markdown table; --plot draws `--metric` against the round, one panel per alpha and
one line per row (or per value of `--by`, a config key) with a band of one std over seeds;
--diagnostics prints, per record that has them, every rule's ensemble accuracy on the same
client models round by round; --communication prints the bytes each row sent (pre-FL, per
round, whole run) and its clients' compute seconds (per round, pre-FL), with the pre-FL
stage's share of each (FedGO's "negligible overhead"); --gap, per alpha, how much of
the gap between the odds and the label oracle each option beyond the paper closes (the
diagnostics of the runs of the row --of, fedgo by default); --of LABEL, the per-seed
differences of that row to every other (last round, last three, all rounds); --horizon N,
for long runs, the first N and the last N rounds, the best round, the ensemble over the last
N and the rounds and seconds to target (with --of, per-seed differences over both); --lasting
N, per record with diagnostics and per N rounds, the teachers the lasting options would give
against the averaged model they distil; --windows N, per alpha, the mean over seeds of each
row's --metric (one or more, dotted paths into a round allowed) over each N rounds; --update FILE
rewrites, in a Markdown file, each of these tables (summary, per-seed differences in the last
round, over the last three and over all rounds, gap, communication) found there by its header,
from the records.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from functools import partial
from pathlib import Path

from fedgo_app.strategies import STRATEGIES


def load_records(*roots: Path) -> list[dict]:
    return [json.loads(p.read_text()) for root in roots
            for p in sorted(Path(root).glob("**/record.json"))]


def devices(records: list[dict]) -> list[str]:
    """The devices (and runtimes) that made the records; a record from before records named
    theirs was a `flwr run` on the CPU."""
    return sorted({r.get("device", "CPU") for r in records})


def of_architecture(records: list[dict], architecture: str) -> list[dict]:
    """The records as if each mixed run's server were its `architecture` global model alone
    (its rounds' server accuracy and loss); runs without that architecture are left out,
    homogeneous runs of it kept as they are."""
    chosen = []
    for rec in records:
        if any("architectures" in r for r in rec["rounds"]):
            rounds = [{**r, **r["architectures"][architecture]} for r in rec["rounds"]
                      if architecture in r.get("architectures", {})]
            if rounds:
                chosen.append({**rec, "rounds": rounds})
        elif rec["config"].get("model", "cnn") == architecture:
            chosen.append(rec)
    return chosen


def mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:  # one seed is one value, not a spread of zero
        return f"{100 * values[0]:.2f}"
    return f"{100 * statistics.mean(values):.2f} ± {100 * statistics.stdev(values):.2f}"


# The central-training reference (fedgo_lab.central): a record, but no strategy of the app.
CENTRAL = "central"
# The row the per-seed differences and the gap table are about unless told: the paper's method.
FOCUS = "fedgo"


def last_mean(rec: dict, last: int = 3, metric: str = "server_test_acc",
              first: int | None = None) -> float:
    """A record's metric averaged over its last `last` federated rounds, or with `first` over
    its first `first` (a fraction; round 0, the evaluation before training, never counts)."""
    rounds = [r for r in rec["rounds"] if r["round"] > 0]
    return statistics.mean(r[metric] for r in (rounds[:first] if first else rounds[-last:]))


def label(rec: dict) -> str:
    """A record's row: its strategy as the strategy's own spec names a run of this config
    (StrategySpec.marks and row_name: e.g. `fedgo[beta=4]`, `fedgo+fedprox`,
    `feddf-published (labelled val, 500 steps)`), or the central reference."""
    if rec["config"]["strategy"] == CENTRAL:
        return "central (pooled client data, upper bound)"
    return STRATEGIES.label(rec["config"])


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
    text = (f"{statistics.mean(hits):.1f} ± {statistics.stdev(hits):.1f}" if len(hits) > 1
            else f"{hits[0]:.1f}")
    return text if len(hits) == len(reached) else f"{text} ({len(hits)}/{len(reached)} seeds)"


def by_alpha(records: list[dict]) -> dict[float, list[dict]]:
    """Records per alpha; the central reference (no clients, no alpha) joins every alpha."""
    alphas = sorted({r["config"]["alpha"] for r in records if r["config"]["alpha"] is not None})
    return {a: [r for r in records if r["config"]["alpha"] in (a, None)] for a in alphas}


def rows(records: list[dict], central: bool = True) -> dict[tuple[str, float], list[dict]]:
    """Records per (row, alpha), in that order; the central reference is a row of every alpha,
    or (central=False) of none."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for alpha, recs in by_alpha(records).items():
        for rec in recs:
            if central or rec["config"]["strategy"] != CENTRAL:
                groups[(label(rec), alpha)].append(rec)
    return dict(sorted(groups.items()))


def summary_table(records: list[dict]) -> str:
    groups = rows(records)
    targets = {alpha: fedavg_target([r for r in records if r["config"]["alpha"] == alpha])
               for _, alpha in groups}
    lines = ["| strategy | alpha | seeds | rounds | server test acc (%) | "
             "server acc, mean of last 3 rounds (%) | ensemble test acc (%) | "
             "rounds to target (target) |",
             "|---|---|---|---|---|---|---|---|"]
    for (name, alpha), recs in groups.items():
        last = [r["rounds"][-1] for r in recs]
        server = [x["server_test_acc"] for x in last]
        last3 = [last_mean(r) for r in recs]
        ensemble = [x["ensemble_test_acc"] for x in last if "ensemble_test_acc" in x]
        seeds = ",".join(str(r["config"]["seed"]) for r in recs)
        target = targets[alpha]
        to_target = (f"{rounds_to_target(recs, target)} ({100 * target:.0f}%)"
                     if target is not None and recs[0]["config"]["strategy"] != CENTRAL else "-")
        lines.append(f"| {name} | {alpha:g} | {seeds} | {last[0]['round']} | "
                     f"{mean_std(server)} | {mean_std(last3)} | {mean_std(ensemble)} | "
                     f"{to_target} |")
    return "\n".join(lines)


def personal_table(records: list[dict]) -> str:
    """Per row and alpha, with personal-test-fraction > 0: the clients' n_k-weighted accuracy
    on their personal test splits beside the server's test accuracy (last round, and the
    mean of the last three), mean ± std over seeds."""
    groups = rows([rec for rec in records
                   if all("personalised_test_acc" in r for r in rec["rounds"])])
    lines = ["| strategy | alpha | seeds | personalised acc (%) | personalised, last 3 (%) | "
             "server test acc (%) |", "|---|---|---|---|---|---|"]
    for (name, alpha), recs in groups.items():
        last3 = [last_mean(r, metric="personalised_test_acc") for r in recs]
        lines.append(f"| {name} | {alpha:g} | {','.join(str(r['config']['seed']) for r in recs)} "
                     f"| {mean_std([r['rounds'][-1]['personalised_test_acc'] for r in recs])} "
                     f"| {mean_std(last3)} "
                     f"| {mean_std([r['rounds'][-1]['server_test_acc'] for r in recs])} |")
    return "\n".join(lines)


def seconds_to_target(rec: dict, target: float, metric: str = "server_test_acc"
                      ) -> float | None:
    """The run's seconds until its first round at the target: its pre-FL stage and every
    round's wall time up to that round (None if never reached)."""
    spent = sum(rec.get("timings", {}).get(k, 0.0)
                for k in ("generator_training", "discriminator_training", "odds"))
    for r in rec["rounds"]:
        spent += r.get("round_seconds", 0.0)
        if r["round"] > 0 and r[metric] >= target - 1e-9:
            return spent
    return None


def horizon_table(records: list[dict], window: int = 10) -> str:
    """Both horizons of long runs (issue 46), per row and alpha, mean ± std over seeds: the
    server accuracy averaged over the first `window` rounds and over the last `window`, the
    best round, the ensemble's accuracy over the last `window` (the teacher against the
    student), and the rounds and seconds to FedAvg's target."""
    groups = rows(records, central=False)
    targets = {alpha: fedavg_target([r for r in records if r["config"]["alpha"] == alpha])
               for _, alpha in groups}
    lines = [f"| strategy | alpha | seeds | rounds | server acc, first {window} (%) | "
             f"server acc, last {window} (%) | best round (%) | ensemble acc, last {window} "
             "(%) | rounds to target | seconds to target (target) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for (name, alpha), recs in groups.items():
        ensemble = [last_mean(r, window, "ensemble_test_acc") for r in recs
                    if all("ensemble_test_acc" in x for x in r["rounds"][1:])]
        target = targets[alpha]
        to_target = seconds = "-"
        if target is not None:
            to_target = rounds_to_target(recs, target)
            hits = [t for t in (seconds_to_target(r, target) for r in recs) if t is not None]
            seconds = (f"{statistics.mean(hits):.0f} ({100 * target:.0f}%)" if hits
                       else f"not reached ({100 * target:.0f}%)")
        lines.append(
            f"| {name} | {alpha:g} | {','.join(str(r['config']['seed']) for r in recs)} | "
            f"{recs[0]['rounds'][-1]['round']} | "
            f"{mean_std([last_mean(r, first=window) for r in recs])} | "
            f"{mean_std([last_mean(r, window) for r in recs])} | "
            f"{mean_std([max(x['server_test_acc'] for x in r['rounds']) for r in recs])} | "
            f"{mean_std(ensemble)} | {to_target} | {seconds} |")
    return "\n".join(lines)


def lasting_table(record: dict, window: int = 10, level: str = "0.9") -> str:
    """Per window of `window` rounds of a record with diagnostics (issue 46): the mean test
    accuracy (%) of the server model, the averaged model before distillation, the round's
    teacher, and the teachers the lasting options would give on the same client models
    (`teacher-floor`, `averaged-share` 0.5, `past-teachers`: "-" where a record has none, as
    in round 1 and in records made before the key) with the share of images the floor hands to
    the averaged model, and at confidence `level` the share of images kept and the teacher's
    and the averaged model's accuracy on them; last, the best of every label-free rule the
    diagnostics score (both spaces), chosen after the fact in each window (a choice no run can
    make), and its margin over the averaged model. Where every teacher stays below the
    averaged model, distillation pulls the server model down."""
    rounds = [r for r in record["rounds"] if "lasting" in r.get("diagnostics", {})]
    if not rounds:
        return "(no lasting diagnostics in this record: run it with diagnostics = true)"
    space = record["config"].get("ensemble-space", "logits")
    lines = [f"| rounds | server | averaged (before distillation) | teacher | floored teacher "
             f"| teacher with averaged member | teacher with past globals | floor's own share "
             f"| kept at {level} | teacher there | averaged there "
             f"| best label-free rule, after the fact (− averaged) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for start in range(0, len(rounds), window):
        part = rounds[start:start + window]
        d = [r["diagnostics"] for r in part]
        sure = [x["lasting"]["confident"][level] for x in d]
        cells = [statistics.mean(v) if v else None for v in (
            [r["server_test_acc"] for r in part], [x["averaged"]["acc"] for x in d],
            [r["ensemble_test_acc"] for r in part], [x["lasting"]["floor"]["acc"] for x in d],
            [x[space]["active+averaged"]["acc"] for x in d],
            [x["lasting"]["past"]["acc"] for x in d if "past" in x["lasting"]],
            [x["lasting"]["floor"]["own_share"] for x in d], [c["kept"] for c in sure],
            [c["acc"] for c in sure], [c["averaged_acc"] for c in sure])]
        lines.append(f"| {part[0]['round']}-{part[-1]['round']} | " + " | ".join(
            "-" if c is None else f"{100 * c:.1f}" for c in cells) + f" | {best_rule(d)} |")
    return "\n".join(lines)


def rule_acc(diagnostics: list[dict], space: str, rule: str) -> float:
    """A rule's mean test accuracy over these rounds' diagnostics."""
    return statistics.mean(x[space][rule]["acc"] for x in diagnostics)


def best_rule(diagnostics: list[dict]) -> str:
    """Over these rounds' diagnostics, the label-free rule (either space) with the highest
    mean test accuracy, and its margin over the averaged model (points)."""
    mean = partial(rule_acc, diagnostics)
    rules = [(space, rule) for space in ("logits", "probabilities")
             for rule in diagnostics[0].get(space, {})
             if rule != "label-oracle" and all(rule in x.get(space, {}) for x in diagnostics)]
    if not rules:
        return "-"
    space, rule = max(rules, key=lambda sr: mean(*sr))
    averaged = statistics.mean(x["averaged"]["acc"] for x in diagnostics)
    return f"{rule} ({space}) {100 * (mean(space, rule) - averaged):+.1f}"


def per_class_table(record: dict, window: int = 10) -> str:
    """Per class of a record with per-class diagnostics (issue 46: where the lead fades, on
    which classes), the means over rounds 1..window and over the later rounds: the share of
    the round's images of the class its top holder has, the weight the run's rule gives that
    client, and the teacher's accuracy minus the averaged model's (points); then, over the
    classes, the correlation of the later weight with the later difference."""
    rounds = [r for r in record["rounds"] if "per_class" in r.get("diagnostics", {})]
    if not rounds:
        return "(no per-class diagnostics in this record: run it with diagnostics = true)"
    spans = tuple([r["diagnostics"]["per_class"] for r in rounds if early == (r["round"] <= window)]
                  for early in (True, False))

    def mean(part: list[dict], key: str, c: int) -> float:  # nan: no test image of class c
        values = [x[key][c] for x in part if not math.isnan(x[key][c])]
        return statistics.fmean(values) if values else math.nan

    lines = ["| class | holder's share | weight on holder, early | weight on holder, late | "
             "teacher − averaged, early | teacher − averaged, late | averaged, late | "
             "teacher, late |", "|---|---|---|---|---|---|---|---|"]
    late = []
    for c in range(len(rounds[0]["diagnostics"]["per_class"]["teacher_acc"])):
        share = mean(spans[0] + spans[1], "holder_share", c)
        weights = [mean(part, "weight_on_holder", c) for part in spans]
        gaps = [mean(part, "teacher_acc", c) - mean(part, "averaged_acc", c) for part in spans]
        accs = [mean(spans[1], key, c) for key in ("averaged_acc", "teacher_acc")]
        late.append((weights[1], gaps[1]))
        cells = [f"{x:.2f}" for x in (share, *weights)] + [f"{100 * x:+.1f}" for x in gaps] + [
            f"{100 * x:.1f}" for x in accs]
        lines.append(f"| {c} | " + " | ".join("-" if "nan" in x else x for x in cells) + " |")
    last = rounds[-1]["round"]
    head = (f"early: rounds 1-{window}, late: rounds {window + 1}-{last}" if last > window
            else f"early: rounds 1-{last}, no later rounds")
    pairs = [(w, g) for w, g in late if not (math.isnan(w) or math.isnan(g))]
    if len(pairs) > 2 and len({w for w, _ in pairs}) > 1 and len({g for _, g in pairs}) > 1:
        r = statistics.correlation(*zip(*pairs))
        head += (f"; over the classes, late weight on the holder against late difference: "
                 f"r = {r:+.2f}")
    return head + "\n\n" + "\n".join(lines)


def round_value(round_: dict, metric: str) -> float | None:
    """A round's value of `metric`: one of its keys, or a dotted path into it
    (`diagnostics.averaged.acc`); None where the round has none."""
    value = round_
    for key in metric.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def window_mean(rec: dict, metric: str, start: int, window: int) -> float | None:
    """A record's `metric` averaged over rounds start .. start + window - 1 (None: no value)."""
    values = [x for r in rec["rounds"] if start <= r["round"] < start + window
              and (x := round_value(r, metric)) is not None]
    return statistics.mean(values) if values else None


def round_windows(last: int, window: int) -> list[tuple[int, str]]:
    """Windows of `window` rounds over rounds 1 .. last (round 0 never counts): each one's
    first round and its name, e.g. (41, "41-50")."""
    return [(s, f"{s}-{min(s + window - 1, last)}") for s in range(1, last + 1, window)]


def window_table(records: list[dict], window: int = 10,
                 metrics: tuple[str, ...] = ("server_test_acc",)) -> str:
    """Per alpha, each row's curve in a few lines (issue 46): the mean over its seeds of each
    metric averaged over each `window` rounds (%), one column per row and metric that its
    records have (the seeds in the header), one line per window; round 0 never counts."""
    tables = []
    every = rows(records, central=False)  # the central reference counts epochs, not rounds
    for alpha in sorted({alpha for _, alpha in every}):
        groups = {name: recs for (name, a), recs in every.items() if a == alpha}
        last = max(r["round"] for group in groups.values() for rec in group
                   for r in rec["rounds"])
        spans = round_windows(last, window)
        columns, cells = [], []
        for name, group in groups.items():
            for metric in metrics:
                per_window = [[m for rec in group
                               if (m := window_mean(rec, metric, start, window)) is not None]
                              for start, _ in spans]  # per window, one mean per seed
                if not any(per_window):
                    continue
                seeds = ",".join(str(rec["config"]["seed"]) for rec in group)
                shown = "" if metric == "server_test_acc" else f" {metric}"
                columns.append(f"{name}{shown} (seeds {seeds})")
                cells.append(["-" if not v else f"{100 * statistics.mean(v):.1f}"
                              for v in per_window])
        lines = [f"alpha {alpha:g}, mean over seeds of each {window} rounds (%):", "",
                 "| rounds | " + " | ".join(columns) + " |", "|---" * (1 + len(columns)) + "|"]
        for i, (_, span) in enumerate(spans):
            lines.append(f"| {span} | " + " | ".join(c[i] for c in cells) + " |")
        tables.append("\n".join(lines))
    return "\n\n".join(tables)


def kept_averaged(round_: dict) -> bool | None:
    """Whether the round's server kept the averaged model over the distilled one: its guard
    chose it, or FedDF's labelled validation scored the checkpoint before the first step
    best (`best_step` 0); None where nothing chose (no guard, or no step distilled)."""
    if "guard" in round_:
        return round_["guard"]["kept"] == "averaged"
    return round_["best_step"] == 0 if "best_step" in round_ else None


def kept_table(records: list[dict], window: int = 10) -> str:
    """Per record whose server chooses between the averaged and the distilled model (a
    `distillation-guard`, or FedDF as published validating on labelled images), in how many
    of the rounds that chose in each `window` rounds it kept the averaged one."""
    chose = [(rec, {r["round"]: k for r in rec["rounds"] if (k := kept_averaged(r)) is not None})
             for rec in records]
    chose = [(rec, kept) for rec, kept in chose if kept]
    if not chose:
        return ("no record chooses between the averaged and the distilled model (a "
                "distillation-guard, or feddf-published with val-size > 0)")
    last = max(r["round"] for rec, _ in chose for r in rec["rounds"])
    spans = round_windows(last, window)
    lines = ["rounds that kept the averaged model / rounds that chose:", "",
             "| run | row | alpha | seed | " + " | ".join(n for _, n in spans) + " | all |",
             "|---" * (5 + len(spans)) + "|"]
    for rec, kept in sorted(chose, key=lambda c: (label(c[0]), -c[0]["config"]["alpha"],
                                                   c[0]["config"]["seed"])):
        cells = []
        for s in (*(start for start, _ in spans), None):
            part = [k for t, k in kept.items() if s is None or s <= t < s + window]
            cells.append(f"{sum(part)}/{len(part)}" if part else "-")
        lines.append(f"| {rec['run_name']} | {label(rec)} | {rec['config']['alpha']:g} | "
                     f"{rec['config']['seed']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# The windows of the per-seed differences: the last round, the last three, every round.
SEED_WINDOWS = (1, 3, None)


def seed_differences(records: list[dict], of: str = FOCUS,
                     metric: str = "server_test_acc", last: int | None = 1,
                     first: int | None = None, against: list[str] | None = None) -> str:
    """Per alpha and seed, `metric` of row `of` minus that of every other row (or of the rows
    `against`, in that order) (points), in the last round, averaged over the `last` rounds, or
    (last=None) over every round after round 0, the paper's accuracy over the rounds, or over
    the `first` rounds; so a lead or deficit is seen seed by seed, not only in the means."""
    cells: dict[tuple, dict[str, float]] = defaultdict(dict)
    for (name, alpha), recs in rows(records, central=False).items():
        for rec in recs:
            cells[(alpha, rec["config"]["seed"])][name] = last_mean(
                rec, last or len(rec["rounds"]), metric, first)
    others = against or sorted({name for row in cells.values() for name in row} - {of})
    shown = of if metric == "server_test_acc" else f"{of} {metric.removesuffix('_test_acc')}"
    what = (f"{shown}, mean of first {first} (%)" if first else f"{shown} (%)" if last == 1
            else f"{shown}, mean of last {last} (%)" if last
            else f"{shown}, mean over all rounds (%)")
    lines = [f"| alpha | seed | {what} | " + " | ".join(f"{of} − {o}" for o in others) + " |",
             "|" + "---|" * (3 + len(others))]
    for (alpha, seed), row in sorted(cells.items(), key=lambda kv: (-kv[0][0], kv[0][1])):
        if of not in row:
            continue
        diffs = [f"{100 * (row[of] - row[o]):+.1f}" if o in row else "-" for o in others]
        lines.append(f"| {alpha:g} | {seed} | {100 * row[of]:.1f} | " + " | ".join(diffs) + " |")
    return "\n".join(lines)


def paired_interval(diffs: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """The mean of per-seed paired differences and its `level` Student-t interval over the
    seeds (nan bounds for one seed)."""
    from scipy import stats
    n, mean = len(diffs), sum(diffs) / len(diffs)
    if n < 2:
        return mean, float("nan"), float("nan")
    sd = (sum((d - mean) ** 2 for d in diffs) / (n - 1)) ** 0.5
    half = stats.t.ppf(0.5 + level / 2, n - 1) * sd / n ** 0.5
    return mean, mean - half, mean + half


def verdict(mean: float, low: float, high: float, n: int) -> str:
    """"leads" where the interval is above zero, "trails" where below, "level" where it
    straddles zero; one seed is one value, no verdict."""
    if n < 2:
        return "one seed"
    return "leads" if low > 0 else "trails" if high < 0 else "level"


def paired_cell(diffs: list[float]) -> tuple[str, str]:
    """Per-seed differences (points) as "per seed: mean [95 % interval]", and the verdict."""
    mean, low, high = paired_interval(diffs)
    shown = (", ".join(f"{d:+.1f}" for d in diffs) + f": {mean:+.2f} [{low:+.2f}, {high:+.2f}]"
             if len(diffs) > 1 else f"{mean:+.2f}")  # one seed: one value
    return shown, verdict(mean, low, high, len(diffs))


def strongest(seeds_of: dict[int, dict], against: list[str], window: int, metric: str
              ) -> list[str]:
    """The one baseline of `against` with the highest `metric` over the last `window` rounds
    (its mean over the seeds it has), of one K and alpha's runs {seed: {row: record}}."""
    scores = {other: statistics.mean(last_mean(row[other], window, metric)
                                     for row in seeds_of.values() if other in row)
              for other in against if any(other in row for row in seeds_of.values())}
    return [max(scores, key=scores.get)] if scores else []


def paired_table(records: list[dict], of: str, against: list[str], window: int = 10,
                 metric: str = "server_test_acc", only_strongest: bool = False) -> str:
    """Per K (the federation's clients), alpha and baseline: `metric` of row `of` minus the
    baseline's, seed by seed (same seed), over the first and the last `window` rounds (per
    seed, their mean with a 95 % interval over the seeds, and what it says: `verdict`), and
    the rounds each takes to FedAvg's target (of that K and alpha) over those seeds. With
    `only_strongest`, per K and alpha only the baseline that ends highest (`strongest`)."""
    runs: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for rec in records:
        if rec["config"]["strategy"] != CENTRAL:
            k = rec.get("clients", {}).get("num_partitions", "-")
            runs[(k, rec["config"]["alpha"], rec["config"]["seed"])][label(rec)] = rec
    lines = [f"| K | alpha | {of} minus | seeds | rounds 1-{window} (points) | | last "
             f"{window} rounds (points) | | rounds to target (row; baseline) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for k, alpha in sorted({key[:2] for key in runs},
                           key=lambda c: (c[0] if isinstance(c[0], int) else 1e9, -c[1])):
        seeds_of = {key[2]: row for key, row in runs.items() if key[:2] == (k, alpha)}
        target = fedavg_target([row["fedavg"] for row in seeds_of.values() if "fedavg" in row],
                               metric)
        for other in (strongest(seeds_of, against, window, metric) if only_strongest
                      else against):
            seeds = sorted(s for s, row in seeds_of.items() if of in row and other in row)
            if not seeds:
                continue
            pairs = [(seeds_of[s][of], seeds_of[s][other]) for s in seeds]
            cells = [paired_cell([100 * (last_mean(a, window, metric, **first)
                                         - last_mean(b, window, metric, **first))
                                  for a, b in pairs])
                     for first in ({"first": window}, {})]
            to_target = "-" if target is None else (
                f"{rounds_to_target([a for a, _ in pairs], target, metric)}; "
                f"{rounds_to_target([b for _, b in pairs], target, metric)} "
                f"({100 * target:.0f}%)")
            lines.append(f"| {k} | {alpha:g} | {other} | {', '.join(map(str, seeds))} | "
                         + " | ".join(" | ".join(c) for c in cells) + f" | {to_target} |")
    return "\n".join(lines)


# Columns of the per-round diagnostics table: (header, space, rule).
DIAGNOSTIC_COLUMNS = (
    ("uniform", "logits", "uniform"), ("variance", "logits", "variance"),
    ("entropy", "logits", "entropy"), ("domain-aware", "logits", "domain-aware"),
    ("size (n_k)", "logits", "size"), ("**odds**", "logits", "odds"), ("odds β=4", "logits", "odds-beta4"),
    ("odds unsquashed", "logits", "odds-unsquashed"), ("uniform (prob.)", "probabilities", "uniform"),
    ("odds (prob.)", "probabilities", "odds"), ("odds β=4 (prob.)", "probabilities", "odds-beta4"),
    ("class count", "logits", "class-count"),
    ("class count from averaged", "logits", "class-count-from-averaged"),
    ("class count from own", "logits", "class-count-from-own"),
    ("own + averaged", "logits", "active+averaged"),
    ("label oracle", "logits", "label-oracle"))


def diagnostics_table(record: dict) -> str:
    """Per round: the server model's test accuracy (%), the averaged model's before it was
    distilled (when recorded), the ensemble test accuracy of that round's client models under
    every rule (from the record's diagnostics), the mean weight the run's own rule and uniform
    weighting give the client the oracle favours, and the share of Phi near its cap e."""
    rounds = [r for r in record["rounds"] if "diagnostics" in r]
    if not rounds:
        return "(no diagnostics in this record: run it with diagnostics = true)"
    columns = [c for c in DIAGNOSTIC_COLUMNS if c[2] in rounds[0]["diagnostics"][c[1]]]
    averaged = "averaged" in rounds[0]["diagnostics"]  # absent from older records
    capped = record.get("config", {}).get("discriminator-calibration", "none") == "none"
    head = (["round", "server"] + ["averaged (before distillation)"] * averaged
            + [h for h, _, _ in columns] + ["w(oracle client): own / uniform", "Phi near e"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rounds:
        d = r["diagnostics"]
        w = d.get("weight_on_oracle_client", {})
        cells = [str(r["round"]), f"{100 * r['server_test_acc']:.1f}"]
        if averaged:
            cells.append(f"{100 * d['averaged']['acc']:.1f}")
        cells += [f"{100 * d[space][rule]['acc']:.1f}" for _, space, rule in columns]
        cells.append(f"{w['active']:.2f} / {w['uniform']:.2f}" if w else "-")
        cells.append(f"{100 * d['phi']['share_near_cap']:.0f} %" if "phi" in d and capped
                     else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# The options beyond the paper against the odds (logits, beta 1) and the label oracle.
GAP_VARIANTS = (("odds β=4", "logits", "odds-beta4"), ("odds (prob.)", "probabilities", "odds"),
                ("odds β=4 (prob.)", "probabilities", "odds-beta4"),
                ("odds unsquashed", "logits", "odds-unsquashed"))


def gap_table(records: list[dict], of: str = FOCUS) -> str:
    """Per alpha, over the diagnostics of the runs of row `of` (every round, every seed): the
    mean ensemble accuracy of the odds, of each option beyond the paper and of the label
    oracle, and the share of the odds-to-oracle gap each option closes,
    (m - odds) / (oracle - odds)."""
    head = ["alpha", "seeds", "odds", *[h for h, _, _ in GAP_VARIANTS], "label oracle"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for alpha, recs in by_alpha(records).items():
        runs = [rec for rec in recs if label(rec) == of
                and any("diagnostics" in r for r in rec["rounds"])]
        rounds = [r["diagnostics"] for rec in runs for r in rec["rounds"] if "diagnostics" in r]
        if not rounds:
            continue
        mean = partial(rule_acc, rounds)
        odds, oracle = mean("logits", "odds"), mean("logits", "label-oracle")
        cells = [f"{alpha:g}", ",".join(str(rec["config"]["seed"]) for rec in runs),
                 f"{100 * odds:.1f}"]
        for _, space, rule in GAP_VARIANTS:
            m = mean(space, rule)
            cells.append(f"{100 * m:.1f} ({100 * (m - odds) / (oracle - odds):+.0f} % of gap)")
        cells.append(f"{100 * oracle:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def rounds_figure(records: list[dict], metric: str = "server_test_acc", by=label,
                  title: str = ""):
    """A matplotlib Figure of `metric` against the round: one panel per alpha, side by side
    (the central reference, which has no alpha, in each), one line per group `by` names with a
    band of one std over its records, the same colour for a group in every panel, integer
    round ticks."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.ticker import MaxNLocator

    panels = {}  # alpha -> group -> records
    for alpha, recs in (by_alpha(records) or {None: records}).items():
        panels[alpha] = defaultdict(list)
        for rec in recs:
            panels[alpha][by(rec)].append(rec)
    names = sorted({name for groups in panels.values() for name in groups})
    levels = {by(rec) for rec in records if rec["config"]["strategy"] == CENTRAL}  # black
    lines = [n for n in names if n not in levels]
    palette = ([f"C{i}" for i in range(10)] if len(lines) <= 10
               else plt.get_cmap("tab20").colors)  # a colour a line up to 20 lines
    colours = {name: palette[i % len(palette)] for i, name in enumerate(lines)}
    counts = {name: [len(g[name]) for g in panels.values() if name in g] for name in names}
    legend = {name: f"{name} (n={'/'.join(map(str, n)) if len(set(n)) > 1 else n[0]})"
              for name, n in counts.items()}  # records per panel, once when all agree
    # the legend goes under the panels, where long option names do not squeeze them
    columns = 1 if len(panels) == 1 else 2
    legend_inches = 0.2 + 0.2 * -(-len(names) // columns)
    fig, axes = plt.subplots(1, len(panels), figsize=(0.6 + 5.4 * len(panels),
                                                      4.2 + legend_inches),
                             sharey=True, squeeze=False)
    title = title or metric.replace("_", " ")
    for ax, (alpha, groups) in zip(axes[0], panels.items()):
        for name, recs in sorted(groups.items()):
            if recs[0]["config"]["strategy"] == CENTRAL:  # epochs, not rounds: its final level
                level = 100 * np.mean([rec["rounds"][-1][metric] for rec in recs
                                       if metric in rec["rounds"][-1]] or [np.nan])
                if np.isfinite(level):
                    ax.axhline(level, color="k", ls="--", lw=1, label=legend[name])
                continue
            rounds = sorted({r["round"] for rec in recs for r in rec["rounds"] if metric in r})
            if not rounds:  # e.g. no ensemble in FedAvg's records
                continue
            values = np.array([[next(r[metric] for r in rec["rounds"] if r["round"] == t)
                                for t in rounds] for rec in recs]) * 100
            mean, std = values.mean(0), values.std(0)
            ax.plot(rounds, mean, label=legend[name], lw=1.8, color=colours[name])
            ax.fill_between(rounds, mean - std, mean + std, alpha=0.2, color=colours[name])
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("round")
        where = f"alpha = {alpha:g}" if alpha is not None else ""
        ax.set_title(where if len(panels) > 1 else ", ".join(filter(None, (title, where))))
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(metric.replace("_", " ") + " (%)")
    if len(panels) > 1:
        fig.suptitle(title)
    # one legend for every panel
    handles = {}
    for ax in axes[0]:
        for handle, name in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(name, handle)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=columns,
               fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, legend_inches / fig.get_figheight(), 1, 1))
    return fig


def plot_rounds(records: list[dict], path: Path, metric: str = "server_test_acc",
                by=label, title: str = "") -> Path:
    """`rounds_figure` of the records, saved as `path` (PNG)."""
    import matplotlib.pyplot as plt

    fig = rounds_figure(records, metric, by, title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")  # the whole legend, however wide
    plt.close(fig)
    return path


def mib(nbytes: float) -> str:
    return f"{nbytes / 2 ** 20:.2f}"


def communication_table(records: list[dict]) -> str:
    """Per strategy (first record of each label): MiB sent down and up in the pre-FL stage,
    per round (mean over rounds) and over the whole run, the pre-FL stage's share of the
    run's bytes; the clients' compute seconds per round (their sum, mean over rounds), in
    the pre-FL stage (discriminators, FedGAN) and its share of the run's client seconds.
    Records made before a column existed show '-'."""
    lines = ["| strategy | rounds | pre-FL down | pre-FL up | per round down | per round up | "
             "whole run (MiB) | pre-FL share of bytes | client s / round | pre-FL client s | "
             "pre-FL share of client s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    seen = set()
    for rec in records:
        name = label(rec)
        if name in seen or rec["config"]["strategy"] == CENTRAL:
            continue
        seen.add(name)
        rounds = [r for r in rec["rounds"] if r["round"] > 0]
        per = lambda key: statistics.mean(r["bytes"].get(key, 0) for r in rounds) if rounds else 0
        sent = rec["bytes"]
        total = sum(sent.values())
        pre_fl = sent.get("pre_fl_down", 0) + sent.get("pre_fl_up", 0)
        seconds = [r["client_seconds"] for r in rounds if "client_seconds" in r]
        main = f"{statistics.mean(seconds):.1f}" if seconds else "-"
        pre_fl_record = rec.get("pre_fl", {})
        spent = pre_fl_record.get("client_seconds")
        if spent is None and "discriminator_loss" in pre_fl_record or not seconds:
            before, share = "-", "-"  # a record from before pre-FL seconds were kept
        else:
            before = sum((spent or {}).values())
            share = f"{100 * before / (before + sum(seconds)):.1f} %"
            before = f"{before:.1f}"
        lines.append(f"| {name} | {len(rounds)} | {mib(sent.get('pre_fl_down', 0))} | "
                     f"{mib(sent.get('pre_fl_up', 0))} | {mib(per('down'))} | "
                     f"{mib(per('up'))} | {mib(total)} | "
                     f"{100 * pre_fl / total if total else 0:.1f} % | {main} | {before} | "
                     f"{share} |")
    return "\n".join(lines)


def update_tables(path: Path, records: list[dict]) -> list[str]:
    """Replace each table of `path` whose header row begins (first three cells) like one of
    the report's tables (summary, per-seed differences in the last round, over the last 3
    and over all rounds, gap, communication) with that table made from `records`; the rest
    of the file is kept as it is. Returns the headers of the tables replaced."""
    key = lambda line: "|".join(line.split("|")[1:4])  # noqa: E731 - its first three cells
    makers = (summary_table, *(partial(seed_differences, last=last) for last in SEED_WINDOWS),
              gap_table, communication_table)
    # a table's first three header cells do not depend on the records: ask each for its own
    by_header = {key(make([]).split("\n")[0]): make for make in makers}
    out, replaced, lines, i = [], [], path.read_text().split("\n"), 0
    while i < len(lines):
        make = by_header.get(key(lines[i])) if lines[i].startswith("|") else None
        if make is None:
            out.append(lines[i])
            i += 1
            continue
        out += make(records).split("\n")
        replaced.append(lines[i])
        while i < len(lines) and lines[i].startswith("|"):
            i += 1
    path.write_text("\n".join(out))
    return replaced


def heading(rec: dict) -> str:
    """The heading a per-record table is printed under."""
    return f"\n### {rec['run_name']} ({label(rec)}, alpha {rec['config']['alpha']})\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fedgo_lab.report", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Tables and plots from run records. Without an option: the summary table\n"
                    "(mean ± std over seeds per row and alpha).",
        epilog="e.g. python -m fedgo_lab.report docs/records/fmnist-fair --update docs/results/fair.md")
    parser.add_argument("dirs", nargs="*", type=Path, metavar="RESULTS_DIR",
                        help="folders searched for record.json files, at any depth (before "
                             "--metric and --against, which take every value after them)")
    parser.add_argument("--plot", type=Path, metavar="FILE.png",
                        help="also draw --metric against the round: one panel per alpha, one "
                             "line per row (mean over seeds, band of one std)")
    parser.add_argument("--metric", nargs="+", default=["server_test_acc"],
                        help="the per-round value --plot draws (one) or --windows averages "
                             "(one or more), e.g. ensemble_test_acc or a dotted path into a "
                             "round such as diagnostics.averaged.acc (default: %(default)s)")
    parser.add_argument("--by", default=None, metavar="KEY",
                        help="--plot groups lines by this config key instead of by row")
    parser.add_argument("--title", default="", help="--plot's title (default: the metric)")
    parser.add_argument("--diagnostics", action="store_true",
                        help="per record with diagnostics, the per-round table of every rule "
                             "and the label oracle on the same client models")
    parser.add_argument("--communication", action="store_true",
                        help="MiB each way (pre-FL, per round, whole run), client seconds "
                             "(per round, pre-FL) and the pre-FL share of each, per row")
    parser.add_argument("--gap", action="store_true",
                        help="per alpha, the share of the odds-to-oracle gap each option "
                             "beyond the paper closes, over the diagnostics of row --of "
                             f"(default: {FOCUS})")
    parser.add_argument("--of", metavar="LABEL",
                        help="per-seed differences of this row (as the tables name it, e.g. "
                             "'fedgo[beta=4]') to every other row, in the last round, over the "
                             "last three and over all rounds (with --personalised: of the "
                             "personalised accuracy)")
    parser.add_argument("--paired", type=int, metavar="N",
                        help="with --of and --against: per alpha and baseline, the per-seed "
                             "paired differences over the first and the last N rounds, their "
                             "mean with a 95 %% interval over the seeds, leads / level / "
                             "trails, and the rounds to FedAvg's target of both")
    parser.add_argument("--strongest", action="store_true",
                        help="with --paired: per K and alpha only the baseline of --against "
                             "that ends highest (its mean over the last N rounds and its seeds)")
    parser.add_argument("--against", nargs="+", metavar="LABEL",
                        help="with --of: only these rows, in this order (default: every other "
                             "row)")
    parser.add_argument("--horizon", type=int, metavar="N",
                        help="long runs: the server accuracy over the first N and the last N "
                             "rounds, the best round, the ensemble over the last N, rounds and "
                             "seconds to target, per row (with --of: per-seed differences over "
                             "both windows)")
    parser.add_argument("--lasting", type=int, metavar="N",
                        help="per record with diagnostics, per window of N rounds: the server, "
                             "the averaged model before distillation, the teacher and the "
                             "teachers the lasting options would give on the same models")
    parser.add_argument("--per-class", type=int, metavar="N",
                        help="per record with per-class diagnostics: per class, over rounds "
                             "1..N and the later rounds, its holder's share and weight and the "
                             "teacher's accuracy minus the averaged model's")
    parser.add_argument("--kept", type=int, metavar="N",
                        help="per record whose server chooses between the averaged and the "
                             "distilled model (a distillation-guard, FedDF as published's "
                             "labelled validation), per window of N rounds: the rounds that "
                             "kept the averaged model")
    parser.add_argument("--windows", type=int, metavar="N",
                        help="long runs: per alpha, the mean over seeds of each row's --metric "
                             "over each N rounds, one column per row and metric")
    parser.add_argument("--personalised", action="store_true",
                        help="the clients' accuracy on their personal test splits "
                             "(personal-test-fraction) beside the server's, per row")
    parser.add_argument("--architecture", metavar="MODEL",
                        help="in mixed federations (client-models), report this "
                             "architecture's global model (its server accuracy and loss)")
    parser.add_argument("--update", type=Path, metavar="FILE.md",
                        help="rewrite in place every table of FILE.md the report makes (found by "
                             "its header row), e.g. docs/results.md")
    args = parser.parse_args(argv)
    if not args.dirs:  # argparse's own message would not say that --metric took the folders
        parser.error("no RESULTS_DIR: name the folders before --metric and --against, which "
                     "take every value that follows them")
    records = load_records(*args.dirs)
    if args.architecture:
        records = of_architecture(records, args.architecture)
    if not records:
        print(f"no record.json under {[str(d) for d in args.dirs]}"
              + (f" with architecture {args.architecture!r}" if args.architecture else ""))
        return 1
    rows = {label(r) for r in records}
    named = ([args.of] if args.of else []) + (args.against or [])
    if unknown := [name for name in named if name not in rows]:
        parser.error(f"no row named {', '.join(map(repr, unknown))}; the records' rows: "
                     + ", ".join(sorted(rows)))
    if args.against and not args.of:
        parser.error("--against compares with the row --of names: give --of too")
    if len(made := devices(records)) > 1:  # rounding differs between them: docs/benchmarks.md
        print(f"warning: these records were made on different devices or runtimes {made}; "
              "a table compares methods on one", file=sys.stderr)
    if args.diagnostics:
        with_diagnostics = [r for r in records if any("diagnostics" in x for x in r["rounds"])]
        for rec in with_diagnostics:
            print(heading(rec))
            print(diagnostics_table(rec))
        if not with_diagnostics:
            print("no record has diagnostics: run with diagnostics = true")
        return 0
    if args.plot and len(args.metric) > 1:
        parser.error("--plot draws one --metric")
    if args.windows:
        if missing := [m for m in args.metric if not any(
                round_value(r, m) is not None for rec in records for r in rec["rounds"])]:
            parser.error(f"--metric {', '.join(missing)}: no round of these records has it "
                         "(a round's key, e.g. ensemble_test_acc, or a dotted path such as "
                         "diagnostics.averaged.acc)")
        print(window_table(records, args.windows, tuple(args.metric)))
        return 0
    for window, key, table in ((args.lasting, "lasting", lasting_table),
                               (args.per_class, "per_class", per_class_table)):
        if window:  # one table per record whose diagnostics have the key
            for rec in records:
                if any(key in x.get("diagnostics", {}) for x in rec["rounds"]):
                    print(heading(rec))
                    print(table(rec, window))
            return 0
    if args.kept:
        print(kept_table(records, args.kept))
        return 0
    if args.communication:
        print(communication_table(records))
        return 0
    if args.personalised:
        print(personal_table(records))
        for last in SEED_WINDOWS if args.of else ():
            print("\n" + seed_differences(records, of=args.of, metric="personalised_test_acc",
                                           last=last, against=args.against))
        return 0
    if args.gap:
        print(gap_table(records, of=args.of or FOCUS))
        return 0
    if args.paired:
        if not (args.of and args.against):
            parser.error("--paired needs --of ROW and --against BASELINE ...")
        print(paired_table(records, args.of, args.against, args.paired,
                           only_strongest=args.strongest))
        return 0
    if args.horizon:
        print(horizon_table(records, args.horizon))
        for window in ({"first": args.horizon}, {"last": args.horizon}) if args.of else ():
            print("\n" + seed_differences(records, of=args.of, against=args.against, **window))
        return 0
    if args.of:
        for last in SEED_WINDOWS:
            print(seed_differences(records, of=args.of, last=last, against=args.against) + "\n")
        return 0
    if args.update:
        replaced = update_tables(args.update, records)
        print(f"{args.update}: {len(replaced)} tables rewritten from {len(records)} records")
        return 0
    print(summary_table(records))
    if args.plot:
        by = (lambda rec: str(rec["config"][args.by])) if args.by else label
        print(f"plot: {plot_rounds(records, args.plot, args.metric[0], by, args.title).resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
