"""One typed, validated configuration built from Flower's flat run config.

Every key is declared once, in fedgo_app/config_keys.py (the keys every strategy shares) or in
its strategy's module (`<strategy>-<field>`, e.g. `fedprox-mu`), with `keys.key(default, meaning, allowed, groups)`;
pyproject.toml mirrors the defaults under `[tool.flwr.app.config]` (a test keeps them equal)
and docs/configuration.md is generated from the declarations (a test keeps it current). Keys
are kebab-case there and snake_case here.

The config validates against the registries (strategies, datasets, models, weighting rules),
which never import it.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from fedgo_app.attacks import COLLUDING, byzfl_problem
from fedgo_app.config_keys import (EVERY_STRATEGY, GROUPS, DataKeys, DistillationKeys, NodeKeys,
                                   PreFLKeys, RoundKeys, RunKeys)
from fedgo_app.strategies import STRATEGIES
from fedgo_flwr.aggregation import Aggregation
from fedgo_flwr.keys import (ConfigError, Declared, check, check_fields, choice, coerce,
                             declared)

__all__ = ["Config", "ConfigError", "GROUPS", "check", "choice"]


def unknown_keys_problem(unknown: list[str], known) -> str:
    """One line naming each unknown key and the declared keys it is close to."""
    def close(name: str) -> str:
        near = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
        return f"{name!r} (close: {', '.join(near)})" if near else repr(name)
    return (f"unknown run-config key{'s' if len(unknown) > 1 else ''} "
            f"{'; '.join(close(k) for k in unknown)}; every key is in docs/configuration.md")


@dataclass(frozen=True)
class Config(PreFLKeys, DistillationKeys, NodeKeys, RoundKeys, DataKeys, RunKeys):
    """Every key of the run config: the shared ones (fedgo_app.config_keys, in the
    reference's order) and the strategies' own (`strategy_keys`)."""
    # --- the keys strategies declare (kebab-case -> value), each strategy's defaults to start
    strategy_keys: dict = field(default_factory=lambda: strategy_defaults(), hash=False)

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> "Config":
        """Build from Flower's run config (kebab-case keys); unknown keys are an error."""
        known = declared_keys()
        unknown = sorted(set(run_config) - set(known))
        if unknown:
            raise ConfigError(unknown_keys_problem(unknown, known))
        values, strategy_keys = {}, strategy_defaults()
        for name, value in run_config.items():
            d = known[name]
            if name in SHARED_NAMES:
                values[d.field] = coerce(name, value, d.kind)
            else:
                strategy_keys[name] = coerce(name, value, d.kind)
        cfg = cls(**values, strategy_keys=strategy_keys)
        cfg.validate()
        return cfg

    def to_run_config(self) -> dict[str, Any]:
        shared = {d.name: getattr(self, d.field) for d in SHARED}
        return {**shared, **self.strategy_keys}

    def replace(self, **changes: Any) -> "Config":
        """A copy with some keys changed, snake_case (`feddf_published=True` sets a strategy's
        key `feddf-published`)."""
        own, theirs = dict(self.strategy_keys), {d.name: d for d in strategy_declared()}
        for name in [n for n in changes if n not in SHARED_FIELDS]:
            kebab = name.replace("_", "-")
            if kebab not in theirs:
                raise ConfigError(f"unknown run-config key {kebab!r}")
            own[kebab] = coerce(kebab, changes.pop(name), theirs[kebab].kind)
        cfg = dataclasses.replace(self, **changes, strategy_keys=own)
        cfg.validate()
        return cfg

    def keys(self, strategy: str):
        """The keys `strategy` declares, as its keys dataclass (defaults where unset)."""
        spec = STRATEGIES[strategy]
        return spec.keys(**{d.field: self.strategy_keys[d.name]
                            for d in declared(spec.keys, spec.name)})

    def keywords(self, strategy: str) -> dict:
        """The keys `strategy` declares as the library strategy's keywords of the same
        names."""
        return dataclasses.asdict(self.keys(strategy))

    def unread_keys(self) -> list[str]:
        """Keys set away from their default that the chosen strategy never reads."""
        reads = {*EVERY_STRATEGY, *STRATEGIES.reads(self.strategy, self.strategy_keys),
                 *((self.client_method,) if self.client_method else ())}
        given = self.to_run_config()
        return [name for name, d in declared_keys().items()
                if given[name] != d.default and not reads.intersection(d.groups)]

    # --- derived values
    @property
    def effective_partition_seed(self) -> int:
        return self.seed if self.partition_seed < 0 else self.partition_seed

    @property
    def aggregation(self) -> Aggregation:
        return Aggregation(self.aggregator, self.aggregator_byzantine, self.aggregator_select,
                           self.aggregator_trim)

    @property
    def calibrated_odds(self) -> bool:
        """The discriminators are calibrated: their odds have no cap e."""
        return self.discriminator_calibration != "none"

    @property
    def data_path(self) -> Path:
        default = os.environ.get("FEDGO_DATA_DIR") or "~/.cache/fedgo-flwr/data"
        return Path(self.data_dir or default).expanduser().resolve()

    @property
    def results_path(self) -> Path:
        default = os.environ.get("FEDGO_RESULTS_DIR") or "~/fedgo-flwr-results"
        return Path(self.results_dir or default).expanduser().resolve()

    @property
    def reads_server_data(self) -> bool:
        """Whether the server opens its unlabeled set U: not when it distils on a generated set
        from a generator it did not train on U (FedGO's S2 rows)."""
        return (self.distill_set == "server-data" or self.generator_source == "train-on-u"
                or self.discriminator_negatives == "server-sample")

    def validate(self) -> None:
        check_fields(self)
        if self.generator_source == "load" and not self.generator_file:
            raise ConfigError("run-config key 'generator-source' is 'load' and "
                              "'generator-file' is empty: name the generator file")
        if self.attack in COLLUDING and (why := byzfl_problem()):
            raise ConfigError(f"run-config key 'attack' is {self.attack!r}, which {why}")
        liars = self.byzantine_clients > 0 or bool(self.byzantine_partitions.strip())
        if self.byzantine_clients > 0 and self.byzantine_partitions.strip():
            raise ConfigError("run-config keys 'byzantine-clients' and 'byzantine-partitions' "
                              "both name the liars: set one")
        if (self.attack == "none") == liars:
            raise ConfigError(f"run-config key 'attack' is {self.attack!r} while "
                              f"'byzantine-clients' is {self.byzantine_clients} and "
                              f"'byzantine-partitions' is {self.byzantine_partitions!r}: name "
                              "both the attack and the clients that make it, or neither")
        if self.redraw_distill_set and self.distill_set != "generated":
            raise ConfigError("run-config key 'redraw-distill-set' is true and 'distill-set' "
                              f"is {self.distill_set!r}: only a generated set (distill-set = "
                              "\"generated\") can be redrawn")
        if self.distill_set == "generated" and self.distill_size == 0:
            raise ConfigError("run-config key 'distill-set' is 'generated' and 'distill-size' "
                              "is 0 (all of U): say how many images to draw from G")
        if self.budget_probe and self.distill_budget != "disagreement":
            raise ConfigError(f"run-config key 'budget-probe' is {self.budget_probe} and "
                              f"'distill-budget' is {self.distill_budget!r}: a probe measures "
                              "the disagreement budget; set distill-budget = \"disagreement\" "
                              "or budget-probe = 0")
        if self.distillation_guard == "labelled-val" and self.val_size == 0:
            raise ConfigError("run-config key 'distillation-guard' is 'labelled-val' and "
                              "'val-size' is 0: say how many labelled server images score the "
                              "averaged and the distilled model")
        if self.guard_judges and self.distillation_guard != "clients":
            raise ConfigError(f"run-config key 'guard-judges' is {self.guard_judges} and "
                              f"'distillation-guard' is {self.distillation_guard!r}: judges are "
                              "clients; set distillation-guard = \"clients\" or guard-judges = 0")
        if self.discriminator_calibration != "none" and self.weighting == "odds-unsquashed":
            raise ConfigError("run-config key 'weighting' is 'odds-unsquashed', which recovers "
                              "D_k's logit from the paper's capped odds; with "
                              "'discriminator-calibration' = "
                              f"{self.discriminator_calibration!r} the odds are already "
                              "uncapped: use weighting = \"odds\"")
        if self.client_method and (why := STRATEGIES.method_problem(self.strategy,
                                                                    self.client_method)):
            raise ConfigError(f"run-config key 'client-method' is {self.client_method!r}: {why}")
        for name, spec in STRATEGIES.items():  # each strategy checks its own keys
            if spec.keys is not None:
                own = self.keys(name)
                check_fields(own, name)
                if hasattr(own, "validate"):
                    own.validate(self, STRATEGIES)


# The shared keys, declared above; the strategies' keys are read from the registry each time
# (a strategy may be registered after import).
SHARED = declared(Config)
SHARED_FIELDS = {d.field for d in SHARED}
SHARED_NAMES = {d.name for d in SHARED}


def strategy_declared() -> list[Declared]:
    """Every key the registered strategies declare, `<strategy>-<field>`."""
    return [d for name, spec in STRATEGIES.items() if spec.keys is not None
            for d in declared(spec.keys, name)]


def declared_keys() -> dict[str, Declared]:
    """Every run-config key, kebab-case -> its declaration."""
    return {d.name: d for d in [*SHARED, *strategy_declared()]}


def strategy_defaults() -> dict[str, Any]:
    return {d.name: d.default for d in strategy_declared()}
