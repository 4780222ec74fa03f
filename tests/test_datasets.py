"""Every registered dataset read from tiny files in its real on-disk format: CIFAR's python
pickles, an ImageFolder tree; and the one-line errors of a bad folder."""

import pickle
import threading

import numpy as np
import pytest
import torch
from PIL import Image

import fedgo_app.data.cifar as cifar
import fedgo_app.data.fmnist as fmnist
from conftest import write_tiny_fmnist
from fedgo_app.config import Config
from fedgo_app.data import DATASETS, client_data, load_dataset, server_data
from fedgo_app.data.lock import fetching
from fedgo_flwr.keys import ConfigError

pytestmark = pytest.mark.unit


def write_cifar(root, classes: int, per_batch: int = 20, seed: int = 0):
    """CIFAR-10 (five data batches, a test batch, batches.meta) or CIFAR-100 (train, test,
    meta) as the official python archives lay them out, at `per_batch` images a file."""
    rng = np.random.default_rng(seed)
    if classes == 10:
        folder, files, key = root / "cifar-10-batches-py", [
            *(f"data_batch_{i}" for i in range(1, 6)), "test_batch"], "labels"
        meta, names = ("batches.meta", "label_names"), [f"class{i}" for i in range(10)]
    else:
        folder, files, key = root / "cifar-100-python", ["train", "test"], "fine_labels"
        meta, names = ("meta", "fine_label_names"), [f"class{i}" for i in range(100)]
    folder.mkdir(parents=True)
    for name in files:
        n = per_batch * (5 if classes == 100 and name == "train" else 1)
        entry = {"data": rng.integers(0, 256, (n, 3 * 32 * 32), dtype=np.uint8),
                 key: (np.arange(n) % classes).tolist()}
        (folder / name).write_bytes(pickle.dumps(entry))
    (folder / meta[0]).write_bytes(pickle.dumps({meta[1]: names}))
    return names


@pytest.mark.parametrize("classes", [10, 100])
def test_cifar_is_read_from_its_python_pickles(tmp_path, classes):
    names = write_cifar(tmp_path, classes)
    data = load_dataset(f"cifar{classes}", tmp_path)
    assert data.train_x.shape == (100, 3, 32, 32) and data.train_x.dtype == torch.uint8
    assert data.test_x.shape == (20, 3, 32, 32)
    assert data.num_classes == classes and list(data.classes) == names
    first = pickle.loads((next(tmp_path.iterdir()) / ("data_batch_1" if classes == 10
                                                      else "train")).read_bytes())
    assert torch.equal(data.train_x[0], torch.from_numpy(first["data"][0]).view(3, 32, 32))
    small = load_dataset(f"cifar{classes}", tmp_path, 16)  # image-size resizes
    assert small.train_x.shape == (100, 3, 16, 16)


def test_a_corrupt_cifar_file_names_the_folder_and_the_fix(tmp_path):
    write_cifar(tmp_path, 10)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").write_bytes(b"not a pickle")
    with pytest.raises(RuntimeError, match="cannot read the files in .*cifar-10-batches-py"):
        load_dataset("cifar10", tmp_path)


def no_network(self):
    raise RuntimeError("this test has no network")


@pytest.mark.parametrize("dataset", ["fmnist", "cifar10"])
def test_a_process_that_finds_the_data_missing_waits_for_the_one_fetching_it(tmp_path,
                                                                           monkeypatch, dataset):
    # Ray's clients, parallel runs or SuperNodes sharing a folder on a fresh machine: one
    # fetches, the others wait for it and read its files (they neither download into the
    # same place at once nor read a half-written file).
    monkeypatch.setattr(fmnist, "DEBIAN_DIR", tmp_path / "nowhere")
    monkeypatch.setattr(fmnist.FashionMNIST, "download", no_network)
    monkeypatch.setattr(cifar.CIFAR10, "download", no_network)
    root, loaded = tmp_path / "data", {}
    waiter = threading.Thread(target=lambda: loaded.update(x=DATASETS[dataset](root, 0).train_x))
    with fetching(root):  # another process is fetching
        waiter.start()
        waiter.join(timeout=1.0)
        assert waiter.is_alive()  # waiting, not downloading (which fails at once here)
        if dataset == "fmnist":  # what the fetcher writes
            write_tiny_fmnist(root / "FashionMNIST" / "raw", n_train=40, n_test=10)
        else:
            write_cifar(root, 10)
    waiter.join(timeout=60)
    assert loaded["x"].shape[0] == (40 if dataset == "fmnist" else 100)


def write_folder(root, classes=("cat", "dog", "owl"), per_class=4, size=(20, 20), seed=0):
    rng = np.random.default_rng(seed)
    for split in ("train", "test"):
        for c in classes:
            (root / split / c).mkdir(parents=True)
            for i in range(per_class):
                pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / c / f"{i}.png")


def test_an_image_folder_is_a_dataset(tmp_path):
    write_folder(tmp_path)
    data = load_dataset("folder", tmp_path)
    assert data.classes == ("cat", "dog", "owl")
    assert data.train_x.shape == (12, 3, 20, 20) and data.test_x.shape == (12, 3, 20, 20)
    assert data.train_y.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    saved = np.array(Image.open(tmp_path / "train" / "dog" / "0.png"))
    assert torch.equal(data.train_x[4], torch.from_numpy(saved).permute(2, 0, 1))
    assert load_dataset("folder", tmp_path, 32).train_x.shape == (12, 3, 32, 32)


def test_a_run_reads_its_folder_dataset(tmp_path):
    """The split, the partitions and the server's sets come out of a folder like any dataset."""
    write_folder(tmp_path, per_class=10)
    cfg = Config().replace(dataset="folder", data_dir=str(tmp_path), image_size=32, alpha=1.0,
                           distill_size=0, test_size=0)
    x, y = client_data(cfg, 0, 2)
    assert x.shape[1:] == (3, 32, 32) and len(y) > 0
    u, test_x, test_y = server_data(cfg)
    assert len(u) == 15 and len(test_y) == 30


@pytest.mark.parametrize("damage,message", [
    ("no-train", r"no folder .*train; lay the images out as <data-dir>/train/<class>"),
    ("empty-class", r"Found no valid file for the classes owl.*every class needs a folder"),
    ("unreadable", r"cannot read image .*dog.0.png .*remove or replace it"),
    ("sizes", r"images differ in size: .* is 20x20, .* is 24x18; set run-config key "
              r"'image-size'"),
    ("test-classes", r"class folders of .*test \(cat, dog\) differ from those of .*train"),
])
def test_a_bad_folder_fails_in_one_line_naming_the_path_and_the_fix(tmp_path, damage, message):
    write_folder(tmp_path)
    if damage == "no-train":
        for f in (tmp_path / "train").rglob("*.png"):
            f.unlink()
        for d in sorted((tmp_path / "train").glob("*")):
            d.rmdir()
        (tmp_path / "train").rmdir()
    elif damage == "empty-class":
        for f in (tmp_path / "train" / "owl").glob("*"):
            f.unlink()
    elif damage == "unreadable":
        (tmp_path / "train" / "dog" / "0.png").write_bytes(b"not an image")
    elif damage == "sizes":
        Image.new("RGB", (24, 18)).save(tmp_path / "train" / "owl" / "9.png")
    elif damage == "test-classes":
        for f in (tmp_path / "test" / "owl").glob("*"):
            f.unlink()
        (tmp_path / "test" / "owl").rmdir()
    with pytest.raises(RuntimeError, match=message) as err:
        load_dataset("folder", tmp_path)
    assert "\n" not in str(err.value)


def test_an_unknown_dataset_names_the_registered_ones():
    with pytest.raises(ConfigError, match="'dataset' is 'mnist'; allowed: one of "
                                          + ", ".join(DATASETS) + r", or \"hub:<name or path>"):
        Config().replace(dataset="mnist").validate()


def test_a_hugging_face_dataset_is_read_through_flwr_datasets(tmp_path):
    """dataset = "hub:<path>": a local dataset in the hub's parquet layout, its image and
    class-label columns found by their features."""
    import datasets
    features = datasets.Features({"caption": datasets.Value("string"),
                                  "picture": datasets.Image(),
                                  "kind": datasets.ClassLabel(names=["ant", "bee"])})
    rng = np.random.default_rng(0)
    (tmp_path / "set" / "data").mkdir(parents=True)
    for split, n in (("train", 6), ("test", 4)):
        pixels = rng.integers(0, 256, (n, 12, 12, 3), dtype=np.uint8)
        rows = {"caption": ["x"] * n, "picture": [Image.fromarray(p) for p in pixels],
                "kind": [i % 2 for i in range(n)]}
        datasets.Dataset.from_dict(rows, features=features).to_parquet(
            tmp_path / "set" / "data" / f"{split}-00000-of-00001.parquet")
        if split == "train":
            first = pixels[0]
    name = f"hub:{tmp_path / 'set'}"
    Config().replace(dataset=name).validate()
    data = load_dataset(name, tmp_path / "cache")
    assert data.classes == ("ant", "bee") and data.train_x.shape == (6, 3, 12, 12)
    assert data.test_y.tolist() == [0, 1, 0, 1]
    assert torch.equal(data.train_x[0], torch.from_numpy(first).permute(2, 0, 1))
    with pytest.raises(RuntimeError, match="could not be loaded"):
        load_dataset(f"hub:{tmp_path / 'nothing-here'}", tmp_path / "cache")


def test_the_servers_unlabeled_set_can_come_from_another_dataset(tmp_path):
    """server-dataset: U is the server half of another dataset (FedGO's Table 7), the clients
    and the test split stay on `dataset`; images of another shape are refused naming both."""
    write_cifar(tmp_path, 10)
    write_cifar(tmp_path, 100, per_batch=40, seed=1)  # 200 images, two of each class
    cfg = Config().replace(dataset="cifar10", data_dir=str(tmp_path), distill_size=0,
                           test_size=0, alpha=1.0)
    own_u, test_x, _ = server_data(cfg)
    u, other_test_x, _ = server_data(cfg.replace(server_dataset="cifar100"))
    cifar100 = load_dataset("cifar100", tmp_path)
    assert len(u) == 100 and all((cifar100.train_x == img).all((1, 2, 3)).any() for img in u)
    assert len(own_u) == 50
    assert torch.equal(test_x, other_test_x)
    write_folder(tmp_path, size=(16, 16))
    with pytest.raises(ConfigError, match=r"'server-dataset' is 'folder', whose images are "
                                          r"3x16x16, while dataset 'cifar10' has 3x32x32"):
        server_data(cfg.replace(server_dataset="folder"))


def test_imagenet100_is_its_100_synsets_at_32_or_64_pixels(tmp_path):
    from fedgo_app.data.imagenet100 import CLASSES
    root = tmp_path / "imagenet100"
    for split in ("train", "val"):
        for i, wnid in enumerate(CLASSES):
            (root / split / wnid).mkdir(parents=True)
            Image.new("RGB", (64, 64), (i, 2 * i, 0)).save(root / split / wnid / "a.png")
    data = load_dataset("imagenet100", tmp_path)
    assert data.num_classes == 100 and data.train_x.shape == (100, 3, 64, 64)
    assert list(data.classes) == sorted(CLASSES)
    assert load_dataset("imagenet100", tmp_path, 32).test_x.shape == (100, 3, 32, 32)
    (root / "train" / "n99999999").mkdir()
    Image.new("RGB", (64, 64)).save(root / "train" / "n99999999" / "a.png")
    for f in (root / "train" / CLASSES[0]).glob("*"):
        f.unlink()
    (root / "train" / CLASSES[0]).rmdir()
    with pytest.raises(RuntimeError, match=r"not ImageNet100's 100 synsets \(1 missing: "
                                           r"n02869837; 1 not in the list: n99999999\)"):
        load_dataset("imagenet100", tmp_path, 16)


def test_missing_data_in_a_folder_it_cannot_write_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(cifar.CIFAR10, "download", no_network)
    (tmp_path / "file").write_text("")  # a data-dir below a file: nothing can be created there
    with pytest.raises(RuntimeError, match="CIFAR-10 is not in .* Fix: set run-config key"):
        cifar.load_cifar(tmp_path / "file" / "data", 10)
