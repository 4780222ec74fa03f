"""Fashion-MNIST through torchvision's FashionMNIST class.

Looked up in `data_dir`; else the Debian package's files (/usr/share/datasets/fashion-mnist,
`apt-get install dataset-fashion-mnist`) are decompressed into `data_dir` with torchvision's own
extractor (Debian recompressed the .gz files, so their checksums differ from torchvision's list,
while the images inside are the same; torchvision's IDX reader checks their headers); else
torchvision downloads them.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from torchvision.datasets import FashionMNIST
from torchvision.datasets.utils import extract_archive

from fedgo_app.data.lock import fetch_once

DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")
log = logging.getLogger(__name__)


def load_fmnist(root: Path) -> tuple:
    """(train x, train y, test x, test y, class names), images uint8 [N, 1, 28, 28]."""
    root = Path(root)
    raw = root / "FashionMNIST" / "raw"
    probe = FashionMNIST.__new__(FashionMNIST)
    probe.root = str(root)
    fetch_once(root, probe._check_exists, lambda: fetch(root, raw))
    return read(root)


def fetch(root: Path, raw: Path) -> None:
    """The Debian files decompressed into `raw`, else torchvision's download."""
    if all((DEBIAN_DIR / name).is_file() for name, _ in FashionMNIST.resources):
        raw.mkdir(parents=True, exist_ok=True)
        # Into a private folder, then renamed: a process that does not take the lock (one
        # that found the files already there) never reads a half-written file.
        with tempfile.TemporaryDirectory(dir=raw, prefix=".extract-") as private:
            for name, _ in FashionMNIST.resources:
                extracted = extract_archive(str(DEBIAN_DIR / name), private)
                os.replace(extracted, raw / Path(extracted).name)
        log.info("Fashion-MNIST: using the Debian files from %s", DEBIAN_DIR)
        return
    log.info("Fashion-MNIST: not in %s nor %s; downloading", root, DEBIAN_DIR)
    try:
        FashionMNIST(str(root), train=True, download=True)
    except (OSError, RuntimeError) as err:  # no network: URLError is an OSError
        why = " ".join(str(err).split())  # torchvision's message spans lines
        raise RuntimeError(
            f"Fashion-MNIST is neither in {raw} nor in {DEBIAN_DIR}, and downloading it failed "
            f"({why}). Fix: set run-config key data-dir (or $FEDGO_DATA_DIR) to a folder "
            "holding FashionMNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz], or "
            "install the offline copy: apt-get install dataset-fashion-mnist") from None


def read(root: Path) -> tuple:
    train = FashionMNIST(str(root), train=True)
    test = FashionMNIST(str(root), train=False)
    return (train.data.unsqueeze(1), train.targets.long(),
            test.data.unsqueeze(1), test.targets.long(), tuple(train.classes))
