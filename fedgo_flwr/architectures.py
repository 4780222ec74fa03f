"""Heterogeneous client models (FedDF's heterogeneous setting): clients of one federation run
different architectures; each architecture has its own global model, averaged among its own
clients, and ensemble distillation spans them all (it needs only predictions).

Which client runs which model: `client-models = "cnn:0.5,resnet18:0.5"` gives each
architecture a share of the K partitions (a seeded assignment); in deployment a SuperNode's
`--node-config "model=..."` chooses its own. A client reports its architecture at discovery.
The server holds the global models in one ArrayRecord, each tensor named
"<architecture>/<name>" (a homogeneous run keeps plain names), so checkpoints and resume
cover every one of them.
"""

from __future__ import annotations

import numpy as np

from fedgo_flwr.models import model_name_problem

SEP = "/"


def parse_client_models(text: str) -> list[tuple[str, float]]:
    """[(architecture, share)] of a client-models value; ValueError says what is wrong."""
    pairs = []
    for item in text.split(","):
        name, sep, share = item.strip().rpartition(":")
        if not sep or not name:
            raise ValueError(f"{item.strip()!r} is not <model>:<share>")
        try:
            value = float(share)
        except ValueError:
            raise ValueError(f"share {share!r} of {name!r} is not a number") from None
        if value <= 0:
            raise ValueError(f"share of {name!r} is {value}; shares are > 0")
        pairs.append((name, value))
    names = [n for n, _ in pairs]
    if len(set(names)) != len(names):
        raise ValueError(f"an architecture is named twice in {text!r}")
    return pairs


def architecture_of(client_models: str, default: str, partition_id: int, num_partitions: int,
                    seed: int) -> str:
    """The architecture partition `partition_id` runs: `default` without client-models, else
    its place in a seeded order of the partitions, cut by the shares (largest remainders)."""
    if not client_models.strip():
        return default
    pairs = parse_client_models(client_models)
    total = sum(s for _, s in pairs)
    exact = [num_partitions * s / total for _, s in pairs]
    counts = [int(e) for e in exact]
    for i in sorted(range(len(pairs)), key=lambda i: exact[i] - counts[i],
                    reverse=True)[:num_partitions - sum(counts)]:
        counts[i] += 1
    order = np.random.default_rng(seed + 104_729).permutation(num_partitions)
    place = int(np.flatnonzero(order == partition_id)[0])
    bounds = np.cumsum(counts)
    return pairs[int(np.searchsorted(bounds, place, side="right"))][0]


def split(state: dict, architectures: list[str]) -> dict[str, dict]:
    """{architecture: its global model} from the joined state."""
    return {a: {name[len(a) + 1:]: v for name, v in state.items() if name.startswith(a + SEP)}
            for a in architectures}


def join(states: dict[str, dict]) -> dict:
    """One state holding every architecture's model, tensors named "<architecture>/<name>"."""
    return {f"{a}{SEP}{name}": v for a, state in states.items() for name, v in state.items()}


def client_models_ok(text: str) -> bool:
    """Whether `text` is empty or names registered models with their shares."""
    if not text.strip():
        return True
    try:
        return all(model_name_problem(name) is None for name, _ in parse_client_models(text))
    except ValueError:
        return False
