"""Real `flwr run`s through a local SuperLink and Ray: isolated FLWR_HOME and ports, the
SuperLink stopped by its PID afterwards."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from fedgo_lab import bench
from fedgo_lab.bench import local_superlinks as _superlink_pids
from test_runs_in_process import USER_NET, check_mixed_run, mixed_overrides


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def isolated_flwr(tmp_path, monkeypatch):
    """Environment of a private local SuperLink (own FLWR_HOME and ports), stopped afterwards."""
    flwr_home = tmp_path / "flwr-home"
    bindir = Path(sys.executable).parent
    env = {"FLWR_HOME": str(flwr_home),
           "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(_free_port()),
           "FLWR_LOCAL_CONTROL_API_PORT": str(_free_port()),
           "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
           "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    yield {**os.environ, **env}
    for pid in _superlink_pids(flwr_home):
        os.kill(pid, signal.SIGTERM)


def _status(env, cwd, out: str) -> str:
    """The final status of the run whose `flwr run` printed `out`."""
    run_id = re.search(r"Successfully started run (\d+)", out)
    assert run_id, out[-3000:]
    listing = subprocess.run(
        [str(Path(sys.executable).parent / "flwr"), "list", "--run-id", run_id.group(1),
         "--format", "json"], env=env, cwd=cwd, capture_output=True, text=True, timeout=120)
    return json.loads(listing.stdout)["runs"][0]["status"]


def _children(pid: int) -> list[int]:
    """Every process below `pid`."""
    parent = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [], [pid]
    while frontier:
        below = [p for p, pp in parent.items() if pp in frontier]
        found += below
        frontier = below
    return found


def _flwr_run(env, cwd, overrides):
    cmd = [str(Path(sys.executable).parent / "flwr"), "run", str(REPO), "--stream",
           "--federation-config", "num-supernodes=3 client-resources-num-cpus=1", "-c", overrides]
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)


# Every strategy's messages run in process through Flower's serialisation, each node's Context
# too (fedgo_lab.inprocess; tests/test_strategies.py, test_runs_in_process.py,
# test_resilience.py). Through the real runtime: the first run and its resumed copy (FedGO,
# tests/test_first_run.py), two architectures (below), and FedBPG, whose clients keep their
# own model in context.state from one round to the next on Ray's workers, run by the bench
# runner.
@pytest.mark.e2e(seconds=90)
def test_a_bench_plan_runs_fedbpg_through_flwr_run_resumes_and_reports(tiny_data_dir, tmp_path,
                                                                       isolated_flwr, capsys):
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({
        "name": "tiny", "federation": {"num-supernodes": 3, "client-resources-num-cpus": 1},
        "config": {"data-dir": str(tiny_data_dir), "num-server-rounds": 2, "model": "mlp",
                   "fraction-train": 1.0, "test-size": 0, "personal-test-fraction": 0.25,
                   "fedbpg-generator-steps": 2, "fedbpg-tune-steps": 2,
                   "fedbpg-fusion-steps": 2},
        "alphas": [0.5], "seeds": [0], "cells": ["fedbpg"]}))
    out = tmp_path / "bench"
    assert bench.main([str(plan), "--out", str(out), "--repo", str(REPO)]) == 0
    printed = capsys.readouterr().out
    assert "[bench 1/1 fedbpg-a0.5-s0] finished" in printed
    # the local SuperLink its `flwr run` started is stopped at the end, by PID
    assert not _superlink_pids(Path(isolated_flwr["FLWR_HOME"]))
    assert "[stop-superlink] stopped 1 SuperLink(s)" in printed
    assert "round 2 | server acc" in printed  # the runs' progress reaches the user
    record = json.loads((out / "fedbpg-a0.5-s0" / "record.json").read_text())
    assert record["config"]["strategy"] == "fedbpg"
    assert record["clients"]["num_partitions"] == 3
    assert [r["round"] for r in record["rounds"]] == [0, 1, 2]
    assert all(r["personalised_test_acc"] >= 0 for r in record["rounds"][1:])
    # every client trains in both rounds, so round 2's fusion proves that context.state kept
    # each node's local model through Ray
    assert 0 <= record["rounds"][2]["fusion_alpha"] <= 1
    assert (out / "fedbpg-a0.5-s0" / "model.pt").is_file()
    table = (out / "table.md").read_text()
    assert "| fedbpg | 0.5 | 0 | 2 |" in table, table
    assert (out / "server_test_acc-a0.5.png").read_bytes()[:4] == b"\x89PNG"

    # it resumes: nothing is left to run
    assert bench.main([str(plan), "--out", str(out), "--repo", str(REPO)]) == 0
    assert "1 cells, 1 finished, 0 to run" in capsys.readouterr().out


# Both ensemble strategies run two architectures in process (tests/test_runs_in_process.py);
# through the real runtime FedGO's, whose user model module must import on Ray's workers.
@pytest.mark.e2e(seconds=70)
@pytest.mark.parametrize("strategy", ["fedgo"])
def test_two_architectures_run_through_flwr_run(strategy, tiny_data_dir, tmp_path,
                                                isolated_flwr):
    """Half the clients the CNN, half a user's network, one round through the real runtime:
    both global models trained and distilled from the ensemble of all three clients."""
    env, results = isolated_flwr, tmp_path / "results"
    (tmp_path / "user_nets.py").write_text(USER_NET)
    env = {**env, "PYTHONPATH": f"{tmp_path}{os.pathsep}{env.get('PYTHONPATH', '')}"}
    run = _flwr_run(env, tmp_path, mixed_overrides(strategy, tiny_data_dir, results))
    out = run.stdout + run.stderr
    assert _status(env, tmp_path, out) == "finished:completed", out[-3000:]
    sys.path.insert(0, str(tmp_path))
    try:
        check_mixed_run(results, out)
    finally:
        sys.path.remove(str(tmp_path))
