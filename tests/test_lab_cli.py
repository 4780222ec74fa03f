"""The flags the harness commands share (fedgo_lab/cli.py): `--config KEY=VALUE ...` with TOML
values, and `--repo DIR`, the repository found from the current directory or the flag."""

import argparse

import pytest

from conftest import REPO
from fedgo_lab import bench, central, sweep
from fedgo_lab.cli import (add_config_flag, add_repo_flag, config_from, config_values,
                           repo_of)

pytestmark = pytest.mark.unit


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cmd")
    add_config_flag(p)
    add_repo_flag(p)
    return p


def test_config_values_are_toml():
    p = parser()
    args = p.parse_args(["--config", "generator-steps=0", 'model="resnet18"', "lr=1e-3",
                         "flip=false"])
    assert config_values(p, args.config) == {"generator-steps": 0, "model": "resnet18",
                                             "lr": 0.001, "flip": False}
    assert config_values(p, []) == {}
    cfg = config_from(p, ["alpha=0.5", "seed=3"], under={"alpha": 0.1, "seed": 1},
                      over={"seed": 7})
    assert (cfg.alpha, cfg.seed) == (0.5, 7)  # --config over the command's defaults, flags last


@pytest.mark.parametrize("items,needle", [
    (["alpha=oops"], "'alpha=oops'"),
    (["fedgo"], "'fedgo' is not KEY=VALUE"),
    (["model=resnet18"], 'key="text"'),
    (["seed=1", "seed=2"], "'seed' given twice"),
    (["alphaa=0.5"], "alphaa"),  # an unknown key: the config's own error
    (["alpha=-1"], "alpha"),
])
def test_a_malformed_config_item_is_a_usage_error(items, needle, capsys):
    with pytest.raises(SystemExit) as done:
        config_from(parser(), items)
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "cmd: error: --config: " in err and needle in err, err


def test_the_repository_is_the_current_directory_or_the_flag(tmp_path, monkeypatch):
    p = parser()
    assert repo_of(p, p.parse_args(["--repo", str(REPO)])) == REPO.resolve()
    monkeypatch.chdir(REPO)
    assert repo_of(p, p.parse_args([])) == REPO.resolve()


@pytest.mark.parametrize("pyproject", [None, '[project]\nname = "other"\n'])
def test_a_folder_without_the_apps_pyproject_is_refused_naming_repo(pyproject, tmp_path,
                                                                     monkeypatch, capsys):
    if pyproject:
        (tmp_path / "pyproject.toml").write_text(pyproject)
    monkeypatch.chdir(tmp_path)
    for command in (lambda: bench.main(["plan.yaml", "--dry-run"]),
                    lambda: central.main(["--epochs", "1"]),
                    lambda: sweep.main(["--repo", str(tmp_path)])):
        with pytest.raises(SystemExit) as done:
            command()
        assert done.value.code == 2
        err = capsys.readouterr().err
        assert f"error: --repo: {tmp_path.resolve()} has no pyproject.toml" in err, err
