#!/usr/bin/env bash
# Runs a grid of cells, each a real `flwr run` (local SuperLink, Ray, 20 SuperNodes) with the
# preset $PRESET (default conf/fmnist-compare.toml) plus the cell's strategy, weighting and seed.
#   CELLS  strategies, `strategy:weighting` for a FedGO weighting rule (default "fedavg fedgo")
#   SEEDS  default "0 1 2";  OUT  results folder (default results/compare)
# Finished cells are skipped, so an interrupted comparison resumes. Examples:
#   bash scripts/compare.sh                                    # the README's FedAvg vs FedGO table
#   CELLS="fedgo:uniform fedgo:variance fedgo:entropy fedgo:domain-aware" SEEDS=0 \
#       OUT=results/weighting bash scripts/compare.sh         # the weighting comparison
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
PRESET="${PRESET:-conf/fmnist-compare.toml}"
CELLS="${CELLS:-fedavg fedgo}"
SEEDS="${SEEDS:-0 1 2}"
OUT="$(realpath -m "${OUT:-results/compare}")"
for seed in $SEEDS; do
    for cell in $CELLS; do
        strategy="${cell%%:*}"
        weighting="${cell#*:}"
        name="$strategy-s$seed"
        extra=""
        if [ "$weighting" != "$cell" ]; then
            name="$strategy-$weighting-s$seed"
            extra="weighting = \"$weighting\""
        fi
        if [ -f "$OUT/$name/record.json" ]; then echo "[compare] $name: done"; continue; fi
        echo "[compare] $name"
        # flwr run takes either one TOML file or key=value pairs: merge them into one file.
        toml=$(mktemp --suffix .toml)
        cat "$PRESET" > "$toml"
        printf 'strategy = "%s"\nseed = %s\nresults-dir = "%s"\nrun-name = "%s"\n%s\n' \
            "$strategy" "$seed" "$OUT" "$name" "$extra" >> "$toml"
        flwr run . --stream --federation-config "num-supernodes=20 client-resources-num-cpus=1" \
            -c "$toml"
        rm -f "$toml"
        [ -f "$OUT/$name/record.json" ] || { echo "[compare] $name failed"; exit 1; }
    done
done
python -m fedgo_flwr.report "$OUT"
