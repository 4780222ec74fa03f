import json

import numpy as np
import pytest
import torch
from torch import nn

from client_app.app import app as client_app
from conftest import tiny_images
from fedgo_app.data import client_indices, distillation_indices, validation_indices
from fedgo_flwr.distill import distill_early_stopping, draw_batches
from fedgo_flwr.train import evaluate
from fedgo_lab.inprocess import InProcessGrid
from server_app.app import run

CPU = torch.device("cpu")


def _images(n, seed):
    x, y = tiny_images(n, np.random.default_rng(seed))
    return torch.from_numpy(x).unsqueeze(1), torch.from_numpy(y).long()


def _linear_student(x, y):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    xf = x.float() / 127.5 - 1
    for _ in range(100):
        opt.zero_grad()
        nn.functional.cross_entropy(model(xf), y).backward()
        opt.step()
    return model


def test_early_stopping_restores_the_best_checkpoint():
    val_x, val_y = _images(200, 1)
    student = _linear_student(val_x, val_y)
    initial = {k: v.clone() for k, v in student.state_dict().items()}
    initial_acc = evaluate(student, val_x, val_y, device=CPU)[0]
    assert initial_acc > 0.9
    # Pseudo-labels that are wrong on purpose: distilling them ruins validation accuracy.
    u, u_y = _images(256, 2)
    targets = nn.functional.one_hot((u_y + 1) % 10, 10).float().unsqueeze(0)
    batches = draw_batches(256, 1, epochs=50, batch_size=32, seed=0)  # 400 steps
    info = distill_early_stopping(student, u, targets, batches=batches, lr=1e-2, device=CPU,
                                  validation=(val_x, val_y), eval_every=10, patience=50)
    assert info["best_step"] == 0 and info["distill_steps"] == 50  # stopped by patience
    for k, v in student.state_dict().items():
        assert torch.equal(v, initial[k]), k
    assert evaluate(student, val_x, val_y, device=CPU)[0] == initial_acc


def test_early_stopping_keeps_an_improved_checkpoint():
    val_x, val_y = _images(200, 1)
    u, u_y = _images(256, 2)
    targets = nn.functional.one_hot(u_y, 10).float().unsqueeze(0)
    torch.manual_seed(0)
    student = nn.Sequential(nn.Flatten(), nn.Linear(784, 10))
    batches = draw_batches(256, 1, epochs=8, batch_size=32, seed=0)[:60]
    info = distill_early_stopping(student, u, targets, batches=batches, lr=1e-2, device=CPU,
                                  validation=(val_x, val_y), eval_every=10)
    assert info["distill_steps"] == 60 and info["best_step"] > 0
    assert evaluate(student, val_x, val_y, device=CPU)[0] == info["val_acc"] > 0.5


def test_validation_split_is_labelled_server_data_outside_u(tiny_config):
    cfg = tiny_config.replace(strategy="feddf", feddf_published=True, distill_size=300,
                              val_size=100)
    val = validation_indices(cfg)
    assert len(val) == 100
    assert len(np.intersect1d(val, distillation_indices(cfg))) == 0
    clients = np.concatenate([client_indices(cfg, k, 4) for k in range(4)])
    assert len(np.intersect1d(val, clients)) == 0
    with pytest.raises(ValueError, match="'val-size'"):
        validation_indices(cfg.replace(val_size=201))


def _round_entries(cfg, **variants):
    out = {}
    for name, changes in variants.items():
        c = cfg.replace(run_name=name, **changes)
        grid = InProcessGrid(client_app, c.to_run_config(), 4)
        out[name] = json.loads(run(grid, c).read_text())["rounds"][1:]
    return out


def test_shared_protocol_feddf_and_fedgo_distil_alike(tiny_config):
    """By default FedDF, FedGO and FedGO with uniform weights take the same distillation steps
    at the same learning rates; FedDF and FedGO[uniform] then differ in nothing at all."""
    cfg = tiny_config.replace(num_server_rounds=2, distill_size=300, server_epochs=2)
    runs = _round_entries(cfg, feddf={"strategy": "feddf"}, fedgo={},
                          fedgo_uniform={"weighting": "uniform"})
    steps = 2 * -(-300 // cfg.server_batch_size)  # E_s passes over U
    for df, go, gu in zip(runs["feddf"], runs["fedgo"], runs["fedgo_uniform"]):
        assert df["distill_steps"] == go["distill_steps"] == gu["distill_steps"] == steps
        assert df["distill_lr"] == go["distill_lr"] == gu["distill_lr"]
        assert "val_acc" not in df  # no labelled data
        assert df["clients"] == go["clients"]
        for key in ("ensemble_test_loss", "distill_loss", "server_test_acc", "server_test_loss"):
            assert df[key] == gu[key], key
    lrs = [r["distill_lr"] for r in runs["fedgo"]]
    assert lrs == [cfg.server_lr, 0.5 * cfg.server_lr]  # cosine over T = 2 rounds


def test_constant_schedule_keeps_the_server_lr(tiny_config):
    runs = _round_entries(tiny_config, const={"distill_schedule": "constant"})
    assert [r["distill_lr"] for r in runs["const"]] == [tiny_config.server_lr] * 2


def test_feddf_published_uses_its_step_budget_and_labelled_data(tiny_config):
    cfg = tiny_config.replace(num_server_rounds=1, distill_size=300)
    runs = _round_entries(cfg, pub={"strategy": "feddf", "feddf_published": True,
                                    "val_size": 100, "feddf_steps": 20, "feddf_eval_every": 5})
    r = runs["pub"][0]
    assert r["distill_steps"] <= 20 and 0 <= r["val_acc"] <= 1
    assert r["distill_lr"] == cfg.server_lr  # restarted every round


def test_labels_name_what_departs_from_the_paper():
    from fedgo_lab.report import label
    rec = lambda **c: {"config": {"strategy": "fedgo", **c}}
    assert label(rec()) == "fedgo"
    assert label(rec(**{"odds-beta": 4.0, "ensemble-space": "probabilities"})) == \
        "fedgo[beta=4, probabilities]"
    assert label(rec(strategy="feddf", **{"feddf-published": True, "val-size": 1000})) == \
        "feddf-published (labelled val, 500 steps)"
    assert label(rec(strategy="feddf", **{"feddf-published": True, "feddf-steps": 200})) == \
        "feddf-published (200 steps)"  # its own budget, no labels read
    assert label(rec(strategy="feddf", **{"distill-schedule": "constant"})) == "feddf[constant lr]"
    assert label(rec(strategy="fedprox", **{"fedprox-base": "fedavg"})) == "fedprox"
    assert label(rec(strategy="fedprox", **{"fedprox-base": "fedgo", "odds-beta": 2.0})) == \
        "fedgo+fedprox[beta=2]"
    assert label(rec(strategy="fedgen", **{"ensemble-space": "probabilities"})) == "fedgen"
    assert label(rec(strategy="dafkd", **{"distill-schedule": "constant"})) == "dafkd[constant lr]"
