"""Platt's calibration of each client's discriminator (not in the paper): the client holds out
a share of its data from D_k's training, fits (a, b) so that sigmoid(a * logit + b) is a
calibrated probability of "real" there, and the server's log-odds are a * logit + b, uncapped
(the paper's are log sigmoid(logit), capped at 1). `PlattCalibration` is the policy FedGO's
`calibration_fraction` builds: what the server checks and reads of a reply; the client's part is
`hold_out` and `calibrate_discriminator`, which `fedgo_flwr.strategies.fedgo.
discriminator_update` runs when the config's "calibration-fraction" is above 0."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fedgo_flwr.gan import Negatives
from fedgo_flwr.models import Discriminator
from fedgo_flwr.train import apply_in_batches

CALIBRATIONS = ("none", "platt")


class PlattCalibration:
    """The server's side: the share the clients hold out, what a usable reply carries
    (metrics "odds-scale" a > 0 and "odds-shift" b, finite) and the (a, b) it reads."""

    def __init__(self, fraction: float):
        if not isinstance(fraction, (int, float)) or not 0.0 < fraction < 1.0:
            raise ValueError(f"calibration_fraction is {fraction!r}; allowed: [0, 1)")
        self.fraction = float(fraction)

    def problem(self, metrics) -> str | None:
        return calibration_problem(metrics)

    def of(self, metrics) -> tuple[float, float]:
        return float(metrics["odds-scale"]), float(metrics["odds-shift"])


def calibration_problem(metrics) -> str | None:
    """Why a reply's Platt calibration (odds-scale a, odds-shift b) is unusable, or None."""
    a, b = metrics.get("odds-scale"), metrics.get("odds-shift")
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (a, b)) or a <= 0:
        return f"calibration (odds-scale, odds-shift) is ({a}, {b}); expected a > 0, b finite"
    return None


def platt_calibration(real_logits: torch.Tensor, fake_logits: torch.Tensor,
                      max_iter: int = 100) -> tuple[float, float]:
    """Platt scaling of a discriminator's inner logit l (not in the paper): the (a, b), a > 0,
    that make sigmoid(a l + b) a calibrated probability of "real" on held-out images of the
    client against as many negatives, by binary cross-entropy (L-BFGS) on Platt's smoothed
    targets (N+ + 1) / (N+ + 2) and 1 / (N- + 2), which keep a finite on a few separable
    images. log Phi = a l + b is then the log of the estimated density ratio p_k / p_neg, with
    no cap; a > 0 keeps the order of the images."""
    s = torch.cat([real_logits, fake_logits]).double()
    n_pos, n_neg = len(real_logits), len(fake_logits)
    y = torch.cat([torch.full((n_pos,), (n_pos + 1) / (n_pos + 2)),
                   torch.full((n_neg,), 1 / (n_neg + 2))]).double()
    log_a = torch.zeros((), dtype=torch.float64, requires_grad=True)
    b = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([log_a, b], max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(log_a.clamp(max=10).exp() * s + b, y)
        loss.backward()
        return loss

    opt.step(closure)
    return float(log_a.detach().clamp(max=10).exp()), float(b.detach())


def calibrate_discriminator(discriminator: Discriminator, negatives: Negatives,
                            held_out: torch.Tensor, *, seed: int,
                            device: torch.device = torch.device("cpu")) -> tuple[float, float]:
    """Platt's (a, b) for D on the held-out uint8 images against as many fresh negatives."""
    gen = torch.Generator().manual_seed(seed)
    discriminator.to(device).eval()
    real = apply_in_batches(discriminator.logit, held_out, device=device)
    with torch.no_grad():
        fake = discriminator.logit(negatives(len(held_out), gen).to(device)).float().cpu()
    return platt_calibration(real, fake)


def hold_out(x: torch.Tensor, fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded split of x into (training, held-out) with about `fraction` held out (at least
    one image each side when fraction > 0)."""
    if fraction <= 0:
        return x, x[:0]
    if len(x) < 2:
        raise ValueError(f"calibrating D_k needs at least 2 images, this client has {len(x)}")
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    held = min(len(x) - 1, max(1, round(fraction * len(x))))
    return x[order[held:]], x[order[:held]]
