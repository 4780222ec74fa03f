"""How a run-config key is declared and checked, in one place.

A key is a dataclass field made with `key(default, meaning, allowed=..., groups=...)`: the
shared keys in `config.Config`, a strategy's own keys in its `<Name>Keys` dataclass. From the
declaration come the default (mirrored in pyproject.toml under a test), the check of a value
(`check_fields`), the configuration reference (docs/configuration.md) and which strategies
read the key (a strategy names the groups it reads; a key set away from its default that the
chosen strategy never reads is reported at the start of a run).

This module imports nothing of the package, so registries and strategies can use it while the
config validates against them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Iterable


class ConfigError(ValueError):
    """A run-config key has a value outside what is allowed."""


class Allowed:
    """What values a key takes: `text` for messages and the reference, `ok(value)` checks one."""

    def __init__(self, text: str, ok: Callable[[Any], bool]):
        self.text, self.ok = text, ok


class OneOf(Allowed):
    """One of `names`: a registry (read when the check runs, so later entries count) or a
    tuple."""

    def __init__(self, names: Iterable[str]):
        self.names = names

    @property
    def text(self) -> str:  # type: ignore[override]
        return ", ".join(sorted(self.names))

    def ok(self, value: Any) -> bool:  # type: ignore[override]
        return value in self.names


POSITIVE = Allowed("> 0", lambda v: v > 0)
NON_NEGATIVE = Allowed(">= 0", lambda v: v >= 0)
AT_LEAST_ONE = Allowed(">= 1", lambda v: v >= 1)
FRACTION = Allowed("in (0, 1]", lambda v: 0 < v <= 1)


def key(default: Any, meaning: str, allowed: Allowed | None = None,
        groups: tuple[str, ...] = ("run",)) -> Any:
    """Declare a run-config key: its default, what it means, what values it takes, and the
    groups of keys it belongs to ("run": read by every strategy)."""
    return dataclasses.field(default=default, metadata={
        "meaning": meaning, "allowed": allowed, "groups": groups})


@dataclass(frozen=True)
class Declared:
    """One declared key, as the reference and the checks see it."""
    name: str  # run-config key, kebab-case
    field: str  # dataclass field name
    default: Any
    meaning: str
    allowed: Allowed | None
    groups: tuple[str, ...]

    @property
    def kind(self) -> type:
        return type(self.default)

    @property
    def allowed_text(self) -> str:
        return self.allowed.text if self.allowed is not None else KINDS[self.kind]


def declared(cls: type, prefix: str = "") -> list[Declared]:
    """The keys a dataclass declares (with `key()`, or plain fields: no meaning, no check), in
    order; `prefix` names a strategy, whose keys are `<prefix>-<field>`."""
    out = []
    for f in dataclasses.fields(cls):
        if f.default is dataclasses.MISSING:  # not a run-config key (Config.strategy_keys)
            continue
        name = f"{prefix}-{f.name}" if prefix else f.name
        # A strategy's own keys form a group of its name: read by that strategy alone.
        groups = (prefix,) if prefix else f.metadata.get("groups", ("run",))
        out.append(Declared(name.replace("_", "-"), f.name, f.default,
                            f.metadata.get("meaning", ""), f.metadata.get("allowed"), groups))
    return out


def check_fields(obj: Any, prefix: str = "") -> None:
    """Check every declared key of `obj` against what it allows."""
    for d in declared(type(obj), prefix):
        value = getattr(obj, d.field)
        if d.allowed is not None and not d.allowed.ok(value):
            raise ConfigError(not_allowed(d.name, value, d.allowed.text))


def not_allowed(name: str, value: Any, allowed: str) -> str:
    """The one-line message for a bad value: the key, the value, what is allowed."""
    return f"run-config key '{name}' is {value!r}; allowed: {allowed}"


# What a value of each kind is called in messages and in the reference.
KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def coerce(name: str, value: Any, kind: type) -> Any:
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
    raise ConfigError(not_allowed(name, value, KINDS[kind]))


def choice(name: str, value: str, allowed: Iterable[str]) -> None:
    """Fail with a message naming the key and the allowed values unless value is one."""
    if value not in allowed:
        raise ConfigError(not_allowed(name, value, OneOf(allowed).text))


def check(name: str, ok: bool, why: str) -> None:
    """Fail with a message naming the key unless `ok` (checks that involve several keys)."""
    if not ok:
        raise ConfigError(f"run-config key '{name}' {why}")
