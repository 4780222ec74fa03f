"""The server's seconds a round against K, from saved outputs of `python -m fedgo_lab.perf`
(its table "One FedGO round"): one line per output (e.g. before and after an option), the
server's stages (aggregation, pseudo-labelling, distillation, evaluation) summed, and the
round's CPU seconds.

    python -m fedgo_lab.perf_plot docs/perf/k-scaling-before.txt docs/perf/k-scaling-after.txt \\
        --labels "as the paper" "teachers-per-image = 8, ensemble-test = false" \\
        --out docs/server-cost-vs-k.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

SERVER = ("aggregation s", "pseudo labelling s", "distillation s", "evaluation s")


def rounds_table(text: str) -> list[dict[str, float]]:
    """The rows of perf's "One FedGO round" table, by column name."""
    lines = text.split("## One FedGO round", 1)[1].splitlines()
    rows = [ln for ln in lines if ln.startswith("|")]
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    return [dict(zip(header, (float(c) for c in r.strip("|").split("|"))))
            for r in rows[2:]]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fedgo_lab.perf_plot", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("outputs", nargs="+", type=Path, help="saved outputs of fedgo_lab.perf")
    parser.add_argument("--labels", nargs="+", help="one a line (default: the file names)")
    parser.add_argument("--out", type=Path, required=True, help="the figure, a .png")
    args = parser.parse_args(argv)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = args.labels or [p.stem for p in args.outputs]
    fig, (server, cpu) = plt.subplots(1, 2, figsize=(10, 4))
    for path, label in zip(args.outputs, labels):
        rows = rounds_table(path.read_text())
        ks = [r["K"] for r in rows]
        seconds = [sum(r[s] for s in SERVER) for r in rows]
        server.plot(ks, seconds, marker="o", label=label)
        cpu.plot(ks, [r["round CPU s"] for r in rows], marker="o", label=label)
        print(f"{label}: server s a round " + ", ".join(
            f"K={k:.0f} {s:.1f}" for k, s in zip(ks, seconds)))
    for ax, title in ((server, "server stages, wall s a round"),
                      (cpu, "whole round (clients in process), CPU s")):
        ax.set_xscale("log")
        ax.set_xticks(ks, [f"{k:.0f}" for k in ks])
        ax.minorticks_off()
        ax.set_xlabel("K (clients; 40 % a round)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    server.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"figure written to {args.out}")


if __name__ == "__main__":
    main()
