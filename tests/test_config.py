import tomllib

import pytest

from conftest import REPO
from fedgo_flwr.config import Config, ConfigError


def test_pyproject_declares_every_key_with_the_config_default():
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert declared == Config().to_run_config()


def test_run_config_round_trip_and_int_for_float():
    cfg = Config.from_run_config({**Config().to_run_config(), "alpha": 1, "seed": 3})
    assert cfg.alpha == 1.0 and isinstance(cfg.alpha, float) and cfg.seed == 3


@pytest.mark.parametrize("key,value,needle", [
    ("strategy", "fedsgd", "allowed values: dafkd, fedavg, feddf, fedgen, fedgo, fedprox"),
    ("weighting", "magic", "allowed values: domain-aware, entropy, odds, uniform, variance"),
    ("entropy-tau", 0.0, "'entropy-tau' must be > 0"),
    ("server-device", "tpu", "allowed values: auto, cpu, cuda"),
    ("alpha", 0.0, "'alpha' must be > 0"),
    ("fraction-train", 1.5, "'fraction-train' must be in (0, 1]"),
    ("local-epochs", 1.5, "'local-epochs' must be a int"),
    ("flip", "yes", "'flip' must be a bool"),
    ("num-server-rounds", 0, "'num-server-rounds' must be >= 1"),
    ("distill-schedule", "step", "allowed values: constant, cosine"),
    ("ensemble-space", "margins", "allowed values: logits, probabilities"),
    ("odds-beta", 0.0, "'odds-beta' must be > 0"),
    ("feddf-published", True, "it switches FedDF"),
    ("val-size", 100, "only FedDF's published server update reads labelled server data"),
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
