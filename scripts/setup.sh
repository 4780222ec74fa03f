#!/usr/bin/env bash
# Sets up .venv with the project, its test tools and the harness's dependencies (plots, plan
# files: the `lab` extra), and the offline Fashion-MNIST where Debian's package can be
# installed (elsewhere torchvision downloads it on first use).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
    echo "[setup] creating .venv"
    python3 -m venv .venv
fi
echo "[setup] installing fedgo-flwr and its dependencies (torch, flwr[simulation], ...)"
# pip, not uv: this machine's local wheel store (torch 2.14.1) is only seen by pip.
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[app,dev,lab,byzantine,tensorboard,mlflow]' 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; }

if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
        echo "[setup] installing Debian's dataset-fashion-mnist (offline copy of the data)"
        { apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist; } >/dev/null 2>&1 \
            || echo "[setup] dataset-fashion-mnist not installable; torchvision will download"
    else
        echo "[setup] no Debian Fashion-MNIST; torchvision will download it on first use"
    fi
fi
echo "[setup] done: .venv is ready"
