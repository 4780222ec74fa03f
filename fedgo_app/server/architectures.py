"""The run's global model when clients run different architectures (fedgo_flwr/architectures.py):
one global model per architecture, joined into one state for Flower's `start`; each client
trains its own architecture's. With one architecture the joined state is that model's."""

from __future__ import annotations

from logging import INFO, WARNING
from typing import Callable

import torch
from flwr.app import ArrayRecord, Message
from flwr.common.logger import log

from fedgo_app.server.clients import ClientDirectory
from fedgo_app.server.setup import ServerSetup
from fedgo_flwr.architectures import join, split
from fedgo_flwr.replies import payload_bytes
from fedgo_flwr.strategies.rounds import ClientModel


class Architectures:
    """Which architecture each partition runs, and the global model of each."""

    def __init__(self, setup: ServerSetup):
        self.setup = setup
        self.names: list[str] = [setup.cfg.model]  # found at discovery
        self.clients: ClientDirectory | None = None

    def found(self, clients: ClientDirectory) -> dict | None:
        """The architectures the discovered clients report; for a mixed federation, what the
        record says about them (None for one architecture)."""
        self.clients = clients
        self.names = sorted({self.of(p) for p in clients.partition_ids})
        if not self.heterogeneous:
            return None
        log(INFO, "architectures: %s", ", ".join(
            f"{a} ({sum(self.of(p) == a for p in clients.partition_ids)} clients)"
            for a in self.names))
        return {str(p): self.of(p) for p in clients.partition_ids}

    def of(self, pid: int) -> str:
        """The architecture partition `pid` runs."""
        return self.clients.by_partition[pid].model or self.setup.cfg.model

    @property
    def heterogeneous(self) -> bool:
        return len(self.names) > 1

    def count(self, by_architecture: dict, way: str, messages: list[Message],
              partition_of: Callable[[Message], int | None]) -> None:
        """Add each message's bytes to its architecture's `way` ("down", "up"); those of
        partitions not asked this round are not counted."""
        for message in messages:
            pid = partition_of(message)
            if pid is not None:
                entry = by_architecture.setdefault(self.of(pid), {})
                entry[way] = entry.get(way, 0) + payload_bytes([message])

    def combine(self, models: list[ClientModel],
                combine: Callable[[list[ClientModel]], tuple[ArrayRecord | None, list | None]],
                previous: dict[str, dict], when: str, aggregator: str
                ) -> tuple[ArrayRecord | None, dict]:
        """The round's average: each architecture's models combined among themselves
        (`combine`: (the combination or None, the positions it selected or None)), joined,
        and what the record says of it ("selected": the partitions Krum's rules kept,
        "kept_previous": the architectures whose model stays, `previous`'s, logged). None:
        one architecture, and it kept its model."""
        averaged, info = {}, {}
        for a in self.names:
            group = [m for m in models if self.of(m.key) == a]
            combined, selected = combine(group) if group else (None, None)
            if combined is None:
                log(WARNING, "%s: %s%s; its global model is unchanged", when,
                    f"{len(group)} usable models are too few for aggregator {aggregator}"
                    if group else "no usable model", f" of {a}" if self.heterogeneous else "")
                info.setdefault("kept_previous", []).append(a)
                if not self.heterogeneous:
                    return None, info
                averaged[a] = previous[a]
                continue
            if selected is not None:
                info.setdefault("selected", []).extend(group[i].key for i in selected)
            if not self.heterogeneous:
                return combined, info
            averaged[a] = combined.to_torch_state_dict()
        return ArrayRecord(self.joined(averaged)), info

    def templates(self) -> dict[str, dict[str, torch.Tensor]]:
        """Each architecture's arrays (names, shapes), freshly built."""
        return {a: self.setup.new_classifier(a).state_dict() for a in self.names}

    def joined_template(self) -> dict[str, torch.Tensor]:
        """The joined global model's arrays, drawn without touching the run's random state."""
        with torch.random.fork_rng(devices=[]):
            return self.joined(self.templates())

    def globals_of(self, state: dict) -> dict[str, dict]:
        """{architecture: its global model} of the joined global state."""
        return split(state, self.names) if self.heterogeneous else {self.names[0]: state}

    def joined(self, states: dict[str, dict]) -> dict:
        return join(states) if self.heterogeneous else next(iter(states.values()))

    def initial_model(self) -> ArrayRecord:
        """theta_s^0 of every architecture, each from the seed alone."""
        states = {}
        for a in self.names:
            torch.manual_seed(self.setup.cfg.seed)
            states[a] = self.setup.new_classifier(a).state_dict()
        return ArrayRecord(self.joined(states))
