#!/usr/bin/env bash
# Checks the CPU-only install of the library (README, "CPU-only install"): in a new venv,
# PyTorch's CPU build first, then fedgo-flwr from this repository; the package must keep that
# torch (no CUDA wheels pulled), import, and distil on the CPU. The torch wheel comes from
# TORCH_SPEC (default: "torch" from pip's configured sources; here, a local wheel store holds
# torch 2.13.0+cpu). Prints the venv's size; removes it unless KEEP=1.
#   TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cpu" bash scripts/check-cpu-install.sh
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(mktemp -d /tmp/fedgo-cpu-venv.XXXXXX)
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv"
quiet() { grep -v "is ignored: it is neither a file nor a directory" || true; }
pip="$venv/bin/python -m pip --quiet --disable-pip-version-check"
# shellcheck disable=SC2086
$pip install ${TORCH_SPEC:-torch} 2>&1 | quiet
before=$("$venv/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null)
echo "[cpu-install] torch $before installed first"
$pip install . 2>&1 | quiet
after=$("$venv/bin/python" -c 'import torch; print(torch.__version__)')
cuda=$("$venv/bin/python" -m pip list 2>/dev/null | grep -ci '^nvidia-' || true)
echo "[cpu-install] after fedgo-flwr: torch $after, $cuda nvidia-* (CUDA) packages"
[ "$before" = "$after" ] || { echo "[cpu-install] FAIL: the install replaced torch"; exit 1; }
[ "$cuda" = 0 ] || { echo "[cpu-install] FAIL: CUDA wheels were pulled"; exit 1; }
"$venv/bin/python" - <<'PY'
import torch
from fedgo_flwr import FedGO  # noqa: F401  the strategies import
from fedgo_flwr.distill import distill, draw_batches
from fedgo_flwr.models import CNN

u = torch.randint(0, 256, (64, 1, 28, 28), dtype=torch.uint8)
targets = torch.softmax(torch.randn(2, 64, 10), -1)
info = distill(CNN(), u, targets, batches=draw_batches(64, 2, epochs=1, batch_size=16, seed=0),
               lr=1e-3, device=torch.device("cpu"))
print(f"[cpu-install] fedgo_flwr imports and distils on the CPU (KL {info['distill_loss']:.3f}), "
      f"torch {torch.__version__}, CUDA build: {torch.version.cuda is not None}")
PY
echo "[cpu-install] venv size: $(du -sh "$venv" | cut -f1)"
