"""A second example, unlike the quickstart: a small Flower app written in a temporary folder as a
user of the wheel writes one (its own tiny grayscale images of 11x13 pixels, a size the
paper's generator was not built for; an MLP; its own SGD train handler; no torchvision, no
flwr-datasets), run through a real `flwr run` in simulation with the wheel installed apart
from this repository. Its ServerApp runs FedGO, FedDF, DaFKD and the Table 3 baselines
(SCAFFOLD, FedDisco, FedGKD+, FedUV, FedTGP) one after another on the same nodes, each taken
as Flower's `FedAvg` is; each must complete and end above chance, and SCAFFOLD's clients find
their control variates in `context.state` from round 2 on, through Ray's workers."""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest

from test_example import superlink_env, user_env  # noqa: F401 (fixtures)
from test_flwr_run import _status

NODES, CLASSES = 3, 4

PYPROJECT = """
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "tiny-mlp"
version = "1.0.0"
requires-python = ">=3.11"
dependencies = ["fedgo-flwr", "flwr[simulation]>=1.42", "torch>=2.1"]

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "someone"

[tool.flwr.app.components]
serverapp = "tinymlp.server_app:app"
clientapp = "tinymlp.client_app:app"

[tool.flwr.app.config]
num-server-rounds = 3
lr = 0.1
local-epochs = 2
output = ""
"""

TASK = '''
"""The user's own data and model: 11x13 grayscale images of 4 classes (a bright band of rows
each), drawn from a seed; a two-layer MLP with the latent layer DaFKD reads."""
import torch
from torch import nn

SHAPE, CLASSES = (1, 11, 13), 4


def images(n, seed):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, CLASSES, (n,), generator=g)
    x = torch.randint(0, 60, (n, *SHAPE), generator=g)
    for i, label in enumerate(y.tolist()):
        x[i, :, 2 * label:2 * label + 3, :] = 230
    return (x.float() / 127.5 - 1), y


class MLP(nn.Module):
    latent_dim = 32

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(11 * 13, 32), nn.ReLU())
        self.out = nn.Linear(32, CLASSES)

    def features(self, x):
        return self.body(x)

    def head(self, z):
        return self.out(z)

    def forward(self, x):
        return self.head(self.features(x))
'''

CLIENT = '''
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedgo_flwr.client import register
from tinymlp.task import MLP, images

app = ClientApp()


def data(context):
    return images(60, seed=int(context.node_config["partition-id"]))


@app.train()
def train(msg, context):
    model = MLP()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = data(context)
    config = msg.content["config"]
    opt = torch.optim.SGD(model.parameters(), lr=config["lr"])
    for _ in range(config["local-epochs"]):
        for i in range(0, len(x), 20):
            loss = F.cross_entropy(model(x[i:i + 20]), y[i:i + 20])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics":
                               MetricRecord({"train_loss": loss.item(),
                                             "num-examples": len(y)})}), reply_to=msg)


register(app, model_fn=MLP, data_fn=data, device="cpu")
'''

SERVER = '''
import json

import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
from flwr.serverapp import ServerApp

from fedgo_flwr import SCAFFOLD, DaFKD, FedDF, FedDisco, FedGKD, FedGO, FedTGP, FedUV
from tinymlp.task import MLP, images

app = ServerApp()
GAN = dict(generator_steps=20, generator_width=8, latent_dim=16, discriminator_epochs=2,
           discriminator_width=8)


@app.main()
def main(grid, context):
    cfg = context.run_config
    u, _ = images(120, seed=100)
    test_x, test_y = images(200, seed=101)

    def accuracy(server_round, arrays):
        model = MLP()
        model.load_state_dict(arrays.to_torch_state_dict())
        with torch.no_grad():
            return MetricRecord({"accuracy": (model(test_x).argmax(1) == test_y)
                                 .float().mean().item()})

    training = ConfigRecord({"lr": cfg["lr"], "local-epochs": cfg["local-epochs"],
                             "optimizer": "sgd", "batch-size": 20, "momentum": 0.0,
                             "train-loss-key": "train_loss"})
    out = {}
    for strategy in (FedGO(unlabeled_data=u, model_fn=MLP, distill_epochs=1, **GAN),
                     FedDF(unlabeled_data=u, model_fn=MLP, distill_epochs=1),
                     DaFKD(unlabeled_data=u, model_fn=MLP, distill_epochs=1, gan_rounds=1,
                           generator_width=8, latent_dim=16),
                     SCAFFOLD(model_fn=MLP), FedDisco(model_fn=MLP, num_classes=4),
                     FedGKD(unlabeled_data=u, model_fn=MLP, distill_epochs=1),
                     FedUV(model_fn=MLP),
                     FedTGP(model_fn=MLP, num_classes=4, server_epochs=50)):
        torch.manual_seed(0)
        result = strategy.start(grid=grid, initial_arrays=ArrayRecord(MLP().state_dict()),
                                num_rounds=cfg["num-server-rounds"], train_config=training,
                                evaluate_fn=accuracy)
        out[type(strategy).__name__] = {
            "accuracy": {t: m["accuracy"] for t, m in result.evaluate_metrics_serverapp.items()},
            "train": {t: dict(m) for t, m in result.train_metrics_clientapp.items()}}
    with open(cfg["output"], "w") as f:
        json.dump(out, f)
'''


def write_app(root):
    (root / "tinymlp").mkdir(parents=True)
    (root / "pyproject.toml").write_text(PYPROJECT.lstrip())
    (root / "tinymlp" / "__init__.py").write_text("")
    for name, source in (("task", TASK), ("client_app", CLIENT), ("server_app", SERVER)):
        (root / "tinymlp" / f"{name}.py").write_text(textwrap.dedent(source).lstrip())


@pytest.mark.e2e(seconds=150)
def test_a_users_own_small_app_runs_every_strategy_from_the_wheel(
        user_env, superlink_env, tmp_path):  # noqa: F811
    app, out = tmp_path / "tiny-mlp", tmp_path / "result.json"
    write_app(app)
    run = subprocess.run(
        [str(user_env / "flwr"), "run", str(app), "--stream", "--federation-config",
         f"num-supernodes={NODES} client-resources-num-cpus=1", "-c", f"output='{out}'"],
        cwd=superlink_env["FLWR_HOME"], env=superlink_env, capture_output=True, text=True,
        timeout=600)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-3000:]
    assert _status(superlink_env, superlink_env["FLWR_HOME"], log) == "finished:completed", \
        log[-3000:]
    result = json.loads(out.read_text())
    assert sorted(result) == ["DaFKD", "FedDF", "FedDisco", "FedGKD", "FedGO", "FedTGP",
                              "FedUV", "SCAFFOLD"]
    assert result["FedTGP"]["train"]["3"]["prototypes-known"] == CLASSES
    assert result["SCAFFOLD"]["train"]["1"]["control-kept"] == 0
    assert result["SCAFFOLD"]["train"]["3"]["control-kept"] == 1  # every client's c_i kept
    for method, runs in result.items():
        assert sorted(runs["accuracy"]) == ["0", "1", "2", "3"], method
        assert runs["accuracy"]["3"] > 2 / CLASSES, (method, runs["accuracy"])  # chance: 1/4
        assert all("train_loss" in m for m in runs["train"].values()), method
