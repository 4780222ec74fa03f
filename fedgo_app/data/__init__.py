"""Datasets, the paper's server/client split, and Dirichlet client partitions.

Images are kept in memory as uint8 tensors [N, C, H, W]; `to_unit_range` maps them to the
paper's pixel range [-1, 1] batch by batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from fedgo_app.data.cifar import load_cifar
from fedgo_app.data.fmnist import load_fmnist
from fedgo_app.data.folder import load_folder
from fedgo_app.data.hub import PREFIX as HUB
from fedgo_app.data.hub import load_hub
from fedgo_app.data.imagenet100 import load_imagenet100
from fedgo_app.data.split import PARTITIONERS, Partitioning, partition_pool, server_client_split
from fedgo_flwr.keys import ConfigError


@dataclass(frozen=True)
class ImageData:
    train_x: torch.Tensor  # uint8 [N, C, H, W]
    train_y: torch.Tensor  # int64 [N]
    test_x: torch.Tensor
    test_y: torch.Tensor
    classes: tuple[str, ...]  # class names, in label order

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.train_x.shape[1:])  # type: ignore[return-value]


def resized(images: torch.Tensor, side: int) -> torch.Tensor:
    """uint8 images [N, C, H, W] at side x side (bilinear, antialiased), in chunks."""
    if not side or images.shape[-2:] == (side, side):
        return images
    return torch.cat([F.interpolate(part.float(), size=(side, side), mode="bilinear",
                                    antialias=True).round().clamp(0, 255).to(torch.uint8)
                      for part in images.split(4096)])


def fixed_size(load: Callable[[Path], tuple]) -> Callable[[Path, int], ImageData]:
    """A loader of images of one native size, resized to `image-size` when that is set."""
    def loader(root: Path, side: int) -> ImageData:
        train_x, train_y, test_x, test_y, classes = load(root)
        return ImageData(resized(train_x, side), train_y, resized(test_x, side), test_y,
                         classes)
    return loader


# name -> loader(data_dir, image_size) -> ImageData (image_size 0: as stored)
DATASETS: dict[str, Callable[[Path, int], ImageData]] = {
    "fmnist": fixed_size(load_fmnist),
    "cifar10": fixed_size(lambda root: load_cifar(root, 10)),
    "cifar100": fixed_size(lambda root: load_cifar(root, 100)),
    "imagenet100": lambda root, side: ImageData(*load_imagenet100(root, side)),
    "folder": lambda root, side: ImageData(*load_folder(root, side)),
}


def dataset_name_problem(name: str) -> str | None:
    """Why `dataset` names no dataset, or None."""
    if name in DATASETS or (name.startswith(HUB) and len(name) > len(HUB)):
        return None
    return (f"run-config key 'dataset' is {name!r}; allowed: {', '.join(DATASETS)}, or a "
            "Hugging Face dataset as \"hub:<name or local path>\"")


@lru_cache(maxsize=4)
def load_dataset(name: str, data_dir: Path, image_size: int = 0) -> ImageData:
    """Load a dataset once per process (Ray actors serve many clients)."""
    if name.startswith(HUB):
        return ImageData(*load_hub(name[len(HUB):], Path(data_dir), image_size))
    return DATASETS[name](Path(data_dir), image_size)


def dataset(cfg) -> ImageData:
    """The run's dataset (`dataset`, `data-dir`, `image-size`)."""
    return load_dataset(cfg.dataset, cfg.data_path, cfg.image_size)


def split_indices(cfg) -> tuple[np.ndarray, np.ndarray]:
    """(client pool, server U) indices into the training split: half of each class each."""
    return _split(cfg.dataset, cfg.data_path, cfg.image_size, cfg.seed)


@lru_cache(maxsize=8)
def _split(name: str, data_dir: Path, image_size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    return server_client_split(load_dataset(name, data_dir, image_size).train_y.numpy(), seed)


@lru_cache(maxsize=8)
def _partitions(name: str, data_dir: Path, image_size: int, split_seed: int,
                num_partitions: int, how: Partitioning,
                partition_seed: int) -> tuple[np.ndarray, ...]:
    pool, _ = _split(name, data_dir, image_size, split_seed)
    labels = load_dataset(name, data_dir, image_size).train_y.numpy()[pool]
    parts = partition_pool(labels, num_partitions, how, partition_seed)
    return tuple(pool[p] for p in parts)  # back to training-split indices


def partitioning(cfg) -> Partitioning:
    return Partitioning(cfg.partitioner, cfg.alpha, cfg.classes_per_client,
                        cfg.shards_per_client, cfg.dirichlet_group)


def client_indices(cfg, partition_id: int, num_partitions: int) -> np.ndarray:
    """Training-split indices of client `partition_id`'s data S_k."""
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition-id {partition_id} not in [0, {num_partitions})")
    return _partitions(cfg.dataset, cfg.data_path, cfg.image_size, cfg.seed, num_partitions,
                       partitioning(cfg), cfg.effective_partition_seed)[partition_id]


def client_data(cfg, partition_id: int, num_partitions: int) -> tuple[torch.Tensor, torch.Tensor]:
    data = dataset(cfg)
    idx = torch.from_numpy(client_indices(cfg, partition_id, num_partitions))
    return data.train_x[idx], data.train_y[idx]


def distillation_indices(cfg) -> np.ndarray:
    """The server's unlabeled set U (D1), optionally a seeded subset of `distill-size`."""
    _, server = split_indices(cfg)
    if cfg.distill_size and cfg.distill_size < len(server):
        rng = np.random.default_rng(cfg.seed)
        server = np.sort(rng.choice(server, cfg.distill_size, replace=False))
    return server


def validation_indices(cfg) -> np.ndarray:
    """A labelled validation split held by the server (FedDF's early stopping): `val-size`
    seeded images of the server's half that are not in the distillation set."""
    if cfg.val_size == 0:
        return np.empty(0, dtype=np.int64)
    _, server = split_indices(cfg)
    rest = np.setdiff1d(server, distillation_indices(cfg))
    if cfg.val_size > len(rest):
        raise ConfigError(f"run-config key 'val-size' is {cfg.val_size}, but only {len(rest)} "
                         "server images lie outside the distillation set; lower 'val-size' or "
                         "'distill-size'")
    return np.sort(np.random.default_rng(cfg.seed + 1).choice(rest, cfg.val_size, replace=False))


def validation_data(cfg) -> tuple[torch.Tensor, torch.Tensor]:
    data = dataset(cfg)
    idx = torch.from_numpy(validation_indices(cfg))
    return data.train_x[idx], data.train_y[idx]


def server_source(cfg):
    """The config U is drawn from: the run's own, or with `server-dataset` in place of
    `dataset` (FedGO's Table 7: CIFAR-100 images as U for CIFAR-10 clients)."""
    return cfg.replace(dataset=cfg.server_dataset) if cfg.server_dataset else cfg


def server_data(cfg) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(U images, test images, test labels); labels of U are never handed out. U is the
    server's half of `server-dataset` when that is set, else of `dataset`."""
    data, source = dataset(cfg), server_source(cfg)
    if cfg.reads_server_data:
        u = dataset(source).train_x[torch.from_numpy(distillation_indices(source))]
    else:  # a data-free run (FedGO's S2): U is never opened
        u = torch.empty((0, *data.image_shape), dtype=torch.uint8)
    if u.shape[1:] != data.image_shape:
        raise ConfigError(
            f"run-config key 'server-dataset' is {cfg.server_dataset!r}, whose images are "
            f"{'x'.join(map(str, u.shape[1:]))}, while dataset {cfg.dataset!r} has "
            f"{'x'.join(map(str, data.image_shape))} (channels x height x width); set "
            "'image-size' to give both one side, and use datasets with as many channels")
    test_x, test_y = data.test_x, data.test_y
    if cfg.test_size and cfg.test_size < len(test_y):
        keep = torch.from_numpy(np.sort(np.random.default_rng(cfg.seed).choice(
            len(test_y), cfg.test_size, replace=False)))
        test_x, test_y = test_x[keep], test_y[keep]
    return u, test_x, test_y
