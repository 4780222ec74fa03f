#!/usr/bin/env bash
# A whole bench plan in process on a GPU host that has PyTorch but neither Ray nor this
# project's other packages (fedgo_lab.rerun: the real apps, no SuperLink), records packed into
# one tarball as they come, for a host that hands back few files:
#
#   PAR=8 MINUTES=8 BUDGET=540 OUT=/some/dir bash scripts/gpu-plan.sh conf/bench/<plan>.yaml \
#       [RUN-NAME-PREFIX ...]
#
# Before (on the machine that sends the checkout): Python 3.12 wheels of flwr, flwr-datasets and
# what they need that the host lacks in .whl/ (see docs/benchmarks.md, "On a GPU"); the four
# Fashion-MNIST .gz files in .devdata/fmnist/; inputs a plan names (the G2 files of
# conf/bench/fmnist-table2.yaml in results/g2/, made on the CPU beforehand: three
# pretrain_generator processes at once with 16 threads each crawl). Records of an earlier call
# in results/rerun/<plan>/ are skipped (the call resumes). Prefixes order the runs: the ones
# named first start first (give the longest, so the plan ends soonest), then by seed.
# PAR runs at once (8 on 16 cores; 12 was not faster), MINUTES: start no run after, BUDGET:
# seconds before everything stops. Comes back in $OUT: records.tgz (results/rerun/<plan>:
# records and the generator cache), log.txt.
set -u
plan=$1; shift
OUT=${OUT:?set OUT to the folder the records go to}
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 3
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
if [ -d .devdata/fmnist ]; then
    mkdir -p /usr/share/datasets/fashion-mnist && cp .devdata/fmnist/*.gz /usr/share/datasets/fashion-mnist/
fi
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
name=$(python3 -c "import yaml,sys;print(yaml.safe_load(open(sys.argv[1]))['name'])" "$plan")
mkdir -p "results/rerun/$name"
pack() {
    (cd results/rerun && find "$name" \( -name '*.json' -o -path '*/generators/*' \) -type f \
        | tar czf "$OUT/r.tmp" -T - && mv "$OUT/r.tmp" "$OUT/records.tgz")
}
( while sleep 30; do pack; done ) & packer=$!
names=$(python3 - "$plan" "$@" <<'PY'
import sys
from pathlib import Path
from fedgo_lab.bench import cells_of, load_plan
plan, order = sys.argv[1], sys.argv[2:]
cells = [c.run_name for c in cells_of(load_plan(Path(plan)), Path("/tmp/x"), Path("."))
         if c.central is None]
rank = lambda n: next((i for i, p in enumerate(order) if n.startswith(p + "-a")), len(order))
print(" ".join(sorted(cells, key=lambda n: (rank(n), n.rsplit("-s", 1)[1]))))
PY
)
timeout "${BUDGET:-540}" python3 -m fedgo_lab.rerun "$plan" $names --parallel "${PAR:-8}" \
    --max-minutes "${MINUTES:-8}" > "$OUT/log.txt" 2>&1
echo "rerun exit $?"
grep -E "^\[rerun|Error" "$OUT/log.txt" | tail -60
kill $packer; pack
echo "$(find "results/rerun/$name" -name record.json | wc -l) records in $OUT/records.tgz"
