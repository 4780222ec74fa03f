"""FedUV (issue 93): its two regularisers on a tiny batch against a hand computation, and three
rounds through the in-process grid."""

from __future__ import annotations

import math

import pytest
import torch
from flwr.app import ArrayRecord
from torch import nn

from fedgo_flwr import FedUV
from fedgo_flwr.strategies.feduv import TRAIN_FEDUV, uniformity_term, variance_term
from fedgo_lab.inprocess import InProcessGrid
from test_any_app import CLASSES, MLP, NODES, TRAINING, accuracy, user_app

pytestmark = pytest.mark.app


def test_the_variance_term_by_hand():
    """C = 2: gamma = std of a column of the 2x2 identity = sqrt(0.5). Logits (0, 0) and
    (0, 0) give softmax (0.5, 0.5) twice: std 0, so the term is sqrt(0.5); one-hot-like
    outputs of two different classes reach gamma: the term is (nearly) 0."""
    assert math.isclose(variance_term(torch.zeros(2, 2)).item(), math.sqrt(0.5), rel_tol=1e-6)
    assert variance_term(torch.tensor([[50.0, 0.0], [0.0, 50.0]])).item() < 1e-6


def test_the_uniformity_term_by_hand():
    """Three points at squared distances 1, 1 and 4 (0, 1 and 2 on a line): sigma = median
    of (1, 4, 1) = 1; the term is (e^-1 + e^-4 + e^-1) / 3."""
    z = torch.tensor([[0.0], [1.0], [2.0]])
    expected = (2 * math.exp(-1) + math.exp(-4)) / 3
    assert math.isclose(uniformity_term(z).item(), expected, rel_tol=1e-6)


def test_feduv_needs_an_encoder_and_runs_through_the_grid():
    with pytest.raises(TypeError, match="FedUV regularises the model's encoder and classifier"):
        FedUV(model_fn=lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, CLASSES)))
    shape = (1, 8, 8)
    strategy = FedUV(model_fn=lambda: MLP(shape), fraction_evaluate=0.0, device="cpu")
    grid = InProcessGrid(user_app(shape), {}, NODES)
    torch.manual_seed(0)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(MLP(shape).state_dict()),
                            num_rounds=3, train_config=TRAINING, evaluate_fn=accuracy(shape))
    assert {m.metadata.message_type for m in grid.sent} == {TRAIN_FEDUV}
    assert result.evaluate_metrics_serverapp[3]["accuracy"] > 2 / CLASSES  # chance: 1/4
