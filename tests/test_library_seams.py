"""The seams of the library's strategies an app plugs into, each a constructor keyword
(issue 90): seeded sampling over stable client keys, the n_k policy, FedProx's clients under
any server, the averaged model as a member, the guard, a distillation set per round and
round observers; and the README's best row as one constructor call."""

import math

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord

from fedgo_app.server import checkpoint
from fedgo_flwr import FedDF, FedGO
from fedgo_flwr.guard import ClientsGuard, LabelledGuard, kept
from fedgo_flwr.presets import BEST_ROW
from fedgo_flwr.sampling import sample_clients
from fedgo_flwr.strategies.base import RoundReport
from fedgo_flwr.weighting import uniform_weights
from fedgo_lab.inprocess import InProcessGrid
from test_library import (NODES, PARTS, SMALL, SMALL_GAN, TEST, TRAINING, U, UserNet, run,
                          user_client_app)

pytestmark = pytest.mark.app


class Reports(list):
    """An observer: every round's RoundReport (FedGO's pre-FL stage, round 0, apart)."""

    def __init__(self):
        super().__init__()
        self.stages = []

    def __call__(self, report: RoundReport) -> None:
        (self if report.server_round else self.stages).append(report)


def test_sampling_is_seeded_over_partition_ids_whatever_the_node_ids():
    """Two grids whose nodes got other ids train the same partitions each round, those
    `sample_clients` draws for the seed; node ids alone would differ."""
    sampled = []
    for first_id in (1000, 5000):
        grid = InProcessGrid(user_client_app(), {}, NODES)
        grid.nodes = {first_id + 7 * i: c for i, c in enumerate(grid.nodes.values())}
        reports = Reports()
        run(FedDF(unlabeled_data=U, model_fn=UserNet, fraction_train=0.5, seed=3,
                  client_key="partition-id", observers=[reports], **SMALL), grid, rounds=3)
        sampled.append([sorted(r.sampled.values()) for r in reports])
        assert all(sorted(m.key for m in r.clients) == sorted(r.sampled.values())
                   for r in reports)  # the round's models, known by partition
    expected = [sample_clients(range(NODES), 0.5, 3, t) for t in (1, 2, 3)]
    assert sampled[0] == sampled[1] == expected
    assert len({tuple(s) for s in expected}) > 1  # the rounds differ: a draw, not a constant


def test_a_bad_client_key_fails_at_construction():
    with pytest.raises(ValueError, match="client_key is 'cid'; allowed: None"):
        FedDF(unlabeled_data=U, model_fn=UserNet, client_key="cid")


def test_the_n_k_policy_weights_the_average_and_the_ensemble():
    reports = Reports()
    capped = FedDF(unlabeled_data=U, model_fn=UserNet, num_examples_fn=lambda key, n: 7,
                   observers=[reports], **SMALL)
    run(capped, rounds=1)
    (report,) = reports
    assert [m.num_examples for m in report.clients] == [7] * NODES
    assert all(m.metrics["num-examples"] == len(PARTS[0][1]) for m in report.clients)


def test_proximal_mu_goes_out_in_every_train_config():
    grid = InProcessGrid(user_client_app(), {}, NODES)
    run(FedGO(unlabeled_data=U, model_fn=UserNet, proximal_mu=0.01, **SMALL, **SMALL_GAN),
        grid, rounds=1)
    sent = [m for m in grid.sent if m.metadata.message_type == "train"]
    assert sent and all(m.content["config"]["proximal-mu"] == 0.01 for m in sent)
    with pytest.raises(ValueError, match="proximal_mu is -1; allowed: a number >= 0"):
        FedDF(unlabeled_data=U, model_fn=UserNet, proximal_mu=-1)


def test_the_average_as_a_member_holds_its_share_of_the_weight():
    reports = Reports()
    member = FedDF(unlabeled_data=U, model_fn=UserNet, averaged_share=0.5,
                   observers=[reports], **SMALL)
    run(member, rounds=1)
    rule = reports[0].details["weighting"]
    logits = torch.randn(NODES + 1, 5, 10)  # the clients' and the average's last
    weights = rule(logits, torch.zeros(NODES, 5), torch.ones(NODES))
    assert torch.allclose(weights[-1], torch.full((5,), 0.5))
    assert torch.allclose(weights[:-1], torch.full((NODES, 5), 0.5 / NODES))
    with pytest.raises(ValueError, match=r"averaged_share is 1; allowed: \[0, 1\)"):
        FedDF(unlabeled_data=U, model_fn=UserNet, averaged_share=1)


def test_the_clients_guard_asks_those_that_did_not_train_and_keeps_the_better_model():
    grid = InProcessGrid(user_client_app(), {}, NODES)
    reports = Reports()
    strategy = FedDF(unlabeled_data=U, model_fn=UserNet, fraction_train=0.5,
                     guard=ClientsGuard(), observers=[reports], **SMALL)
    run(strategy, grid, rounds=2)
    for report in reports:
        guard = report.details["guard"]
        judges = set(guard["clients"])
        assert len(judges) == 2 and not judges & set(report.sampled.values())
        assert guard["scored"] == sorted(judges)
        choice = kept({"averaged": guard["averaged_acc"], "distilled": guard["distilled_acc"]})
        assert guard["kept"] == choice
        new, average = (a.to_torch_state_dict() for a in (report.arrays, report.averaged))
        same = all(torch.equal(new[k], v) for k, v in average.items())
        assert same == (choice == "averaged")  # the global model is the one kept
        assert report.metrics["guard-kept-distilled"] == int(choice == "distilled")
    asked = [m for m in grid.sent if m.metadata.message_type == "evaluate.candidates"]
    assert len(asked) == 4 and all(set(m.content.array_records) == {"averaged", "distilled"}
                                   for m in asked)


def test_fewer_judges_are_the_first_of_the_same_draw():
    """ClientsGuard(judges=1) asks one client, one of those the default guard asks."""
    grid = InProcessGrid(user_client_app(), {}, NODES)
    reports = Reports()
    strategy = FedDF(unlabeled_data=U, model_fn=UserNet, fraction_train=0.5,
                     guard=ClientsGuard(judges=1), observers=[reports], **SMALL)
    run(strategy, grid, rounds=1)
    default = ClientsGuard().judges(strategy, 1)
    judges = reports[0].details["guard"]["clients"]
    assert len(judges) == 1 and set(judges) <= set(default.values())
    assert len([m for m in grid.sent if m.metadata.message_type == "evaluate.candidates"]) == 1
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="judges is .*; allowed: None"):
            ClientsGuard(judges=bad)


def test_a_labelled_guard_scores_on_the_servers_images():
    reports = Reports()
    strategy = FedDF(unlabeled_data=U, model_fn=UserNet, guard=LabelledGuard(TEST),
                     observers=[reports], **SMALL)
    run(strategy, rounds=1)
    guard = reports[0].details["guard"]
    assert guard["judges"] == f"{len(TEST[1])} labelled server images"
    model = UserNet()
    model.load_state_dict(reports[0].arrays.to_torch_state_dict())
    with torch.no_grad():
        acc = (model(TEST[0]).argmax(1) == TEST[1]).float().mean().item()
    assert acc == pytest.approx(max(guard["averaged_acc"], guard["distilled_acc"]), abs=1e-6)
    with pytest.raises(TypeError, match="guard is a str; allowed: None"):
        FedDF(unlabeled_data=U, model_fn=UserNet, guard="clients")


def test_a_distillation_set_per_round_gets_fedgos_odds_on_it():
    sets = {t: U[torch.randperm(len(U), generator=torch.Generator().manual_seed(t))[:40]]
            for t in (1, 2)}
    reports = Reports()
    strategy = FedGO(unlabeled_data=U, model_fn=UserNet, distillation_sets=sets.__getitem__,
                     observers=[reports], **SMALL, **SMALL_GAN)
    run(strategy, rounds=2)
    for t, report in zip((1, 2), reports):
        assert report.details["distillation_set"] is sets[t]
        assert report.details["targets"].shape[1] == 40
    u, odds = strategy.round_odds  # the last round's, from the kept discriminators
    assert u is sets[2] and set(odds) == set(strategy.log_odds)
    assert all(o.shape == (strategy.views, 40) for o in odds.values())
    assert all(r.seconds["odds"] > 0 for r in reports)  # scored anew each round
    (stage,) = reports.stages  # the pre-FL stage: every client's D_k, by node id here
    assert sorted(stage.details["discriminators"]) == sorted(strategy.log_odds)
    assert stage.details["missing"] == [] and stage.bytes["down"] > 0


def test_observers_see_every_round_even_one_without_usable_models():
    def no_model(reply):
        if "arrays" in reply.content.array_records:
            reply.content["arrays"] = ArrayRecord({})
        return reply

    reports = Reports()
    grid = InProcessGrid(user_client_app(), {}, NODES, tamper=no_model)
    run(FedDF(unlabeled_data=U, model_fn=UserNet, observers=[reports], **SMALL), grid,
        rounds=1)
    (report,) = reports
    assert report.clients == [] and report.arrays is None and len(report.left_out) == NODES
    assert report.bytes["up"] == 0


def test_the_readmes_best_row_is_one_constructor_call():
    grid = InProcessGrid(user_client_app(), {}, NODES)
    reports = Reports()
    strategy = FedGO(unlabeled_data=U, model_fn=UserNet, fraction_train=0.5,
                     observers=[reports], **BEST_ROW, **{**SMALL, **SMALL_GAN})
    initial = ArrayRecord(UserNet().state_dict())
    strategy.start(grid=grid, initial_arrays=initial, num_rounds=3,
                   train_config=ConfigRecord({"lr": 0.05}))
    assert strategy.ensemble_space == "probabilities" and strategy.weighting is not \
        uniform_weights
    assert strategy.discriminator_config["calibration-fraction"] == 0.1
    for t, report in enumerate(reports, 1):
        assert report.metrics["past-teachers"] == min(t - 1, 3)
        assert 0 <= report.metrics["disagreement"] <= 1
        assert "guard" in report.details
    train = [m for m in grid.sent if m.metadata.message_type == "train"]
    assert all(m.content["config"]["proximal-mu"] == 0.001 for m in train)


def test_the_default_average_is_the_float64_mean_the_benchmarks_used():
    from fedgo_flwr.aggregation import mean
    reports = Reports()
    strategy = FedDF(unlabeled_data=U, model_fn=UserNet, observers=[reports],
                     **{**SMALL, "distill_epochs": 0})  # no distillation: the average stays
    run(strategy, rounds=1)
    (report,) = reports
    states = [m.state for m in report.clients]
    expected = mean(states, [m.num_examples for m in report.clients], states[0])
    got = report.arrays.to_torch_state_dict()
    assert all(torch.equal(got[k], v) for k, v in expected.items())


def test_the_cosine_schedule_anneals_over_schedule_rounds():
    resumed = FedDF(unlabeled_data=U, model_fn=UserNet, schedule_rounds=10, **SMALL)
    _, result = run(resumed, rounds=2)
    plain = FedDF(unlabeled_data=U, model_fn=UserNet, **SMALL)
    _, short = run(plain, rounds=2)
    lr = [result.train_metrics_clientapp[t]["distill-lr"] for t in (1, 2)]
    assert lr == pytest.approx([1e-3, 0.5e-3 * (1 + math.cos(math.pi / 10))])
    assert short.train_metrics_clientapp[2]["distill-lr"] == pytest.approx(0.5e-3)


def test_feddf_as_published_is_a_keyword_with_its_step_budget_and_labelled_images():
    reports = Reports()
    published = FedDF(unlabeled_data=U, model_fn=UserNet, published=True, published_steps=3,
                      published_batch_size=16, validation_data=TEST, eval_every=1,
                      observers=[reports], **SMALL)
    run(published, rounds=2)
    for report in reports:
        info = report.details["distillation"]
        assert info["distill_steps"] <= 3 and 0 <= info["val_acc"] <= 1
        assert info["distill_lr"] == published.distill_lr  # restarted every round
    with pytest.raises(ValueError, match="validation_data is given, but published is False"):
        FedDF(unlabeled_data=U, model_fn=UserNet, validation_data=TEST)


def test_fedgos_negatives_can_be_a_sample_of_u_and_its_odds_screened():
    grid = InProcessGrid(user_client_app(), {}, NODES)
    reports = Reports()
    strategy = FedGO(unlabeled_data=U, model_fn=UserNet, discriminator_negatives="server-sample",
                     server_sample_size=24, odds_screen=0.0, observers=[reports],
                     **SMALL, **SMALL_GAN)
    run(strategy, grid, rounds=1)
    asked = [m for m in grid.sent if m.metadata.message_type == "train.discriminator"]
    assert len(asked) == NODES and all(
        m.content["server-sample"].to_torch_state_dict()["images"].shape[0] == 24
        and "generator" not in m.content.array_records for m in asked)
    assert strategy.generator is None  # no G trained for a sample of U
    (stage,) = reports.stages
    assert stage.details["screened"]  # z = 0: every D_k off the median is out, not all
    assert set(stage.details["screened"]).isdisjoint(strategy.log_odds) and strategy.log_odds
    with pytest.raises(ValueError, match="discriminator_negatives is 'noise'; allowed"):
        FedGO(unlabeled_data=U, model_fn=UserNet, discriminator_negatives="noise")


def test_failed_rounds_count_only_rounds_with_replies_none_usable_and_reset():
    """max_failed_rounds' count: a round without replies says nothing, a usable reply resets
    it, the limit-th unusable round in a row raises with the first reason, None never does."""
    from fedgo_flwr.strategies.rounds import FailedRounds
    failures = FailedRounds(2)
    failures.count(1, 3, 0, {7: "no ArrayRecord ['arrays']"})
    failures.count(2, 0, 0, {})  # reached nobody
    failures.count(3, 2, 1, {})  # one usable
    assert failures.in_a_row == 0
    failures.count(4, 1, 0, {8: "duplicate reply"})
    with pytest.raises(RuntimeError, match="2 rounds in a row .* round 5: shape"):
        failures.count(5, 1, 0, {9: "shape"})
    never = FailedRounds(None)
    for t in range(5):
        never.count(t, 1, 0, {1: "x"})
    with pytest.raises(ValueError, match="max_failed_rounds is 0; allowed: >= 1 or None"):
        FailedRounds(0)


def test_a_strategy_resumes_from_its_state_dict_where_it_left_off():
    """Two rounds, then `state_dict()` (and the RNG's state); a new FedGO (the README's best row: D_k, odds, past
    teachers, the guard) given it and round 2's model runs rounds 3-4 as the uninterrupted
    run does, without the pre-FL stage, evaluate_fn given the run's rounds."""
    def fedgo(reports):  # (the cosine schedule over the whole run's rounds)
        return FedGO(unlabeled_data=U, model_fn=UserNet, observers=[reports], schedule_rounds=4,
                     **BEST_ROW, **{**SMALL, **SMALL_GAN})

    def start(strategy, arrays, rounds, seen):
        return strategy.start(grid=InProcessGrid(user_client_app(), {}, NODES),
                              initial_arrays=arrays, num_rounds=rounds,
                              train_config=TRAINING, evaluate_fn=lambda t, a: seen.append(t))

    def initial():
        torch.manual_seed(0)
        return ArrayRecord(UserNet().state_dict())

    straight, seen = Reports(), []
    whole = start(fedgo(straight), initial(), 4, seen)
    first, resumed, seen_first, seen_resumed = Reports(), Reports(), [], []
    strategy = fedgo(first)
    halfway = start(strategy, initial(), 2, seen_first)
    state, rng = strategy.state_dict(), checkpoint.rng_states()  # (in-process clients draw
    # from this process's RNGs: the app's checkpoint keeps them too)
    assert state["rounds_done"] == 2 and len(state["discriminators"]) == NODES
    again = fedgo(resumed)
    again.load_state_dict(state)
    checkpoint.set_rng_states(rng)
    rest = start(again, halfway.arrays, 2, seen_resumed)
    assert (seen, seen_first, seen_resumed) == ([0, 1, 2, 3, 4], [0, 1, 2], [3, 4])
    assert not resumed.stages and len(straight.stages) == 1  # no second pre-FL stage
    assert [r.server_round for r in resumed] == [3, 4]
    for a, b in zip(straight[2:], resumed):
        untimed = [{k: v for k, v in r.metrics.items() if not k.endswith("seconds")}
                   for r in (a, b)]
        assert a.sampled == b.sampled and untimed[0] == pytest.approx(untimed[1], nan_ok=True)
    end, got = whole.arrays.to_torch_state_dict(), rest.arrays.to_torch_state_dict()
    assert all(torch.allclose(end[k].double(), got[k].double(), atol=1e-6) for k in end)
