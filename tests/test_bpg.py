"""FedBPG's server-side pieces (fedgo_flwr/bpg.py): the generator's three losses, the exp(-CE)
consensus weights and the retention rule, each against a case worked by hand."""

import math

import pytest
import torch
import torch.nn.functional as F

from fedgo_flwr.bpg import (authenticity_loss, consensus, diversity_loss, effectiveness_gap,
                            generator_loss, retained)
from fedgo_flwr.weighting import label_shares

pytestmark = pytest.mark.unit


def test_label_shares_split_each_label_among_the_clients_that_hold_it():
    counts = torch.tensor([[3, 0, 0], [1, 4, 0]])
    torch.testing.assert_close(label_shares(counts),
                               torch.tensor([[0.75, 0.0, 0.0], [0.25, 1.0, 0.0]]))


def test_authenticity_weights_each_clients_cross_entropy_by_its_share_of_the_label():
    torch.manual_seed(0)
    logits, y = torch.randn(2, 5, 3), torch.tensor([0, 1, 1, 0, 2])
    shares = torch.tensor([[0.75, 0.2, 0.5], [0.25, 0.8, 0.5]])
    expected = sum(shares[k, y[i]] * F.cross_entropy(logits[k, i:i + 1], y[i:i + 1])
                   for k in range(2) for i in range(5)) / 5
    torch.testing.assert_close(authenticity_loss(logits, y, shares), expected)


def test_diversity_is_lower_when_distant_noises_give_distant_data():
    z = torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]])  # mean squared distance (a - b)^2
    spread = diversity_loss(z, torch.tensor([[0.0], [5.0], [10.0]]))  # mean |.|: 5 |a - b|
    collapsed = diversity_loss(z, torch.zeros(3, 1))
    assert collapsed == 1.0 and spread < collapsed
    pairs = [(a - b) ** 2 * 5 * abs(a - b) for a in range(3) for b in range(3)]
    assert spread.item() == pytest.approx(math.exp(-sum(pairs) / 9))


def test_diversity_keeps_a_gradient_on_images():
    """Per-coordinate means: on 28x28 images in [-1, 1] and 32-wide noise the term is neither
    0 nor 1 and pushes outputs apart (norms gave exp(-100): no gradient at all)."""
    torch.manual_seed(0)
    z = torch.randn(16, 32)
    x = (0.3 * torch.randn(16, 1, 28, 28)).tanh().requires_grad_(True)
    loss = diversity_loss(z, x)
    loss.backward()
    assert 1e-3 < loss.item() < 0.999 and x.grad.abs().sum() > 0


def test_effectiveness_is_zero_when_the_clients_agree_with_the_global_model():
    torch.manual_seed(1)
    g, y, shares = torch.randn(4, 3), torch.tensor([0, 1, 2, 0]), torch.full((2, 3), 0.5)
    assert effectiveness_gap(torch.stack([g, g]), g, y, shares) == 0
    other = torch.stack([g, -g])
    gap = 0.5 * (other[1].softmax(-1) - g.softmax(-1)).abs().sum(-1).mean()
    torch.testing.assert_close(effectiveness_gap(other, g, y, shares), gap)
    # the generator's loss rewards the gap (it is subtracted)
    x, z = torch.randn(4, 2), torch.randn(4, 2)
    base, _ = generator_loss(other, g, x, z, y, shares, lambda_div=0.0, lambda_eff=0.0)
    torch.testing.assert_close(
        generator_loss(other, g, x, z, y, shares, lambda_div=0.0, lambda_eff=2.0)[0],
        base - 2 * gap)


def test_the_consensus_trusts_the_client_with_the_lower_loss_on_each_sample():
    y = torch.tensor([0, 1])
    sure_0 = torch.tensor([[5.0, 0.0], [5.0, 0.0]])  # right on sample 0, wrong on 1
    sure_1 = torch.tensor([[0.0, 5.0], [0.0, 5.0]])  # wrong on 0, right on 1
    weights, logits = consensus(torch.stack([sure_0, sure_1]), y)
    assert weights[0, 0] > 0.99 and weights[1, 1] > 0.99
    torch.testing.assert_close(weights.sum(0), torch.ones(2))
    ce = torch.stack([F.cross_entropy(c, y, reduction="none") for c in (sure_0, sure_1)])
    torch.testing.assert_close(weights, (-ce).exp() / (-ce).exp().sum(0))
    assert logits.argmax(-1).tolist() == [0, 1]


def test_a_sample_is_retained_when_the_consensus_beats_the_global_model_within_zeta():
    y = torch.tensor([0, 0, 0])
    global_logits = torch.tensor([[0.0, 2.0], [4.0, 0.0], [0.0, 3.0]])
    consensus_logits = torch.tensor([[3.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    # 0: consensus better and sure; 1: global better; 2: consensus better but still wrong
    assert retained(global_logits, consensus_logits, y, zeta=0.5).tolist() == [True, False,
                                                                               False]
    assert retained(global_logits, consensus_logits, y, zeta=2.0).tolist() == [True, False,
                                                                               True]


def test_generator_steps_make_the_clients_recognise_the_labels_they_hold():
    """Frozen linear 'clients' that read a label from the image's mean in one of ten bands:
    G(z, y) learns to draw images that the clients holding y classify as y."""
    from torch import nn

    from fedgo_flwr.bpg import generator_step
    from fedgo_flwr.models import ConditionalGenerator

    class Bands(nn.Module):  # logits: how close the image's mean is to each band's centre
        def forward(self, x):
            centres = torch.linspace(-0.9, 0.9, 10)
            return -50 * (x.mean((1, 2, 3)).unsqueeze(1) - centres) ** 2

    torch.manual_seed(0)
    g = ConditionalGenerator(8, 10, 1, 28, dim=8)
    optimizer = torch.optim.Adam(g.parameters(), lr=1e-2, betas=(0.5, 0.999))
    clients, shares = [Bands(), Bands()], label_shares(torch.ones(2, 10))
    rng = torch.Generator().manual_seed(1)
    parts = [generator_step(g, optimizer, clients, Bands(), shares, torch.full((10,), 0.1),
                            batch_size=32, lambda_div=0.1, lambda_eff=0.0, rng=rng)
             for _ in range(60)]
    first = sum(p["authenticity"] for p in parts[:5]) / 5
    last = sum(p["authenticity"] for p in parts[-5:]) / 5
    assert last < 0.5 * first
