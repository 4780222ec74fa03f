import tomllib

import pytest

from conftest import REPO
from fedgo_app.config import Config, ConfigError


def test_pyproject_declares_every_key_with_the_config_default():
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert declared == Config().to_run_config()


def test_run_config_round_trip_and_int_for_float():
    cfg = Config.from_run_config({**Config().to_run_config(), "alpha": 1, "seed": 3})
    assert cfg.alpha == 1.0 and isinstance(cfg.alpha, float) and cfg.seed == 3


@pytest.mark.parametrize("key,value,needle", [
    ("strategy", "fedsgd", "allowed: dafkd, fedavg, fedbpg, feddf, feddisco, fedgen, fedgkd, fedgo, fedprox, fedtgp, feduv, scaffold"),
    ("weighting", "magic", "allowed: class-count, domain-aware, entropy, odds, odds-unsquashed, uniform, variance"),
    ("entropy-tau", 0.0, "'entropy-tau' is 0.0; allowed: > 0"),
    ("server-device", "tpu", "allowed: auto, cpu, cuda"),
    ("alpha", 0.0, "'alpha' is 0.0; allowed: > 0"),
    ("fraction-train", 1.5, "'fraction-train' is 1.5; allowed: in (0, 1]"),
    ("local-epochs", 1.5, "'local-epochs' is 1.5; allowed: an integer"),
    ("flip", "yes", "'flip' is 'yes'; allowed: true or false"),
    ("num-server-rounds", 0, "'num-server-rounds' is 0; allowed: >= 1"),
    ("distill-schedule", "step", "allowed: constant, cosine"),
    ("ensemble-space", "margins", "allowed: logits, probabilities"),
    ("odds-beta", 0.0, "'odds-beta' is 0.0; allowed: > 0"),
    ("feddf-published", True, "it switches FedDF"),
    ("val-size", 100, "only FedDF's published server update and distillation-guard"),
    ("distillation-guard", "labelled-val", "'val-size' is 0"),
    ("guard-judges", 4, "'distillation-guard' is 'none'"),
    ("guard-judges", -1, "'guard-judges' is -1; allowed: >= 0"),
])
def test_bad_values_fail_naming_key_and_allowed_values(key, value, needle):
    with pytest.raises(ConfigError) as err:
        Config.from_run_config({key: value})
    assert key in str(err.value) and needle in str(err.value)


def test_unknown_key_is_rejected():
    with pytest.raises(ConfigError, match="unknown run-config key"):
        Config.from_run_config({"num-rounds": 3})


def test_partition_seed_defaults_to_seed():
    assert Config(seed=5).effective_partition_seed == 5
    assert Config(seed=5, partition_seed=9).effective_partition_seed == 9


@pytest.mark.parametrize("changes, unread", [
    ({}, []),
    ({"strategy": "fedgo", "odds-beta": 4.0, "fedprox-mu": 0.1}, ["fedprox-mu"]),
    ({"strategy": "feddf", "weighting": "entropy", "odds-beta": 4.0, "generator-steps": 0},
     ["weighting", "odds-beta", "generator-steps"]),
    ({"strategy": "fedavg", "server-epochs": 3, "lr": 0.01, "dafkd-gan-rounds": 1},
     ["server-epochs", "dafkd-gan-rounds"]),
    # FedProx under FedGO reads FedGO's keys and its own.
    ({"strategy": "fedprox", "fedprox-base": "fedgo", "odds-beta": 4.0, "fedprox-mu": 0.1,
      "feddf-steps": 3}, ["feddf-steps"]),
    ({"strategy": "dafkd", "latent-dim": 64, "discriminator-epochs": 3},
     ["discriminator-epochs"]),
])
def test_keys_the_strategy_never_reads_are_named(changes, unread):
    cfg = Config.from_run_config(changes)
    assert sorted(cfg.unread_keys()) == sorted(unread)
