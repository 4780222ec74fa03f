"""The discriminator options beyond the paper: Platt calibration, held-out splits, the sample of
U as negatives."""

import math

import pytest
import torch

from fedgo_flwr.calibration import (PlattCalibration, calibrate_discriminator, hold_out,
                                    platt_calibration)
from fedgo_flwr.gan import image_negatives, log_odds
from fedgo_flwr.models import Discriminator


def test_calibration_keeps_a_perfectly_separable_discriminators_order():
    """Real logits all above the fakes': Platt's a is positive, so log Phi = a l + b orders the
    images as l does, and the real images get the larger odds."""
    real, fake = torch.linspace(1, 3, 50), torch.linspace(-3, -1, 50)
    a, b = platt_calibration(real, fake)
    assert a > 0 and math.isfinite(a) and math.isfinite(b)
    logits = torch.cat([real, fake])[torch.randperm(100, generator=torch.Generator().manual_seed(0))]
    calibrated = a * logits + b
    assert torch.equal(calibrated.argsort(), logits.argsort())
    assert (a * real + b).min() > (a * fake + b).max()
    # Platt's smoothed targets keep a finite on a few separable images: with two of each the
    # target is 3/4, so no held-out image gets odds much beyond 3
    a, b = platt_calibration(torch.tensor([1.0, 2.0]), torch.tensor([-2.0, -1.0]))
    assert 0 < a < 5 and math.exp(2 * a + b) < 4


def test_calibration_makes_overconfident_logits_honest():
    """Logits ten times too large on overlapping classes: the fit shrinks them (a < 1) to about
    the true log-likelihood ratio of two unit Gaussians at +-1, which is 2 x."""
    gen = torch.Generator().manual_seed(0)
    real, fake = torch.randn(4000, generator=gen) + 1, torch.randn(4000, generator=gen) - 1
    a, b = platt_calibration(10 * real, 10 * fake)
    assert a * 10 == pytest.approx(2.0, rel=0.1) and abs(b) < 0.1


def test_calibrated_log_odds_are_the_scaled_logit():
    torch.manual_seed(0)
    d = Discriminator(1, 28, dim=8).eval()
    x = torch.randint(0, 256, (10, 1, 28, 28), dtype=torch.uint8)
    paper = log_odds(d, x, device=torch.device("cpu"))
    scaled = log_odds(d, x, device=torch.device("cpu"), calibration=(2.0, -1.0))
    assert torch.allclose(torch.sigmoid((scaled + 1) / 2), paper, atol=1e-6)
    negatives = image_negatives(x, flip=False)
    a, b = calibrate_discriminator(d, negatives, x[:5], seed=0)
    assert a > 0 and math.isfinite(b)


def test_hold_out_is_seeded_and_keeps_both_sides():
    x = torch.arange(20)
    train, held = hold_out(x, 0.1, seed=3)
    assert len(held) == 2 and len(train) == 18
    assert sorted(torch.cat([train, held]).tolist()) == list(range(20))
    assert torch.equal(held, hold_out(x, 0.1, seed=3)[1])
    assert len(hold_out(x[:3], 0.01, seed=0)[1]) == 1 and len(hold_out(x, 0.0, seed=0)[1]) == 0
    with pytest.raises(ValueError, match="at least 2"):
        hold_out(x[:1], 0.5, seed=0)


def test_image_negatives_draw_from_the_images_in_the_unit_range():
    images = torch.full((4, 1, 28, 28), 255, dtype=torch.uint8)
    images[0] = 0
    out = image_negatives(images, flip=True)(64, torch.Generator().manual_seed(0))
    assert out.shape == (64, 1, 28, 28) and out.min() == -1 and out.max() == 1


def test_the_calibration_policy_reads_a_usable_replys_scale_and_shift_only():
    """FedGO's `calibration_fraction` as a policy: (a, b) from a reply's metrics, a reply
    without them or with a <= 0 named as unusable, and the share outside (0, 1) refused."""
    platt = PlattCalibration(0.1)
    assert platt.of({"odds-scale": 2.0, "odds-shift": -0.5}) == (2.0, -0.5)
    assert platt.problem({"odds-scale": 2.0, "odds-shift": -0.5}) is None
    assert "expected a > 0" in platt.problem({"odds-scale": 0.0, "odds-shift": 1.0})
    assert "expected a > 0" in platt.problem({"num-examples": 5})
    for bad in (0.0, 1.0, -0.2):
        with pytest.raises(ValueError, match=r"calibration_fraction is .*; allowed: \[0, 1\)"):
            PlattCalibration(bad)
