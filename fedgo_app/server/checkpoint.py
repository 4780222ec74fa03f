"""Checkpoints after every round, and resuming from one.

A checkpoint holds everything the next round needs: the round, the global model, the
strategy's `state_dict` (the library's: the rounds done and what the method carries across
rounds, FedGO's D_k and cached odds, FedGen's generator with its optimiser and scheduler, ...;
the app's: a generated distillation set), the server's RNG states, the run config and the
record so far. It is written to a temporary file and renamed, so a run killed while
saving leaves the previous checkpoint whole. Client training needs nothing from it: every
client draws its randomness from seeds the server sends each round.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch

FORMAT = 2  # 2: the strategy's state is the library's state_dict
FOLDER = "checkpoints"


def path_of(run_dir: Path, server_round: int) -> Path:
    return Path(run_dir) / FOLDER / f"round-{server_round:04d}.pt"


def rng_states() -> dict:
    np_state = np.random.get_state()
    states = {"torch": torch.get_rng_state(), "python": random.getstate(),
              "numpy": (np_state[0], torch.from_numpy(np_state[1].astype(np.int64)),
                        *np_state[2:])}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    random.setstate(states["python"])
    name, keys, *rest = states["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def save(run_dir: Path, server_round: int, state: dict, keep: int) -> Path | None:
    """Write round `server_round`'s checkpoint atomically and keep only the newest `keep`
    (0: write none)."""
    if keep <= 0:
        return None
    path = path_of(run_dir, server_round)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"format": FORMAT, "round": server_round, "rng": rng_states(), **state}, tmp)
    os.replace(tmp, path)
    for old in sorted(path.parent.glob("round-*.pt"))[:-keep]:
        old.unlink()
    return path


def newest(folder: Path) -> Path | None:
    """The newest checkpoint in a run folder or its checkpoints folder; None where none is."""
    for place in (Path(folder) / FOLDER, Path(folder)):
        found = sorted(place.glob("round-*.pt")) if place.is_dir() else []
        if found:
            return found[-1]
    return None


def find(location: str | Path) -> Path:
    """The checkpoint `location` names: a checkpoint file, a run folder or its checkpoints
    folder (then the newest checkpoint in it)."""
    location = Path(location).expanduser()
    if location.is_file():
        return location
    if found := newest(location):
        return found
    raise FileNotFoundError(
        f"resume-from = {str(location)!r}: no checkpoint there; give a checkpoint file "
        f"(<run>/{FOLDER}/round-NNNN.pt) or a run folder holding {FOLDER}/ (checkpoints are "
        "written when checkpoint-keep > 0)")


def load(location: str | Path) -> tuple[Path, dict]:
    path = find(location)
    state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and state.get("format") == 1:
        state = from_format_1(state)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"{path} is not a fedgo-flwr checkpoint of format {FORMAT}")
    return path, state


def from_format_1(state: dict) -> dict:
    """A checkpoint of format 1 (the app's own strategy state) as format 2: the same content,
    with the round in the strategy's state and the past teachers under the library's name."""
    strategy = dict(state["strategy"])
    strategy["rounds_done"] = state["round"]
    strategy["past"] = {"states": strategy.pop("past_globals", []),
                        "pending": strategy.pop("next_past", None)}
    return {**state, "format": 2, "strategy": strategy}
