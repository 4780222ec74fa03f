#!/usr/bin/env bash
# Sets up, then runs the default experiment (FedGO on Fashion-MNIST, K = 20 clients) through
# `flwr run .` on a local SuperLink with the Ray simulation engine, and checks its status.
# Extra arguments go to `flwr run`, e.g.:  bash scripts/run.sh -c 'strategy="fedavg"'
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
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
stop_superlink() {
  for pid in $(pgrep -f "flower-superlink.*$FLWR_HOME" || true); do
    # The SuperLink's SuperExec runs in a session of its own, and the simulation and Ray's
    # processes keep its process group even once orphaned: stop that group too, or Ray's
    # agents linger for minutes after a stopped run (Ctrl-C here, or `flwr stop`).
    groups=$(for c in $(pgrep -P "$pid" -f flower-superexec || true); do
               ps -o pgid= -p "$c" | tr -d ' '; done)
    kill "$pid" 2>/dev/null || continue
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    for g in $groups; do kill -TERM -- "-$g" 2>/dev/null || true; done
    [ -z "$groups" ] || sleep 3
    for g in $groups; do kill -KILL -- "-$g" 2>/dev/null || true; done
  done
}
trap stop_superlink EXIT
FEDERATION="${FEDERATION:-num-supernodes=20 client-resources-num-cpus=1 client-resources-num-gpus=0}"
log=$(mktemp)
echo "[run] flwr run . --stream --federation-config \"$FEDERATION\" $*"
flwr run . --stream --federation-config "$FEDERATION" "$@" 2>&1 | tee "$log"
run_id=$(grep -o 'Successfully started run [0-9]*' "$log" | grep -o '[0-9]*$' || true)
[ -n "$run_id" ] || { echo "[run] the run did not start"; exit 1; }
status=$(flwr list --run-id "$run_id" --format json \
         | python -c 'import json,sys; print(json.load(sys.stdin)["runs"][0]["status"])')
echo "[run] run $run_id: $status"
[ "$status" = "finished:completed" ]
