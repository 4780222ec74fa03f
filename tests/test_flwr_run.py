"""One real `flwr run` through a local SuperLink and Ray: isolated FLWR_HOME and ports, the
SuperLink stopped by its PID afterwards."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from conftest import REPO
from fedgo_lab import bench
from test_runs_in_process import (USER_NET, check_mixed_run, check_table2_record, mixed_overrides,
                                  table2_row)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _superlink_pids(flwr_home: Path) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "flower-superlink" in cmd and str(flwr_home) in cmd:
                pids.append(int(entry.name))
    return pids


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


# Each strategy whose clients do something of their own, through the real runtime:
# name -> (overrides, what every round's record entry must hold)
# (FedGO's own run is the uninterrupted run of the kill-and-resume test below.)
STRATEGY_RUNS = {
    "fedprox-over-fedgo": ('strategy="fedprox" fedprox-base="fedgo"', "ensemble_test_acc"),
    "fedgen": ('strategy="fedgen" fedgen-generator-steps=3', "generator_loss"),
    "dafkd": ('strategy="dafkd" dafkd-gan-rounds=1', "ensemble_test_acc"),
    # every client trains in both rounds, so round 2's fusion proves that context.state kept
    # each node's local model through Ray
    "fedbpg": ('strategy="fedbpg" personal-test-fraction=0.25 fraction-train=1.0 '
               "fedbpg-generator-steps=2 fedbpg-tune-steps=2 fedbpg-fusion-steps=2",
               "personalised_test_acc"),
}


@pytest.mark.parametrize("strategy", STRATEGY_RUNS)
def test_flwr_run_completes_and_writes_the_record(strategy, tiny_data_dir, tmp_path,
                                                  isolated_flwr):
    env, results = isolated_flwr, tmp_path / "results"
    bindir = Path(sys.executable).parent
    own = STRATEGY_RUNS[strategy][0]
    base = (f'data-dir="{tiny_data_dir}" results-dir="{results}" run-name="real" '
            "num-server-rounds=2 fraction-train=0.5 local-epochs=1 server-epochs=1 "
            "generator-steps=2 generator-width=8 discriminator-width=8 "
            "discriminator-epochs=1 distill-size=0 alpha=0.5")
    mine = {pair.split("=")[0] for pair in own.split()}  # flwr refuses a key given twice
    overrides = " ".join([*(p for p in base.split() if p.split("=")[0] not in mine), own])
    run = subprocess.run(
        [str(bindir / "flwr"), "run", str(REPO), "--stream", "--federation-config",
         "num-supernodes=3 client-resources-num-cpus=1", "-c", overrides],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    out = run.stdout + run.stderr
    assert _status(env, tmp_path, out) == "finished:completed", out[-3000:]

    record = json.loads((results / "real" / "record.json").read_text())
    overrides, every_round = STRATEGY_RUNS[strategy]
    assert record["config"]["strategy"] == overrides.split('"')[1]
    assert record["clients"]["num_partitions"] == 3
    assert [r["round"] for r in record["rounds"]] == [0, 1, 2]
    assert all(r[every_round] >= 0 for r in record["rounds"][1:])
    assert ("pre_fl_down" in record["bytes"]) == ("fedgo" in overrides)  # FedGO's pre-FL stage
    assert (results / "real" / "model.pt").is_file()
    assert "round 2 | server acc" in out  # progress lines reach the user
    if strategy == "fedbpg":
        assert 0 <= record["rounds"][2]["fusion_alpha"] <= 1


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


def _flwr_run(env, cwd, overrides, wait=True):
    cmd = [str(Path(sys.executable).parent / "flwr"), "run", str(REPO), "--stream",
           "--federation-config", "num-supernodes=3 client-resources-num-cpus=1", "-c", overrides]
    if wait:
        return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    log = open(cwd / "killed.log", "w")
    return subprocess.Popen(cmd, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)


def test_a_killed_run_resumes_from_its_checkpoint_to_the_uninterrupted_model(
        tiny_data_dir, tmp_path, isolated_flwr):
    env, results = isolated_flwr, tmp_path / "results"
    common = (f'data-dir="{tiny_data_dir}" results-dir="{results}" strategy="fedgo" '
              "num-server-rounds=3 fraction-train=0.5 local-epochs=1 server-epochs=1 "
              "generator-steps=2 generator-width=8 discriminator-width=8 "
              "discriminator-epochs=1 distill-size=0 alpha=0.5")
    whole = _flwr_run(env, tmp_path, common + ' run-name="whole"')
    out = whole.stdout + whole.stderr
    assert _status(env, tmp_path, out) == "finished:completed", out[-3000:]
    record = json.loads((results / "whole" / "record.json").read_text())
    assert record["clients"]["num_partitions"] == 3
    assert [r["round"] for r in record["rounds"]] == [0, 1, 2, 3]
    assert all(r["ensemble_test_acc"] >= 0 for r in record["rounds"][1:])
    assert record["bytes"]["pre_fl_down"] > 0  # FedGO's pre-FL stage
    assert "round 3 | server acc" in out  # progress lines reach the user

    # The same run, its ServerApp process (in simulation, flwr-simulation, which also holds
    # the Ray clients) killed with SIGKILL once round 2's checkpoint is written.
    killed = _flwr_run(env, tmp_path, common + ' run-name="cut"', wait=False)
    checkpoint = results / "cut" / "checkpoints" / "round-0002.pt"
    try:
        deadline = time.monotonic() + 300
        while not checkpoint.exists() and time.monotonic() < deadline and killed.poll() is None:
            time.sleep(0.1)
        assert checkpoint.exists(), (tmp_path / "killed.log").read_text()[-3000:]
        superlink, = _superlink_pids(Path(env["FLWR_HOME"]))
        simulation = [p for p in _children(superlink)
                      if b"flwr-simulation" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert len(simulation) == 1
        doomed = [simulation[0], *_children(simulation[0])]
        for pid in doomed:
            os.kill(pid, signal.SIGKILL)
    finally:
        killed.kill()
        killed.wait()
    assert not (results / "cut" / "record.json").exists()  # it did not get to the end
    assert not (results / "cut" / "checkpoints" / "round-0003.pt").exists()
    run_id = re.search(r"Successfully started run (\d+)", (tmp_path / "killed.log").read_text())
    subprocess.run([str(Path(sys.executable).parent / "flwr"), "stop", run_id.group(1)],
                   env=env, cwd=tmp_path, capture_output=True, timeout=120)

    resumed = _flwr_run(env, tmp_path, common + f' run-name="cut" resume-from="{results / "cut"}"')
    out = resumed.stdout + resumed.stderr
    assert "resuming cut after round 2" in out, out[-3000:]
    record = json.loads((results / "cut" / "record.json").read_text())
    assert [r["round"] for r in record["rounds"]] == [0, 1, 2, 3]
    assert record["resumed"][0]["after_round"] == 2
    reference = torch.load(results / "whole" / "model.pt")
    final = torch.load(results / "cut" / "model.pt")
    for name, tensor in reference.items():
        assert torch.allclose(final[name].double(), tensor.double(), atol=1e-5), name


def test_bench_plan_runs_every_cell_resumes_and_reports(tiny_data_dir, tmp_path, isolated_flwr,
                                                        capsys):
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({
        "name": "tiny", "federation": {"num-supernodes": 3, "client-resources-num-cpus": 1},
        "config": {"data-dir": str(tiny_data_dir), "num-server-rounds": 2,
                   "fraction-train": 0.5, "test-size": 0},
        "alphas": [0.5], "seeds": [0, 1], "cells": ["fedavg"]}))
    out = tmp_path / "bench"
    assert bench.main([str(plan), "--out", str(out), "--repo", str(REPO)]) == 0
    printed = capsys.readouterr().out
    assert "[bench 2/2 fedavg-a0.5-s1] finished" in printed
    assert "round 2 | server acc" in printed  # the runs' progress reaches the user
    records = [json.loads((out / f"fedavg-a0.5-s{s}" / "record.json").read_text())
               for s in (0, 1)]
    assert [r["config"]["seed"] for r in records] == [0, 1]
    assert all(len(r["rounds"]) == 3 for r in records)
    assert records[0]["rounds"][-1] != records[1]["rounds"][-1]  # the seeds differ
    table = (out / "table.md").read_text()
    assert "| fedavg | 0.5 | 0,1 | 2 |" in table
    assert (out / "server_test_acc-a0.5.png").read_bytes()[:4] == b"\x89PNG"

    # it resumes: nothing is left to run
    assert bench.main([str(plan), "--out", str(out), "--repo", str(REPO)]) == 0
    assert "2 cells, 2 finished, 0 to run" in capsys.readouterr().out


def _toml_value(value) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value).lower() \
        if isinstance(value, bool) else str(value)


# Table 2's rows all run in process (tests/test_runs_in_process.py); through the real runtime
# the one whose clients train the generator (FedGAN's own messages).
@pytest.mark.parametrize("row", ["s2-g3-d2"])
def test_each_row_of_table_2_runs_through_flwr_run(row, tiny_data_dir, tmp_path, isolated_flwr):
    """Table 2's FedGAN row through the real runtime (tests/test_runs_in_process.py)."""
    env = isolated_flwr
    preset = table2_row(row, tiny_data_dir, tmp_path)
    run = _flwr_run(env, tmp_path, " ".join(f"{k}={_toml_value(v)}" for k, v in preset.items()))
    out = run.stdout + run.stderr
    assert _status(env, tmp_path, out) == "finished:completed", out[-3000:]
    check_table2_record(json.loads((tmp_path / "results" / "row" / "record.json").read_text()),
                        preset)


# Both ensemble strategies run two architectures in process (tests/test_runs_in_process.py);
# through the real runtime FedGO's, whose user model module must import on Ray's workers.
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
