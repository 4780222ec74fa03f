"""FedBPG's server-side pieces, as tensor functions (fedgo_flwr/strategies/fedbpg.py runs
them each round). Notation of the appendix (seed 004): clients' shared models omega_k, the
global model omega-bar, the label-conditional generator G(z, y) and its pseudo-data x~.

The appendix's equations 2-4 give the generator's losses; equations 11-14 (the global model's
tuning) are missing and are reconstructed from its Algorithm 1 and its text:

- authenticity (Eq. 2): sum_k |D_k^y| / |D^y| CE(omega_k(x~), y), averaged over the batch;
- diversity (Eq. 3, printed garbled as e^{1/(Q+Q)} sum -||x~_i - x~_j|| ||z_i - z_j||):
  FedGen's form, per-coordinate means instead of norms (fedgo_flwr/diversity.py);
- effectiveness (Eq. 4): sum_k |D_k^y| / |D^y| |omega_k(x~) - omega-bar(x~)| (L1 between the
  softmax outputs). The text wants the difference "emphasized": the generator maximises it,
  so the generator's loss is L_aut + lambda_div L_div - lambda_eff L_eff (a choice);
- consensus: per pseudo-sample, client weights exp(-CE_k) normalised over the clients, which
  multiply the clients' logits (as FedGO's odds weights do) before the softmax;
- the tuning loss (Eq. 11): KL(consensus || omega-bar) on each pseudo-sample;
- delta (Eq. 12): delta_i = CE(omega-bar(x~_i), y_i) - xi_i, xi_i = CE(consensus_i, y_i) being
  how well the clients' consensus recognises x~_i as y_i (the pseudo-sample's quality);
- retention (Algorithm 1, lines 5-6): a pseudo-sample whose consensus beats the global model
  (delta_i > 0) and whose quality passes the threshold (xi_i < zeta) is kept for the next
  round's tuning, where it comes first (the appendix: zeta = 0 turns retention off);
- the empirical loss (Algorithm 1, lines 7-8, Eq. 13): where the consensus does not beat the
  global model (delta_i <= 0) and xi_i < zeta, CE(omega-bar(x~_i), y_i) is added to the KL, so
  that a consensus worse than the global model does not pull it down ("the empirical loss is
  added ... in cases where we can ensure the quality of the pseudo-data"). The issue's wording
  ("plus the empirical loss when the consensus beats the global model") reverses the
  condition; this follows the appendix's Algorithm 1 and its text.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedgo_flwr.diversity import diversity_loss


def authenticity_loss(client_logits: torch.Tensor, y: torch.Tensor,
                      shares: torch.Tensor) -> torch.Tensor:
    """Eq. 2: the clients' cross-entropy on (x~, y), each weighted by its share of label y;
    client_logits [K, N, C], y [N], shares [K, C]."""
    ce = torch.stack([F.cross_entropy(logits, y, reduction="none") for logits in client_logits])
    return (shares[:, y] * ce).sum(0).mean()


def effectiveness_gap(client_logits: torch.Tensor, global_logits: torch.Tensor,
                      y: torch.Tensor, shares: torch.Tensor) -> torch.Tensor:
    """Eq. 4: sum_k share_k(y) |softmax(omega_k(x~)) - softmax(omega-bar(x~))|_1, averaged over
    the batch (the generator maximises it)."""
    gap = (client_logits.softmax(-1) - global_logits.softmax(-1)).abs().sum(-1)  # [K, N]
    return (shares[:, y] * gap).sum(0).mean()


def generator_loss(client_logits: torch.Tensor, global_logits: torch.Tensor, x: torch.Tensor,
                   z: torch.Tensor, y: torch.Tensor, shares: torch.Tensor, *,
                   lambda_div: float, lambda_eff: float
                   ) -> tuple[torch.Tensor, dict[str, float]]:
    """L_gen = L_aut + lambda_div L_div - lambda_eff L_eff, and its three parts' values."""
    parts = {"authenticity": authenticity_loss(client_logits, y, shares),
             "diversity": diversity_loss(z, x),
             "effectiveness": effectiveness_gap(client_logits, global_logits, y, shares)}
    loss = (parts["authenticity"] + lambda_div * parts["diversity"]
            - lambda_eff * parts["effectiveness"])
    return loss, {name: value.item() for name, value in parts.items()}


def consensus(client_logits: torch.Tensor, y: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [K, N] = softmax_k(-CE(omega_k(x~_i), y_i)), consensus logits [N, C] =
    sum_k w_ki omega_k(x~_i))."""
    ce = torch.stack([F.cross_entropy(logits, y, reduction="none") for logits in client_logits])
    weights = (-ce).softmax(0)
    return weights, (weights.unsqueeze(-1) * client_logits).sum(0)


def retained(global_logits: torch.Tensor, consensus_logits: torch.Tensor, y: torch.Tensor,
             zeta: float) -> torch.Tensor:
    """Which pseudo-samples are kept for the next round, [N] bool: the consensus beats the
    global model on them (delta > 0) and its own loss is below zeta."""
    global_ce = F.cross_entropy(global_logits, y, reduction="none")
    consensus_ce = F.cross_entropy(consensus_logits, y, reduction="none")
    return (global_ce - consensus_ce > 0) & (consensus_ce < zeta)


def tuning_loss(global_logits: torch.Tensor, client_logits: torch.Tensor, y: torch.Tensor,
                zeta: float) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """(Eq. 13's loss, the retained mask [N], its parts): KL(consensus || omega-bar) averaged
    over the batch, plus CE(omega-bar(x~_i), y_i) / N on the pseudo-samples where delta_i <= 0
    and xi_i < zeta. The consensus is fixed (client_logits carry no gradient)."""
    _, consensus_logits = consensus(client_logits, y)
    kl = F.kl_div(global_logits.log_softmax(-1), consensus_logits.log_softmax(-1),
                  log_target=True, reduction="batchmean")
    ce = F.cross_entropy(global_logits, y, reduction="none")
    with torch.no_grad():
        keep = retained(global_logits, consensus_logits, y, zeta)
        xi = F.cross_entropy(consensus_logits, y, reduction="none")
        empirical = (ce - xi <= 0) & (xi < zeta)
    loss = kl + (ce * empirical).sum() / len(y)
    return loss, keep, {"kl": kl.item(), "empirical_share": empirical.float().mean().item(),
                        "consensus_acc": (consensus_logits.argmax(-1) == y).float().mean().item()}


def tune_global(global_model: nn.Module, clients: list[nn.Module], generator: nn.Module,
                label_prior: torch.Tensor, kept: tuple[torch.Tensor, torch.Tensor], *,
                steps: int, batch_size: int, lr: float, zeta: float, retain_max: int,
                rng: torch.Generator, device: torch.device = torch.device("cpu")
                ) -> tuple[tuple[torch.Tensor, torch.Tensor], dict]:
    """Algorithm 1: `steps` Adam steps of the global model on Eq. 13's loss, the pseudo-data
    of the previous round's retained pool first (in batches), then fresh draws of G(z, y),
    y ~ label_prior. Returns the new retained pool (x~, y), at most `retain_max` (the latest),
    and the means of the losses' parts."""
    generator.to(device).eval()
    for net in clients:
        net.to(device).eval().requires_grad_(False)
    global_model.to(device).train().requires_grad_(True)  # generator_step froze it
    opt = torch.optim.Adam(global_model.parameters(), lr=lr)
    pool_x, pool_y = kept
    new_x, new_y, parts = [], [], []
    for step in range(steps):
        start = step * batch_size
        if start < len(pool_y):
            x, y = pool_x[start:start + batch_size], pool_y[start:start + batch_size]
        else:
            y = torch.multinomial(label_prior, batch_size, replacement=True, generator=rng)
            with torch.no_grad():
                x = generator(torch.randn(batch_size, generator.noise_dim, generator=rng)
                              .to(device), y.to(device)).cpu()
        x, y = x.to(device), y.to(device)
        with torch.no_grad():
            client_logits = torch.stack([net(x) for net in clients])
        loss, keep, part = tuning_loss(global_model(x), client_logits, y, zeta)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        new_x.append(x[keep].cpu())
        new_y.append(y[keep].cpu())
        parts.append({**part, "from_pool": float(start < len(pool_y))})
    global_model.eval()
    if new_y:
        pool_x, pool_y = torch.cat(new_x), torch.cat(new_y)
        first = max(0, len(pool_y) - retain_max)
        pool_x, pool_y = pool_x[first:], pool_y[first:]
    info = {name: sum(p[name] for p in parts) / len(parts) for name in parts[0]} if parts else {}
    return (pool_x, pool_y), {**info, "retained": len(pool_y)}


def generator_step(generator: nn.Module, optimizer: torch.optim.Optimizer,
                   clients: list[nn.Module], global_model: nn.Module, shares: torch.Tensor,
                   label_prior: torch.Tensor, *, batch_size: int, lambda_div: float,
                   lambda_eff: float, rng: torch.Generator,
                   device: torch.device = torch.device("cpu")) -> dict[str, float]:
    """One Adam step of G(z, y) on L_gen: labels drawn from `label_prior` (the clients' label
    proportions), the clients' shared models and the global model frozen (evaluation mode;
    their gradients flow to G only)."""
    generator.to(device).train()
    y = torch.multinomial(label_prior, batch_size, replacement=True, generator=rng).to(device)
    z = torch.randn(batch_size, generator.noise_dim, generator=rng).to(device)
    x = generator(z, y)
    for net in (*clients, global_model):
        net.to(device).eval().requires_grad_(False)
    loss, parts = generator_loss(torch.stack([net(x) for net in clients]), global_model(x), x,
                                 z, y, shares.to(device), lambda_div=lambda_div,
                                 lambda_eff=lambda_eff)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return parts
