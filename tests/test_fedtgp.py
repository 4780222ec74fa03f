"""FedTGP (issue 93): the adaptive margin, the contrastive loss and one step of the trainable
prototypes against a hand computation, the clients' prototype term, and three rounds through
the in-process grid."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord
from torch import nn

from fedgo_flwr import FedTGP
from fedgo_flwr.strategies.fedtgp import (TRAIN_FEDTGP, TrainablePrototypes, adaptive_margin,
                                          class_prototypes, contrastive_loss, prototype_term,
                                          train_prototypes)
from fedgo_flwr.strategies.feduv import Encoded
from fedgo_lab.inprocess import InProcessGrid
from test_any_app import CLASSES, MLP, NODES, TRAINING, accuracy, user_app

pytestmark = pytest.mark.app


def test_the_adaptive_margin_by_hand():
    """Class means Q_0 = (0, 0) (two prototypes (0, 1), (0, -1)), Q_1 = (3, 0), Q_2 = (3, 4):
    nearest-other distances 3, 3 and 4, their max 4; capped by tau = 3.5."""
    q = torch.tensor([[0.0, 1.0], [0.0, -1.0], [3.0, 0.0], [3.0, 4.0]])
    labels = torch.tensor([0, 0, 1, 2])
    assert adaptive_margin(q, labels, 100.0) == pytest.approx(4.0)
    assert adaptive_margin(q, labels, 3.5) == pytest.approx(3.5)
    assert adaptive_margin(q[:2], labels[:2], 100.0) == 0.0  # one class: no margin


def test_the_contrastive_loss_and_a_tgp_step_by_hand():
    """q = (0, 0) of class 0, P_0 = (1, 0), P_1 = (0, 2), margin 0.5: distances 1 + 0.5 and 2,
    loss = -log(e^-1.5 / (e^-1.5 + e^-2)); an SGD step moves P_0 toward q."""
    q, labels = torch.zeros(1, 2), torch.tensor([0])
    p = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    expected = -math.log(math.exp(-1.5) / (math.exp(-1.5) + math.exp(-2.0)))
    assert contrastive_loss(q, labels, p, 0.5).item() == pytest.approx(expected, rel=1e-6)
    torch.manual_seed(0)
    tgp = TrainablePrototypes(2, 2, 4)
    before = tgp().detach()
    info = train_prototypes(tgp, q, labels, epochs=1, batch_size=10, lr=0.1, tau=100.0,
                            generator=torch.Generator().manual_seed(0))
    after = tgp().detach()
    assert info["tgp-margin"] == 0.0
    assert after[0].norm() < before[0].norm()  # P_0 pulled toward q = 0
    assert F.cross_entropy(-torch.cdist(q, after), labels) < F.cross_entropy(
        -torch.cdist(q, before), labels)


def test_class_prototypes_and_the_clients_term_by_hand():
    """features = identity on 2-pixel images: prototypes are the class means of the images in
    [-1, 1]; the term is lambda times the mean squared distance over the B x D entries, a row
    whose class has no prototype adding 0."""

    class Identity(nn.Module):
        def features(self, x):
            return x.flatten(1)

        def head(self, z):
            return z

        def forward(self, x):
            return self.head(self.features(x))

    x = torch.tensor([[[[0, 255]]], [[[255, 255]]], [[[0, 0]]]], dtype=torch.uint8)
    y = torch.tensor([0, 0, 2])
    p, counts = class_prototypes(Identity(), x, y, 3, device=torch.device("cpu"))
    assert counts.tolist() == [2, 0, 1]
    torch.testing.assert_close(p, torch.tensor([[0.0, 1.0], [0.0, 0.0], [-1.0, -1.0]]))
    encoded = Encoded(Identity())
    z = torch.tensor([[1.0, 1.0], [2.0, 0.0]])
    encoded(z)
    known = torch.tensor([1.0, 0.0, 1.0])
    term = prototype_term(encoded, p, known, 0.5)(None, z, torch.tensor([0, 1]))
    assert term.item() == pytest.approx(0.5 * (1.0 + 0.0) / 4)  # (1-0)^2 + (1-1)^2, row 2: 0


def test_fedtgp_checks_its_model_and_runs_through_the_grid():
    with pytest.raises(TypeError, match="FedTGP pulls the model's representations"):
        FedTGP(model_fn=lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, CLASSES)),
               num_classes=CLASSES)
    with pytest.raises(ValueError, match="FedTGP needs num_classes >= 2"):
        FedTGP(model_fn=lambda: MLP((1, 8, 8)), num_classes=CLASSES, server_lr=0)
    shape = (1, 8, 8)
    strategy = FedTGP(model_fn=lambda: MLP(shape), num_classes=CLASSES, server_epochs=20,
                      fraction_evaluate=0.0, device="cpu")
    grid = InProcessGrid(user_app(shape), {}, NODES)
    torch.manual_seed(0)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(MLP(shape).state_dict()),
                            num_rounds=3, train_config=TRAINING, evaluate_fn=accuracy(shape))
    sent = [m for m in grid.sent if m.metadata.message_type == TRAIN_FEDTGP]
    assert len(sent) == 3 * NODES
    assert ["global-prototypes" in m.content.array_records for m in sent[::NODES]] == [
        False, True, True]  # P from round 2 on
    metrics = result.train_metrics_clientapp
    assert metrics[3]["prototypes-known"] == CLASSES and metrics[3]["tgp-loss"] >= 0
    assert result.evaluate_metrics_serverapp[3]["accuracy"] > 2 / CLASSES  # chance: 1/4
    # its state_dict carries P into a new FedTGP (one that builds TGP lazily, as this one)
    again = FedTGP(model_fn=lambda: MLP(shape), num_classes=CLASSES, device="cpu")
    assert again.tgp is None
    again.load_state_dict(strategy.state_dict())
    assert again.rounds_done == 3 and torch.equal(again.known, strategy.known)
    assert torch.equal(again.tgp().detach(), strategy.tgp().detach())
