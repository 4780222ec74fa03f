import json

import numpy as np
import pytest
import torch
from torch import nn

from client_app.app import app as client_app
from conftest import tiny_images
from fedgo_flwr.data import client_indices, distillation_indices, validation_indices
from fedgo_flwr.distill import distill_early_stopping, draw_batches
from fedgo_flwr.train import evaluate
from fedgo_flwr.inprocess import InProcessGrid
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
    cfg = tiny_config.replace(distill_size=300, val_size=100)
    val = validation_indices(cfg)
    assert len(val) == 100
    assert len(np.intersect1d(val, distillation_indices(cfg))) == 0
    clients = np.concatenate([client_indices(cfg, k, 4) for k in range(4)])
    assert len(np.intersect1d(val, clients)) == 0
    with pytest.raises(ValueError, match="'val-size'"):
        validation_indices(cfg.replace(val_size=201))


def test_feddf_teacher_is_the_uniform_ensemble(tiny_config):
    cfg = tiny_config.replace(num_server_rounds=1, distill_size=300, val_size=100,
                              feddf_steps=20, feddf_eval_every=5)
    records = {}
    for name, c in (("feddf", cfg.replace(strategy="feddf", run_name="df")),
                    ("fedgo-uniform", cfg.replace(weighting="uniform", run_name="gu"))):
        grid = InProcessGrid(client_app, c.to_run_config(), 4)
        records[name] = json.loads(run(grid, c).read_text())["rounds"][1]
    df, gu = records["feddf"], records["fedgo-uniform"]
    assert df["ensemble_test_loss"] == gu["ensemble_test_loss"]
    assert df["clients"] == gu["clients"]
    assert df["distill_steps"] <= 20 and 0 <= df["val_acc"] <= 1
