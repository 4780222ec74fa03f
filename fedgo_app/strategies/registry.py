"""What a strategy is to the apps: its server strategy, the client handler of every message type
its clients answer, the run-config keys it declares and the groups of shared keys it reads.
Each method's module builds one `StrategySpec`; `fedgo_app/strategies/__init__.py` lists
them. The ServerApp builds `STRATEGIES.server(setup, record)`; the ClientApp hands each message
to `STRATEGIES.handler(cfg, type)`.

Keys a strategy declares are named `<strategy>-<field>` (`fedprox-mu`), declared with
`keys.key()` like every other key, and mirrored in pyproject.toml (a test keeps the two equal).
This module never imports the config: the config validates against the registry.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

from flwr.app import Message

from fedgo_app.attacks import attacked

if TYPE_CHECKING:
    from fedgo_app.client_context import Local

Handler = Callable[[Message, "Local"], Message]


@dataclass(frozen=True)
class StrategySpec:
    name: str
    # (ServerSetup, RunRecord) -> a FedAvgStrategy; with `wraps`, (setup, record, base spec).
    server: Callable
    handlers: Mapping[str, Handler] = field(default_factory=dict)  # message type -> handler
    keys: type | None = None  # a frozen dataclass; field `mu` is run-config key `<name>-mu`
    # Groups of shared keys this strategy reads (config.GROUPS), besides those every strategy
    # reads and its own keys.
    reads: tuple[str, ...] = ()
    # The field of `keys` that names another strategy whose server and clients this one runs
    # under (FedProx's `base`): its handlers are laid over that strategy's, its reads added.
    wraps: str | None = None
    # How a results table names a run: (key, default, mark) marks a row "name[mark]" while
    # the key differs from its default (mark formatted with the value); `row_name(config)`
    # replaces the name itself.
    marks: tuple[tuple[str, Any, str], ...] = ()
    row_name: Callable[[Mapping[str, Any]], str] | None = None
    # config -> the library keywords of this strategy's clients' method, which run-config key
    # client-method = <name> puts under another strategy's server (SCAFFOLD's
    # {"client_method": ControlVariates(...)}, FedProx's {"proximal_mu": mu})
    clients: Callable[[Any], dict] | None = None

    def label(self, config: Mapping[str, Any], name: str | None = None) -> str:
        marks = [mark.format(config[key]) for key, default, mark in (*self.marks, *EVERY_MARK)
                 if config.get(key, default) != default]
        name = name or (self.row_name(config) if self.row_name else self.name)
        return name + (f"[{', '.join(marks)}]" if marks else "")


# What every strategy's row says when it departs from the default: a partitioner other than
# Dirichlet (whose rows' alpha is then unused), mixed architectures, the aggregation and the
# Byzantine clients (data/split.py, architectures.py, aggregation.py, attacks.py).
EVERY_MARK = (("partitioner", "dirichlet", "{}"), ("client-models", "", "{}"),
              ("aggregator", "mean", "{}"),
              ("sample-size-cap", 0.0, "cap {:g}"),
              ("attack", "none", "{}"), ("byzantine-clients", 0, "{} liars"),
              ("byzantine-partitions", "", "liars {}"))


class Registry(dict):
    """name -> StrategySpec; a name is registered once."""

    def register(self, spec: StrategySpec) -> StrategySpec:
        if spec.name in self:
            raise ValueError(f"strategy {spec.name!r} is already registered")
        for message_type in spec.handlers:
            category, _, action = message_type.partition(".")
            if category not in ("train", "evaluate", "query") or (action and not action.isidentifier()):
                raise ValueError(f"strategy {spec.name!r}: message type {message_type!r} must be "
                                 "train|evaluate|query, optionally followed by .<identifier>")
        if spec.wraps and (spec.keys is None or spec.wraps not in
                           {f.name for f in dataclasses.fields(spec.keys)}):
            raise ValueError(f"strategy {spec.name!r} wraps the strategy its key "
                             f"{spec.wraps!r} names, but declares no such key")
        self[spec.name] = spec
        return spec

    def message_types(self) -> list[str]:
        """Every message type some registered strategy's clients answer."""
        return sorted({t for spec in self.values() for t in spec.handlers})

    def base(self, name: str, keys: Mapping[str, Any]) -> StrategySpec | None:
        """The strategy that `name` runs under (the value of its `wraps` key in `keys`, its
        default where absent), or None."""
        default = self.default_base(name)
        if default is None:
            return None
        return self[keys.get(f"{name}-{self[name].wraps}".replace("_", "-"), default)]

    def default_base(self, name: str) -> str | None:
        spec = self[name]
        if not spec.wraps:
            return None
        return next(f.default for f in dataclasses.fields(spec.keys) if f.name == spec.wraps)

    def server(self, setup, record):
        """The chosen strategy's server for this run (`setup.cfg.strategy`)."""
        cfg = setup.cfg
        spec, base = self[cfg.strategy], self.base(cfg.strategy, cfg.strategy_keys)
        if cfg.client_method:
            setup.client_keywords = self[cfg.client_method].clients(cfg)
        return spec.server(setup, record, base) if base else spec.server(setup, record)

    def handlers(self, cfg) -> Mapping[str, Handler]:
        """message type -> the chosen strategy's client handler for this run."""
        spec, base = self[cfg.strategy], self.base(cfg.strategy, cfg.strategy_keys)
        return {**base.handlers, **spec.handlers} if base else spec.handlers

    def handler(self, cfg, message_type: str) -> Handler:
        """The run's client handler for this message type, as a Byzantine client of the run
        (`attack`, `byzantine-clients`) would answer it."""
        handlers = self.handlers(cfg)
        if message_type not in handlers:
            raise RuntimeError(f"strategy {cfg.strategy!r} has no client handler for message "
                               f"type {message_type!r}; it answers {sorted(handlers)}")
        return attacked(cfg, message_type, handlers[message_type])

    def takes_client_method(self, strategy: str) -> bool:
        """Whether another's clients can run under strategy's server: not where it has a
        client method of its own (FedProx, SCAFFOLD, ...) or a client step that takes none
        (FedGen's, FedTGP's: the library's `own_client_step`)."""
        spec = self[strategy]
        return not (spec.clients or spec.wraps or getattr(spec.server, "own_client_step", False))

    def method_problem(self, strategy: str, client_method: str) -> str | None:
        """Why strategy's server cannot run on client_method's clients, or None."""
        if not self.takes_client_method(strategy):
            return (f"strategy {strategy!r} has clients of its own; client-method puts "
                    f"{client_method!r}'s under the servers of "
                    + ", ".join(n for n in self if self.takes_client_method(n)))
        return None

    def reads(self, name: str, strategy_keys: Mapping[str, Any]) -> set[str]:
        """The groups of keys strategy `name` reads in a run: its own group, what it names,
        and, when it wraps another strategy, what that one reads."""
        spec, base = self[name], self.base(name, strategy_keys)
        return {name, *spec.reads, *(self.reads(base.name, strategy_keys) if base else ())}

    def label(self, config: Mapping[str, Any]) -> str:
        """A results table's name for a run of this config: the strategy ("<server>+<clients>"
        when it runs another's clients, as FedGO's server with FedProx's: fedprox-base or
        client-method, the same run), marked with what departs from the defaults."""
        spec = self[config["strategy"]]
        base = self.base(spec.name, config)
        if config.get("client-method"):
            return spec.label(config, name=f"{spec.name}+{config['client-method']}")
        if base is None:
            return spec.label(config)
        own = base.name == self.default_base(spec.name)
        return base.label(config, name=spec.name if own else f"{base.name}+{spec.name}")
