"""The distillation budget (fedgo_flwr.budget): the share it keeps, the probe, and the two
policies EnsembleDistillation composes."""
import pytest
import torch

from fedgo_flwr.budget import (DisagreementBudget, FullBudget, budget_policy, budgeted,
                               budgeted_pseudo_labels, disagreement, probe_batches)
from fedgo_flwr.distill import draw_batches, view_pseudo_labels
from fedgo_flwr.teachers import teacher_logits
from fedgo_flwr.weighting import odds_weights

pytestmark = pytest.mark.unit

def test_the_budget_is_the_share_of_met_views_where_the_model_and_the_labels_differ():
    """A model that calls every image class 0, as is or mirrored, against pseudo-labels on 3
    of the 6 views (the rest unmet, NaN): it disagrees where the label is not 0."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))
    with torch.no_grad():
        model[1].weight.zero_()
        model[1].bias.copy_(torch.tensor([5.0, 0.0, 0.0]))
    u = torch.randint(0, 256, (3, 1, 4, 4), dtype=torch.uint8)
    targets = torch.full((2, 3, 3), float("nan"))
    targets[0, 0] = torch.tensor([0.8, 0.1, 0.1])  # agrees
    targets[0, 2] = torch.tensor([0.1, 0.7, 0.2])  # differs
    targets[1, 1] = torch.tensor([0.2, 0.2, 0.6])  # differs, on the mirrored view
    share = disagreement(model, u, targets, device=torch.device("cpu"))
    assert share == pytest.approx(2 / 3)
    batches = [torch.tensor([i]) for i in range(6)]
    assert [b.item() for b in budgeted(batches, share)] == [0, 1, 2, 3]  # ceil(4.0)
    assert budgeted(batches, 0.0) == [] and len(budgeted(batches, 0.01)) == 1


def test_a_budget_probe_labels_the_probe_and_the_kept_steps_only_and_those_exactly():
    """budgeted_pseudo_labels: the share is measured on the probe's images; the teachers then
    label what the kept steps meet beyond it, each entry as labelling everything would; with
    no probe the share is the one over every met view (the budget without a probe)."""
    torch.manual_seed(0)
    nets = [torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3)) for _ in range(2)]
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))
    u = torch.randint(0, 256, (40, 1, 4, 4), dtype=torch.uint8)
    n_k, log_odds = torch.tensor([1.0, 3.0]), torch.randn(2, 2, 40)
    batches = draw_batches(40, 2, epochs=3, batch_size=8, seed=1)  # 15 steps
    calls = []

    def label(some, targets):
        calls.append(sum(len(b) for b in some))
        return view_pseudo_labels(
            lambda v, s: (teacher_logits(nets, u[s], device=torch.device("cpu"), flip=v == 1),
                          log_odds[v][:, s]), 40, n_k, odds_weights, some, views=2,
            targets=targets)

    def share_of(targets):
        return disagreement(model, u, targets, device=torch.device("cpu"))

    everything = label(batches, None)
    assert probe_batches(batches, 0) == batches and len(probe_batches(batches, 17)) == 3
    full, kept, share = budgeted_pseudo_labels(label, share_of, batches)
    assert share == share_of(everything) and kept == budgeted(batches, share)
    torch.testing.assert_close(full, everything, equal_nan=True)

    calls.clear()
    targets, kept, share = budgeted_pseudo_labels(label, share_of, batches, probe=16)
    probe_share = share_of(label(batches[:2], None))
    assert share == probe_share and kept == budgeted(batches, probe_share)
    labelled = ~targets.isnan().any(-1).flatten()
    assert labelled.nonzero().squeeze(1).tolist() == torch.cat(batches[:max(2, len(kept))]
                                                               ).unique().tolist()
    assert labelled.sum() < (~everything.isnan().any(-1)).sum()  # fewer forwards
    torch.testing.assert_close(targets.flatten(0, 1)[labelled],
                               everything.flatten(0, 1)[labelled])


def test_the_policies_label_all_or_the_budgeted_steps_and_say_the_share():
    batches = [torch.tensor([i]) for i in range(10)]
    seen = []

    def label(some, targets):
        seen.append(len(some))
        return torch.zeros(1, 10, 2) if targets is None else targets

    targets, kept, metrics = FullBudget().pseudo_labels(label, lambda t: 1 / 0, batches)
    assert kept == batches and metrics == {} and seen == [10]  # the share is never asked
    seen.clear()
    _, kept, metrics = DisagreementBudget(probe=3).pseudo_labels(label, lambda t: 0.25, batches)
    assert len(kept) == 3 and metrics == {"disagreement": 0.25} and seen == [3, 3]


def test_budget_policy_names_the_key_and_the_allowed_values():
    assert isinstance(budget_policy("full"), FullBudget)
    assert budget_policy("disagreement", 64).probe == 64
    with pytest.raises(ValueError, match="distill_budget is 'half'; allowed: full, disagreement"):
        budget_policy("half")
    with pytest.raises(ValueError, match="budget_probe is 8; allowed: >= 0, and 0 unless"):
        budget_policy("full", 8)
    with pytest.raises(ValueError, match="budget_probe is -1; allowed: an integer >= 0"):
        DisagreementBudget(-1)
