import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import fedgo_app.data.fmnist as fmnist
from conftest import write_tiny_fmnist
from fedgo_flwr.batches import random_hflip
from fedgo_app.data import client_indices, distillation_indices, split_indices
from fedgo_app.data.split import (PARTITIONERS, Partitioning, dirichlet_partitions,
                                   partition_pool, server_client_split)


def test_split_is_disjoint_per_class_halves_and_seeded():
    labels = np.repeat(np.arange(10), [100, 101, 50, 7, 64, 80, 90, 33, 12, 40])
    pool, server = server_client_split(labels, seed=1)
    assert len(np.intersect1d(pool, server)) == 0
    assert len(pool) + len(server) == len(labels)
    for c in range(10):
        n_c = (labels == c).sum()
        assert (labels[pool] == c).sum() == n_c // 2
        assert (labels[server] == c).sum() == n_c - n_c // 2
    again, _ = server_client_split(labels, seed=1)
    other, _ = server_client_split(labels, seed=2)
    assert np.array_equal(pool, again) and not np.array_equal(pool, other)


def test_dirichlet_partitions_cover_the_pool_disjointly_and_are_seeded():
    labels = np.random.default_rng(0).integers(0, 10, 3000)
    parts = dirichlet_partitions(labels, 20, alpha=0.1, seed=4)
    flat = np.concatenate(parts)
    assert sorted(flat.tolist()) == list(range(3000))
    same = dirichlet_partitions(labels, 20, alpha=0.1, seed=4)
    assert all(np.array_equal(a, b) for a, b in zip(parts, same))
    other = dirichlet_partitions(labels, 20, alpha=0.1, seed=5)
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other))
    # alpha = 0.1 is strongly non-IID: most clients hold few classes for most of their data
    top_share = [np.bincount(labels[p], minlength=10).max() / len(p) for p in parts]
    assert np.median(top_share) > 0.5


@pytest.mark.parametrize("name", PARTITIONERS)
def test_every_partitioner_is_disjoint_and_seeded(name):
    """Each partitioner gives the same shares for the same seed, other shares for another
    seed, and no row twice."""
    labels = np.random.default_rng(0).integers(0, 10, 3000)
    how = Partitioning(name, alpha=0.5, classes_per_client=3, shards_per_client=2)
    parts = partition_pool(labels, 5, how, seed=4)
    assert len(parts) == 5 and all(len(p) > 0 for p in parts)
    flat = np.concatenate(parts)
    assert len(np.unique(flat)) == len(flat) and flat.min() >= 0 and flat.max() < 3000
    again = partition_pool(labels, 5, how, seed=4)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    other = partition_pool(labels, 5, how, seed=5)
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other))
    if name in ("dirichlet", "iid", "linear", "square", "exponential"):
        assert len(flat) == 3000  # these cover the whole pool
    if name in ("linear", "square", "exponential"):  # sizes grow with the partition id
        assert [len(p) for p in parts] == sorted(len(p) for p in parts)
        assert len(parts[-1]) > 2 * len(parts[0])


def test_a_split_that_leaves_a_client_empty_names_the_partitioner():
    labels = np.arange(3000) % 10
    with pytest.raises(ValueError, match="partitioner 'exponential' could not give each of 20"):
        partition_pool(labels, 20, Partitioning("exponential"), seed=0)


def test_the_pathological_split_gives_each_client_its_number_of_classes():
    labels = np.random.default_rng(1).integers(0, 10, 5000)
    for k in (1, 2, 4):
        parts = partition_pool(labels, 20, Partitioning("pathological", classes_per_client=k),
                               seed=0)
        assert [len(np.unique(labels[p])) for p in parts] == [k] * 20


def test_the_shard_split_gives_each_client_few_classes():
    labels = np.random.default_rng(1).integers(0, 10, 4000)
    parts = partition_pool(labels, 20, Partitioning("shard", shards_per_client=2), seed=0)
    assert {len(p) for p in parts} == {200}  # 40 shards of 100
    assert max(len(np.unique(labels[p])) for p in parts) <= 4


def test_impossible_dirichlet_split_names_alpha_and_the_clients():
    labels = np.arange(3000) % 10
    with warnings.catch_warnings(record=True) as seen, pytest.raises(ValueError) as err:
        warnings.simplefilter("always")
        dirichlet_partitions(labels, 250, alpha=0.05, seed=0)
    assert "'alpha'" in str(err.value) and "250 clients" in str(err.value)
    # flwr-datasets warns at each of its redraws; the redraws are what we ask of it
    assert not [w for w in seen if "min_partition_size" in str(w.message)]


def test_partition_seed_is_independent_of_alpha(tiny_config):
    a = client_indices(tiny_config, 0, 4)
    b = client_indices(tiny_config.replace(partition_seed=11), 0, 4)
    c = client_indices(tiny_config.replace(seed=11), 0, 4)  # moves the split as well
    assert not np.array_equal(a, b) and not np.array_equal(a, c)


def test_the_partitioner_key_chooses_the_clients_shares(tiny_config):
    from fedgo_app.data import dataset
    labels = dataset(tiny_config).train_y.numpy()
    cfg = tiny_config.replace(partitioner="pathological", classes_per_client=1)
    assert [len(np.unique(labels[client_indices(cfg, k, 4)])) for k in range(4)] == [1] * 4
    assert len(np.unique(labels[client_indices(tiny_config, 0, 4)])) > 1  # dirichlet, 0.5


def test_clients_and_server_never_share_images(tiny_config):
    pool, server = split_indices(tiny_config)
    clients = np.concatenate([client_indices(tiny_config, k, 4) for k in range(4)])
    assert sorted(clients.tolist()) == pool.tolist()
    assert len(np.intersect1d(clients, distillation_indices(tiny_config))) == 0
    subset = distillation_indices(tiny_config.replace(distill_size=50))
    assert len(subset) == 50 and set(subset) <= set(server)


def test_fmnist_is_read_from_the_debian_location(tmp_path, monkeypatch):
    debian = write_tiny_fmnist(tmp_path / "debian", n_train=40, n_test=10, compress=True)
    monkeypatch.setattr(fmnist, "DEBIAN_DIR", debian)
    train_x, train_y, test_x, test_y, _ = fmnist.load_fmnist(tmp_path / "data")
    assert train_x.shape == (40, 1, 28, 28) and train_x.dtype == torch.uint8
    assert test_y.shape == (10,) and int(train_y.max()) <= 9
    assert (tmp_path / "data" / "FashionMNIST" / "raw" / "train-images-idx3-ubyte").is_file()


def test_fmnist_files_appear_whole_for_processes_starting_together(tmp_path, monkeypatch):
    # A process that finds the four files reads them: each must appear complete (renamed from
    # a private folder), never while it is being written (seen: parallel runs on a fresh GPU
    # host, one read an empty file).
    debian = write_tiny_fmnist(tmp_path / "debian", n_train=40, n_test=10, compress=True)
    monkeypatch.setattr(fmnist, "DEBIAN_DIR", debian)
    raw = tmp_path / "data" / "FashionMNIST" / "raw"
    written = []

    def extract(source, target):
        path = fmnist_extract(source, target)
        written.append(Path(path))
        assert not (raw / Path(path).name).exists()  # not yet visible where readers look
        return path

    fmnist_extract = fmnist.extract_archive
    monkeypatch.setattr(fmnist, "extract_archive", extract)
    fmnist.load_fmnist(tmp_path / "data")
    assert len(written) == 4 and all(p.parent != raw for p in written)
    assert sorted(p.name for p in raw.iterdir()) == sorted(p.name for p in written)


def test_missing_data_without_network_names_where_it_looked_and_both_fixes(tmp_path,
                                                                           monkeypatch):
    monkeypatch.setattr(fmnist, "DEBIAN_DIR", tmp_path / "nowhere")
    monkeypatch.setattr(fmnist.FashionMNIST, "mirrors", ["http://127.0.0.1:9/"])
    with pytest.raises(RuntimeError) as err:
        fmnist.load_fmnist(tmp_path / "data")
    message = str(err.value)
    assert str(tmp_path / "data" / "FashionMNIST" / "raw") in message
    assert str(tmp_path / "nowhere") in message and "Error downloading" in message
    assert "data-dir" in message and "apt-get install dataset-fashion-mnist" in message
    assert "\n" not in message


def test_random_hflip_flips_about_half():
    x = torch.arange(4.0).view(1, 1, 1, 4).repeat(1000, 1, 1, 1)
    out = random_hflip(x, torch.Generator().manual_seed(0))
    flipped = (out[:, 0, 0, 0] == 3).float().mean().item()
    assert 0.4 < flipped < 0.6
    assert ((out[:, 0, 0, 0] == 0) | (out[:, 0, 0, 0] == 3)).all()


def test_random_crop_takes_a_window_of_the_padded_image():
    from fedgo_flwr.batches import augment, random_crop
    x = torch.rand(16, 3, 8, 8) * 2 - 1
    out = random_crop(x, 2, torch.Generator().manual_seed(0))
    assert out.shape == x.shape
    padded = torch.nn.functional.pad(x, (2,) * 4, value=-1.0)
    offsets = set()
    for i in range(16):
        found = [(a, b) for a in range(5) for b in range(5)
                 if torch.equal(out[i], padded[i, :, a:a + 8, b:b + 8])]
        assert found
        offsets.add(found[0])
    assert len(offsets) > 3  # the offsets vary from image to image
    # no crop: the flip-only path draws the same numbers as before the crop existed
    a = augment(x, torch.Generator().manual_seed(3), flip=True, crop=0)
    assert torch.equal(a, random_hflip(x, torch.Generator().manual_seed(3)))


def test_an_unknown_partitioner_names_the_allowed_ones(tiny_config):
    from fedgo_flwr.keys import ConfigError
    with pytest.raises(ConfigError, match="'partitioner' is 'natural'; allowed: dirichlet, "
                                          "exponential, iid, linear, pathological, shard, square"):
        tiny_config.replace(partitioner="natural").validate()


@pytest.mark.parametrize("clients,alpha", [(100, 0.05), (100, 0.1), (500, 0.05)])
def test_the_papers_many_client_split_is_made_for_the_full_fmnist_pool(clients, alpha):
    """K = 100 (and 500) over Fashion-MNIST's client pool (3,000 images a class), by Lin et
    al.'s groups of 10: every image once, every client at least half its group's mean, few
    classes a client, and the seed alone fixes it; one draw over all K cannot be made."""
    labels = np.repeat(np.arange(10), 3000)
    how = Partitioning("dirichlet", alpha, dirichlet_group=10)
    parts = partition_pool(labels, clients, how, seed=3)
    assert len(parts) == clients
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(len(labels)))
    assert min(map(len, parts)) >= len(labels) // clients // 2
    main = [np.sum(np.bincount(labels[p], minlength=10) >= 0.1 * len(p)) for p in parts]
    assert np.median(main) <= 3  # narrow clients, as the paper's Figures 5-6 show
    if clients > 100:
        return
    again = partition_pool(labels, clients, how, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    other = partition_pool(labels, clients, how, seed=4)
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other))
    with pytest.raises(ValueError, match="could not give each of .* or split them in groups "
                                         r"\('dirichlet-group'"):
        partition_pool(labels, clients, Partitioning("dirichlet", alpha), seed=3)
