import json
import tomllib

import pytest
import yaml

from conftest import REPO
from fedgo_app.config import Config
from fedgo_lab import bench
from fedgo_lab.bench import PlanError, cells_of, finished, load_plan, toml_text

PLAN = {"name": "t", "preset": "conf/fmnist-fair.toml", "config": {"num-server-rounds": 3},
        "federation": {"num-supernodes": 20}, "alphas": [0.1, 0.05], "seeds": [0, 1],
        "cells": ["fedavg", {"strategy": "fedgo", "weighting": "uniform"},
                  {"name": "feddf-es", "preset": "conf/feddf-published.toml",
                   "num-server-rounds": 4}]}


def main(argv: list[str]) -> int:
    """The bench command, on this repository's presets wherever pytest runs."""
    return bench.main([*argv, "--repo", str(REPO)])


def write_plan(tmp_path, **changes):
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump({**PLAN, **changes}))
    return path


def test_cells_cover_the_grid_with_preset_config_and_cell_keys_layered(tmp_path):
    cells = cells_of(load_plan(write_plan(tmp_path)), tmp_path, REPO)
    assert len(cells) == 3 * 2 * 2
    by_name = {c.run_name: c.run_config for c in cells}
    fedavg = by_name["fedavg-a0.05-s1"]
    assert (fedavg["strategy"], fedavg["alpha"], fedavg["seed"]) == ("fedavg", 0.05, 1)
    assert fedavg["num-server-rounds"] == 3 and fedavg["distill-size"] == 3000  # plan, preset
    assert by_name["fedgo-uniform-a0.1-s0"]["weighting"] == "uniform"
    feddf = by_name["feddf-es-a0.1-s0"]
    assert feddf["num-server-rounds"] == 4 and feddf["strategy"] == "feddf"  # the cell wins
    assert feddf["val-size"] == 1000 and fedavg["val-size"] == 0  # the cell's own preset
    assert fedavg["results-dir"] == str(tmp_path) and fedavg["run-name"] == "fedavg-a0.05-s1"
    assert tomllib.loads(toml_text(fedavg)) == fedavg
    assert Config.from_run_config(fedavg).alpha == 0.05


def test_a_cell_names_a_file_per_seed_relative_to_the_repository(tmp_path):
    cell = {"name": "g2", "preset": "conf/table2/s2-g2-d2.toml",
            "generator-file": "results/g2/g-s{seed}-a{alpha}.pt"}
    cells = cells_of(load_plan(write_plan(tmp_path, cells=[cell])), tmp_path, REPO)
    files = {c.run_name: c.run_config["generator-file"] for c in cells}
    assert files["g2-a0.05-s1"] == str(REPO / "results/g2/g-s1-a0.05.pt")
    assert files["g2-a0.1-s0"] == str(REPO / "results/g2/g-s0-a0.1.pt")


@pytest.mark.parametrize("changes,needle", [
    ({"strategies": ["fedavg"]}, "unknown plan key(s) ['strategies']"),
    ({"seeds": []}, "'seeds' must be a non-empty list"),
    ({"federation": {}}, "num-supernodes"),
    ({"cells": [{"strategy": "fedsgd"}]}, "cell fedsgd-a0.1-s0: run-config key 'strategy'"),
    ({"cells": [{"weighting": "magic", "strategy": "fedgo"}]}, "allowed: class-count, domain-aware"),
    ({"config": {"num-rounds": 3}}, "unknown run-config key"),
    ({"cells": ["fedavg", "fedavg"]}, "two cells share a name"),
])
def test_bad_plans_fail_before_anything_runs(tmp_path, capsys, changes, needle):
    with pytest.raises(PlanError) as err:
        cells_of(load_plan(write_plan(tmp_path, **changes)), tmp_path, REPO)
    assert needle in str(err.value)
    assert main([str(write_plan(tmp_path, **changes)), "--out", str(tmp_path)]) == 2
    assert needle in capsys.readouterr().err


def test_finished_cells_are_skipped_and_stale_records_refused(tmp_path, capsys):
    cells = cells_of(load_plan(write_plan(tmp_path)), tmp_path / "elsewhere", REPO)
    cell = cells[0]
    assert not finished(cell, tmp_path)
    (tmp_path / cell.run_name).mkdir()
    record = {"config": {**cell.run_config, "results-dir": "/old/place"}, "rounds": []}
    (tmp_path / cell.run_name / "record.json").write_text(json.dumps(record))
    assert finished(cell, tmp_path)  # where it was written does not matter
    assert main([str(write_plan(tmp_path)), "--out", str(tmp_path), "--dry-run"]) == 0
    assert "12 cells, 1 finished, 11 to run" in capsys.readouterr().out
    del record["config"]["fedprox-mu"]  # a record made before the key existed ...
    (tmp_path / cell.run_name / "record.json").write_text(json.dumps(record))
    assert finished(cell, tmp_path)  # ... is the same run while the key keeps its default
    cells = cells_of(load_plan(write_plan(tmp_path, config={"num-server-rounds": 3,
                                                            "fedprox-mu": 0.01})),
                     tmp_path / "elsewhere", REPO)
    with pytest.raises(PlanError, match=r"another config \(keys \['fedprox-mu'\]\)"):
        finished(cells[0], tmp_path)
    record["config"]["local-epochs"] = 5
    (tmp_path / cell.run_name / "record.json").write_text(json.dumps(record))
    with pytest.raises(PlanError, match=r"another config \(keys \['local-epochs'\]\)"):
        finished(cell, tmp_path)


def test_a_run_stopped_part_way_goes_on_from_its_newest_checkpoint(tmp_path, monkeypatch,
                                                                  capsys):
    from fedgo_app.server import checkpoint
    started = []
    monkeypatch.setattr(bench, "run_cell", lambda cell, *_: started.append(cell.run_config))
    out = tmp_path / "out"
    plan = write_plan(tmp_path, cells=["fedavg"], alphas=[0.1], seeds=[0, 1])
    cell = cells_of(load_plan(plan), out, REPO)[0]
    # what the harness reads of a checkpoint: its run's config (the real resume: test_rerun.py)
    for server_round in (1, 2):
        checkpoint.save(out / cell.run_name, server_round,
                        {"record": {"data": {"config": cell.run_config}}}, keep=2)
    newest = str(checkpoint.path_of(out / cell.run_name, 2))
    assert main([str(plan), "--out", str(out), "--dry-run"]) == 0
    assert f"todo  {cell.run_name} (goes on from {newest})" in capsys.readouterr().out
    assert main([str(plan), "--out", str(out)]) == 0
    assert [c["resume-from"] for c in started] == [newest, ""]  # seed 1 starts afresh
    assert f"started, going on from {newest}" in capsys.readouterr().out
    checkpoint.save(out / cell.run_name, 3, {"record": {"data": {"config": {
        **cell.run_config, "local-epochs": 5}}}}, keep=2)
    assert main([str(plan), "--out", str(out)]) == 2
    assert "round-0003.pt was made with another config (keys ['local-epochs'])" in \
        capsys.readouterr().err


def test_max_minutes_starts_no_run_after_the_budget(tmp_path, monkeypatch, capsys):
    import time
    started = []

    def fake_run(cell, federation, out, tag, repo):
        started.append(cell.run_name)
        time.sleep(0.2)

    monkeypatch.setattr(bench, "run_cell", fake_run)
    plan = write_plan(tmp_path, cells=["fedavg"], alphas=[0.1], seeds=[0, 1, 2])
    assert main([str(plan), "--out", str(tmp_path / "out"), "--max-minutes", "0.001"]) == 0
    assert started == ["fedavg-a0.1-s0"]  # the budget passed during the first run
    assert "2 run(s) left for the next invocation" in capsys.readouterr().out


def test_a_run_expected_to_overrun_the_budget_waits_and_shorter_ones_go_ahead(
        tmp_path, monkeypatch, capsys):
    from fedgo_lab.bench import expected_seconds, kind
    assert [kind(n) for n in ("fedgo-a0.1-s2", "feddf-published-a0.05-s0", "central-s1")] == \
        ["fedgo", "feddf-published", "central"]
    started = []
    monkeypatch.setattr(bench, "run_cell", lambda cell, *_: started.append(cell.run_name))
    out = tmp_path / "out"
    plan = write_plan(tmp_path, cells=["fedavg", "fedgo"], alphas=[0.1], seeds=[0, 1])
    cells = cells_of(load_plan(plan), out, REPO)
    for name, wall, made in (("fedavg-a0.1-s0", 300.0, "2026-11-23T10:00:00+00:00"),
                             ("fedgo-a0.1-s0", 1500.0, "2026-11-23T10:00:00+00:00"),
                             ("fedavg-a0.1-s1", 900.0, "2026-11-22T10:00:00+00:00")):
        (out / name).mkdir(parents=True)
        cell = next(c for c in cells if c.run_name == name)
        (out / name / "record.json").write_text(json.dumps(
            {"config": cell.run_config, "timings": {"wall": wall}, "started_at": made,
             "rounds": [{"round": t, "server_test_acc": 0.1 * (t + 1)} for t in range(2)]}))
    # The latest record of each cell, not the slowest: FedAvg's 900 s run came first.
    assert expected_seconds(cells, out) == {"fedavg": 360.0, "fedgo": 1560.0}
    (out / "fedavg-a0.1-s1" / "record.json").unlink()
    # 10 minutes: FedAvg's 6 fit, FedGO's 26 do not.
    assert main([str(plan), "--out", str(out), "--max-minutes", "10"]) == 0
    assert started == ["fedavg-a0.1-s1"]
    printed = capsys.readouterr().out
    assert "[bench 2/2 fedgo-a0.1-s1] deferred: expected 26 min, 10 min left" in printed
    assert "1 run(s) deferred to the next invocation: fedgo-a0.1-s1" in printed


def test_a_run_of_a_new_cell_sets_the_expectation_for_the_next_of_its_kind(
        tmp_path, monkeypatch, capsys):
    import time
    clock, started = [0.0], []

    def ten_minute_run(cell, *_):
        started.append(cell.run_name)
        clock[0] += 600.0

    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(bench, "run_cell", ten_minute_run)
    plan = write_plan(tmp_path, cells=["fedgo"], alphas=[0.1], seeds=[0, 1, 2])
    # no record of this cell yet: the first run goes; after it 5 of 15 minutes are left,
    # and the next two are expected to take 10 each
    assert main([str(plan), "--out", str(tmp_path / "out"), "--max-minutes", "15"]) == 0
    assert started == ["fedgo-a0.1-s0"]
    assert "2 run(s) deferred to the next invocation" in capsys.readouterr().out


def test_central_reference_one_run_per_seed_in_every_alphas_table(tiny_config, tmp_path):
    from fedgo_lab.central import train_central
    from fedgo_lab.report import summary_table
    plan = load_plan(write_plan(tmp_path, central=2))
    cells = cells_of(plan, tmp_path, REPO)
    central = [c for c in cells if c.central is not None]
    assert [c.run_name for c in central] == ["central-s0", "central-s1"]
    assert central[0].run_config["central-epochs"] == 2
    path = train_central(tiny_config, 2, tmp_path)
    record = json.loads(path.read_text())
    assert [r["round"] for r in record["rounds"]] == [0, 1, 2]
    assert record["rounds"][2]["server_test_acc"] > record["rounds"][0]["server_test_acc"]
    fedavg = {"config": {"strategy": "fedavg", "alpha": 0.1, "seed": 0},
              "rounds": [{"round": 1, "server_test_acc": 0.5}]}
    rows = summary_table([record, fedavg, {**fedavg, "config": {**fedavg["config"],
                                                                "alpha": 0.05}}]).splitlines()[2:]
    central_rows = [r for r in rows if r.startswith("| central")]
    assert len(central_rows) == 2 and central_rows[0].endswith("| - |")
    from fedgo_lab.report import plot_rounds  # the reference is drawn as a level line
    png = plot_rounds([record, fedavg], tmp_path / "with-central.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_central_must_be_a_number_of_epochs(tmp_path):
    with pytest.raises(PlanError, match="'central' is the reference's number of epochs"):
        load_plan(write_plan(tmp_path, central="yes"))


def test_shipped_plans_and_presets_are_valid(tmp_path):
    plans = sorted((REPO / "conf" / "bench").glob("*.yaml"))
    assert plans
    for plan in plans:
        assert cells_of(load_plan(plan), tmp_path, REPO), plan
    presets = sorted((REPO / "conf").rglob("*.toml"))
    assert len([p for p in presets if p.parent.name == "paper"]) == 7
    assert len([p for p in presets if p.parent.name == "table2"]) == 4
    for preset in presets:
        Config.from_run_config(tomllib.loads(preset.read_text()))
