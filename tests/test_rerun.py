"""fedgo_lab.rerun: a plan's cells in process against their recorded runs."""

import json

import pytest
import yaml

from conftest import REPO
from fedgo_app.config import Config
from fedgo_lab import rerun
from fedgo_lab.bench import cells_of, load_plan

pytestmark = pytest.mark.app


def tiny_plan(tmp_path, tiny_data_dir):
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump({
        "name": "tiny", "config": {"data-dir": str(tiny_data_dir), "num-server-rounds": 2,
                                   "fraction-train": 0.5, "local-epochs": 1, "test-size": 0,
                                   "distill-size": 0, "model": "mlp"},
        "federation": {"num-supernodes": 4}, "alphas": [0.5], "seeds": [0],
        "cells": ["fedavg"]}))
    return path


def test_a_rerun_on_the_same_device_reproduces_its_record(tmp_path, tiny_data_dir, capsys):
    plan = tiny_plan(tmp_path, tiny_data_dir)
    cell, = cells_of(load_plan(plan), tmp_path / "recorded", REPO)
    recorded, _ = rerun.rerun(Config.from_run_config(cell.run_config), 4)
    assert rerun.main([str(plan), "fedavg-a0.5-s0", "--against", str(tmp_path / "recorded"),
                       "--out", str(tmp_path / "again"), "--repo", str(REPO),
                       "--threads", "1"]) == 0
    again = json.loads((tmp_path / "again" / "fedavg-a0.5-s0" / "record.json").read_text())
    assert [r["server_test_acc"] for r in again["rounds"]] == \
        [r["server_test_acc"] for r in recorded["rounds"]]
    row = capsys.readouterr().out.splitlines()[-1]
    assert row.startswith("| fedavg-a0.5-s0 |") and row.endswith("| +0.00 |")
    summary = json.loads((tmp_path / "again" / "rerun.json").read_text())
    assert summary["rows"][0]["last3"] == pytest.approx(rerun.last3(recorded))


@pytest.mark.parametrize("args,needle", [
    (["fedgo-a0.5-s0"], "not cells of"),
    (["fedavg-a0.5-s0", "--config", "alpha=-1"], "alpha"),
    (["fedavg-a0.5-s0"], "no recorded run"),
    (["fedavg-a0.5-s0", "--threads", "0"], "--threads: at least 1, got 0"),
])
def test_bad_requests_stop_before_anything_runs(tmp_path, tiny_data_dir, capsys, args, needle):
    plan = tiny_plan(tmp_path, tiny_data_dir)
    against = tmp_path / "recorded"
    if needle != "no recorded run":  # a record, so only the named problem is left
        (against / "fedavg-a0.5-s0").mkdir(parents=True)
        (against / "fedavg-a0.5-s0" / "record.json").write_text("{}")
    with pytest.raises(SystemExit) as stop:
        rerun.main([str(plan), *args, "--against", str(against), "--repo", str(REPO)])
    assert stop.value.code == 2 and needle in capsys.readouterr().err


def test_a_whole_plan_runs_in_parallel_resumes_and_keeps_to_its_time(tmp_path, tiny_data_dir,
                                                                     capsys):
    plan = tiny_plan(tmp_path, tiny_data_dir)
    spec = yaml.safe_load(plan.read_text())
    plan.write_text(yaml.safe_dump({**spec, "seeds": [0, 1]}))
    out = tmp_path / "gpu"
    common = [str(plan), "--out", str(out), "--repo", str(REPO)]
    assert rerun.main([*common, "--max-minutes", "0"]) == 0  # no time: nothing starts
    assert "the time was up before 2 cells" in capsys.readouterr().out
    assert not list(out.glob("*/record.json"))
    assert rerun.main([*common, "--parallel", "2"]) == 0
    records = {p.parent.name: json.loads(p.read_text()) for p in out.glob("*/record.json")}
    assert sorted(records) == ["fedavg-a0.5-s0", "fedavg-a0.5-s1"]
    assert all(r["device"] == "CPU, in process" for r in records.values())
    assert records["fedavg-a0.5-s0"]["rounds"] != records["fedavg-a0.5-s1"]["rounds"]
    assert "| fedavg-a0.5-s1 |" in capsys.readouterr().out
    assert rerun.main(common) == 0  # both records there: the call resumes with nothing to do
    assert "0 of 2 cells to run" in capsys.readouterr().out


def test_a_cell_stopped_part_way_goes_on_from_its_newest_checkpoint(tmp_path, tiny_data_dir,
                                                                    capsys):
    plan = tiny_plan(tmp_path, tiny_data_dir)
    out = tmp_path / "out"
    common = [str(plan), "--out", str(out), "--repo", str(REPO), "--threads", "1",
              "--config", "checkpoint-keep=2"]
    assert rerun.main(common) == 0
    folder = out / "fedavg-a0.5-s0"
    whole = json.loads((folder / "record.json").read_text())
    # as if stopped during round 2: round 1's checkpoint, no record
    (folder / "record.json").unlink()
    (folder / "checkpoints" / "round-0002.pt").unlink()
    assert rerun.main(common) == 0
    assert "fedavg-a0.5-s0 goes on from" in capsys.readouterr().out
    resumed = json.loads((folder / "record.json").read_text())
    assert resumed["resumed"][0]["after_round"] == 1
    assert [r["server_test_acc"] for r in resumed["rounds"]] == \
        [r["server_test_acc"] for r in whole["rounds"]]
    # a checkpoint made with another config stops the call before anything runs
    (folder / "record.json").unlink()
    with pytest.raises(SystemExit) as stop:
        rerun.main([*common, "local-epochs=2"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "round-0002.pt was made with another config" in err
    assert "['local-epochs']" in err and "move its run folder away" in err
