"""The FedGO paper's other Table 3 baselines in this repository's app (issue 93): each the
library's strategy through the registry, its keys and the real ServerApp and ClientApp code on
the in-process grid, for two rounds."""

import json

import pytest
from fedgo_app.attacks import MODEL_TRAINING
import torch

import client_app.app as client_module
from fedgo_lab.inprocess import InProcessGrid
from server_app.app import run

pytestmark = pytest.mark.app

OWN = {"scaffold": {}, "feddisco": {}, "feduv": {}, "fedgkd": {},
       "fedtgp": {"fedtgp_server_epochs": 5}}


def trains(grid, server_round: int) -> list:
    return [m for m in grid.sent if m.metadata.message_type in MODEL_TRAINING
            and m.content.config_records["config"]["server-round"] == server_round]


@pytest.mark.parametrize("strategy", sorted(OWN))
def test_each_table_3_baseline_runs_two_rounds_in_the_app(strategy, tiny_config):
    cfg = tiny_config.replace(strategy=strategy, run_name=strategy, **OWN[strategy])
    grid = InProcessGrid(client_module.app, cfg.to_run_config(), 4)
    record = json.loads(run(grid, cfg).read_text())
    rounds = [r for r in record["rounds"] if r["round"] > 0]
    assert len(rounds) == 2
    for r in rounds:
        assert r["replies"]["usable"] == r["replies"]["asked"] == 2, r["replies"]
        assert r["server_test_acc"] >= 0
    first, second = trains(grid, 1), trains(grid, 2)
    arrays = [set(m.content.array_records) for m in (first[0], second[0])]
    config = second[0].content.config_records["config"]
    if strategy == "scaffold":  # c sent each round; zero in round 1, moved by round 2
        controls = [m.content.array_records["control"].to_torch_state_dict()
                    for m in (first[0], second[0])]
        assert all(not v.any() for v in controls[0].values())
        assert any(v.any() for v in controls[1].values())
    elif strategy == "feddisco":  # counts asked at discovery, the weights replace n_k
        queries = [m for m in grid.sent if m.metadata.message_type == "query"]
        assert all(m.content.config_records["config"]["label-histogram"] for m in queries)
    elif strategy == "feduv":
        assert (config["variance-weight"], config["uniformity-weight"]) == (2.5, 0.5)
    elif strategy == "fedgkd":
        assert arrays == [{"arrays", "historical"}] * 2 and config["kd-temperature"] == 3.0
    else:  # fedtgp: P from round 2 on
        assert arrays == [{"arrays"}, {"arrays", "global-prototypes"}]
        p = second[0].content.array_records["global-prototypes"].to_torch_state_dict()
        assert p["prototypes"].shape == (10, 200) and torch.isfinite(p["prototypes"]).all()
