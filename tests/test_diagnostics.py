"""The label oracle, the per-rule diagnostics, and the round-1 sweep against a real run."""

import json
import math

import pytest
import torch

from fedgo_flwr.diagnostics import ensemble_diagnostics, per_class_diagnostics, phi_stats
from fedgo_flwr.weighting import label_oracle_weights, odds_weights, uniform_weights


def test_label_oracle_gives_weight_one_to_the_only_client_holding_a_class():
    hist = torch.tensor([[5, 0, 3], [0, 0, 1], [2, 7, 0]])  # class 1: client 2 alone
    labels = torch.tensor([1, 0, 2, 1])
    w = label_oracle_weights(hist, labels)
    torch.testing.assert_close(w[:, 0], torch.tensor([0.0, 0.0, 1.0]))
    torch.testing.assert_close(w[:, 1], torch.tensor([5 / 7, 0.0, 2 / 7]))
    torch.testing.assert_close(w[:, 2], torch.tensor([0.75, 0.25, 0.0]))
    torch.testing.assert_close(w.sum(0), torch.ones(4))
    nobody = label_oracle_weights(torch.tensor([[1, 0], [2, 0]]), torch.tensor([1]))
    torch.testing.assert_close(nobody[:, 0], torch.tensor([0.5, 0.5]))


def test_oracle_ensemble_follows_the_expert_and_weights_are_measured_on_its_client():
    # Client k predicts class k confidently on every image; images of class k are client k's.
    k = 3
    labels = torch.tensor([0, 1, 2, 2])
    logits = torch.full((k, 4, k), -5.0)
    for c in range(k):
        logits[c, :, c] = 5.0
    hist = torch.eye(k, dtype=torch.long) * 10
    log_odds = torch.full((k, 4), 0.5)
    active = uniform_weights(logits, log_odds, torch.ones(k))
    diag = ensemble_diagnostics(logits, log_odds, torch.ones(k), labels, active=active,
                                histograms=hist)
    assert diag["logits"]["label-oracle"]["acc"] == 1.0
    assert diag["weight_on_oracle_client"]["label-oracle"] == pytest.approx(1.0)
    assert diag["weight_on_oracle_client"]["uniform"] == pytest.approx(1 / 3)
    assert diag["weight_on_oracle_client"]["active"] == pytest.approx(1 / 3)
    assert diag["logits"]["uniform"]["acc"] < 1.0  # the tie picks one class for all
    assert diag["phi"]["min"] == pytest.approx(math.exp(0.5))
    # With equal odds the odds rule is the size rule, w_k proportional to n_k.
    assert diag["logits"]["odds"] == diag["logits"]["size"]


def test_phi_stats_count_saturation_at_the_cap():
    stats = phi_stats(torch.tensor([[0.0, 1.0], [0.999, 0.5]]))
    assert stats["min"] == pytest.approx(1.0) and stats["max"] == pytest.approx(math.e)
    assert stats["share_near_cap"] == 0.5


def test_sharpened_odds_move_weight_to_the_client_with_higher_odds():
    n = torch.ones(2)
    log_odds = torch.tensor([[0.9], [0.1]])
    w1 = odds_weights(torch.zeros(2, 1, 3), log_odds, n)
    w4 = odds_weights(torch.zeros(2, 1, 3), log_odds, n, beta=4.0)
    assert w4[0, 0] > w1[0, 0] > 0.5
    assert w4[0, 0] / w4[1, 0] == pytest.approx(math.exp(4 * 0.8), rel=1e-5)


def test_sweep_round_one_is_the_runs_round_one(tiny_config, tmp_path):
    """The sweep rebuilds round 1 exactly (same clients, models, generator, discriminators):
    its odds and uniform ensembles equal a real run's diagnostics. Its generator and
    discriminator snapshots equal shorter trainings (the 1-step G and 1-epoch D of the run)."""
    from client_app.app import app as client_app
    from fedgo_lab.inprocess import InProcessGrid
    from fedgo_lab.sweep import sweep
    from server_app.app import run

    cfg = tiny_config.replace(num_server_rounds=1, diagnostics=True, generator_steps=1,
                              discriminator_epochs=1)
    sweep_cfg = cfg.replace(results_dir=str(tmp_path / "sweep-results"))
    rows = sweep(sweep_cfg, [cfg.alpha], 4, [0, 1, 2], [1, 2], [1])
    row = next(r for r in rows if r["generator_steps"] == 1 and r["discriminator_epochs"] == 1)
    record = json.loads(run(InProcessGrid(client_app, cfg.to_run_config(), 4), cfg).read_text())
    assert record["pre_fl"]["generator"]["reused"] is False
    diag = record["rounds"][1]["diagnostics"]
    assert row["clients"] == record["rounds"][1]["clients"]
    for rule in ("odds", "uniform", "label-oracle"):
        assert row["logits"][rule]["acc"] == diag["logits"][rule]["acc"], rule
        # float32 summation order (a GPU's kernels): relative 1e-6, far below any rule's gap
        assert row["logits"][rule]["loss"] == pytest.approx(diag["logits"][rule]["loss"],
                                                            rel=1e-6, abs=1e-6)
    assert row["phi"] == pytest.approx(diag["phi"])
    assert len(rows) == 3 * 2  # generator steps x discriminator epochs, one local-epoch value
    # A run reading the sweep's cache reuses its 1-step generator and ends the same.
    again = json.loads(run(InProcessGrid(client_app, sweep_cfg.to_run_config(), 4),
                           sweep_cfg.replace(run_name="cached")).read_text())
    assert again["pre_fl"]["generator"]["reused"] is True
    assert again["rounds"][1]["server_test_acc"] == record["rounds"][1]["server_test_acc"]


@pytest.mark.parametrize("variant", ["calibrated", "server-sample"])
def test_the_sweeps_discriminator_options_are_what_a_run_with_that_option_gets(
        variant, tiny_config, tmp_path):
    """Each discriminator option beyond the paper, scored by the sweep on round 1's models,
    equals a run with that option alone: its odds ensemble, and the run's own ensemble."""
    from client_app.app import app as client_app
    from fedgo_lab.inprocess import InProcessGrid
    from fedgo_lab.sweep import VARIANTS, sweep
    from server_app.app import run

    negatives, calibration = VARIANTS[variant]
    cfg = tiny_config.replace(num_server_rounds=1, diagnostics=True, generator_steps=1,
                              discriminator_epochs=1, discriminator_negatives=negatives,
                              discriminator_calibration=calibration, server_sample_size=40,
                              calibration_fraction=0.2)
    rows = sweep(cfg.replace(results_dir=str(tmp_path / "sweep")), [cfg.alpha], 4, [1], [1],
                 [1], [variant])
    row, = rows
    record = json.loads(run(InProcessGrid(client_app, cfg.to_run_config(), 4), cfg).read_text())
    first = record["rounds"][1]
    for rule in ("odds", "odds-beta4", "class-count", "label-oracle"):
        assert row["logits"][rule]["acc"] == first["diagnostics"]["logits"][rule]["acc"], rule
    assert first["ensemble_test_acc"] == row["logits"]["odds"]["acc"]
    assert ("odds-unsquashed" in row["logits"]) is (calibration == "none")
    assert ("calibration" in record["pre_fl"]) is (calibration != "none")
    assert ("generator" in record["pre_fl"]) is (negatives == "generator")


def test_the_class_count_rule_from_the_averaged_model_is_the_oracle_when_that_model_is():
    """Two clients, each holding one class: an averaged model that predicts the class right
    makes the class-count ensemble the oracle's; from a wrong prediction it stays wrong."""
    hist = torch.tensor([[10, 0], [0, 10]])
    labels = torch.tensor([0, 1])
    # client 0 is sure of class 0 on image 0, client 1 sure of class 1 on image 1; each is
    # confidently wrong on the other's image
    logits = torch.tensor([[[9.0, 0.0], [3.0, 0.0]], [[0.0, 3.0], [0.0, 9.0]]])
    right = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    half = torch.full((2, 2), 0.5)
    diag = ensemble_diagnostics(logits, None, torch.ones(2), labels, active=half,
                                histograms=hist, averaged_logits=right)
    from_averaged = diag["logits"]["class-count-from-averaged"]["acc"]
    assert from_averaged == diag["logits"]["label-oracle"]["acc"] == 1.0
    assert diag["weight_on_oracle_client"]["class-count-from-averaged"] == 1.0
    wrong = right.flip(-1)
    diag = ensemble_diagnostics(logits, None, torch.ones(2), labels, active=half,
                                histograms=hist, averaged_logits=wrong)
    # All the weight on the wrong client, which agrees with the wrong start: with clients of
    # one class each, iterating cannot leave a wrong start.
    assert diag["logits"]["class-count-from-averaged"]["acc"] == 0.0


def test_the_averaged_model_as_a_member_takes_its_share_of_the_weight():
    """Clients that know nothing (equal logits) leave the decision to the averaged model
    wherever it joins the ensemble; the class count from the uniform ensemble needs no model."""
    labels = torch.tensor([0, 1, 1])
    logits = torch.zeros(3, 3, 2)
    averaged = torch.tensor([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0]])  # right on 2 of 3
    active = torch.full((3, 3), 1 / 3)
    diag = ensemble_diagnostics(logits, None, torch.ones(3), labels, active=active,
                                histograms=torch.tensor([[5, 5], [5, 5], [5, 5]]),
                                averaged_logits=averaged)
    for space in ("logits", "probabilities"):
        assert diag[space]["active+averaged"]["acc"] == pytest.approx(2 / 3)
    assert "class-count" in diag["logits"]  # the registered rule, from the uniform ensemble
    assert "active+averaged" not in ensemble_diagnostics(logits, None, torch.ones(3), labels,
                                                         active=active)["logits"]


def test_the_class_count_rule_from_the_runs_own_ensemble_starts_where_its_weights_point():
    """Started from the run's own ensemble: with weights that find each image's expert it is
    the oracle; with weights on the wrong client it follows them."""
    hist = torch.tensor([[10, 0], [0, 10]])
    labels = torch.tensor([0, 1])
    logits = torch.tensor([[[9.0, 0.0], [3.0, 0.0]], [[0.0, 3.0], [0.0, 9.0]]])
    experts = torch.tensor([[0.9, 0.1], [0.1, 0.9]])
    diag = ensemble_diagnostics(logits, None, torch.ones(2), labels, active=experts,
                                histograms=hist)
    assert diag["logits"]["class-count-from-own"]["acc"] == 1.0
    diag = ensemble_diagnostics(logits, None, torch.ones(2), labels, active=experts.flip(0),
                                histograms=hist)
    assert diag["logits"]["class-count-from-own"]["acc"] == 0.0


def test_per_class_diagnostics_say_on_which_class_the_teacher_falls_behind_the_average():
    # two clients; client 0 holds 9 of class 0's 10 images, client 1 all of class 1's
    hist = torch.tensor([[9, 0, 0], [1, 4, 0]])
    labels = torch.tensor([0, 0, 1, 1])
    teacher = torch.log(torch.tensor([[0.8, 0.1, 0.1], [0.1, 0.8, 0.1],
                                      [0.1, 0.8, 0.1], [0.1, 0.8, 0.1]]))
    averaged = torch.tensor([[5.0, 0, 0], [5.0, 0, 0], [0, 5.0, 0], [5.0, 0, 0]])
    active = torch.tensor([[0.5, 0.25, 0.6, 0.2], [0.5, 0.75, 0.4, 0.8]])
    out = per_class_diagnostics(teacher, averaged, labels, hist, active)
    assert out["teacher_acc"][:2] == [0.5, 1.0] and out["averaged_acc"][:2] == [1.0, 0.5]
    assert out["weight_on_holder"][:2] == pytest.approx([0.375, 0.6])  # client 0, client 1
    assert out["holder_share"][:2] == pytest.approx([0.9, 1.0])
    assert all(math.isnan(x) for x in (out["teacher_acc"][2], out["holder_share"][2]))
