"""Same rounds before and after a change: twenty small configurations (every strategy,
FedGO on SCAFFOLD's clients, mixed architectures, two attacks, the ensemble's options; 3 rounds, 4 clients, the tests'
tiny Fashion-MNIST) through the apps of the checkout on PYTHONPATH, each run's per-round
accuracies, losses and reply tallies written to OUT.json; `--compare A.json B.json` prints
every difference.

    git worktree add /tmp/before <commit>
    PYTHONPATH=/tmp/before python fedgo_lab/same_rounds.py before.json /tmp/before
    PYTHONPATH=. python fedgo_lab/same_rounds.py after.json .
    python fedgo_lab/same_rounds.py --compare before.json after.json

`--records A B` compares full-size runs instead: every run folder of A with a record.json in
B too (bench or rerun records), every per-round value of its record but the seconds, and
prints per run how many values are equal and the largest gap in server accuracy.
"""
import json
import sys
from pathlib import Path


def per_round(value, path=""):
    """(path, value) of every number, string and list of plain values under a round's
    record, the seconds left out (they are the machine's, not the run's)."""
    if isinstance(value, dict):
        for k, v in value.items():
            if "seconds" not in k:
                yield from per_round(v, f"{path}.{k}")
    elif isinstance(value, list) and value and isinstance(value[0], (dict, list)):
        for i, v in enumerate(value):
            yield from per_round(v, f"{path}[{i}]")
    else:
        yield path, value


if len(sys.argv) < 3 or sys.argv[1] in ("-h", "--help") or (
        sys.argv[1] in ("--records", "--compare") and len(sys.argv) != 4):
    sys.exit(__doc__)

if sys.argv[1] == "--records":
    a_dir, b_dir = map(Path, sys.argv[2:4])
    runs = [p.parent.name for p in sorted(a_dir.glob("*/record.json"))
            if (b_dir / p.parent.name / "record.json").is_file()]
    for run in runs:
        a, b = (json.loads((d / run / "record.json").read_text())["rounds"]
                for d in (a_dir, b_dir))
        va, vb = ({k: v for r in rounds for k, v in per_round(r, f"[{r['round']}]")}
                  for rounds in (a, b))
        shared = va.keys() & vb.keys()
        unequal = {k for k in shared if va[k] != vb[k]  # (NaN in both: no value in both)
                   and not (va[k] != va[k] and vb[k] != vb[k])}
        differ = sorted({k.split("]", 1)[1] for k in unequal})
        gap = max((abs(x["server_test_acc"] - y["server_test_acc"]) for x, y in zip(a, b)), default=0)
        print(f"{run}: {len(a)} and {len(b)} rounds, {len(shared) - len(unequal)}"
              f" of {len(shared)} per-round values equal, {len(va.keys() ^ vb.keys())} in one only; "
              f"server accuracy {100 * gap:.2f} points apart at most"
              + (f"; differ: {', '.join(differ[:6])}" if differ else ""))
    print(f"{len(runs)} runs in both")
    sys.exit(0)

if sys.argv[1] == "--compare":
    a, b = (json.load(open(p)) for p in sys.argv[2:4])
    both = [k for k in a if k in b]
    diffs = [(k, ra, rb) for k in both for ra, rb in zip(a[k], b[k]) if ra != rb]
    diffs += [(k, len(a[k]), len(b[k])) for k in both if len(a[k]) != len(b[k])]
    for k, ra, rb in diffs:
        print("differs:", k, ra, rb)
    alone = sorted(set(a) ^ set(b))
    print(f"{len(both)} configurations, {len(diffs)} rounds differ"
          + (f"; in one file only: {', '.join(alone)}" if alone else ""))
    sys.exit(1 if diffs else 0)
sys.path.insert(0, sys.argv[2] + "/tests")
import torch
torch.set_num_threads(1)
from pathlib import Path
from conftest import write_tiny_fmnist
from fedgo_app.config import Config
from client_app.app import app as client_app
from fedgo_lab.inprocess import InProcessGrid
from server_app.app import run

root = Path("/tmp/parity-data")
if not (root / "FashionMNIST").exists():
    write_tiny_fmnist(root / "FashionMNIST" / "raw")
out = sys.argv[1]
base = dict(data_dir=str(root), results_dir=f"/tmp/parity-res-{Path(out).stem}", num_server_rounds=3,
            fraction_train=0.5, local_epochs=1, server_epochs=1, generator_steps=2,
            discriminator_epochs=1, distill_size=0, test_size=0, generator_width=8,
            discriminator_width=8, alpha=0.5, model="mlp")
CASES = {
    "fedavg": {}, "fedprox": dict(strategy="fedprox"), "feddf": dict(strategy="feddf"),
    "fedgo": dict(strategy="fedgo"),
    "best": dict(strategy="fedprox", fedprox_base="fedgo", discriminator_calibration="platt",
                 calibration_fraction=0.1, ensemble_space="probabilities",
                 distillation_guard="clients", distill_budget="disagreement", budget_probe=64,
                 past_teachers=3),
    "dafkd": dict(strategy="dafkd", dafkd_gan_rounds=1), "fedgen": dict(strategy="fedgen", model="cnn"),
    "fedbpg": dict(strategy="fedbpg", model="cnn", personal_test_fraction=0.25), "fedtgp": dict(strategy="fedtgp", model="cnn"),
    "feddisco": dict(strategy="feddisco"), "scaffold": dict(strategy="scaffold"),
    "feduv": dict(strategy="feduv"), "fedgkd": dict(strategy="fedgkd"),
    "fedgo+scaffold": dict(strategy="fedgo", client_method="scaffold"),
    "mixed-fedgo": dict(strategy="fedgo", client_models="mlp:0.5,cnn:0.5"),
    "mixed-fedavg": dict(strategy="fedavg", client_models="mlp:0.5,cnn:0.5"),
    "krum-alie": dict(aggregator="krum", attack="alie", byzantine_clients=1, fraction_train=1.0),
    "signflip": dict(attack="sign-flip", byzantine_clients=1, fraction_train=1.0, aggregator="median"),
    # the ensemble's options beyond the papers, each through its own code
    "fedgo-options": dict(strategy="fedgo", discriminator_screen="odds", discriminator_screen_z=1.0, teachers_per_image=1,
                          averaged_share=0.2, teacher_floor=True, confidence_threshold=0.3),
    "fedgo-budget": dict(strategy="fedgo", distill_budget="disagreement", past_teachers=1,
                         distillation_guard="clients", distill_schedule="constant"),
}
only = sys.argv[3:] or list(CASES)
results = {}
for name in only:
    cfg = Config().replace(**{**base, "run_name": name.replace("+", "-"), **CASES[name]})
    path = run(InProcessGrid(client_app, cfg.to_run_config(), 4), cfg)
    rec = json.loads(path.read_text())
    results[name] = [(r["round"], r.get("server_test_acc"), r.get("server_test_loss"), r.get("train_loss"),
                      r.get("ensemble_test_acc"), r.get("replies")) for r in rec["rounds"]]
    print(name, results[name][-1][:4], flush=True)
json.dump(results, open(out, "w"), indent=1, default=str)
