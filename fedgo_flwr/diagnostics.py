"""The mechanism, measured on the same client models: every weighting rule applied to one
round's client logits on the test split (computed once; the rules are cheap), in both ensemble
spaces, against the label oracle, with the weight each rule gives the client the oracle favours
and the statistics of the odds Phi_k (the paper's Figure 2 without drift between runs).

Nothing here feeds back into training: the label histograms the oracle needs are a diagnostic
that clients send only when `diagnostics = true` asks for them.
"""

from __future__ import annotations

import math
from functools import partial

import torch

from fedgo_flwr.distill import ENSEMBLE_SPACES, ensemble_log_probs, floored
from fedgo_flwr.train import accuracy_and_loss
from fedgo_flwr.weighting import (NEEDS_DISCRIMINATORS, NEEDS_LABEL_COUNTS, WEIGHTINGS,
                                  WeightRule, class_count_ensemble_weights,
                                  label_oracle_weights, odds_weights, weighting_rule,
                                  with_members)

# Sharpened odds reported beside the paper's beta = 1 (see odds_weights).
ODDS_BETAS = (2, 4, 8)
# Phi within 1 % of its cap e counts as saturated.
NEAR_CAP = 0.99 * math.e
# The confidence thresholds at which lasting_diagnostics scores the ensemble's sure labels.
CONFIDENCE_LEVELS = (0.5, 0.8, 0.9, 0.95)
ORACLE = "label-oracle"
# Recovers D_k's logit from the paper's capped odds: meaningless on calibrated odds.
UNSQUASHED = "odds-unsquashed"
# The class-count rule started from the round's averaged model's prediction instead of the
# uniform ensemble's (the server has that model; the registered rule does not use it).
CLASS_COUNT_FROM_AVERAGED = "class-count-from-averaged"
# ... and from the prediction of the run's own ensemble (FedGO: its odds find the class, the
# counts the clients that hold it), mixed in logits.
CLASS_COUNT_FROM_OWN = "class-count-from-own"
# The run's own ensemble with the averaged model (a teacher the server already has) as one
# more member holding this share of the weight.
WITH_AVERAGED, AVERAGED_SHARE = "active+averaged", 0.5
# The past global models the lasting diagnostics add as members when the run has none.
PAST_TEACHERS = 3


def size_weights(logits: torch.Tensor, log_odds: torch.Tensor,
                 num_examples: torch.Tensor) -> torch.Tensor:
    """w_k = n_k / sum_i n_i: the odds rule with every Phi_k equal, which separates what the
    discriminators add from what the client sizes add."""
    return odds_weights(logits, torch.zeros_like(log_odds), num_examples)


def diagnostic_rules(entropy_tau: float, with_discriminators: bool,
                     histograms: torch.Tensor | None = None,
                     capped: bool = True) -> dict[str, WeightRule]:
    """Every registered rule (those reading discriminators only when there are any, those
    reading label counts only when `histograms` are given, odds-unsquashed only on the paper's
    capped odds), the size-only weights and the sharpened odds."""
    rules = {name: weighting_rule(name, entropy_tau, histograms=histograms) for name in WEIGHTINGS
             if (with_discriminators or name not in NEEDS_DISCRIMINATORS)
             and (histograms is not None or name not in NEEDS_LABEL_COUNTS)
             and (capped or name != UNSQUASHED)}
    rules["size"] = size_weights
    if with_discriminators:
        rules.update({f"odds-beta{b}": partial(odds_weights, beta=float(b)) for b in ODDS_BETAS})
    return rules


def phi_stats(log_odds: torch.Tensor) -> dict[str, float]:
    """min, mean and max of Phi = exp(log Phi), and the share within 1 % of the cap e."""
    phi = log_odds.double().exp()
    return {"min": phi.min().item(), "mean": phi.mean().item(), "max": phi.max().item(),
            "share_near_cap": (phi >= NEAR_CAP).double().mean().item()}


def ensemble_diagnostics(logits: torch.Tensor, log_odds: torch.Tensor | None,
                         num_examples: torch.Tensor, labels: torch.Tensor, *,
                         active: torch.Tensor, entropy_tau: float = 1.0,
                         histograms: torch.Tensor | None = None,
                         averaged_logits: torch.Tensor | None = None,
                         capped: bool = True) -> dict:
    """Diagnostics of one round's ensemble on labelled images.

    logits [K, N, C] of the round's client models; log_odds [K, N] of their discriminators (None
    when the strategy has none); num_examples n_k [K]; labels [N]; active: the weights [K, N]
    of the run's own rule;
    histograms [K, C] of the clients' labels (the oracle and the class-count rules), or None;
    averaged_logits [N, C] of the round's averaged model, where the class-count rules start;
    capped: the odds are the paper's (False: calibrated, see fedgo_flwr.calibration).

    Returns {space: {rule: {acc, loss}}} for both ensemble spaces (the oracle as 'label-oracle';
    with averaged_logits also the run's rule with the averaged model as a member),
    'phi' statistics, and with histograms 'weight_on_oracle_client': {rule: mean over the images
    of the weight the rule gives the client holding most images of the image's class}, the run's
    own rule as 'active'.
    """
    odds_in = log_odds if log_odds is not None else torch.zeros(logits.shape[:2])
    rules = diagnostic_rules(entropy_tau, log_odds is not None, histograms, capped)
    weights = {name: rule(logits, odds_in, num_examples) for name, rule in rules.items()}
    out: dict = {}
    if histograms is not None:
        if averaged_logits is not None:
            weights[CLASS_COUNT_FROM_AVERAGED] = class_count_ensemble_weights(
                logits, odds_in, num_examples, histograms=histograms,
                start=averaged_logits.argmax(-1))
        weights[CLASS_COUNT_FROM_OWN] = class_count_ensemble_weights(
            logits, odds_in, num_examples, histograms=histograms,
            start=ensemble_log_probs(logits, active, "logits").argmax(-1))
        weights[ORACLE] = label_oracle_weights(histograms, labels)
        favoured = histograms[:, labels].argmax(0)  # [N]
        rows = torch.arange(len(labels))
        out["weight_on_oracle_client"] = {
            name: w[favoured, rows].mean().item()
            for name, w in {**weights, "active": active}.items()}
    members = {name: (logits, w) for name, w in weights.items()}
    if averaged_logits is not None:
        with_averaged = torch.cat([logits, averaged_logits[None]])
        members[WITH_AVERAGED] = (with_averaged, with_members(
            lambda *_: active, [AVERAGED_SHARE])(with_averaged, odds_in, num_examples))
    for space in ENSEMBLE_SPACES:
        out[space] = {}
        for name, (teachers, w) in members.items():
            acc, loss = accuracy_and_loss(ensemble_log_probs(teachers, w, space), labels)
            out[space][name] = {"acc": acc, "loss": loss}
    if log_odds is not None:
        out["phi"] = phi_stats(log_odds)
    return out


def lasting_diagnostics(ensemble_log_probs: torch.Tensor, averaged_logits: torch.Tensor,
                        labels: torch.Tensor, past_log_probs: torch.Tensor | None = None
                        ) -> dict:
    """What the options that keep FedGO's lead (issue 46) would do with one round's teacher
    on labelled images: log y~ [N, C] of the run's own rule, the averaged model's logits
    [N, C], labels [N], and log y~ of that rule with past global models as members
    (`past-teachers`, see weighting.past_member_shares) where the run has any.

    Returns 'floor' (teacher-floor): the floored teacher's acc and loss and the share of images
    where the averaged model keeps its own label; 'confident' (confidence-threshold): for each
    of CONFIDENCE_LEVELS the share of images kept and the ensemble's and the averaged model's
    accuracy on them; 'past' (past-teachers): that teacher's acc and loss."""
    acc, loss = accuracy_and_loss(floored(ensemble_log_probs, averaged_logits), labels)
    own = torch.log_softmax(averaged_logits, -1)
    surer = own.max(-1).values > ensemble_log_probs.max(-1).values
    top, predicted = ensemble_log_probs.exp().max(-1)
    right = predicted == labels
    averaged_right = own.argmax(-1) == labels
    confident = {}
    for level in CONFIDENCE_LEVELS:
        kept = top >= level
        confident[f"{level:g}"] = {
            "kept": kept.float().mean().item(),
            "acc": right[kept].float().mean().item() if kept.any() else float("nan"),
            "averaged_acc": (averaged_right[kept].float().mean().item() if kept.any()
                             else float("nan"))}
    out = {"floor": {"acc": acc, "loss": loss, "own_share": surer.float().mean().item()},
           "confident": confident}
    if past_log_probs is not None:
        acc, loss = accuracy_and_loss(past_log_probs, labels)
        out["past"] = {"acc": acc, "loss": loss}
    return out


def per_class_diagnostics(ensemble_log_probs: torch.Tensor, averaged_logits: torch.Tensor,
                          labels: torch.Tensor, histograms: torch.Tensor,
                          active: torch.Tensor) -> dict[str, list[float]]:
    """Per class c, on the labelled images of class c: the accuracy of the run's teacher
    (log y~ [N, C]) and of the averaged model (logits [N, C]); the mean weight the run's rule
    (`active` [K, N]) gives the client holding most images of c (of the round's label
    histograms [K, C]), and that client's share of the round's images of c. Where the teacher
    falls behind the average, this says on which classes, and how much of their weight went to
    the clients that hold them. A class with no test image scores nan."""
    holder = histograms.argmax(0)  # [C]: the client holding most images of each class
    totals = histograms.sum(0)
    on_holder = active[holder[labels], torch.arange(len(labels))]  # [N]
    teacher_right = ensemble_log_probs.argmax(-1) == labels
    averaged_right = averaged_logits.argmax(-1) == labels
    nan = float("nan")
    out: dict[str, list[float]] = {"teacher_acc": [], "averaged_acc": [], "weight_on_holder": [],
                                   "holder_share": []}
    for c in range(averaged_logits.shape[-1]):
        mine = labels == c
        seen = bool(mine.any())
        out["teacher_acc"].append(teacher_right[mine].float().mean().item() if seen else nan)
        out["averaged_acc"].append(averaged_right[mine].float().mean().item() if seen else nan)
        out["weight_on_holder"].append(on_holder[mine].mean().item() if seen else nan)
        out["holder_share"].append(
            (histograms[holder[c], c] / totals[c]).item() if totals[c] > 0 else nan)
    return out
