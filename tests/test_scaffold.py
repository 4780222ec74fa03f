"""SCAFFOLD (issue 93): the corrected local step and option II's control variate against a hand
computation, the server's update of x and c, and two rounds through the in-process grid with
the clients' variates kept in their nodes' context.state."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from torch import nn

from fedgo_flwr import SCAFFOLD
from fedgo_flwr.strategies.base import ClientModel
from fedgo_flwr.strategies.scaffold import (CLIENT_CONTROL, CONTROL, CONTROL_DELTA,
                                            TRAIN_SCAFFOLD)
from fedgo_flwr.strategies.client_methods import local_update
from fedgo_lab.inprocess import InProcessGrid
from test_any_app import CLASSES, MLP, NODES, TRAINING, accuracy, user_app

pytestmark = pytest.mark.app


@pytest.fixture(autouse=True)
def a_run():
    """Messages made outside a grid need a run to belong to, as a ServerApp's do."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1


def linear():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(4, 3))


def test_one_full_batch_sgd_step_is_corrected_and_option_ii_gives_the_gradient():
    """One plain SGD step on all the data: y = x - lr (g(x) + c - c_i), and option II's
    c_i+ = c_i - c + (x - y) / lr is then exactly g(x), the gradient at x."""
    images = torch.randint(0, 256, (8, 1, 2, 2), dtype=torch.uint8)
    labels = torch.arange(8) % 3
    model, lr = linear(), 0.5
    x = {n: p.detach().clone() for n, p in model.named_parameters()}
    c = {n: torch.full_like(p, 0.3) for n, p in x.items()}
    c_i = {n: torch.full_like(p, -0.1) for n, p in x.items()}
    loss = F.cross_entropy(model(images.float() / 127.5 - 1), labels)
    g = dict(zip(x, torch.autograd.grad(loss, list(model.parameters()))))

    state = RecordDict({CLIENT_CONTROL: ArrayRecord(c_i)})
    config = ConfigRecord({"lr": lr, "local-epochs": 1, "optimizer": "sgd", "momentum": 0.0,
                           "batch-size": 8, "seed": 0, "client-method": "scaffold"})
    message = Message(RecordDict({"arrays": ArrayRecord(linear().state_dict()),
                                  CONTROL: ArrayRecord(c), "config": config}),
                      dst_node_id=5, message_type=TRAIN_SCAFFOLD)
    reply = local_update(message, linear(), (images, labels), state, seed=0)
    y = reply.content.array_records["arrays"].to_torch_state_dict()
    delta = reply.content.array_records[CONTROL_DELTA].to_torch_state_dict()
    kept = state.array_records[CLIENT_CONTROL].to_torch_state_dict()
    assert reply.content.metric_records["metrics"]["local-steps"] == 1
    assert abs(reply.content.metric_records["metrics"]["train-loss"] - loss.item()) < 1e-5
    for n in x:
        assert torch.allclose(y[n], x[n] - lr * (g[n] + c[n] - c_i[n]), atol=1e-5)
        assert torch.allclose(kept[n], g[n], atol=1e-4)
        assert torch.allclose(delta[n], g[n] - c_i[n], atol=1e-4)


def test_the_server_steps_by_global_lr_and_moves_c_by_the_sum_over_all_clients():
    strategy = SCAFFOLD(model_fn=linear, global_lr=0.5)
    x = {k: torch.zeros_like(v) for k, v in linear().state_dict().items()}
    mean = {k: torch.ones_like(v) for k, v in x.items()}
    method = strategy.client_method
    method.sent, method.known = x, set(range(4))  # N = 4 clients, 2 of them this round
    deltas = [{n: torch.full_like(t, d) for n, t in method.control.items()} for d in (1., 3.)]
    models = [ClientModel(k, 10, RecordDict(), {}, {CONTROL_DELTA: ArrayRecord(d)}, k)
              for k, d in enumerate(deltas)]
    arrays, info = method.server_step(1, ArrayRecord(mean), models)
    for v in arrays.to_torch_state_dict().values():
        assert torch.allclose(v, torch.full_like(v, 0.5))  # x + 0.5 (mean - x)
    for c in method.control.values():
        assert torch.allclose(c, torch.full_like(c, 1.0))  # (1 + 3) / 4
    assert info["clients-known"] == 4


def test_scaffold_runs_through_the_grid_keeping_each_clients_variate():
    shape = (1, 8, 8)
    strategy = SCAFFOLD(model_fn=lambda: MLP(shape), fraction_train=0.67,
                        fraction_evaluate=0.0, device="cpu")
    grid = InProcessGrid(user_app(shape), {}, NODES)
    torch.manual_seed(0)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(MLP(shape).state_dict()),
                            num_rounds=3, train_config=TRAINING, evaluate_fn=accuracy(shape))
    assert {m.metadata.message_type for m in grid.sent} >= {TRAIN_SCAFFOLD}
    assert "train" not in {m.metadata.message_type for m in grid.sent}
    kept = [ctx.state.array_records.get(CLIENT_CONTROL) for ctx in grid.nodes.values()]
    assert sum(k is not None for k in kept) >= 2  # every client that trained keeps its c_i
    assert result.train_metrics_clientapp[3]["control-norm"] > 0
    assert result.evaluate_metrics_serverapp[3]["accuracy"] > 2 / CLASSES  # chance: 1/4
    with pytest.raises(ValueError, match="SCAFFOLD's clients train with the library's loop"):
        SCAFFOLD(model_fn=lambda: MLP(shape)).start(
            grid=grid, initial_arrays=ArrayRecord(MLP(shape).state_dict()), num_rounds=1,
            train_config=ConfigRecord({"lr": 0.1}))


def test_a_malformed_control_delta_is_left_out():
    strategy = SCAFFOLD(model_fn=linear)
    good = Message(RecordDict({"arrays": ArrayRecord(linear().state_dict()),
                               CONTROL_DELTA: ArrayRecord({"1.weight": torch.zeros(2, 2)}),
                               "metrics": MetricRecord({"num-examples": 3})}),
                   dst_node_id=1, message_type=TRAIN_SCAFFOLD)
    why = strategy.reply_problem(good, strategy.extra_arrays(1))
    assert why and "array names differ" in why
