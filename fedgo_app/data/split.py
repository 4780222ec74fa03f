"""The paper's split (App. E.2): client pool = half of each class, server U = the other half;
the pool is divided among K clients by a flwr-datasets partitioner (Dirichlet(alpha) in the
paper)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from datasets import Dataset
from flwr_datasets.partitioner import (DirichletPartitioner, ExponentialPartitioner,
                                       IidPartitioner, LinearPartitioner, PathologicalPartitioner,
                                       ShardPartitioner, SquarePartitioner)


def server_client_split(labels: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Per class, a seeded half goes to the client pool and the rest to the server (sorted)."""
    rng = np.random.default_rng(seed)
    pool, server = [], []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        half = len(idx) // 2
        pool.append(idx[:half])
        server.append(idx[half:])
    return np.sort(np.concatenate(pool)), np.sort(np.concatenate(server))


# How the client pool is divided among the K clients: flwr-datasets' partitioners by name.
# dirichlet: label skew by Dirichlet(alpha) per class (the paper); iid: equal random shares;
# pathological: each client holds `classes-per-client` classes (FedBPG's "PAT"); shard: the
# pool sorted by label and cut into shards, `shards-per-client` each (McMahan et al.);
# linear / square / exponential: IID labels, client sizes growing with the partition id.
PARTITIONERS = ("dirichlet", "iid", "pathological", "shard", "linear", "square", "exponential")


@dataclass(frozen=True)
class Partitioning:
    """What divides the client pool: a partitioner name and its parameters."""
    name: str = "dirichlet"
    alpha: float = 0.1
    classes_per_client: int = 2
    shards_per_client: int = 2
    dirichlet_group: int = 0


def partition_pool(labels: np.ndarray, num_partitions: int, how: Partitioning, seed: int,
                   min_partition_size: int = 10) -> list[np.ndarray]:
    """Indices into `labels` of each client's share, by the flwr-datasets partitioner `how`
    names; the same seed gives the same shares. Partitioners that cut the rows in order
    (iid and the size-skewed ones) get them in a seeded random order."""
    if num_partitions < 1:
        raise ValueError(f"num-partitions must be >= 1, got {num_partitions}")
    rows = np.arange(len(labels))
    if how.name == "dirichlet" and 0 < how.dirichlet_group < num_partitions:
        return grouped_dirichlet_partitions(labels, num_partitions, how.alpha, seed,
                                            how.dirichlet_group)
    if how.name == "dirichlet":
        return dirichlet_partitions(labels, num_partitions, how.alpha, seed, min_partition_size)
    if how.name == "pathological":
        partitioner = PathologicalPartitioner(
            num_partitions=num_partitions, partition_by="label",
            num_classes_per_partition=how.classes_per_client, shuffle=True, seed=seed)
    elif how.name == "shard":
        partitioner = ShardPartitioner(
            num_partitions=num_partitions, partition_by="label",
            num_shards_per_partition=how.shards_per_client, shuffle=True, seed=seed)
    elif how.name in SIZED:
        rows = np.random.default_rng(seed).permutation(len(labels))
        partitioner = SIZED[how.name](num_partitions=num_partitions)
    else:
        raise ValueError(f"partitioner {how.name!r}; allowed: {', '.join(PARTITIONERS)}")
    try:
        parts = read_partitions(partitioner, labels[rows], num_partitions, rows)
    except ValueError as err:
        parts, why = [], " ".join(str(err).split())
    else:
        why = "" if all(len(p) for p in parts) else "a client would get no sample"
    if why:
        raise ValueError(f"partitioner {how.name!r} could not give each of {num_partitions} "
                         f"clients a share of {len(labels)} samples ({why}): use fewer "
                         "clients (the federation's num-supernodes) or another 'partitioner'")
    return parts


SIZED = {"iid": IidPartitioner, "linear": LinearPartitioner, "square": SquarePartitioner,
         "exponential": ExponentialPartitioner}


def read_partitions(partitioner, labels: np.ndarray, num_partitions: int,
                    rows: np.ndarray) -> list[np.ndarray]:
    """Each partition of `partitioner` over a dataset of (label, row): flwr-datasets exposes
    its index map only through load_partition, so every row carries its index into the pool."""
    partitioner.dataset = Dataset.from_dict({"label": labels.astype(np.int64),
                                             "row": rows.astype(np.int64)})
    return [np.asarray(partitioner.load_partition(k)["row"], dtype=np.int64)
            for k in range(num_partitions)]


def dirichlet_partitions(labels: np.ndarray, num_partitions: int, alpha: float,
                         seed: int, min_partition_size: int = 10) -> list[np.ndarray]:
    """Indices into `labels` of each client's share, by flwr-datasets' DirichletPartitioner."""
    if num_partitions < 1:
        raise ValueError(f"num-partitions must be >= 1, got {num_partitions}")
    min_size = min(min_partition_size, len(labels) // num_partitions)
    partitioner = DirichletPartitioner(
        num_partitions=num_partitions, partition_by="label", alpha=alpha,
        min_partition_size=min_size, self_balancing=False, shuffle=True, seed=seed,
    )
    try:
        with warnings.catch_warnings():
            # It redraws while a share is below min_size and warns at every redraw; the
            # redraws are what we ask of it (and fix the partitions), so they are not news.
            warnings.filterwarnings("ignore", "The specified min_partition_size",
                                    UserWarning)
            return read_partitions(partitioner, labels, num_partitions, np.arange(len(labels)))
    except ValueError as err:  # it gives up after 10 Dirichlet draws with a too-small share
        raise ValueError(
            f"Dirichlet(alpha={alpha}) could not give each of {num_partitions} clients at "
            f"least {min_size} of {len(labels)} samples in 10 draws: raise 'alpha', use "
            f"fewer clients (the federation's num-supernodes), or split them in groups "
            f"('dirichlet-group', e.g. 10, as Lin et al. and FedGO's paper do for 100)") from err


def grouped_dirichlet_partitions(labels: np.ndarray, num_partitions: int, alpha: float,
                                 seed: int, group: int, attempts: int = 100
                                 ) -> list[np.ndarray]:
    """The many-client Dirichlet split of Lin et al. (2020), which FedGO's paper follows (App.
    E.2, F.1): the pool, in a seeded order, is cut into one share per `group` clients (the
    last group takes the rest), and each share is split among its clients by Dirichlet(alpha)
    per class, a client full at its group's mean taking no more (flwr-datasets'
    `self_balancing`), redrawn until every client holds at least half that mean. Over all K
    clients at once no such split exists at K = 100 and alpha 0.1 or 0.05: most clients would
    get (almost) nothing."""
    order = np.random.default_rng(seed).permutation(len(labels))
    sizes = [min(group, num_partitions - start) for start in range(0, num_partitions, group)]
    cuts = np.cumsum([len(labels) * n // num_partitions for n in sizes])[:-1]
    parts = []
    for g, (rows, n) in enumerate(zip(np.split(order, cuts), sizes)):
        floor = len(rows) // (2 * n)
        for attempt in range(attempts):  # each attempt is flwr-datasets' 10 draws
            partitioner = DirichletPartitioner(
                num_partitions=n, partition_by="label", alpha=alpha, min_partition_size=floor,
                self_balancing=True, shuffle=True, seed=seed * 1_000_003 + g * 1009 + attempt)
            try:
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", "The specified min_partition_size",
                                            UserWarning)
                    parts += read_partitions(partitioner, labels[rows], n, rows)
                break
            except ValueError:
                continue
        else:
            raise ValueError(f"Dirichlet(alpha={alpha}) could not give each of the {n} clients "
                             f"of group {g} at least {floor} of its {len(rows)} samples in "
                             f"{10 * attempts} draws: raise 'alpha' or 'dirichlet-group'")
    return parts
