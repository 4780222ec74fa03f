"""What a round of each strategy costs, stage by stage: seeded in-process runs (the real
ServerApp and ClientApp code, the clients one after another in this process) on the lead
plan's settings, one after the other on the same machine.

    python -m fedgo_lab.roundcost [--rounds 3] [--clients 20]
                                  [--strategies fedavg fedgo fedgo-cal best-row]
                                  [--config KEY=VALUE ...]

Settings: conf/fmnist-fair.toml with 1 local epoch, diagnostics off, K = 20 partitions
(`--clients`; at 100 or more add `--config dirichlet-group=10`, the paper's split), alpha 0.1,
seed 0, then --config. A strategy name is a run-config `strategy`, `fedgo-cal`
(conf/fedgo-calibrated.toml) or `best-row` (conf/best-row.toml), and may carry keys of its own
after "+" (`best-row+teachers-per-image=8+ensemble-test=false`: the same strategy with them).
Prints, per strategy, the pre-FL stage and the mean seconds per round of each stage (rounds
2.. when there are several: round 1 pays one-off costs), and each round's total against
FedAvg's: in wall seconds, and in the CPU seconds of this process (clients and server; far
less sensitive to other load on the machine than the wall seconds, not immune to it: shared
caches and cores slow the work itself). A FedAvg round runs first, unreported: the first run
in a process measured up to a quarter slower.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import tomllib
from pathlib import Path

from fedgo_lab.cli import add_config_flag, config_from, config_values
from fedgo_lab.perf import STAGES as PERF_STAGES

REPO = Path(__file__).resolve().parent.parent
PRESETS = {"fedgo-cal": REPO / "conf" / "fedgo-calibrated.toml",
           "best-row": REPO / "conf" / "best-row.toml"}
PRE_FL = ("generator_training", "discriminator_training", "odds")
# a round's stages; "guard": the distillation guard's exchange (clients scoring the candidates)
STAGES = (*PERF_STAGES, "guard")


def settings(name: str) -> dict:
    fair = tomllib.loads((REPO / "conf" / "fmnist-fair.toml").read_text())
    name = name.split("+")[0]
    preset = (tomllib.loads(PRESETS[name].read_text()) if name in PRESETS
              else {"strategy": name})
    return {**fair, "local-epochs": 1, "diagnostics": False, "alpha": 0.1, "seed": 0,
            "generator-cache": False, **preset}


def measure(cfg, partitions: int) -> dict:
    """One seeded run; its record's stage seconds."""
    from client_app.app import app as client_app
    from server_app.app import run

    from fedgo_lab.inprocess import InProcessGrid

    start = time.perf_counter()
    record = json.loads(run(InProcessGrid(client_app, cfg.to_run_config(), partitions),
                            cfg).read_text())
    rounds = [r for r in record["rounds"] if r["round"] > 0]
    timed = rounds[1:] or rounds
    per_round = {s: sum(r["seconds"].get(s, 0.0) for r in timed) / len(timed) for s in STAGES}
    return {"wall_s": time.perf_counter() - start,
            "pre_fl_s": {k: record["timings"].get(k, 0.0) for k in PRE_FL},
            "round_s": per_round, "round_total_s": sum(per_round.values()),
            "round_cpu_s": sum(r.get("cpu_seconds", 0.0) for r in timed) / len(timed),
            "dropped_weight": [r["dropped_weight"] for r in rounds if "dropped_weight" in r],
            "acc": [r["server_test_acc"] for r in rounds]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fedgo_lab.roundcost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partitions", "--clients", type=int, default=20,
                        help="K, the federation's clients (default: %(default)s)")
    parser.add_argument("--strategies", nargs="+", default=["fedavg", "fedgo", "fedgo-cal"])
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads (default: torch's own choice)")
    add_config_flag(parser)
    args = parser.parse_args(argv)
    import torch
    if args.threads:
        torch.set_num_threads(args.threads)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        # The first run in a process pays one-off costs (allocator, lazy initialisation): a
        # FedAvg round goes first, unreported, so that no measured strategy pays them.
        print("[roundcost] warm-up: one FedAvg round (not reported) ...", flush=True)
        measure(config_from(parser, args.config, under=settings("fedavg"), over={
            "num-server-rounds": 1, "results-dir": tmp, "run-name": "warm-up"}),
            args.partitions)
        for name in args.strategies:
            own = config_values(parser, name.split("+")[1:])
            cfg = config_from(parser, args.config, under=settings(name), over={
                **own, "num-server-rounds": args.rounds, "results-dir": tmp,
                "run-name": name.split("+")[0]})
            print(f"[roundcost] {name}: {args.rounds} rounds ...", flush=True)
            results[name] = measure(cfg, args.partitions)
    print(f"\n# round cost: torch threads {torch.get_num_threads()}, {args.rounds} rounds, "
          f"K = {args.partitions}, {' '.join(args.config) or 'no --config'}")
    print("| strategy | pre-FL s | " + " | ".join(STAGES)
          + " | round s | x FedAvg | round CPU s | x FedAvg |")
    print("|---|---|" + "---|" * len(STAGES) + "---|---|---|---|")
    base = results.get("fedavg", {})
    for name, r in results.items():
        ratios = [f"{r[k] / base[k]:.2f}" if base.get(k) else "-"
                  for k in ("round_total_s", "round_cpu_s")]
        print(f"| {name} | {sum(r['pre_fl_s'].values()):.1f} | "
              + " | ".join(f"{r['round_s'][s]:.2f}" for s in STAGES)
              + f" | {r['round_total_s']:.2f} | {ratios[0]} | {r['round_cpu_s']:.2f} | "
              f"{ratios[1]} |")
    for name, r in results.items():
        if r["dropped_weight"]:  # teachers-per-image: the odds weight the others held
            print(f"{name}: weight left out by the top teachers, rounds 1..: "
                  + ", ".join(f"{w:.4f}" for w in r["dropped_weight"]))
    print("\nJSON " + json.dumps(results))


if __name__ == "__main__":
    main()
