"""Watching a run live (issue 106): the library's TensorBoard and MLflow trackers in a user's
own app and in this repository's app (run-config keys), read back with each tool's own
reader and checked against the run's record; a tracker that fails mid-run or a missing
package never corrupts a run."""

import json
import logging
import sys

import pytest

from fedgo_flwr import FedDF
from fedgo_flwr.observers import MLflowTracker, TensorBoardTracker, Tracker
from fedgo_lab.inprocess import InProcessGrid
from test_library import SMALL, U, UserNet, run as library_run

pytestmark = pytest.mark.app

tensorboard = pytest.importorskip("tensorboard")
mlflow = pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator)


def scalars(folder) -> dict[str, dict[int, float]]:
    """Every scalar in a run's event files, as TensorBoard reads them: {tag: {step: value}}."""
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)}
            for tag in events.Tags()["scalars"]}


def test_a_users_own_strategy_shows_its_rounds_in_tensorboard(tmp_path):
    strategy = FedDF(unlabeled_data=U, model_fn=UserNet, **SMALL,
                     observers=[TensorBoardTracker(tmp_path / "tb", params={"mine": 1})])
    _, result = library_run(strategy)
    shown = scalars(tmp_path / "tb")
    for r in (1, 2):
        assert shown["eval/accuracy"][r] == pytest.approx(
            result.evaluate_metrics_serverapp[r]["accuracy"])
        assert shown["round/distill-loss"][r] == pytest.approx(
            result.train_metrics_clientapp[r]["distill-loss"])
        assert shown["clients/sampled"][r] == shown["clients/usable"][r] > 0
    assert shown["seconds/distillation"][2] > 0 and shown["bytes/up"][1] > 0


@pytest.fixture
def watched(tiny_config, tmp_path):
    """A short FedGO run of the app with both trackers on, with the diagnostics."""
    from client_app.app import app as client_app
    from server_app.app import run
    cfg = tiny_config.replace(strategy="fedgo", diagnostics=True, generator_cache=False,
                              tensorboard_dir=str(tmp_path / "tb"),
                              mlflow_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
                              mlflow_experiment="plan")
    path = run(InProcessGrid(client_app, cfg.to_run_config(), 4), cfg)
    return json.loads(path.read_text()), tmp_path


def test_the_app_shows_each_round_and_the_pre_fl_stage_in_both_tools(watched):
    record, folder = watched
    rounds = {r["round"]: r for r in record["rounds"]}
    tb = scalars(folder / "tb" / "tiny")
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("plan").experiment_id])
    assert run.info.run_name == "tiny" and run.info.status == "FINISHED"
    assert run.data.params["strategy"] == "fedgo"  # the run config, as hyper-parameters
    assert run.data.params["distill_epochs"] == "1"  # and the library strategy's settings

    def history(name):
        return {m.step: m.value for m in client.get_metric_history(run.info.run_id, name)}

    for shown in (tb, {name: history(name) for name in tb}):
        for r, entry in rounds.items():
            assert shown["eval/server-test-acc"][r] == pytest.approx(entry["server_test_acc"])
        for r in (1, 2):
            entry = rounds[r]
            assert shown["round/ensemble_test_acc"][r] == pytest.approx(
                entry["ensemble_test_acc"])
            assert shown["round/train-loss"][r] == pytest.approx(entry["train_loss"])
            oracle = entry["diagnostics"]["logits"]["label-oracle"]["acc"]
            assert shown["round/diagnostics/logits/label-oracle/acc"][r] == pytest.approx(oracle)
            assert shown["clients/sampled"][r] == len(entry["clients"])
        accuracy = record["pre_fl"]["discriminator_train_acc"]
        assert {int(k): v for k, v in accuracy.items()} == pytest.approx(
            shown["pre-fl/discriminator-train-acc"])
        curve = record["pre_fl"]["generator"]["curve"]
        assert shown["pre-fl/generator-loss"] == pytest.approx(
            dict(zip(curve["step"], curve["generator-loss"])))


class Failing(Tracker):
    """A backend that dies at round 1, as a full disk or a vanished server would."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def write(self, values, step):
        self.calls += 1
        if step == 1:
            raise OSError("No space left on device")

    def write_params(self, params):
        pass


def test_a_tracker_that_fails_mid_run_warns_once_and_the_run_goes_on(caplog):
    failing = Failing()
    plain = FedDF(unlabeled_data=U, model_fn=UserNet, **SMALL)
    observed = FedDF(unlabeled_data=U, model_fn=UserNet, **SMALL, observers=[failing])
    _, expected = library_run(plain)
    with caplog.at_level(logging.WARNING):
        _, result = library_run(observed)
    warnings = [r for r in caplog.records if "Failing is off" in r.getMessage()]
    assert len(warnings) == 1 and "No space left on device" in warnings[0].getMessage()
    assert failing.off and failing.calls == 2  # round 0's evaluation, then round 1's write
    assert result.evaluate_metrics_serverapp == expected.evaluate_metrics_serverapp


def test_a_missing_package_names_its_extra_before_the_run(tiny_config, tmp_path,
                                                          monkeypatch):
    from client_app.app import app as client_app
    from server_app.app import run
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)
    with pytest.raises(ImportError, match=r"pip install 'fedgo-flwr\[tensorboard\]'"):
        TensorBoardTracker(tmp_path)
    with pytest.raises(ImportError, match=r"pip install 'fedgo-flwr\[mlflow\]'"):
        MLflowTracker()
    cfg = tiny_config.replace(strategy="fedgo", tensorboard_dir=str(tmp_path / "tb"))
    grid = InProcessGrid(client_app, cfg.to_run_config(), 4)
    with pytest.raises(ImportError, match="tensorboard"):
        run(grid, cfg)
    assert not grid.sent  # before discovery and the pre-FL stage


def test_left_out_replies_are_counted_by_reason():
    from fedgo_flwr.observers import round_values
    from fedgo_flwr.strategies.rounds import RoundReport
    report = RoundReport(3, {1: 1, 2: 2, 3: 3, 4: 4}, [], {
        1: "failed: node 1 lost", 2: "failed: timeout", 3: "arrays: fc.weight has shape (3, 2), "
        "expected (10, 2)", 4: "metric 'num-examples' is -5, not a positive number"},
        None, None, {})
    values = round_values(report)
    assert values["clients/failed"] == 2 and values["clients/rejected"] == 2
    assert values["clients/left-out/failed"] == 2 and values["clients/left-out/arrays"] == 1
    assert values["clients/left-out/metric 'num-examples' is N, not a positive number"] == 1
