"""Client weighting rules w_k(u) for the ensemble, as pure tensor functions.

Every rule maps (client logits [K, B, C], discriminator log-odds log Phi_k(u) [K, B],
client sizes n_k [K]) to weights [K, B] that sum to 1 over the clients. The discriminator
output itself is D_k(u) = sigmoid(log Phi_k(u)), so rules that want D_k get it exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Callable

import torch

WeightRule = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def odds_weights(logits: torch.Tensor, log_odds: torch.Tensor, num_examples: torch.Tensor,
                 beta: float = 1.0) -> torch.Tensor:
    """FedGO, eq. (9): w_k(u) = n_k Phi_k(u) / sum_i n_i Phi_i(u), computed in log space as
    softmax_k(log n_k + log Phi_k(u)). beta != 1 sharpens the odds, w_k proportional to
    n_k Phi_k(u)^beta (not in the paper; the double sigmoid caps any odds ratio at e^beta)."""
    log_n = torch.log(num_examples.to(log_odds.dtype)).unsqueeze(1)
    return torch.softmax(log_n + beta * log_odds, dim=0)


def unsquashed_odds_weights(logits: torch.Tensor, log_odds: torch.Tensor,
                            num_examples: torch.Tensor, beta: float = 1.0) -> torch.Tensor:
    """The odds of a single-sigmoid discriminator D' = sigmoid(l), w_k proportional to
    n_k exp(beta l_k) (not in the paper): FedGO's weights without the second sigmoid, whose cap
    e bounds any odds ratio; l_k is recovered from log Phi_k = sigmoid(l_k) (clamped where
    float32 saturates); beta is an inverse temperature."""
    s = log_odds.clamp(1e-6, 1 - 1e-6)
    return odds_weights(logits, torch.log(s) - torch.log1p(-s), num_examples, beta)


def uniform_weights(logits: torch.Tensor, log_odds: torch.Tensor,
                    num_examples: torch.Tensor) -> torch.Tensor:
    """FedDF: w_k(u) = 1 / |A_t|."""
    k, b = logits.shape[:2]
    return torch.full((k, b), 1.0 / k, dtype=logits.dtype, device=logits.device)


def variance_weights(logits: torch.Tensor, log_odds: torch.Tensor,
                     num_examples: torch.Tensor) -> torch.Tensor:
    """Fed-ET: w_k(u) = Var(f(u; theta_k)) / sum_i Var(f(u; theta_i)), the variance taken over
    the classes of each client's logits (a more peaked output counts as more confident)."""
    var = logits.var(dim=-1, unbiased=False)
    return var / var.sum(0, keepdim=True).clamp_min(torch.finfo(var.dtype).tiny)


def entropy_weights(logits: torch.Tensor, log_odds: torch.Tensor, num_examples: torch.Tensor,
                    tau: float = 1.0) -> torch.Tensor:
    """FedHKT / FedDS: w_k(u) = softmax_k(-Entropy(softmax(f(u; theta_k))) / tau)."""
    log_p = torch.log_softmax(logits, dim=-1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    return torch.softmax(-entropy / tau, dim=0)


def domain_aware_weights(logits: torch.Tensor, log_odds: torch.Tensor,
                         num_examples: torch.Tensor) -> torch.Tensor:
    """DaFKD: w_k(u) = D_k(u) / sum_i D_i(u), with D_k = sigmoid(log Phi_k); no n_k."""
    d = torch.sigmoid(log_odds)
    return d / d.sum(0, keepdim=True)


def label_shares(histograms: torch.Tensor) -> torch.Tensor:
    """n_{k,y} / sum_i n_{i,y}: each client's share of each class's images, [K, C] (0 for a
    class no client holds). FedGen's lambda_k^y and FedBPG's |D_k^y| / |D^y| are these."""
    counts = histograms.to(torch.float64)
    return (counts / counts.sum(0, keepdim=True).clamp_min(1.0)).float()


def label_oracle_weights(histograms: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The label oracle, a diagnostic that no algorithm may use: w_k(x) = n_{k,y(x)} /
    sum_i n_{i,y(x)}, each client weighted by how many images of x's true class it holds
    (uniform where no client holds the class). histograms [K, C], labels [N] -> [K, N]."""
    held = (histograms.sum(0) > 0)[labels]
    return torch.where(held, label_shares(histograms)[:, labels], 1.0 / len(histograms))


def class_count_weights(histograms: torch.Tensor, predicted: torch.Tensor) -> torch.Tensor:
    """Weights from class counts (not in the paper): w_k(x) = n_{k,y^(x)} / sum_i n_{i,y^(x)},
    each client weighted by how many images it holds of the class y^(x) predicted for x. With
    the true labels this is the label oracle; clients would have to send their label counts,
    as FedGen's do. histograms [K, C], predicted [N] -> [K, N]."""
    return label_oracle_weights(histograms, predicted)


def class_count_ensemble_weights(logits: torch.Tensor, log_odds: torch.Tensor,
                                 num_examples: torch.Tensor, *, histograms: torch.Tensor,
                                 start: torch.Tensor | None = None,
                                 iterations: int = 3) -> torch.Tensor:
    """Class-count weights of the class the ensemble predicts (not in the paper): start from
    `start` [B] (by default the uniform ensemble's prediction, which needs nothing but the
    clients' logits), weight each client by its count of that class, re-predict with those
    weights, `iterations` times; the last weights. Needs the clients' label counts."""
    predicted = logits.mean(0).argmax(-1) if start is None else start
    for _ in range(iterations):
        weights = class_count_weights(histograms, predicted).to(logits.dtype)
        predicted = (weights.unsqueeze(-1) * logits).sum(0).argmax(-1)
    return weights


def with_members(rule: WeightRule, shares: Sequence[float]) -> WeightRule:
    """`rule` over the clients with models the server holds as more members (not in the
    paper: the round's averaged model, past global models): their logits come last in
    [K + M, B, C], member m gets shares[m] of the weight everywhere and the clients
    (1 - sum(shares)) of theirs; log-odds and n_k stay the clients' [K]."""
    m = len(shares)

    def weights(logits: torch.Tensor, log_odds: torch.Tensor,
                num_examples: torch.Tensor) -> torch.Tensor:
        inner = rule(logits[:len(logits) - m], log_odds, num_examples)
        fixed = torch.tensor(list(shares), dtype=inner.dtype)[:, None].expand(m, inner.shape[1])
        return torch.cat([(1 - sum(shares)) * inner, fixed])
    return weights


def past_member_shares(num_teachers: int, num_past: int) -> list[float]:
    """The shares of P past global models as members beside K teachers (`past-teachers`, not
    in the papers): each holds what a member holds on average, 1/(K + P)."""
    return [1 / (num_teachers + num_past)] * num_past


WEIGHTINGS: dict[str, WeightRule] = {
    "odds": odds_weights,
    "odds-unsquashed": unsquashed_odds_weights,
    "uniform": uniform_weights,
    "variance": variance_weights,
    "entropy": entropy_weights,
    "domain-aware": domain_aware_weights,
    "class-count": class_count_ensemble_weights,
}


def unlabelled_rule(weighting: str | WeightRule, teachers_per_image: int = 0) -> WeightRule:
    """FedGO's `weighting`: a rule of WEIGHTINGS that reads no label counts, or a function;
    `teachers_per_image` (FedGO's) ranks the teachers by the odds, so it needs "odds"."""
    if teachers_per_image < 0 or teachers_per_image and weighting not in ("odds", odds_weights):
        raise ValueError(f"teachers_per_image is {teachers_per_image} with weighting "
                         f"{weighting!r}; allowed: 0, or >= 1 with weighting 'odds'")
    if not isinstance(weighting, str):
        return weighting
    if weighting not in WEIGHTINGS or weighting.startswith("class-count"):
        raise ValueError(f"weighting {weighting!r}; allowed: " + ", ".join(
            w for w in WEIGHTINGS if not w.startswith("class-count")))
    return WEIGHTINGS[weighting]


# Rules that read the discriminators' log-odds; the others ignore them.
NEEDS_DISCRIMINATORS = ("odds", "odds-unsquashed", "domain-aware")
# Rules that read the clients' label counts [K, C] (sent once, at discovery).
NEEDS_LABEL_COUNTS = ("class-count",)


def weighting_rule(name: str, entropy_tau: float = 1.0, odds_beta: float = 1.0,
                   histograms: torch.Tensor | None = None) -> WeightRule:
    """The registered rule `name`, with its parameters bound (a rule that reads label counts
    needs the `histograms` of the clients it weights, in their order)."""
    if name in NEEDS_LABEL_COUNTS:
        if histograms is None:
            raise ValueError(f"weighting rule {name!r} needs the clients' label counts")
        return partial(WEIGHTINGS[name], histograms=histograms)
    if name == "entropy":
        return partial(entropy_weights, tau=entropy_tau)
    if name in ("odds", "odds-unsquashed") and odds_beta != 1.0:
        return partial(WEIGHTINGS[name], beta=odds_beta)
    return WEIGHTINGS[name]


def log_odds_of(d: torch.Tensor) -> torch.Tensor:
    """log(D / (1 - D)) of a discriminator output D in (0, 1)."""
    return torch.log(d) - torch.log1p(-d)
