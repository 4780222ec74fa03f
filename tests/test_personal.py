"""Personalised accuracy (personal-test-fraction): each client holds out a seeded personal test
split that never trains; after every round every client scores the global model on it, and
the record keeps their n_k-weighted accuracy beside the server's test accuracy."""

import json

import pytest
import torch

from client_app.app import app as client_app
from fedgo_app import data
from fedgo_app.client_context import personal_split
from fedgo_flwr.models import create_classifier
from fedgo_flwr.seeds import client_seed
from fedgo_flwr.train import evaluate
from fedgo_lab.inprocess import InProcessGrid
from server_app.app import run

pytestmark = pytest.mark.app


@pytest.mark.unit
def test_the_personal_split_is_seeded_disjoint_and_sized():
    x = torch.arange(40).view(40, 1, 1, 1).to(torch.uint8)
    y = torch.arange(40) % 10
    tx, ty, sx, sy = personal_split(x, y, 0.25, seed=3)
    assert len(sy) == 10 and len(ty) == 30
    assert not set(sx.flatten().tolist()) & set(tx.flatten().tolist())
    assert torch.equal(sx, personal_split(x, y, 0.25, seed=3)[2])
    assert not torch.equal(sx, personal_split(x, y, 0.25, seed=4)[2])
    assert personal_split(x, y, 0.0, 3)[0] is x and len(personal_split(x, y, 0.0, 3)[3]) == 0


def test_the_record_keeps_the_clients_accuracy_on_their_personal_splits(tiny_config):
    cfg = tiny_config.replace(strategy="fedavg", personal_test_fraction=0.25,
                              num_server_rounds=2)
    path = run(InProcessGrid(client_app, cfg.to_run_config(), 4), cfg)
    record = json.loads(path.read_text())
    assert all(0 <= r["personalised_test_acc"] <= 1 for r in record["rounds"])
    model = create_classifier(cfg.model, 1, 10, 28)
    model.load_state_dict(torch.load(path.parent / "model.pt"))
    scored, total = 0.0, 0
    for p in range(4):
        x, y = data.client_data(cfg, p, 4)
        train_x, _, test_x, test_y = personal_split(x, y, 0.25, client_seed(cfg.seed, p))
        assert record["clients"]["num_examples"][str(p)] == len(train_x)  # n_k: what trains
        acc, _ = evaluate(model, test_x, test_y, device=torch.device("cpu"))
        scored, total = scored + acc * len(test_y), total + len(test_y)
    assert record["rounds"][-1]["personalised_test_acc"] == pytest.approx(scored / total)
    assert record["rounds"][-1]["personalised"]["clients"] == 4


def test_a_malformed_personal_score_is_rejected(tiny_config):
    def tamper(reply):
        metrics = reply.content.metric_records.get("metrics")
        if reply.metadata.message_type == "evaluate" and metrics is not None and \
                (reply.metadata.src_node_id - 1000) // 17 == 0:
            metrics["eval-acc"] = 7.0
        return reply

    cfg = tiny_config.replace(strategy="fedavg", personal_test_fraction=0.25,
                              num_server_rounds=1)
    record = json.loads(run(InProcessGrid(client_app, cfg.to_run_config(), 4, tamper=tamper),
                            cfg).read_text())
    assert all(r["personalised"]["clients"] == 3 for r in record["rounds"])
    assert record["rounds"][1]["personalised"]["max_acc"] <= 1


@pytest.mark.unit
def test_the_report_sets_personalised_beside_server_accuracy():
    from fedgo_lab.report import personal_table, seed_differences
    rec = lambda seed, acc: {"config": {"strategy": "fedavg", "alpha": 0.1, "seed": seed},  # noqa
                             "rounds": [{"round": t, "server_test_acc": 0.5,
                                         "personalised_test_acc": acc} for t in range(3)]}
    table = personal_table([rec(0, 0.8), rec(1, 0.6)])
    assert "| fedavg | 0.1 | 0,1 | 70.00 ± 14.14 | 70.00 ± 14.14 | 50.00 ± 0.00 |" in table
    bpg = {"config": {"strategy": "fedbpg", "alpha": 0.1, "seed": 1},
           "rounds": [{"round": t, "server_test_acc": 0.4, "personalised_test_acc": 0.9}
                      for t in range(3)]}
    lines = seed_differences([rec(0, 0.8), rec(1, 0.6), bpg], of="fedbpg",
                             metric="personalised_test_acc").splitlines()
    assert lines[0] == "| alpha | seed | fedbpg personalised (%) | fedbpg − fedavg |"
    assert lines[2:] == ["| 0.1 | 1 | 90.0 | +30.0 |"]  # seed 0 has no fedbpg row
