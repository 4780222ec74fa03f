"""The distillation budget (not in the papers): how many of its steps the server's distillation
takes a round. `FullBudget` takes all of them (the papers); `DisagreementBudget` takes the share
of the images it meets where the averaged model's class is not the pseudo-label's, so that
distillation fades as the ensemble and the average come to agree (it reads no label). With a
probe it measures that share on the first images only and has the teachers label only what the
kept steps meet, saving the forwards the budget drops.

A budget is any object with `pseudo_labels(label, share_of, batches)` (see `FullBudget`);
EnsembleDistillation's `distill_budget` and `budget_probe` build one of these two."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from fedgo_flwr.teachers import teacher_logits

DISTILL_BUDGETS = ("full", "disagreement")

# label(batches, targets): the ensemble's pseudo-labels on what these batches meet (filling
# `targets`, or a new [V, |U|, C] with NaN where unmet); share_of(targets): the share to keep
Label = Callable[[list[torch.Tensor], torch.Tensor | None], torch.Tensor]
ShareOf = Callable[[torch.Tensor], float]


class FullBudget:
    """Every step: the teachers label every image the distillation meets (the papers)."""
    name = "full"

    def pseudo_labels(self, label: Label, share_of: ShareOf, batches: list[torch.Tensor]
                      ) -> tuple[torch.Tensor, list[torch.Tensor], dict[str, float]]:
        """(targets, the batches to distil on, the round's metrics)."""
        return label(batches, None), batches, {}


class DisagreementBudget(FullBudget):
    """The share of the steps that is the share of the met images where the average disagrees
    with the pseudo-label; `probe` > 0 measures it on the distillation's first this many
    images (`budgeted_pseudo_labels`). Metric "disagreement": the share."""
    name = "disagreement"

    def __init__(self, probe: int = 0):
        if not isinstance(probe, int) or probe < 0:
            raise ValueError(f"budget_probe is {probe!r}; allowed: an integer >= 0")
        self.probe = probe

    def pseudo_labels(self, label, share_of, batches):
        targets, batches, share = budgeted_pseudo_labels(label, share_of, batches,
                                                         probe=self.probe)
        return targets, batches, {"disagreement": share}


def budget_policy(name: str, probe: int = 0) -> FullBudget:
    """The budget named `name` (DISTILL_BUDGETS); a probe only with "disagreement"."""
    if name not in DISTILL_BUDGETS:
        raise ValueError(f"distill_budget is {name!r}; allowed: {', '.join(DISTILL_BUDGETS)}")
    if probe and name != "disagreement":
        raise ValueError(f"budget_probe is {probe}; allowed: >= 0, and 0 unless "
                         "distill_budget is 'disagreement'")
    return DisagreementBudget(probe) if name == "disagreement" else FullBudget()


def disagreement(model: nn.Module, u: torch.Tensor, targets: torch.Tensor, *,
                 device: torch.device, amp: bool = False) -> float:
    """The share of the views of U that the round's distillation meets (the labelled entries
    of targets [V, |U|, C], view_pseudo_labels) where `model`'s class is not the
    pseudo-label's; reads no label."""
    differ = met = 0
    for v, view_targets in enumerate(targets):
        samples = view_targets[:, 0].isfinite().nonzero().squeeze(1)
        if len(samples):
            own = teacher_logits([model], u[samples], device=device, flip=v == 1, amp=amp)[0]
            differ += (own.argmax(-1).cpu() != view_targets[samples].argmax(-1)).sum().item()
            met += len(samples)
    return differ / max(met, 1)


def budgeted(batches: list[torch.Tensor], share: float) -> list[torch.Tensor]:
    """The first ceil(share x steps) of the distillation's batches (draw_batches), so the
    distillation takes that share of its steps; its order and views are kept."""
    return batches[:math.ceil(share * len(batches))]


def probe_batches(batches: list[torch.Tensor], images: int) -> list[torch.Tensor]:
    """The distillation's first batches that hold at least `images` images (all: 0)."""
    if images <= 0:
        return batches
    sizes = torch.tensor([len(b) for b in batches]).cumsum(0)
    return batches[:int((sizes < images).sum()) + 1]


def budgeted_pseudo_labels(label: Label, share_of: ShareOf, batches: list[torch.Tensor], *,
                           probe: int = 0) -> tuple[torch.Tensor, list[torch.Tensor], float]:
    """The disagreement budget's labelling: the teachers label the images of the first `probe`
    (probe_batches), share_of(their targets) is the share of the steps to take (disagreement),
    and they label only what those steps meet beyond the probe. probe = 0 measures the share
    on every image the full distillation meets, so all of them are labelled; a probe smaller
    than the steps the budget keeps saves the teachers' forwards the budget drops.
    Returns the targets, the budgeted batches and the share."""
    targets = label(probe_batches(batches, probe), None)
    share = share_of(targets)
    batches = budgeted(batches, share)
    return label(batches, targets), batches, share
