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
from test_datasets import write_cifar, write_folder


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


USER_NET = """
import torch.nn.functional as F
from torch import nn


class TinyNet(nn.Module):
    def __init__(self, channels, num_classes, image_size):
        super().__init__()
        self.conv = nn.Conv2d(channels, 8, 3, padding=1)
        self.fc = nn.Linear(8 * (image_size // 2) ** 2, num_classes)

    def forward(self, x):
        return self.fc(F.max_pool2d(F.relu(self.conv(x)), 2).flatten(1))
"""


def _write_hub(root):
    import datasets
    import numpy as np
    from PIL import Image
    features = datasets.Features({"img": datasets.Image(),
                                  "label": datasets.ClassLabel(names=list("abcd"))})
    rng = np.random.default_rng(0)
    (root / "data").mkdir(parents=True)
    for split, n in (("train", 48), ("test", 12)):
        rows = {"img": [Image.fromarray(p) for p in
                        rng.integers(0, 256, (n, 28, 28, 3), dtype=np.uint8)],
                "label": [i % 4 for i in range(n)]}
        datasets.Dataset.from_dict(rows, features=features).to_parquet(
            root / "data" / f"{split}-00000-of-00001.parquet")


def write_imagenet100(root):
    from PIL import Image
    from fedgo_app.data.imagenet100 import CLASSES
    for split in ("train", "val"):
        for i, wnid in enumerate(CLASSES):
            (root / "imagenet100" / split / wnid).mkdir(parents=True)
            for j in range(2 if split == "train" else 1):
                Image.new("RGB", (64, 64), (i, 2 * i, 40 * j)).save(
                    root / "imagenet100" / split / wnid / f"{j}.png")


# Each dataset through the real runtime, each with another model: name -> (writer of its
# files under data-dir, overrides). The FedAvg CNN on Fashion-MNIST is every other real run.
DATA_RUNS = {
    "cifar10-resnet18": (lambda d: write_cifar(d, 10), 'dataset="cifar10" model="resnet18"'),
    "cifar100-vgg11-bn": (lambda d: write_cifar(d, 100, per_batch=40),
                          'dataset="cifar100" model="vgg11-bn" optimizer="sgd" lr=0.01'),
    "imagenet100-resnet50": (lambda d: write_imagenet100(d),
                             'dataset="imagenet100" model="resnet50" image-size=32'),
    "folder-user-model": (lambda d: write_folder(d, per_class=8, size=(28, 28)),
                          'dataset="folder" model="user_nets:TinyNet"'),
    "hub-cnn": (lambda d: _write_hub(d / "set"), 'model="cnn"'),
}


@pytest.mark.parametrize("name", DATA_RUNS)
def test_each_dataset_and_model_runs_through_flwr_run(name, tmp_path, isolated_flwr):
    """One FedGO round of each dataset (tiny files in its real format) with another model."""
    env, results, data = isolated_flwr, tmp_path / "results", tmp_path / "data"
    data.mkdir()
    write, overrides = DATA_RUNS[name]
    write(data)
    if name == "hub-cnn":
        overrides = f'dataset="hub:{data / "set"}" {overrides}'
    (tmp_path / "user_nets.py").write_text(USER_NET)
    env = {**env, "PYTHONPATH": f"{tmp_path}{os.pathsep}{env.get('PYTHONPATH', '')}"}
    common = (f'data-dir="{data}" results-dir="{results}" run-name="real" strategy="fedgo" '
              'num-server-rounds=1 fraction-train=0.7 local-epochs=1 server-epochs=1 '
              'generator-steps=1 generator-width=8 discriminator-width=8 '
              'discriminator-epochs=1 distill-size=0 test-size=0 partitioner="iid" ')
    run = _flwr_run(env, tmp_path, common + overrides)
    out = run.stdout + run.stderr
    assert _status(env, tmp_path, out) == "finished:completed", out[-3000:]
    record = json.loads((results / "real" / "record.json").read_text())
    assert record["config"]["model"] in overrides
    assert record["rounds"][1]["ensemble_test_acc"] >= 0



def _toml_value(value) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value).lower() \
        if isinstance(value, bool) else str(value)


@pytest.mark.parametrize("row", ["s1-g1-d1", "s1-g2-d1", "s2-g2-d2", "s2-g3-d2"])
def test_each_row_of_table_2_runs_through_flwr_run(row, tiny_data_dir, tmp_path, isolated_flwr):
    """Each preset of FedGO's Table 2 (conf/table2/), on a tiny configuration: the generator
    from U, from a file, or from the clients (FedGAN); distilled on U or on a generated set."""
    import tomllib

    from fedgo_app.generators import save_generator_file
    from fedgo_flwr.models import Generator
    env, results = isolated_flwr, tmp_path / "results"
    preset = tomllib.loads((REPO / "conf" / "table2" / f"{row}.toml").read_text())
    torch.manual_seed(0)
    generator_file = save_generator_file(tmp_path / "g.pt", Generator(128, 1, 28, dim=8), 1)
    preset.update({"data-dir": str(tiny_data_dir), "results-dir": str(results),
                   "run-name": "row", "num-server-rounds": 1, "fraction-train": 0.7,
                   "local-epochs": 1, "server-epochs": 1, "generator-steps": 2,
                   "generator-width": 8, "discriminator-width": 8, "discriminator-epochs": 1,
                   "fedgan-rounds": 1, "fedgan-epochs": 1, "alpha": 0.5,
                   "distill-size": 64 if preset["distill-set"] == "generated" else 0})
    if preset["generator-source"] == "load":
        preset["generator-file"] = str(generator_file)
    run = _flwr_run(env, tmp_path, " ".join(f"{k}={_toml_value(v)}" for k, v in preset.items()))
    out = run.stdout + run.stderr
    assert _status(env, tmp_path, out) == "finished:completed", out[-3000:]
    record = json.loads((results / "row" / "record.json").read_text())
    generator = record["pre_fl"]["generator"]
    assert generator.get("source", "train-on-u") == preset["generator-source"]
    assert ("distillation_set" in record["pre_fl"]) == (preset["distill-set"] == "generated")
    assert record["rounds"][1]["ensemble_test_acc"] >= 0


@pytest.mark.parametrize("strategy", ["fedgo", "feddf"])
def test_two_architectures_run_through_flwr_run(strategy, tiny_data_dir, tmp_path,
                                                isolated_flwr):
    """Half the clients the CNN, half a user's network, one round through the real runtime:
    both global models trained and distilled from the ensemble of all three clients."""
    env, results = isolated_flwr, tmp_path / "results"
    (tmp_path / "user_nets.py").write_text(USER_NET)
    env = {**env, "PYTHONPATH": f"{tmp_path}{os.pathsep}{env.get('PYTHONPATH', '')}"}
    run = _flwr_run(env, tmp_path, (
        f'data-dir="{tiny_data_dir}" results-dir="{results}" run-name="mixed" '
        f'strategy="{strategy}" client-models="cnn:0.5,user_nets:TinyNet:0.5" '
        'num-server-rounds=1 fraction-train=1.0 local-epochs=1 server-epochs=1 '
        'generator-steps=1 generator-width=8 discriminator-width=8 discriminator-epochs=1 '
        'distill-size=0 test-size=0 alpha=0.5'))
    out = run.stdout + run.stderr
    assert _status(env, tmp_path, out) == "finished:completed", out[-3000:]
    record = json.loads((results / "mixed" / "record.json").read_text())
    assert sorted(set(record["clients"]["architectures"].values())) == [
        "cnn", "user_nets:TinyNet"]
    assert set(record["rounds"][1]["architectures"]) == {"cnn", "user_nets:TinyNet"}
    assert record["rounds"][1]["ensemble_test_acc"] >= 0
    model = torch.load(results / "mixed" / "model.pt")
    assert {name.split("/")[0] for name in model} == {"cnn", "user_nets:TinyNet"}
    assert "pseudo-labels of 3 teachers" in out  # the ensemble spans both architectures
    sys.path.insert(0, str(tmp_path))
    try:
        from fedgo_flwr.models import create_classifier
        for arch in ("cnn", "user_nets:TinyNet"):  # each global model moved from its start
            torch.manual_seed(0)
            start = create_classifier(arch, 1, 10, 28).state_dict()
            assert any(not torch.equal(model[f"{arch}/{k}"], v) for k, v in start.items())
    finally:
        sys.path.remove(str(tmp_path))
