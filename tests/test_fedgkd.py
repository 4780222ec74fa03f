"""FedGKD+ (issue 93): the buffer's average and the client's distillation term against a hand
computation, and three rounds through the in-process grid (the clients distil from the
historical model, the server from the clients' ensemble)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from torch import nn

from fedgo_flwr import FedGKD
from fedgo_flwr.strategies.client_methods import local_update
from fedgo_flwr.strategies.fedgkd import HISTORICAL, TRAIN_FEDGKD, buffer_average
from fedgo_lab.inprocess import InProcessGrid
from test_any_app import CLASSES, MLP, NODES, SMALL, TRAINING, accuracy, tiny_data, user_app

pytestmark = pytest.mark.app


def test_the_buffer_average_is_the_mean_of_the_kept_models():
    states = [{"w": torch.full((2,), float(v)), "n": torch.tensor(v)} for v in (1, 2, 6)]
    mean = buffer_average(states)
    assert torch.equal(mean["w"], torch.full((2,), 3.0)) and mean["n"] == 6  # newest counter


def test_one_full_batch_sgd_step_adds_half_gamma_times_the_tempered_kl():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    torch.manual_seed(0)
    model, hist = nn.Sequential(nn.Flatten(), nn.Linear(4, 3)), nn.Sequential(
        nn.Flatten(), nn.Linear(4, 3))
    images = torch.randint(0, 256, (8, 1, 2, 2), dtype=torch.uint8)
    labels = torch.arange(8) % 3
    lr, tau, gamma = 0.5, 3.0, 0.4
    inputs = images.float() / 127.5 - 1
    logits = model(inputs)
    loss = F.cross_entropy(logits, labels) + gamma / 2 * F.kl_div(
        F.log_softmax(logits / tau, 1), F.softmax(hist(inputs).detach() / tau, 1),
        reduction="batchmean")
    grads = torch.autograd.grad(loss, list(model.parameters()))
    expected = {n: p.detach() - lr * g for (n, p), g in zip(model.named_parameters(), grads)}
    config = ConfigRecord({"lr": lr, "local-epochs": 1, "optimizer": "sgd", "momentum": 0.0,
                           "batch-size": 8, "kd-temperature": tau, "kd-weight": gamma,
                           "client-method": "fedgkd"})
    message = Message(RecordDict({"arrays": ArrayRecord(model.state_dict()),
                                  HISTORICAL: ArrayRecord(hist.state_dict()),
                                  "config": config}), dst_node_id=5, message_type=TRAIN_FEDGKD)
    fresh = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    reply = local_update(message, fresh, (images, labels), seed=0)
    trained = reply.content.array_records["arrays"].to_torch_state_dict()
    for name, value in expected.items():
        assert torch.allclose(trained[name], value, atol=1e-5)
    assert abs(reply.content.metric_records["metrics"]["train-loss"] - loss.item()) < 1e-5


def test_fedgkd_plus_runs_through_the_grid():
    shape = (1, 8, 8)
    u, _ = tiny_data(shape, 32, seed=7)
    strategy = FedGKD(unlabeled_data=u, model_fn=lambda: MLP(shape), buffer_size=2,
                      kd_weight=0.1, **SMALL)
    grid = InProcessGrid(user_app(shape), {}, NODES)
    torch.manual_seed(0)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(MLP(shape).state_dict()),
                            num_rounds=3, train_config=TRAINING, evaluate_fn=accuracy(shape))
    sent = [m for m in grid.sent if m.metadata.message_type == TRAIN_FEDGKD]
    assert len(sent) == 3 * NODES and len(strategy.client_method.buffer) == 2  # M = 2: rounds 2 and 3
    assert result.train_metrics_clientapp[3]["distill-teachers"] == NODES  # the "+"
    assert result.evaluate_metrics_serverapp[3]["accuracy"] > 2 / CLASSES  # chance: 1/4
