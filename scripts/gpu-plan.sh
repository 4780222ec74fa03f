#!/usr/bin/env bash
# A whole bench plan in process on a GPU host that has PyTorch but neither Ray nor this
# project's other packages (fedgo_lab.rerun: the real apps, no SuperLink), records packed into
# one tarball as they come, for a host that hands back few files:
#
#   PAR=8 MINUTES=8 BUDGET=540 OUT=/some/dir bash scripts/gpu-plan.sh conf/bench/<plan>.yaml \
#       [RUN-NAME-PREFIX ...]
#
# Before (on the machine that sends the checkout): Python 3.12 wheels of flwr, flwr-datasets and
# what they need that the host lacks in .whl/ (for an image with PyTorch, pandas, pyarrow,
# grpcio, protobuf and the like already there, these 26, about 19 MB:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 --platform manylinux_2_34_x86_64 -d .whl flwr==1.42.0 \
#     flwr-datasets==0.6.1 datasets==4.8.5 alembic==1.20.1 fastapi==0.138.2 \
#     grpcio-health-checking==1.81.1 iterators==0.0.2 prompt-toolkit==3.0.53 \
#     pycryptodome==3.24.1 sqlalchemy==2.1.9 starlette==1.3.1 tomli==2.5.0 tomli-w==1.2.0 \
#     uvicorn==0.49.0 dill==0.4.1 multiprocess==0.70.19 cryptography==50.0.2 cffi==2.1.1 \
#     pycparser==3.12 pydantic==2.14.4 pydantic-core==2.50.5 mako==1.4.3 greenlet==3.5.6 \
#     annotated-types==0.8.0 typing-inspection==0.4.5 wcwidth==0.9.4); the four
# Fashion-MNIST files in .devdata/fmnist/ (the Debian .gz, or the raw files as .xz, 26 MB
# against 30, as the whole copy sent must stay under 64 MiB:
#   for f in /usr/share/datasets/fashion-mnist/*.gz; do
#     zcat $f | xz -9 > .devdata/fmnist/$(basename $f .gz).xz; done
# ); inputs a plan names (the G2 files of
# conf/bench/fmnist-table2.yaml in results/g2/, made on the CPU beforehand: three
# pretrain_generator processes at once with 16 threads each crawl). Records of an earlier call
# in results/rerun/<plan>/ are skipped (the call resumes: unpack its records.tgz there and
# send it along), and so are those in RESUME_FROM=<folder> (e.g. docs/records/<plan>: committed
# records travel without a carry). Prefixes (a cell's name, or its name and alpha:
# fedgo-cal-a0.1) order the runs: the ones named first start first (give the longest, so the
# plan ends soonest), then by seed; the rest after them.
# PAR runs at once (8 on 16 cores; 12 was not faster), MINUTES: start no run after, BUDGET:
# seconds before everything stops. One plan at a time: each rerun gives its processes the
# host's cores / PAR threads as if alone, and two plans at once ran three to four times
# slower. Comes back in $OUT: records.tgz (results/rerun/<plan>: records and the generator
# cache), log.txt.
set -u
plan=$1; shift
OUT=${OUT:?set OUT to the folder the records go to}
if compgen -G ".whl/*.whl" >/dev/null && [ ! -d /tmp/site/flwr ]; then  # once a machine
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 3
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
if [ -d .devdata/fmnist ]; then  # the Debian files, as .gz or (4 MB smaller) as raw .xz
    mkdir -p /usr/share/datasets/fashion-mnist
    python3 - <<'PY' || exit 4
import gzip, lzma, shutil
from pathlib import Path
to = Path("/usr/share/datasets/fashion-mnist")
for f in Path(".devdata/fmnist").iterdir():
    target = to / (f.name if f.suffix == ".gz" else f.stem + ".gz")
    if target.exists():
        continue  # a warm machine has it from an earlier call
    part = target.with_suffix(".part")  # renamed when whole: a cut call leaves no half file
    if f.suffix == ".gz":
        shutil.copy(f, part)
    elif f.suffix == ".xz":
        with lzma.open(f) as src, gzip.open(part, "wb", compresslevel=1) as dst:
            shutil.copyfileobj(src, dst)
    part.rename(target)
PY
fi
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
name=$(python3 -c "import yaml,sys;print(yaml.safe_load(open(sys.argv[1]))['name'])" "$plan")
mkdir -p "results/rerun/$name"
if [ -n "${RESUME_FROM:-}" ]; then  # records committed earlier (tracked, so they travel free)
    (cd "$RESUME_FROM" \
        && find . -name record.json -exec cp --parents {} "$OLDPWD/results/rerun/$name/" \;)
fi
pack() {
    (cd results/rerun && find "$name" \( -name '*.json' -o -path '*/generators/*' \) -type f \
        | tar czf "$OUT/r.tmp" -T - && mv "$OUT/r.tmp" "$OUT/records.tgz")
}
( while sleep 30; do pack; done ) & packer=$!
names=$(python3 - "$plan" "$@" <<'PY'
import sys
from pathlib import Path
from fedgo_lab.bench import cells_of, load_plan
import re
plan, order = sys.argv[1], sys.argv[2:]
cells = [c.run_name for c in cells_of(load_plan(Path(plan)), Path("/tmp/x"), Path("."))
         if c.central is None]
# a prefix is a cell name (fedgo-cal: not fedgo-cal-guard), with or without its alpha
rank = lambda n: next((i for i, p in enumerate(order)
                       if re.fullmatch(re.escape(p) + r"(-a[0-9.]+)?-s[0-9]+", n)), len(order))
print(" ".join(sorted(cells, key=lambda n: (rank(n), n.rsplit("-s", 1)[1]))))
PY
)
timeout "${BUDGET:-540}" python3 -m fedgo_lab.rerun "$plan" $names --parallel "${PAR:-8}" \
    --max-minutes "${MINUTES:-8}" > "$OUT/log.txt" 2>&1
echo "rerun exit $?"
grep -E "^\[rerun|Error" "$OUT/log.txt" | tail -60
kill $packer; pack
echo "$(find "results/rerun/$name" -name record.json | wc -l) records in $OUT/records.tgz"
