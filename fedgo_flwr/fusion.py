"""Adaptive layer-wise fusion (FedBPG's client side, "AF"): a client builds its personalised
model from the global model it receives and its own local model, layer by layer,

    theta_p[l] = alpha[l] * theta_local[l] + (1 - alpha[l]) * theta_global[l],

with one learnable alpha in [0, 1] per layer and per kind of tensor (a layer's weight and its
bias have their own: the appendix's Figure 5 tracks them apart and sees the biases' alphas
fall faster). Every alpha starts at 1 (the appendix's Algorithm, line 1) and is learned by
gradient descent on the client's loss of the fused model over its own data, the two models
held fixed; alphas are clipped to [0, 1] after each step. A small alpha means the layer
leans on the global model. Buffers (BatchNorm's statistics) are taken from the local model.

The appendix gives the fusion's form in words only (its equations are missing): the convex
mix above, scalar alphas per layer and kind, and the learning on the local loss are this
reconstruction's choices (FedALA's adaptive local aggregation is the nearest published form).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedgo_flwr.batches import to_unit_range


def fusion_keys(model: nn.Module) -> list[str]:
    """The parameters the fusion mixes, one alpha each (a layer's weight and bias apart)."""
    return [name for name, _ in model.named_parameters()]


def fuse(local: dict[str, torch.Tensor], global_: dict[str, torch.Tensor],
         alphas: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """theta_p = alpha theta_local + (1 - alpha) theta_global for every fused tensor; the rest
    (buffers) from the local model."""
    return {name: (alphas[name] * value + (1 - alphas[name]) * global_[name]
                   if name in alphas else value) for name, value in local.items()}


def learn_fusion(local: nn.Module, global_: nn.Module, x: torch.Tensor, y: torch.Tensor, *,
                 steps: int = 20, lr: float = 0.1, batch_size: int = 64, seed: int = 0,
                 start: dict[str, float] | None = None,
                 device: torch.device = torch.device("cpu")) -> dict[str, float]:
    """The alphas (name -> value in [0, 1]) that fuse `local` and `global_` best on (x, y):
    `steps` SGD steps on the cross-entropy of the fused model over seeded minibatches, from
    `start` (the client's alphas of its last round; 1 where none)."""
    local.to(device).eval()
    global_.to(device).eval()
    theta_local = {k: v.detach() for k, v in local.state_dict().items()}
    theta_global = {k: v.detach() for k, v in global_.state_dict().items()}
    start = start or {}
    alphas = {name: torch.tensor(float(start.get(name, 1.0)), device=device, requires_grad=True)
              for name in fusion_keys(local)}
    optimizer = torch.optim.SGD(alphas.values(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randperm(len(y), generator=gen)[:batch_size]
        fused = fuse(theta_local, theta_global, alphas)
        logits = functional_call(local, fused, (to_unit_range(x[idx]).to(device),))
        loss = F.cross_entropy(logits, y[idx].to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            for a in alphas.values():
                a.clamp_(0.0, 1.0)
    return {name: float(a.detach()) for name, a in alphas.items()}
