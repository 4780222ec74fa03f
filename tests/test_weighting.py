import math

import torch

from fedgo_flwr.weighting import WEIGHTINGS, log_odds_of, odds_weights, weighting_rule


def gaussian(x, mean, std):
    return torch.exp(-0.5 * ((x - mean) / std) ** 2) / (std * math.sqrt(2 * math.pi))


def test_odds_weights_are_the_optimal_weights_of_theorem_3_6():
    # K clients with known 1-D densities p_k, a wide generator density p_g, and the optimal
    # discriminators of Theorem 2.1: D_k = p_k / (p_k + p_g).
    x = torch.linspace(-6, 6, 401, dtype=torch.float64)
    p = torch.stack([gaussian(x, -2.0, 1.0), gaussian(x, 0.5, 0.7), gaussian(x, 2.5, 1.5)])
    p_g = gaussian(x, 0.0, 4.0)
    n = torch.tensor([300.0, 120.0, 580.0], dtype=torch.float64)
    d = p / (p + p_g)
    logits = torch.zeros(3, len(x), 10, dtype=torch.float64)

    w = odds_weights(logits, log_odds_of(d), n)

    pi = n / n.sum()
    optimal = pi[:, None] * p / (pi[:, None] * p).sum(0)
    torch.testing.assert_close(w, optimal, rtol=1e-9, atol=1e-12)


def test_odds_weights_sum_to_one_and_reduce_to_n_k_with_equal_discriminators():
    n = torch.tensor([10.0, 30.0, 60.0])
    log_odds = torch.full((3, 5), 0.7)
    w = odds_weights(torch.zeros(3, 5, 4), log_odds, n)
    torch.testing.assert_close(w, (n / n.sum())[:, None].expand(3, 5))
    w = odds_weights(torch.zeros(3, 5, 4), torch.rand(3, 5), n)
    torch.testing.assert_close(w.sum(0), torch.ones(5))


def test_odds_weights_bounded_by_the_double_sigmoid():
    # With log Phi in (0, 1), one client's weight relative to equal-size peers is at most e.
    n = torch.ones(4)
    log_odds = torch.tensor([[1.0], [0.0], [0.0], [0.0]])
    w = odds_weights(torch.zeros(4, 1, 2), log_odds, n)
    assert math.isclose((w[0] / w[1]).item(), math.e, rel_tol=1e-6)


def test_uniform_weights():
    w = WEIGHTINGS["uniform"](torch.randn(4, 3, 5), torch.rand(4, 3), torch.tensor([1., 2, 3, 4]))
    torch.testing.assert_close(w, torch.full((4, 3), 0.25))


def test_variance_rule_by_hand():
    logits = torch.tensor([[[1.0, -1.0]], [[3.0, -3.0]]])  # variances 1 and 9
    w = WEIGHTINGS["variance"](logits, torch.zeros(2, 1), torch.ones(2))
    torch.testing.assert_close(w, torch.tensor([[0.1], [0.9]]))


def test_entropy_rule_by_hand():
    from fedgo_flwr.weighting import weighting_rule
    # client 0 is uniform over 2 classes (entropy log 2), client 1 certain-ish
    logits = torch.tensor([[[0.0, 0.0]], [[20.0, 0.0]]])
    h1 = -(torch.softmax(logits[1, 0], -1) * torch.log_softmax(logits[1, 0], -1)).sum()
    for tau in (1.0, 2.0):
        e = torch.exp(-torch.tensor([math.log(2), h1.item()]) / tau)
        w = weighting_rule("entropy", entropy_tau=tau)(logits, torch.zeros(2, 1), torch.ones(2))
        torch.testing.assert_close(w[:, 0], e / e.sum())


def test_domain_aware_rule_by_hand():
    d = torch.tensor([[0.6], [0.9]])
    w = WEIGHTINGS["domain-aware"](torch.zeros(2, 1, 3), log_odds_of(d),
                                   torch.tensor([1.0, 100.0]))  # n_k plays no part
    torch.testing.assert_close(w, torch.tensor([[0.4], [0.6]]))


def test_every_rule_sums_to_one_and_permutes_with_the_clients():
    torch.manual_seed(0)
    logits, log_odds = torch.randn(5, 7, 10), torch.rand(5, 7)
    n = torch.tensor([5.0, 50.0, 500.0, 7.0, 70.0])
    perm = torch.tensor([3, 0, 4, 1, 2])
    hist = torch.randint(0, 20, (5, 10))  # label counts, for the rules that read them
    for name in WEIGHTINGS:
        w = weighting_rule(name, histograms=hist)(logits, log_odds, n)
        assert w.shape == (5, 7), name
        torch.testing.assert_close(w.sum(0), torch.ones(7), msg=name)
        assert (w >= 0).all(), name
        permuted = weighting_rule(name, histograms=hist[perm])
        torch.testing.assert_close(permuted(logits[perm], log_odds[perm], n[perm]), w[perm],
                                   msg=name)


def test_class_count_weights_with_true_labels_are_the_label_oracle():
    from fedgo_flwr.weighting import class_count_weights, label_oracle_weights
    hist = torch.tensor([[5, 0, 1], [0, 4, 1], [1, 1, 0]])
    labels = torch.tensor([0, 1, 2, 2, 0])
    assert torch.equal(class_count_weights(hist, labels), label_oracle_weights(hist, labels))
    w = class_count_weights(hist, torch.tensor([1]))  # predicted class 1: 0, 4 and 1 of 5
    assert torch.allclose(w[:, 0], torch.tensor([0.0, 0.8, 0.2]))


def test_unsquashed_odds_lift_the_cap_the_double_sigmoid_puts_on_a_sure_client():
    from fedgo_flwr.weighting import odds_weights, unsquashed_odds_weights, weighting_rule
    logit = torch.tensor([[8.0], [0.0], [0.0]])  # one sure discriminator, two unsure
    log_phi = torch.sigmoid(logit)  # what FedGO's double-sigmoid D gives as log Phi
    n = torch.ones(3)
    capped = odds_weights(None, log_phi, n)[0, 0]
    assert capped < torch.e / (torch.e + 2 * torch.exp(torch.tensor(0.5))) + 1e-6
    lifted = unsquashed_odds_weights(None, log_phi, n)[0, 0]
    assert lifted > 0.99 and torch.isclose(lifted, torch.softmax(logit[:, 0], 0)[0], atol=1e-4)
    hot = weighting_rule("odds-unsquashed", odds_beta=0.25)(None, log_phi, n)[0, 0]
    assert torch.isclose(hot, torch.softmax(logit[:, 0] / 4, 0)[0], atol=1e-4)


def test_the_class_count_rule_needs_label_counts_and_finds_the_holder_of_the_class():
    import pytest
    from fedgo_flwr.weighting import weighting_rule
    with pytest.raises(ValueError, match="label counts"):
        weighting_rule("class-count")
    hist = torch.tensor([[10, 0, 0], [0, 10, 0], [0, 0, 10]])
    # every client leans to its own class a little; the uniform ensemble gets image 0 right
    logits = torch.tensor([[[3.0, 0.0, 0.0]], [[0.0, 1.5, 0.0]], [[0.0, 0.0, 1.0]]])
    w = weighting_rule("class-count", histograms=hist)(logits, torch.zeros(3, 1), torch.ones(3))
    assert torch.equal(w[:, 0], torch.tensor([1.0, 0.0, 0.0]))
