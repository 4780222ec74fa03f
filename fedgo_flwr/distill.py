"""Server ensemble distillation (Algorithm 2, lines 8-13): pseudo-label U once per round with
the weighted ensemble of the round's client models, then train the averaged model on it."""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F
from torch import nn

from fedgo_flwr.data import to_unit_range
from fedgo_flwr.train import minibatch_descent


def ensemble_logits(client_logits: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum_k w_k(u) f(u; theta_k): weights [K, B] multiply the logits [K, B, C]."""
    return (weights.unsqueeze(-1) * client_logits).sum(0)


def pseudo_labels(client_logits: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """y~(u) = softmax(sum_k w_k(u) f(u; theta_k))."""
    return torch.softmax(ensemble_logits(client_logits, weights), dim=-1)


def kl_to_targets(student_logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """KL(y~ || softmax(student)), averaged over the batch."""
    return F.kl_div(F.log_softmax(student_logits, -1), targets, reduction="batchmean")


def cosine_lr(base_lr: float, server_round: int, num_rounds: int) -> float:
    """Server learning rate for round t (1-based), cosine-annealed over the T rounds."""
    return 0.5 * base_lr * (1 + math.cos(math.pi * (server_round - 1) / num_rounds))


def distill(student: nn.Module, u: torch.Tensor, targets: torch.Tensor, *, epochs: int,
            batch_size: int, lr: float, seed: int, device: torch.device) -> dict[str, float]:
    """Train `student` on uint8 images u against fixed pseudo-labels.

    targets is [V, N, C]: one set of pseudo-labels per view of U (V = 2 when flipping: the
    plain and the mirrored image). Each sample of a minibatch takes a random view, which is
    exactly on-the-fly random flipping, with the teachers run once per round, not per epoch.
    """
    start = time.perf_counter()
    gen = torch.Generator().manual_seed(seed)
    views = targets.shape[0]
    student.to(device).train()
    opt = torch.optim.Adam(student.parameters(), lr=lr)

    def batch_loss(idx: torch.Tensor) -> torch.Tensor:
        xb = to_unit_range(u[idx]).to(device)
        view = torch.randint(views, (len(idx),), generator=gen)
        flipped = (view == 1).to(device).view(-1, 1, 1, 1)
        xb = torch.where(flipped, xb.flip(-1), xb)
        return kl_to_targets(student(xb), targets[view, idx].to(device))

    loss = minibatch_descent(opt, len(u), epochs=epochs, batch_size=batch_size, gen=gen,
                             batch_loss=batch_loss)
    student.eval()
    return {"distill_loss": loss, "seconds": time.perf_counter() - start}
