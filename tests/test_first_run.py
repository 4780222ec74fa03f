"""A newcomer's first runs, through the real `flwr run` on a local SuperLink with Flower's
default federation of 2 SuperNodes: a real (small) ensemble every round with progress in every
phase, and a bad value that ends the run with one line instead of a traceback."""

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from test_flwr_run import _status, isolated_flwr  # noqa: F401  (a fixture)

pytestmark = pytest.mark.e2e

FLWR = str(Path(sys.executable).parent / "flwr")


def _run(env, cwd, overrides: str) -> str:
    """`flwr run REPO --stream` on Flower's default federation; its output."""
    done = subprocess.run([FLWR, "run", str(REPO), "--stream", "-c", overrides], env=env,
                          cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=600)  # in the order a terminal shows them
    return done.stdout


def test_plain_flwr_run_trains_two_clients_a_round_and_says_so(tiny_data_dir, tmp_path,
                                                               isolated_flwr):
    results = tmp_path / "results"
    out = _run(isolated_flwr, tmp_path,
               f'data-dir="{tiny_data_dir}" results-dir="{results}" run-name="first" '
               "num-server-rounds=2 generator-steps=2 generator-width=8 discriminator-width=8 "
               "discriminator-epochs=1 distill-size=0 alpha=0.5")
    assert _status(isolated_flwr, tmp_path, out) == "finished:completed", out[-3000:]
    for line in ("2 clients, n_k by partition id: 0: ",  # Flower's default: 2 SuperNodes
                 "pre-FL: generator step 2/2", "pre-FL: discriminator: partition 0 done",
                 "pre-FL: discriminator: partition 1 done", "pre-FL: odds of partition 1",
                 "round 1: training on partitions [0, 1]",  # C = 0.4 of 2, still two
                 "round 2: client training: partition 1 done", "round 2: distilled"):
        assert line in out, line
    assert "Federated evaluation will be skipped" not in out  # it never applied here


def test_a_bad_value_ends_the_run_with_one_line_naming_key_value_and_allowed(tmp_path,
                                                                             isolated_flwr):
    out = _run(isolated_flwr, tmp_path, f'alpha=-1 results-dir="{tmp_path}"')
    assert _status(isolated_flwr, tmp_path, out) == "finished:failed", out[-3000:]
    assert "bad run config: run-config key 'alpha' is -1.0; allowed: > 0" in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    # after Flower's exit report, the line again: the last thing the user reads
    assert out.strip().splitlines()[-1].endswith(
        "bad run config: run-config key 'alpha' is -1.0; allowed: > 0"), out[-3000:]
