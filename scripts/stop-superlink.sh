#!/usr/bin/env bash
# Stops, by PID, the local SuperLink of one FLWR_HOME (default: this repository's .flwr-home,
# the one scripts/run.sh uses) and the SuperExec, simulation and Ray processes under it; no
# other SuperLink on the machine is touched. Flower's CLI (`flwr list`, `flwr log`, `flwr stop`)
# starts that SuperLink again when none is running, and leaves it running: stop it after.
#   FLWR_HOME=/path/to/flwr-home bash scripts/stop-superlink.sh
set -uo pipefail
cd "$(dirname "$0")/.."
FLWR_HOME="${FLWR_HOME:-$PWD/.flwr-home}"
stopped=0
for pid in $(pgrep -f "flower-superlink.*$FLWR_HOME" || true); do
  # The SuperExec runs in a session of its own, and the simulation and Ray's processes keep
  # its process group even once orphaned: stop that group too, or Ray's agents linger for
  # minutes after the SuperLink (a stopped run, Ctrl-C).
  groups=$(for c in $(pgrep -P "$pid" -f flower-superexec || true); do
             ps -o pgid= -p "$c" | tr -d ' '; done)
  kill "$pid" 2>/dev/null || continue
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  for g in $groups; do kill -TERM -- "-$g" 2>/dev/null || true; done
  [ -z "$groups" ] || sleep 3
  for g in $groups; do kill -KILL -- "-$g" 2>/dev/null || true; done
  stopped=$((stopped + 1))
done
[ "${1:-}" = "--quiet" ] || echo "[stop-superlink] stopped $stopped SuperLink(s) of $FLWR_HOME"
