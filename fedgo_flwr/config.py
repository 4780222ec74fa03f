"""One typed, validated configuration built from Flower's flat run config.

Every key is declared in ``pyproject.toml`` under ``[tool.flwr.app.config]`` with the same
default as here (a test keeps the two equal). Keys are kebab-case there and snake_case here.
The keys shared by every strategy are fields below; a strategy's own keys (`fedprox-mu`) are
declared in its module (see strategies/registry.py) and read with `cfg.keys("fedprox")`.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

# Choices that are not registries of their own (those are checked against the registry).
SERVER_DEVICES = ("auto", "cpu", "cuda")
DISTILL_SCHEDULES = ("cosine", "constant")


class ConfigError(ValueError):
    """A run-config key has a value outside what is allowed."""


@dataclass(frozen=True)
class Config:
    # --- what runs
    strategy: str = "fedgo"
    dataset: str = "fmnist"
    model: str = "cnn"
    seed: int = 0
    partition_seed: int = -1  # -1: use `seed`
    data_dir: str = ""  # "": $FEDGO_DATA_DIR or ~/.cache/fedgo-flwr/data
    results_dir: str = ""  # "": $FEDGO_RESULTS_DIR or ~/fedgo-flwr-results
    run_name: str = ""  # "": <strategy>-<dataset>-a<alpha>-s<seed>-<timestamp>
    # --- data
    alpha: float = 0.1  # Dirichlet concentration of the client split
    flip: bool = True  # random horizontal flip of client data and U (paper, App. E.2)
    distill_size: int = 3000  # samples of U used for distillation; 0 = all of U
    test_size: int = 2000  # samples of the test split used for evaluation; 0 = all
    val_size: int = 0  # labelled server images for FedDF-as-published's early stopping
    # --- main FL (Algorithm 2)
    num_server_rounds: int = 5
    fraction_train: float = 0.4  # C
    local_epochs: int = 1
    batch_size: int = 64
    lr: float = 1e-3
    round_timeout: float = 3600.0  # seconds a round (or the pre-FL exchange) waits for replies
    # --- nodes, checkpoints
    join_timeout: float = 300.0  # seconds to wait for every partition's node before pre-FL
    require_all_clients: bool = False  # fail instead of going on without a missing node
    checkpoint_keep: int = 1  # checkpoints kept in <run>/checkpoints (newest); 0 = none
    resume_from: str = ""  # a checkpoint, or a run folder (its newest checkpoint), to go on from
    # --- the server update every ensemble-distillation strategy shares
    server_epochs: int = 1  # E_s
    server_lr: float = 1e-3
    server_batch_size: int = 64
    distill_schedule: str = "cosine"  # server lr over the T rounds: cosine (paper) | constant
    weighting: str = "odds"  # client weighting rule of the ensemble (fedgo)
    entropy_tau: float = 1.0  # temperature of the entropy rule
    odds_beta: float = 1.0  # w_k ~ n_k Phi_k^beta; 1 = the paper
    ensemble_space: str = "logits"  # weights mix logits (Algorithm 2) | probabilities (Thm 3.4)
    diagnostics: bool = False  # every rule, label oracle, Phi stats per round; clients send
    # their label histogram (read by the diagnostics only)
    # --- pre-FL stage (generator G1 and discriminators, Algorithm 3)
    generator_steps: int = 60  # WGAN-GP generator steps on U; 0 = randomly initialised G
    critic_steps: int = 5
    gp_weight: float = 10.0
    gan_lr: float = 2e-4
    gan_batch_size: int = 64
    latent_dim: int = 128
    generator_width: int = 32  # base channels of G and its critic (64 in WGAN-GP)
    discriminator_width: int = 32  # base channels of D_k (64 in DCGAN)
    discriminator_epochs: int = 2
    discriminator_lr: float = 2e-4
    generator_cache: bool = True  # reuse a trained G from <results-dir>/generators
    # --- where server work runs
    server_device: str = "auto"
    server_amp: bool = True  # bf16 mixed precision for server forward passes on a GPU
    # --- the keys strategies declare (kebab-case -> value), each strategy's defaults to start
    strategy_keys: dict = field(default_factory=lambda: _declared_defaults(), hash=False)

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> "Config":
        """Build from Flower's run config (kebab-case keys); unknown keys are an error."""
        by_key = {f.name.replace("_", "-"): f for f in fields(cls) if f.name != "strategy_keys"}
        declared = _declared_keys()
        unknown = sorted(set(run_config) - set(by_key) - set(declared))
        if unknown:
            raise ConfigError(f"unknown run-config key(s) {unknown}; allowed keys: "
                              f"{sorted([*by_key, *declared])}")
        values, strategy_keys = {}, _declared_defaults()
        for key, value in run_config.items():
            if key in declared:
                strategy_keys[key] = _coerce(key, value, type(declared[key][2]))
            else:
                field_ = by_key[key]
                values[field_.name] = _coerce(key, value, type(getattr(cls, field_.name)))
        cfg = cls(**values, strategy_keys=strategy_keys)
        cfg.validate()
        return cfg

    def to_run_config(self) -> dict[str, Any]:
        shared = {f.name.replace("_", "-"): getattr(self, f.name) for f in fields(self)
                  if f.name != "strategy_keys"}
        return {**shared, **self.strategy_keys}

    def replace(self, **changes: Any) -> "Config":
        """A copy with some keys changed, snake_case (`feddf_published=True` sets a strategy's
        key `feddf-published`)."""
        names = {f.name for f in fields(self)}
        declared = _declared_keys()
        own = dict(self.strategy_keys)
        for name in [n for n in changes if n not in names]:
            key = name.replace("_", "-")
            if key not in declared:
                raise ConfigError(f"unknown run-config key {key!r}")
            own[key] = _coerce(key, changes.pop(name), type(declared[key][2]))
        cfg = dataclasses.replace(self, **changes, strategy_keys=own)
        cfg.validate()
        return cfg

    def keys(self, strategy: str):
        """The keys `strategy` declares, as its keys dataclass (defaults where unset)."""
        from fedgo_flwr.strategies import STRATEGIES
        spec = STRATEGIES[strategy]
        return spec.keys(**{name: self.strategy_keys[key]
                            for key, (name, _) in spec.declared_keys().items()})

    # --- derived values
    @property
    def effective_partition_seed(self) -> int:
        return self.seed if self.partition_seed < 0 else self.partition_seed

    @property
    def data_path(self) -> Path:
        default = os.environ.get("FEDGO_DATA_DIR") or "~/.cache/fedgo-flwr/data"
        return Path(self.data_dir or default).expanduser().resolve()

    @property
    def results_path(self) -> Path:
        default = os.environ.get("FEDGO_RESULTS_DIR") or "~/fedgo-flwr-results"
        return Path(self.results_dir or default).expanduser().resolve()

    def validate(self) -> None:
        # Registries are imported here so that config stays importable on its own.
        from fedgo_flwr.data import DATASETS
        from fedgo_flwr.distill import ENSEMBLE_SPACES
        from fedgo_flwr.models import CLASSIFIERS
        from fedgo_flwr.strategies import STRATEGIES
        from fedgo_flwr.weighting import WEIGHTINGS

        choice("strategy", self.strategy, STRATEGIES)
        choice("dataset", self.dataset, DATASETS)
        choice("model", self.model, CLASSIFIERS)
        choice("weighting", self.weighting, WEIGHTINGS)
        choice("server-device", self.server_device, SERVER_DEVICES)
        choice("distill-schedule", self.distill_schedule, DISTILL_SCHEDULES)
        choice("ensemble-space", self.ensemble_space, ENSEMBLE_SPACES)
        check("alpha", self.alpha > 0, "must be > 0")
        check("fraction-train", 0 < self.fraction_train <= 1, "must be in (0, 1]")
        for key in ("num-server-rounds", "batch-size", "server-batch-size",
                    "gan-batch-size", "latent-dim", "critic-steps", "generator-width",
                    "discriminator-width"):
            check(key, getattr(self, key.replace("-", "_")) >= 1, "must be >= 1")
        for key in ("local-epochs", "server-epochs", "generator-steps",
                    "discriminator-epochs", "distill-size", "test-size", "seed", "val-size",
                    "checkpoint-keep"):
            check(key, getattr(self, key.replace("-", "_")) >= 0, "must be >= 0")
        for key in ("lr", "server-lr", "gan-lr", "discriminator-lr", "round-timeout", "entropy-tau",
                    "odds-beta", "join-timeout"):
            check(key, getattr(self, key.replace("-", "_")) > 0, "must be > 0")
        check("gp-weight", self.gp_weight >= 0, "must be >= 0")
        for name, spec in STRATEGIES.items():  # each strategy checks its own keys
            if spec.keys is not None and hasattr(spec.keys, "validate"):
                self.keys(name).validate(self)


def _declared_keys() -> dict[str, tuple[str, str, Any]]:
    from fedgo_flwr.strategies import STRATEGIES
    return STRATEGIES.declared_keys()


def _declared_defaults() -> dict[str, Any]:
    return {key: default for key, (_, _, default) in _declared_keys().items()}


def _coerce(key: str, value: Any, kind: type) -> Any:
    """Flower gives TOML values; an int where a float is declared is fine, not the reverse."""
    if kind is bool:
        if isinstance(value, bool):
            return value
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif kind is str:
        if isinstance(value, str):
            return value
    raise ConfigError(f"run-config key '{key}' must be a {kind.__name__}, got {value!r}")


def choice(key: str, value: str, allowed: Mapping[str, Any] | tuple[str, ...]) -> None:
    """Fail with a message naming the key and the allowed values unless value is one."""
    if value not in allowed:
        raise ConfigError(
            f"run-config key '{key}' is {value!r}; allowed values: {', '.join(sorted(allowed))}"
        )


def check(key: str, ok: bool, why: str) -> None:
    """Fail with a message naming the key unless `ok`."""
    if not ok:
        raise ConfigError(f"run-config key '{key}' {why}")
