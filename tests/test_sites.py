"""Deployment with each site's own data: a node started with --node-config dataset-path=...
trains on its own image folder (no partitioning), reports its class names, and the server
refuses a node whose classes are not its own. Here on the in-process grid; the same through
SuperNode processes in test_deploy."""

import json
import logging

import numpy as np
import pytest
from PIL import Image

from client_app.app import app as client_app
from fedgo_lab.inprocess import InProcessGrid
from server_app.app import run

CLASSES = ("cat", "dog", "owl")


def write_site(root, counts: dict[str, int], seed: int, size: int = 32):
    """An ImageFolder of class folders with these image counts (0: an empty folder)."""
    rng = np.random.default_rng(seed)
    for c, n in counts.items():
        (root / c).mkdir(parents=True)
        for i in range(n):
            tint = rng.integers(0, 256, 3)
            pixels = np.clip(rng.normal(tint, 30, (size, size, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / c / f"{i}.png")


@pytest.fixture
def sites(tmp_path):
    server = tmp_path / "server"
    write_site(server / "train", dict.fromkeys(CLASSES, 8), seed=0)
    write_site(server / "test", dict.fromkeys(CLASSES, 4), seed=1)
    mixes = [{"cat": 12, "dog": 2, "owl": 0}, {"cat": 0, "dog": 10, "owl": 3},
             {"cat": 3, "dog": 3, "owl": 9}, {"cat": 5, "dog": 5, "fox": 5}]
    paths = []
    for i, mix in enumerate(mixes):
        write_site(tmp_path / f"site{i}", mix, seed=10 + i)
        paths.append(tmp_path / f"site{i}")
    return server, paths


def _run(cfg, paths):
    grid = InProcessGrid(client_app, cfg.to_run_config(), len(paths))
    for node, path in zip(grid.nodes.values(), paths):
        node.node_config["dataset-path"] = str(path)
    return json.loads(run(grid, cfg).read_text()), grid


def test_each_site_trains_on_its_own_folder_and_a_foreign_one_is_left_out(sites, tiny_config,
                                                                          caplog):
    server, paths = sites
    cfg = tiny_config.replace(dataset="folder", data_dir=str(server), num_server_rounds=1,
                              fraction_train=1.0, diagnostics=True)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        record, _ = _run(cfg, paths)
    clients = record["clients"]
    assert clients["num_examples"] == {"0": 14, "1": 13, "2": 15}  # each site's own n_k
    assert clients["label_histograms"] == {"0": [12, 2, 0], "1": [0, 10, 3], "2": [3, 3, 9]}
    assert clients["refused"] == {
        "3": "its classes [cat, dog, fox] are not the server's [cat, dog, owl]"}
    assert clients["missing_at_start"] == []  # refused, not missing: it answered
    assert "node 1051 (partition 3) is left out: its classes [cat, dog, fox]" in caplog.text
    assert record["rounds"][1]["clients"] == [0, 1, 2]
    assert np.isfinite(record["rounds"][1]["server_test_acc"])


def test_under_require_all_clients_a_foreign_site_fails_the_run_naming_both_lists(
        sites, tiny_config):
    server, paths = sites
    cfg = tiny_config.replace(dataset="folder", data_dir=str(server), num_server_rounds=1,
                              require_all_clients=True)
    with pytest.raises(RuntimeError, match=r"partition 3\): its classes \[cat, dog, fox\] are "
                                           r"not the server's \[cat, dog, owl\]; give every"):
        _run(cfg, paths)
