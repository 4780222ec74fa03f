#!/usr/bin/env bash
# The README's table: FedAvg vs FedGO with conf/fmnist-compare.toml over seeds 0, 1, 2, each
# cell a real `flwr run` (local SuperLink, Ray, 20 SuperNodes). Finished cells are skipped, so
# an interrupted comparison resumes. Results: $OUT (default results/compare).
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
OUT="${OUT:-$PWD/results/compare}"
SEEDS="${SEEDS:-0 1 2}"
for seed in $SEEDS; do
    for strategy in fedavg fedgo; do
        name="$strategy-s$seed"
        if [ -f "$OUT/$name/record.json" ]; then echo "[compare] $name: done"; continue; fi
        echo "[compare] $name"
        # flwr run takes either one TOML file or key=value pairs: merge them into one file.
        cell=$(mktemp --suffix .toml)
        cat conf/fmnist-compare.toml > "$cell"
        printf 'strategy = "%s"\nseed = %s\nresults-dir = "%s"\nrun-name = "%s"\n' \
            "$strategy" "$seed" "$OUT" "$name" >> "$cell"
        flwr run . --stream --federation-config "num-supernodes=20 client-resources-num-cpus=1" \
            -c "$cell"
        [ -f "$OUT/$name/record.json" ] || { echo "[compare] $name failed"; exit 1; }
    done
done
python -m fedgo_flwr.report "$OUT"
