"""The paper's split (App. E.2): client pool = half of each class, server U = the other half;
the pool is divided among K clients by Dirichlet(alpha) through flwr-datasets."""

from __future__ import annotations

import warnings

import numpy as np
from datasets import Dataset
from flwr_datasets.partitioner import DirichletPartitioner


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
    # The partitioner exposes its index map only through load_partition: give it a dataset
    # that carries each row's index, and read that column back.
    rows = Dataset.from_dict({"label": labels.astype(np.int64), "row": np.arange(len(labels))})
    partitioner.dataset = rows
    try:
        with warnings.catch_warnings():
            # It redraws while a share is below min_size and warns at every redraw; the
            # redraws are what we ask of it (and fix the partitions), so they are not news.
            warnings.filterwarnings("ignore", "The specified min_partition_size",
                                    UserWarning)
            return [np.asarray(partitioner.load_partition(k)["row"], dtype=np.int64)
                    for k in range(num_partitions)]
    except ValueError as err:  # it gives up after 10 Dirichlet draws with a too-small share
        raise ValueError(
            f"Dirichlet(alpha={alpha}) could not give each of {num_partitions} clients at "
            f"least {min_size} of {len(labels)} samples in 10 draws: raise 'alpha' or use "
            f"fewer clients (the federation's num-supernodes)") from err
