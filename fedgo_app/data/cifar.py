"""CIFAR-10 and CIFAR-100 through torchvision's CIFAR10 / CIFAR100 classes.

Looked up in `data_dir` (cifar-10-batches-py/ or cifar-100-python/, the python pickles of the
official archives); else torchvision downloads and checks the archive. A copy already there is
read by torchvision's own reader with its md5 checks of the official files replaced by a check
that they exist, so a copy written by other tools in the same format (or a test's tiny one)
loads too; unpickling still checks the format."""

from __future__ import annotations

import pickle
from pathlib import Path

import torch
from torchvision.datasets import CIFAR10, CIFAR100

from fedgo_app.data.lock import fetch_once


def present(cls: type[CIFAR10]) -> type[CIFAR10]:
    """torchvision's reader `cls` for files that are present, whatever their checksums."""

    class Present(cls):
        def _check_integrity(self) -> bool:
            folder = Path(self.root) / self.base_folder
            names = [name for name, _ in [*self.train_list, *self.test_list]]
            return all((folder / name).is_file() for name in [*names, self.meta["filename"]])

        def _load_meta(self) -> None:
            with open(Path(self.root) / self.base_folder / self.meta["filename"], "rb") as f:
                self.classes = pickle.load(f, encoding="latin1")[self.meta["key"]]
            self.class_to_idx = {c: i for i, c in enumerate(self.classes)}

    return Present


def load_cifar(root: Path, classes: int):
    """(train x, train y, test x, test y, class names) of CIFAR-`classes` in `root`, images
    uint8 [N, 3, 32, 32]."""
    official = {10: CIFAR10, 100: CIFAR100}[classes]
    reader = present(official)
    probe = reader.__new__(reader)
    probe.root = str(root)
    fetch_once(root, probe._check_integrity, lambda: download(official, root, classes))
    train, test = read(reader, root, classes)

    def images(ds) -> torch.Tensor:
        return torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous()

    return (images(train), torch.tensor(train.targets, dtype=torch.long), images(test),
            torch.tensor(test.targets, dtype=torch.long), tuple(train.classes))


def read(reader: type[CIFAR10], root: Path, classes: int) -> tuple:
    try:
        return reader(str(root), train=True), reader(str(root), train=False)
    except (pickle.UnpicklingError, EOFError, KeyError, ValueError) as err:
        raise RuntimeError(f"CIFAR-{classes}: cannot read the files in "
                           f"{Path(root) / reader.base_folder} ({err!r}); replace them with the "
                           f"python version of the official archive ({reader.url}), "
                           "extracted") from None


def download(official: type[CIFAR10], root: Path, classes: int) -> None:
    """torchvision's download and check of the official archive, extracted into `root`."""
    try:
        official(str(root), train=True, download=True)
    except (OSError, RuntimeError) as err:  # no network: URLError is an OSError
        why = " ".join(str(err).split())
        raise RuntimeError(
            f"CIFAR-{classes} is not in {Path(root) / official.base_folder} and downloading it "
            f"failed ({why}). Fix: set run-config key data-dir (or $FEDGO_DATA_DIR) to a "
            f"folder holding {official.base_folder}/, the python version of {official.url} "
            "extracted") from None
