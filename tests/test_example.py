"""The example app as a Flower user runs it: copied out of the repository, with the wheel
built from this repository installed into an environment of its own (nothing else of the
repository on its path), through a real `flwr run` in simulation, running the README's best
row by the one line the example says to change; and with FedGO swapped for FedDF and DaFKD by
the other."""

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

from conftest import REPO, write_tiny_fmnist
from test_flwr_run import _free_port, _status, _superlink_pids


EXAMPLE = REPO / "examples" / "quickstart-fedgo"
THE_LINE = "from fedgo_flwr import FedGO as Strategy\n"
PRESET_LINE = "from fedgo_flwr.presets import AS_PUBLISHED as PRESET\n"
NODES = 3


@pytest.fixture(scope="module")
def user_env(tmp_path_factory) -> Path:
    """The bin folder of a virtual environment holding the wheel of this repository and,
    through a path entry, the dependencies installed here (not the repository itself)."""
    root = tmp_path_factory.mktemp("user-env")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                            str(root / "wheels"), str(REPO)], capture_output=True, text=True,
                           timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (root / "wheels").glob("fedgo_flwr-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    # A plain path entry: the .pth files there (the editable install of this checkout) do
    # not run, so the repository stays off the path.
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q",
                                "--target", str(site), str(wheel)], capture_output=True,
                               text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-2000:]
    python = venv / "bin" / "python"
    for script in Path(sys.executable).parent.glob("fl*"):  # flwr, flower-superlink, ...
        lines = script.read_text().splitlines(keepends=True)
        (venv / "bin" / script.name).write_text(f"#!{python}\n" + "".join(lines[1:]))
        (venv / "bin" / script.name).chmod(0o755)
    where = subprocess.run([str(python), "-c", "import fedgo_flwr, importlib.util as u; "
                            "print(fedgo_flwr.__file__, u.find_spec('fedgo_app'))"],
                           capture_output=True, text=True, cwd=root, timeout=120)
    assert where.stdout.split() == [str(site / "fedgo_flwr" / "__init__.py"), "None"], where
    return venv / "bin"


@pytest.fixture(scope="module")
def superlink_env(user_env, tmp_path_factory):
    """A private local SuperLink's environment (own FLWR_HOME and ports), stopped after."""
    home = tmp_path_factory.mktemp("flwr-home")
    env = {**os.environ, "FLWR_HOME": str(home),
           "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(_free_port()),
           "FLWR_LOCAL_CONTROL_API_PORT": str(_free_port()),
           "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
           "PATH": f"{user_env}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("PYTHONPATH", None)
    yield env
    for pid in _superlink_pids(home):
        os.kill(pid, signal.SIGTERM)


def _example(tmp_path, strategy: str, preset: str = "AS_PUBLISHED") -> tuple[Path, Path, Path]:
    """The example copied out, its one line set to `strategy` (or its preset line to
    `preset`); tiny data beside it."""
    app = tmp_path / "quickstart-fedgo"
    shutil.copytree(EXAMPLE, app, ignore=shutil.ignore_patterns("__pycache__"))
    server = app / "fedgo_example" / "server_app.py"
    source = server.read_text()
    assert source.count(THE_LINE) == 1 and source.count(PRESET_LINE) == 1
    source = source.replace(THE_LINE, THE_LINE.replace("FedGO", strategy))
    server.write_text(source.replace(PRESET_LINE, PRESET_LINE.replace("AS_PUBLISHED", preset)))
    data, out = tmp_path / "data", tmp_path / "out"
    write_tiny_fmnist(data / "FashionMNIST" / "raw", n_train=600, n_test=100)
    return app, data, out


OVERRIDES = {"num-server-rounds": 2, "server-size": 150, "fraction-train": 1.0,
             "fraction-evaluate": 1.0, "fedgo.generator-steps": 3,
             "fedgo.discriminator-epochs": 1, "fedgo.generator-width": 8,
             "fedgo.discriminator-width": 8, "dafkd.gan-rounds": 1, "dafkd.generator-width": 8}


DISTILLING = ("FedGO", "FedDF", "DaFKD", "FedGKD")  # on the server's U; the rest do not
TABLE_3 = ("SCAFFOLD", "FedDisco", "FedUV", "FedGKD", "FedTGP")  # the paper's other baselines


def _check_result(out: Path, strategy: str, trained: int = NODES) -> dict:
    result = json.loads((out / "result.json").read_text())
    assert result["strategy"] == strategy
    assert sorted(result["train"]) == ["1", "2"]
    for metrics in result["train"].values():
        # the clients' loss, by the example's name for it: its train handler's, or DaFKD's
        # own client step's
        if strategy in DISTILLING:
            assert metrics["distill-teachers"] == trained
        assert "train_loss" in metrics and "train-loss" not in metrics
        if strategy == "FedGO":  # the pre-FL stage's discriminator from every node
            assert metrics["discriminators"] == NODES
    evaluations = result["evaluate_serverapp"]
    assert sorted(evaluations) == ["0", "1", "2"]
    assert evaluations["2"]["loss"] != evaluations["0"]["loss"]  # the model moved
    assert (out / "final_model.pt").is_file()
    return result


# The best row: 2 of the 3 nodes train, the third judges the distilled model (the guard).
BEST_ROW = {"fraction-train": 0.5}


def _check_best_row(out: Path) -> None:
    result = _check_result(out, "FedGO", trained=2)
    assert result["preset"] == ["budget_probe", "calibration_fraction", "distill_budget",
                                "ensemble_space", "flip_views", "guard", "past_teachers",
                                "proximal_mu"]
    for t, metrics in result["train"].items():
        assert metrics["guard-kept-distilled"] in (0, 1)  # the third node's choice
        assert 0 <= metrics["disagreement"] <= 1  # the budget
        assert metrics["past-teachers"] == int(t) - 1  # the global models so far


@pytest.mark.e2e(seconds=95)
def test_the_example_runs_the_best_row_from_the_wheel_with_a_real_flwr_run(
        user_env, superlink_env, tmp_path):
    app, data, out = _example(tmp_path, "FedGO", "BEST_ROW")
    overrides = " ".join([f"data-dir='{data}'", f"output-dir='{out}'",
                          *(f"{k}={v}" for k, v in {**OVERRIDES, **BEST_ROW}.items())])
    # The local SuperLink the run starts, and its processes, start in the run's folder: one
    # that outlives the test's own (removed when it passes), as the SuperLink does.
    here = Path(superlink_env["FLWR_HOME"])
    run = subprocess.run(
        [str(user_env / "flwr"), "run", str(app), "--stream", "--federation-config",
         f"num-supernodes={NODES} client-resources-num-cpus=1", "-c", overrides],
        cwd=here, env=superlink_env, capture_output=True, text=True, timeout=600)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-3000:]
    assert _status(superlink_env, here, log) == "finished:completed", log[-3000:]
    _check_best_row(out)


LEARNS = {"lr": 0.05, "local-epochs": 3}  # enough for two rounds on the tiny set to learn

# FedGO as published, and the one line swapped to FedDF, DaFKD or one of the paper's other
# Table 3 baselines, run the example's own ServerApp and ClientApp on the in-process grid
# (every message through Flower's serialisation): the real runtime's part is the same as the
# best row's, above.
@pytest.mark.app
@pytest.mark.parametrize("strategy", ["FedGO", "FedDF", "DaFKD", *TABLE_3])
def test_the_examples_one_line_swaps_fedgo_for_any_method(strategy, tmp_path, monkeypatch):
    import tomllib

    from flwr.app import Context, RecordDict
    from flwr.common.config import flatten_dict

    from fedgo_lab.inprocess import InProcessGrid

    app, data, out = _example(tmp_path, strategy)
    for name in [m for m in sys.modules if m.split(".")[0] == "fedgo_example"]:
        monkeypatch.delitem(sys.modules, name)  # this copy's, not an earlier test's
    monkeypatch.syspath_prepend(str(app))
    from fedgo_example.client_app import app as client_app
    from fedgo_example.server_app import app as server_app

    project = tomllib.loads((app / "pyproject.toml").read_text())
    run_config = {**flatten_dict(project["tool"]["flwr"]["app"]["config"]), **OVERRIDES,
                  **LEARNS, "data-dir": str(data), "output-dir": str(out)}
    torch.manual_seed(0)  # the example seeds nothing: its model's initialisation, the test's
    server_app(InProcessGrid(client_app, run_config, NODES),
               Context(run_id=7, node_id=0, node_config={}, state=RecordDict(),
                       run_config=run_config))
    result = _check_result(out, strategy)
    # each method, swapped in by the one line, learns: 10 classes, chance is 0.1
    assert result["evaluate_serverapp"]["2"]["accuracy"] > 0.5, result["evaluate_serverapp"]
