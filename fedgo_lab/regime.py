"""The regime map: where an ensemble strategy leads FedAvg as one run-config key varies (local
epochs by default), from the records of a plan such as conf/bench/fmnist-regime.yaml.

    python -m fedgo_lab.regime RESULTS_DIR [RESULTS_DIR ...] [--key local-epochs]
                               [--last 3] [--of fedgo] [--plot FILE.png] [--update FILE.md]

prints, per alpha and value of the key, each row's server test accuracy (mean over seeds of
its mean over the last `--last` rounds), its lead over FedAvg at the same value, and, from the
records of row `--of` (fedgo by default) that carry diagnostics (every rule on the same
client models each round),
in how many rounds the run's own ensemble beat the round's averaged model (the model it
distils into, what FedAvg keeps after the same clients), the mean weight its rule and the
label oracle give the client holding most images of a test image's class, and the label
oracle's ensemble accuracy. A second table puts every weighting rule on the same client
models of row `--of`'s rounds: its mean ensemble accuracy and in how many rounds it beat the
averaged model. --plot draws the lead over FedAvg against the key, one panel per alpha, one
line per row. --update writes both tables between the lines <!-- regime --> and
<!-- /regime --> of a markdown file.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from fedgo_lab.report import CENTRAL, DIAGNOSTIC_COLUMNS, FOCUS, label, last_mean, load_records

BASELINE = "fedavg"
MARKERS = ("<!-- regime -->", "<!-- /regime -->")


def mechanism(rec: dict) -> dict | None:
    """From a record with diagnostics: rounds whose ensemble beat the averaged model (of the
    rounds that have both), mean weight on the oracle's client of the run's rule and of the
    oracle, and the oracle ensemble's mean accuracy; None without diagnostics."""
    rounds = [r for r in rec["rounds"] if "diagnostics" in r and "averaged" in r["diagnostics"]]
    if not rounds:
        return None
    weights = [r["diagnostics"].get("weight_on_oracle_client", {}) for r in rounds]
    mean = lambda xs: statistics.mean(xs) if xs else float("nan")  # noqa: E731
    return {
        "beats_average": sum(r["ensemble_test_acc"] > r["diagnostics"]["averaged"]["acc"]
                             for r in rounds),
        "rounds": len(rounds),
        "weight_active": mean([w["active"] for w in weights if "active" in w]),
        "weight_oracle": mean([w["label-oracle"] for w in weights if "label-oracle" in w]),
        "oracle_acc": mean([r["diagnostics"]["logits"]["label-oracle"]["acc"] for r in rounds
                            if "label-oracle" in r["diagnostics"]["logits"]]),
    }


def regime(records: list[dict], key: str = "local-epochs", last: int = 3) -> dict:
    """{alpha: {value of key: {row label: [records]}}} (the central reference left out)."""
    out: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for rec in records:
        c = rec["config"]
        if c["strategy"] != CENTRAL:
            out[c["alpha"]][c[key]][label(rec)].append(rec)
    return out


def regime_table(records: list[dict], key: str = "local-epochs", last: int = 3,
                 of: str = FOCUS) -> str:
    """The map as a markdown table; the mechanism columns are those of row `of`'s records."""
    cells = regime(records, key, last)
    labels = sorted({name for by_value in cells.values() for rows in by_value.values()
                     for name in rows})
    others = [n for n in labels if n != BASELINE]
    head = (["alpha", key, "seeds"] + [f"{n} (%)" for n in labels]
            + [f"{n} − {BASELINE}" for n in others]
            + [f"{of}: ensemble > averaged (rounds)",
               f"{of}: weight on oracle client, rule / oracle", f"{of}: label oracle (%)"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for alpha in sorted(cells, reverse=True):
        for value in sorted(cells[alpha]):
            rows = cells[alpha][value]
            acc = {n: statistics.mean(last_mean(r, last) for r in recs)
                   for n, recs in rows.items()}
            seeds = sorted({r["config"]["seed"] for recs in rows.values() for r in recs})
            mech = [m for r in rows.get(of, []) if (m := mechanism(r))]
            line = [f"{alpha:g}", str(value), ",".join(map(str, seeds))]
            line += [f"{100 * acc[n]:.1f}" if n in acc else "-" for n in labels]
            line += [f"{100 * (acc[n] - acc[BASELINE]):+.1f}"
                     if n in acc and BASELINE in acc else "-" for n in others]
            if mech:
                line += [f"{sum(m['beats_average'] for m in mech)}/"
                         f"{sum(m['rounds'] for m in mech)}",
                         f"{statistics.mean(m['weight_active'] for m in mech):.2f} / "
                         f"{statistics.mean(m['weight_oracle'] for m in mech):.2f}",
                         f"{100 * statistics.mean(m['oracle_acc'] for m in mech):.1f}"]
            else:
                line += ["-", "-", "-"]
            lines.append("| " + " | ".join(line) + " |")
    return "\n".join(lines)


def rules_table(records: list[dict], key: str = "local-epochs", of: str = FOCUS) -> str:
    """Every rule the diagnostics score, on the client models of row `of`'s rounds: per alpha
    and value of the key, "mean ensemble accuracy (rounds it beat the averaged model)"."""
    cells = regime(records, key)
    rounds = {(alpha, value): [r for rec in by_value[value].get(of, []) for r in rec["rounds"]
                               if "averaged" in r.get("diagnostics", {})]
              for alpha, by_value in cells.items() for value in by_value}
    present = {(space, rule) for rs in rounds.values() for r in rs
               for space in ("logits", "probabilities") for rule in r["diagnostics"][space]}
    columns = [c for c in DIAGNOSTIC_COLUMNS if (c[1], c[2]) in present]
    head = ["alpha", key, "rounds", "averaged (%)"] + [h for h, _, _ in columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (alpha, value), rs in sorted(rounds.items(), key=lambda kv: (-kv[0][0], kv[0][1])):
        if not rs:
            continue
        averaged = [r["diagnostics"]["averaged"]["acc"] for r in rs]
        line = [f"{alpha:g}", str(value), str(len(rs)), f"{100 * statistics.mean(averaged):.1f}"]
        for _, space, rule in columns:
            accs = [(r["diagnostics"][space][rule]["acc"], avg) for r, avg in zip(rs, averaged)
                    if rule in r["diagnostics"][space]]
            line.append(f"{100 * statistics.mean(a for a, _ in accs):.1f} "
                        f"({sum(a > avg for a, avg in accs)}/{len(accs)})" if accs else "-")
        lines.append("| " + " | ".join(line) + " |")
    return "\n".join(lines)


def lead_figure(records: list[dict], key: str = "local-epochs", last: int = 3):
    """Lead over FedAvg (points) against the key: one panel per alpha, one line per row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = regime(records, key, last)
    alphas = sorted(cells, reverse=True)
    fig, axes = plt.subplots(1, len(alphas), figsize=(5 * len(alphas), 3.6), squeeze=False,
                             sharey=True)
    for ax, alpha in zip(axes[0], alphas):
        leads: dict = defaultdict(list)
        for value in sorted(cells[alpha]):
            rows = cells[alpha][value]
            if BASELINE not in rows:
                continue
            base = statistics.mean(last_mean(r, last) for r in rows[BASELINE])
            for name, recs in rows.items():
                if name != BASELINE:
                    leads[name].append(
                        (value, 100 * (statistics.mean(last_mean(r, last) for r in recs) - base)))
        for name, points in sorted(leads.items()):
            ax.plot(*zip(*points), marker="o", label=name)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xscale("log")
        ax.set_xticks(sorted(cells[alpha]), [str(v) for v in sorted(cells[alpha])])
        ax.set_title(f"alpha = {alpha:g}")
        ax.set_xlabel(key)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(f"lead over {BASELINE}, mean of last {last} rounds (points)")
    axes[0][-1].legend(loc="best", fontsize=8)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedgo_lab.regime",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path, metavar="RESULTS_DIR",
                        help="folders holding run records (<run>/record.json)")
    parser.add_argument("--key", default="local-epochs",
                        help="the run-config key the map varies (default: local-epochs)")
    parser.add_argument("--last", type=int, default=3,
                        help="rounds at the end of each run to average (default: 3)")
    parser.add_argument("--of", default=FOCUS, metavar="LABEL",
                        help="the row whose diagnostics fill the mechanism columns "
                             f"(default: {FOCUS})")
    parser.add_argument("--plot", type=Path, metavar="FILE.png",
                        help="also draw the lead over FedAvg against the key there")
    parser.add_argument("--update", type=Path, metavar="FILE.md",
                        help="write the tables between <!-- regime --> and <!-- /regime --> "
                             "there")
    args = parser.parse_args(argv)
    records = load_records(*args.dirs)
    if not records:
        parser.error(f"no records under {', '.join(map(str, args.dirs))}")
    missing = [r["run_name"] for r in records if args.key not in r["config"]]
    if missing:
        parser.error(f"--key {args.key!r} is not a run-config key of {missing[0]}")
    text = (regime_table(records, args.key, args.last, args.of)
            + f"\n\nEvery rule on the client models of {args.of}'s rounds: mean ensemble "
            "accuracy (rounds it beat the averaged model)\n\n"
            + rules_table(records, args.key, args.of))
    print(text)
    if args.update:
        doc = args.update.read_text()
        start, end = doc.find(MARKERS[0]), doc.find(MARKERS[1])
        if start < 0 or end < start:
            parser.error(f"--update: {args.update} lacks the lines {MARKERS[0]} ... {MARKERS[1]}")
        args.update.write_text(doc[:start + len(MARKERS[0])] + "\n" + text + "\n" + doc[end:])
        print(f"\n[regime] tables written into {args.update}")
    if args.plot:
        fig = lead_figure(records, args.key, args.last)
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.plot, dpi=110)
        print(f"\n[regime] plot in {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
