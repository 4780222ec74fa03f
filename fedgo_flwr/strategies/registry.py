"""What a strategy is to the apps: its server strategy, the client handler of every message type
its clients answer, and the run-config keys it declares. Each method's module builds one
`StrategySpec`; `fedgo_flwr/strategies/__init__.py` lists them. The ServerApp builds
`spec.server(setup, record)`; the ClientApp hands each message to `spec.client(cfg)[type]`.

Keys a strategy declares are named `<strategy>-<field>` (`fedprox-mu`), validated like every
other key, and declared in pyproject.toml with the same default (a test keeps the two equal).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

from flwr.app import Message

if TYPE_CHECKING:
    from fedgo_flwr.config import Config
    from fedgo_flwr.strategies.local import Local

Handler = Callable[[Message, "Local"], Message]


@dataclass(frozen=True)
class StrategySpec:
    name: str
    server: Callable  # (ServerSetup, RunRecord) -> a FedAvgStrategy
    handlers: Mapping[str, Handler] = field(default_factory=dict)  # message type -> handler
    keys: type | None = None  # a frozen dataclass; field `mu` is run-config key `<name>-mu`
    # The handlers of one run, when they depend on its config (FedProx over another strategy).
    resolve_handlers: Callable[["Config"], Mapping[str, Handler]] | None = None

    def client(self, cfg: "Config") -> Mapping[str, Handler]:
        return self.resolve_handlers(cfg) if self.resolve_handlers else self.handlers

    def declared_keys(self) -> dict[str, tuple[str, Any]]:
        """run-config key -> (field name, default) of every key this strategy declares."""
        if self.keys is None:
            return {}
        return {f"{self.name}-{f.name.replace('_', '-')}": (f.name, f.default)
                for f in dataclasses.fields(self.keys)}


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
        self[spec.name] = spec
        return spec

    def message_types(self) -> list[str]:
        """Every message type some registered strategy's clients answer."""
        return sorted({t for spec in self.values() for t in spec.handlers})

    def declared_keys(self) -> dict[str, tuple[str, str, Any]]:
        """run-config key -> (strategy, field name, default) over all strategies."""
        return {key: (spec.name, name, default) for spec in self.values()
                for key, (name, default) in spec.declared_keys().items()}

    def handler(self, cfg: "Config", message_type: str) -> Handler:
        handlers = self[cfg.strategy].client(cfg)
        if message_type not in handlers:
            raise RuntimeError(f"strategy {cfg.strategy!r} has no client handler for message "
                               f"type {message_type!r}; it answers {sorted(handlers)}")
        return handlers[message_type]
