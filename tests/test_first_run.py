"""A newcomer's first runs, through the real `flwr run` on a local SuperLink with Flower's
default federation of 2 SuperNodes: a real (small) ensemble every round with progress in every
phase, the same run killed and resumed, and a bad value that ends the run with one line
instead of a traceback."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO, wait_on_progress
from test_flwr_run import _children, _status, _superlink_pids, isolated_flwr  # noqa: F401

pytestmark = pytest.mark.e2e

FLWR = str(Path(sys.executable).parent / "flwr")


def _run(env, cwd, overrides: str) -> str:
    """`flwr run REPO --stream` on Flower's default federation; its output."""
    done = subprocess.run([FLWR, "run", str(REPO), "--stream", "-c", overrides], env=env,
                          cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=600)  # in the order a terminal shows them
    return done.stdout


@pytest.mark.e2e(seconds=230)
def test_a_plain_run_says_what_it_does_and_a_killed_copy_resumes_to_its_model(
        tiny_data_dir, tmp_path, isolated_flwr):
    """A newcomer's plain run trains a real (small) ensemble with progress in every phase; the
    same run, its ServerApp process (in simulation, flwr-simulation, which also holds the Ray
    clients) killed with SIGKILL once round 2's checkpoint is written, stopped with `flwr stop`
    and started again with `resume-from`, ends with the uninterrupted run's model."""
    env, results = isolated_flwr, tmp_path / "results"
    common = (f'data-dir="{tiny_data_dir}" results-dir="{results}" num-server-rounds=3 '
              "generator-steps=2 generator-width=8 discriminator-width=8 "
              "discriminator-epochs=1 distill-size=0 alpha=0.5")
    out = _run(env, tmp_path, common + ' run-name="first"')
    assert _status(env, tmp_path, out) == "finished:completed", out[-3000:]
    for line in ("2 clients, n_k by partition id: 0: ",  # Flower's default: 2 SuperNodes
                 "pre-FL: generator step 2/2", "pre-FL: sending the generator to 2 clients",
                 "discriminator of client 0 in", "discriminator of client 1 in",
                 "round 1: training on partitions [0, 1]",  # C = 0.4 of 2, still two
                 "round 2: client training: partition 1 done", "round 2: distilled",
                 "round 3 | server acc"):
        assert line in out, line
    assert "Federated evaluation will be skipped" not in out  # it never applied here
    record = json.loads((results / "first" / "record.json").read_text())
    assert [r["round"] for r in record["rounds"]] == [0, 1, 2, 3]
    assert all(r["ensemble_test_acc"] >= 0 for r in record["rounds"][1:])
    assert record["bytes"]["pre_fl_down"] > 0  # G went to every client

    log = open(tmp_path / "killed.log", "w")
    killed = subprocess.Popen([FLWR, "run", str(REPO), "--stream", "-c",
                               common + ' run-name="cut"'], env=env, cwd=tmp_path, stdout=log,
                              stderr=subprocess.STDOUT)
    checkpoint = results / "cut" / "checkpoints" / "round-0002.pt"
    try:
        wait_on_progress(lambda: checkpoint.exists() or killed.poll() is not None,
                         tmp_path / "killed.log", "round 2 did not end", poll=0.1)
        assert checkpoint.exists(), (tmp_path / "killed.log").read_text()[-3000:]
        superlink, = _superlink_pids(Path(env["FLWR_HOME"]))
        simulation = [p for p in _children(superlink)
                      if b"flwr-simulation" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert len(simulation) == 1
        for pid in [simulation[0], *_children(simulation[0])]:
            os.kill(pid, signal.SIGKILL)
    finally:
        killed.kill()
        killed.wait()
    assert not (results / "cut" / "record.json").exists()  # it did not get to the end
    assert not (results / "cut" / "checkpoints" / "round-0003.pt").exists()
    run_id = re.search(r"Successfully started run (\d+)", (tmp_path / "killed.log").read_text())
    subprocess.run([FLWR, "stop", run_id.group(1)], env=env, cwd=tmp_path, capture_output=True,
                   timeout=120)

    out = _run(env, tmp_path, common + f' run-name="cut" resume-from="{results / "cut"}"')
    assert "resuming cut after round 2" in out, out[-3000:]
    record = json.loads((results / "cut" / "record.json").read_text())
    assert [r["round"] for r in record["rounds"]] == [0, 1, 2, 3]
    assert record["resumed"][0]["after_round"] == 2
    reference = torch.load(results / "first" / "model.pt")
    final = torch.load(results / "cut" / "model.pt")
    for name, tensor in reference.items():
        assert torch.allclose(final[name].double(), tensor.double(), atol=1e-5), name


@pytest.mark.e2e(seconds=45)
def test_a_bad_value_ends_the_run_with_one_line_naming_key_value_and_allowed(tmp_path,
                                                                             isolated_flwr):
    out = _run(isolated_flwr, tmp_path, f'alpha=-1 results-dir="{tmp_path}"')
    assert _status(isolated_flwr, tmp_path, out) == "finished:failed", out[-3000:]
    assert "bad run config: run-config key 'alpha' is -1.0; allowed: > 0" in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    # after Flower's exit report, the line again: the last thing the user reads
    assert out.strip().splitlines()[-1].endswith(
        "bad run config: run-config key 'alpha' is -1.0; allowed: > 0"), out[-3000:]
