#!/usr/bin/env bash
# Sets up, then runs the default experiment (FedGO on Fashion-MNIST, K = 20 clients) through
# `flwr run .` on a local SuperLink with the Ray simulation engine, and checks its status.
# Extra arguments go to `flwr run`, e.g.:  bash scripts/run.sh -c 'strategy="fedavg"'
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
# The run config's keys and values, checked before anything starts: a typo'd key or a bad
# value ends here with one line naming it (and the keys close to it).
python -m fedgo_lab.runconfig "$@" || exit 2
# Our dependencies are installed; the SuperLink must not re-resolve them per run (it would
# download a CUDA torch).
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
# A local SuperLink of our own (own FLWR_HOME, free ports): `flwr run` would otherwise attach
# to whatever SuperLink listens on the default ports, started by whom and however. It is
# stopped by PID when this script ends.
export FLWR_HOME="${FLWR_HOME:-$PWD/.flwr-home}"
free_port() { python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
export FLWR_LOCAL_CONTROL_API_PORT="${FLWR_LOCAL_CONTROL_API_PORT:-$(free_port)}"
export FLWR_LOCAL_SUPERLINK_HTTP_API_PORT="${FLWR_LOCAL_SUPERLINK_HTTP_API_PORT:-$(free_port)}"
log=$(mktemp)
trap 'bash scripts/stop-superlink.sh --quiet; rm -f "$log"' EXIT  # by PID, ours only
FEDERATION="${FEDERATION:-num-supernodes=20 client-resources-num-cpus=1 client-resources-num-gpus=0}"
echo "[run] flwr run . --stream --federation-config \"$FEDERATION\" $*"
flwr run . --stream --federation-config "$FEDERATION" "$@" 2>&1 | tee "$log"
run_id=$(grep -o 'Successfully started run [0-9]*' "$log" | grep -o '[0-9]*$' || true)
[ -n "$run_id" ] || { echo "[run] the run did not start"; exit 1; }
status=$(flwr list --run-id "$run_id" --format json \
         | python -c 'import json,sys; print(json.load(sys.stdin)["runs"][0]["status"])')
echo "[run] run $run_id: $status"
[ "$status" = "finished:completed" ]
