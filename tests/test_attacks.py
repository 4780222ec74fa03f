"""Byzantine clients: each attack changes exactly what it says, on the partitions named, through
the real ClientApp (in process); the record names the liars."""

import json

import numpy as np
import pytest
import torch

from client_app.app import app as client_app
from fedgo_app.attacks import INFLATED_EXAMPLES, byzantine_partitions
from fedgo_flwr.gan import log_odds
from fedgo_flwr.keys import ConfigError
from fedgo_flwr.models import Discriminator
from fedgo_lab.inprocess import InProcessGrid
from server_app.app import run

pytestmark = pytest.mark.app
LIAR = 2


def _partition(reply):
    return (reply.metadata.src_node_id - 1000) // 17


def _run(cfg, message_type="train"):
    """One round with every client; the replies of `message_type` by partition, the model
    each was sent, and the record."""
    replies = {}

    def capture(reply):
        if reply.metadata.message_type == message_type and not reply.has_error():
            replies[_partition(reply)] = reply
        return reply

    cfg = cfg.replace(fraction_train=1.0, num_server_rounds=1)
    grid = InProcessGrid(client_app, cfg.to_run_config(), 4, tamper=capture)
    record = json.loads(run(grid, cfg).read_text())
    sent = next(m for m in grid.sent if m.metadata.message_type == message_type)
    return replies, sent, record


def _state(message, key="arrays"):
    return message.content.array_records[key].to_torch_state_dict()


def test_the_liars_are_a_seeded_choice_or_a_list():
    five = byzantine_partitions(5, "", 20, seed=0)
    assert len(set(five)) == 5 and five == byzantine_partitions(5, "", 20, seed=0)
    assert five != byzantine_partitions(5, "", 20, seed=1)
    assert byzantine_partitions(0, "7, 3,3", 20, 0) == [3, 7]
    assert byzantine_partitions(0, "", 20, 0) == []
    with pytest.raises(ValueError, match="outside 0..19"):
        byzantine_partitions(0, "3,20", 20, 0)
    with pytest.raises(ValueError, match="there are 20"):
        byzantine_partitions(21, "", 20, 0)


def test_attack_and_liars_go_together(tiny_config):
    with pytest.raises(ConfigError, match="'attack' is 'scale' while 'byzantine-clients' is 0"):
        tiny_config.replace(attack="scale").validate()
    with pytest.raises(ConfigError, match="'attack' is 'none' while 'byzantine-clients' is 2"):
        tiny_config.replace(byzantine_clients=2).validate()
    with pytest.raises(ConfigError, match="'byzantine-partitions' is 'one'"):
        tiny_config.replace(attack="scale", byzantine_partitions="one").validate()
    with pytest.raises(ConfigError, match="both name the liars"):
        tiny_config.replace(attack="scale", byzantine_clients=1,
                            byzantine_partitions="0").validate()


@pytest.mark.parametrize("attack,s", [("sign-flip", 1.0), ("scale", 10.0), ("gaussian", 0.5)])
def test_model_attacks_send_what_they_say_and_honest_clients_are_untouched(
        tiny_config, attack, s):
    cfg = tiny_config.replace(strategy="fedavg")
    honest, sent, _ = _run(cfg)
    lying, sent_again, record = _run(cfg.replace(attack=attack, byzantine_partitions=str(LIAR),
                                                 attack_scale=s, run_name="attacked"))
    assert record["clients"]["byzantine"] == {"attack": attack, "scale": s,
                                              "partitions": [LIAR]}
    g = _state(sent)
    assert all(torch.equal(g[k], v) for k, v in _state(sent_again).items())
    for p in range(4):
        theirs, ours = _state(honest[p]), _state(lying[p])
        if p != LIAR:  # the same training, bit for bit
            assert all(torch.equal(theirs[k], ours[k]) for k in theirs)
            continue
        for name, trained in theirs.items():
            if not trained.is_floating_point():
                assert torch.equal(ours[name], trained)
            elif attack == "gaussian":
                noise = ours[name] - g[name]
                if noise.numel() > 1000:
                    assert abs(noise.std().item() - s) < 0.05 * s
            else:
                delta = trained - g[name]
                torch.testing.assert_close(ours[name],
                                           g[name] + (-s if attack == "sign-flip" else s) * delta)


def test_label_flip_trains_the_liar_on_flipped_labels(tiny_config, monkeypatch):
    seen = {}
    import fedgo_flwr.strategies.label_counts as loop  # the library's ClientUpdate, the app's
    real = loop.train_classifier

    def spy(model, x, y, **kw):
        seen[len(seen)] = (x.clone(), y.clone())
        return real(model, x, y, **kw)

    monkeypatch.setattr(loop, "train_classifier", spy)
    cfg = tiny_config.replace(strategy="fedavg", attack="label-flip", byzantine_partitions="1")
    _run(cfg)
    from fedgo_app import data
    truth = {p: data.client_data(cfg, p, 4) for p in range(4)}
    for x, y in seen.values():
        p = next(p for p, (tx, _) in truth.items() if torch.equal(tx, x))
        assert torch.equal(y, 9 - truth[p][1] if p == 1 else truth[p][1])


def test_an_inflating_client_reports_a_million_examples_everywhere(tiny_config):
    cfg = tiny_config.replace(strategy="fedavg", attack="inflate-examples",
                              byzantine_partitions="0,3")
    replies, _, record = _run(cfg)
    assert record["clients"]["num_examples"]["0"] == INFLATED_EXAMPLES  # at discovery
    assert record["clients"]["num_examples"]["1"] < 1000
    assert replies[3].content.metric_records["metrics"]["num-examples"] == INFLATED_EXAMPLES
    assert replies[1].content.metric_records["metrics"]["num-examples"] < 1000


def test_the_papers_byzantine_discriminator_has_the_highest_odds_everywhere(tiny_config):
    cfg = tiny_config.replace(attack="discriminator-max", byzantine_partitions=str(LIAR))
    replies, _, _ = _run(cfg, "train.discriminator")
    images = torch.randint(0, 256, (64, 1, 28, 28), dtype=torch.uint8)
    for p, reply in replies.items():
        d = Discriminator(1, 28, cfg.discriminator_width)
        d.load_state_dict(_state(reply, "discriminator"))
        odds = log_odds(d, images, device=torch.device("cpu"))
        if p == LIAR:  # log Phi = 1: Phi at its cap e on every image
            torch.testing.assert_close(odds, torch.ones_like(odds), atol=1e-4, rtol=0)
        else:
            assert odds.min() < 0.99
    assert np.isfinite(replies[0].content.metric_records["metrics"]["discriminator-loss"])


@pytest.mark.parametrize("cap", [0.0, 1.5])
def test_a_sample_size_cap_bounds_the_weight_of_a_client_reporting_a_million(tiny_config, cap):
    """Partition 0 reports 10^6 examples: without a cap FedAvg's model is (almost) its model;
    with sample-size-cap = 1.5 it weighs at most 1.5 x the median n_k of discovery."""
    import statistics
    replies = {}

    def capture(reply):
        if reply.metadata.message_type == "train" and not reply.has_error():
            replies[_partition(reply)] = _state(reply)
        return reply

    cfg = tiny_config.replace(strategy="fedavg", attack="inflate-examples",
                              byzantine_partitions="0", sample_size_cap=cap,
                              fraction_train=1.0, num_server_rounds=1)
    grid = InProcessGrid(client_app, cfg.to_run_config(), 4, tamper=capture)
    path = run(grid, cfg)
    model = torch.load(path.parent / "model.pt")
    reported = {int(p): n for p, n in json.loads(path.read_text())["clients"][
        "num_examples"].items()}
    assert reported[0] == INFLATED_EXAMPLES
    bound = int(cap * statistics.median(reported.values())) if cap else INFLATED_EXAMPLES
    weights = {p: min(n, bound) for p, n in reported.items()}
    assert (weights[0] < 2 * max(weights[p] for p in (1, 2, 3))) == (cap > 0)
    for name, value in model.items():
        if value.is_floating_point():
            expected = sum(replies[p][name].double() * w for p, w in weights.items()) / sum(
                weights.values())
            torch.testing.assert_close(value, expected.float(), rtol=1e-5, atol=1e-6)


def test_the_screen_flags_saturated_constant_and_outlying_odds_only():
    from fedgo_flwr.defences import screen_odds
    torch.manual_seed(0)
    honest = torch.rand(8, 500) * 0.6  # log Phi in [0, 0.6): honest odds, no two alike
    honest[:, :60] = 0.995  # each sure of "its" 12 % of U
    byzantine = torch.full((1, 500), 0.9999)
    flat = torch.full((1, 500), 0.3)
    odd = torch.rand(1, 500) * 0.05  # doubts every image: far below the rest
    flagged = screen_odds(torch.cat([honest, byzantine, flat, odd]), capped=True, z=3.5)
    assert set(flagged) == {8, 9, 10}
    assert flagged[8].startswith("saturated") and flagged[9].startswith("constant")
    assert flagged[10].startswith("outlier")
    # with half the discriminators saturated the saturation rule still finds every one
    many = torch.cat([honest, byzantine.repeat(8, 1)])
    assert set(screen_odds(many, capped=True, z=3.5)) == set(range(8, 16))


def test_the_odds_screen_policy_drops_the_flagged_discriminators_and_never_all():
    """FedGO's `odds_screen` as a policy: the flagged D_k leave the odds and the kept
    discriminators (keyed by client), the reasons are returned, a screen that would leave
    none raises, and z names the keyword."""
    from fedgo_flwr.defences import OddsScreen
    honest = range(8)  # log Phi spread over [0, 0.6], means 0.001 apart
    log_odds = {k: torch.linspace(0, 0.6, 200)[None] + 0.001 * k for k in honest}
    log_odds[9] = torch.full((1, 200), 0.3)  # constant
    discriminators = {k: object() for k in log_odds}
    screened = OddsScreen(3.5).apply(log_odds, discriminators, capped=True)
    assert set(screened) == {9} and screened[9].startswith("constant")
    assert set(log_odds) == set(discriminators) == set(honest)
    with pytest.raises(RuntimeError, match="the screen left no discriminator"):
        OddsScreen(3.5).apply({1: torch.full((1, 50), 0.2)}, {1: None}, capped=False)
    with pytest.raises(ValueError, match="odds_screen is -1; allowed: a number >= 0, or None"):
        OddsScreen(-1)


@pytest.mark.parametrize("liars", ["2", "0,1"])
def test_the_screen_leaves_the_papers_byzantine_discriminators_out_and_honest_ones_in(
        tiny_config, liars):
    cfg = tiny_config.replace(attack="discriminator-max", byzantine_partitions=liars,
                              discriminator_screen="odds", distill_size=200)
    _, _, record = _run(cfg, "train.discriminator")
    screened = record["pre_fl"]["screened"]
    assert sorted(screened) == sorted(liars.split(","))
    assert all(why.startswith("saturated") for why in screened.values())


@pytest.mark.parametrize("attack", ["alie", "ipm"])
def test_colluding_liars_send_byzfls_attack_on_the_honest_updates(attack):
    """ALIE: theta_g + mean + tau * std (ddof 1) of the honest updates; IPM: theta_g - tau x
    their mean; honest models and integer buffers untouched."""
    pytest.importorskip("byzfl")
    from fedgo_app.attacks import colluded
    torch.manual_seed(1)
    sent = {"w": torch.randn(3, 2), "count": torch.tensor(4)}
    states = [{"w": sent["w"] + torch.randn(3, 2), "count": torch.tensor(9)} for _ in range(5)]
    liars = [False, True, False, False, True]
    out = colluded(attack, 1.5, states, liars, sent)
    deltas = torch.stack([s["w"] - sent["w"] for s, liar in zip(states, liars) if not liar])
    expected = (sent["w"] + deltas.mean(0) + 1.5 * deltas.std(0) if attack == "alie"
                else sent["w"] - 1.5 * deltas.mean(0))
    for state, before, liar in zip(out, states, liars):
        torch.testing.assert_close(state["w"], expected if liar else before["w"])
        assert torch.equal(state["count"], before["count"])


def test_an_alie_run_aggregates_the_crafted_models(tiny_config):
    pytest.importorskip("byzfl")
    cfg = tiny_config.replace(strategy="fedavg", attack="alie", byzantine_partitions="1",
                              attack_scale=1.5)
    honest, sent, record = _run(cfg)
    assert record["clients"]["byzantine"]["partitions"] == [1]
    assert record["clients"]["byzantine"]["attack"] == "alie"
    _, _, clean = _run(tiny_config.replace(strategy="fedavg", run_name="clean"))
    # the clients answered alike; the server model differs by the crafted one alone
    assert record["rounds"][1]["server_test_loss"] != clean["rounds"][1]["server_test_loss"]
    assert np.isfinite(record["rounds"][1]["server_test_loss"])


def test_colluding_attacks_without_byzfl_fail_naming_the_extra(tiny_config, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "byzfl", None)  # as if it were not installed
    with pytest.raises(ConfigError, match=r"'attack' is 'ipm', which needs ByzFL.*byzantine"):
        tiny_config.replace(attack="ipm", byzantine_clients=1).validate()
