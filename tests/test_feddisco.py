"""FedDisco (issue 93): its weights from given counts against a hand computation, and three
rounds through the in-process grid with the user's own train handler, each client's label
counts asked once."""

from __future__ import annotations

import math

import pytest
import torch
from flwr.app import ArrayRecord

from fedgo_flwr import FedDisco
from fedgo_flwr.strategies.feddisco import QUERY_LABEL_COUNTS, discrepancies, disco_weights
from fedgo_lab.inprocess import InProcessGrid
from test_any_app import CLASSES, MLP, NODES, TRAINING, accuracy, user_app

pytestmark = pytest.mark.app


def test_the_weights_follow_the_hand_computation():
    """Two clients of 10 images: one holds one class of two, the other both equally. Against
    the uniform T: KL = (log 2, 0), normalised (1, 0); shares (0.5, 0.5); with a = 0.5 and
    b = 0.1 the weights are ReLU(0.5 - 0.5 + 0.1, 0.5 - 0 + 0.1) = (0.1, 0.6), i.e. (1/7, 6/7)."""
    counts = torch.tensor([[10.0, 0.0], [5.0, 5.0]])
    d = discrepancies(counts, torch.tensor([0.5, 0.5]), "kl")
    assert torch.allclose(d, torch.tensor([1.0, 0.0]))
    w = disco_weights(torch.tensor([10.0, 10.0]), d, 0.5, 0.1)
    assert torch.allclose(w, torch.tensor([1 / 7, 6 / 7]))
    l2 = discrepancies(counts, torch.tensor([0.5, 0.5]), "l2")
    assert torch.allclose(l2, torch.tensor([math.sqrt(0.5), 0.0]))
    # every weight cut to zero: n_k's shares
    assert torch.allclose(disco_weights(torch.tensor([1.0, 3.0]), torch.tensor([1.0, 1.0]),
                                        5.0, 0.0), torch.tensor([0.25, 0.75]))


def test_feddisco_runs_with_the_users_training_and_asks_counts_once():
    shape = (1, 8, 8)
    reports = []
    strategy = FedDisco(model_fn=lambda: MLP(shape), num_classes=CLASSES, fraction_train=0.67,
                        fraction_evaluate=0.0, device="cpu", observers=[reports.append])
    grid = InProcessGrid(user_app(shape), {}, NODES)
    torch.manual_seed(0)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(MLP(shape).state_dict()),
                            num_rounds=3, train_config=TRAINING, evaluate_fn=accuracy(shape))
    sent = [m.metadata.message_type for m in grid.sent]
    assert "train" in sent  # the user's own handler trains
    assert sent.count(QUERY_LABEL_COUNTS) == len(strategy.counts) <= NODES
    for report in reports:  # the round averaged with FedDisco's weights, which sum to one
        weights = [next(iter(m.content.metric_records.values()))["num-examples"]
                   for m in report.clients]
        assert abs(sum(weights) - 1) < 1e-6
    assert result.evaluate_metrics_serverapp[3]["accuracy"] > 2 / CLASSES  # chance: 1/4
