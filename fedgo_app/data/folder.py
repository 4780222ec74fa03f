"""Any image folder through torchvision's ImageFolder: <root>/train/<class>/<image> and
<root>/test/<class>/<image>, one folder per class (the same class folders in both), images of
any format PIL reads, converted to RGB and, with `image-size`, resized to that side."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torchvision.datasets import ImageFolder

LAYOUT = "<data-dir>/train/<class>/<image> and <data-dir>/test/<class>/<image>"


def rgb_pixels(img: Image.Image, image_size: int) -> np.ndarray:
    """A PIL image as uint8 [H, W, 3] (a writable copy), resized (bilinear) to image_size x
    image_size when that is set: how every image-file dataset reads its images."""
    img = img.convert("RGB")
    if image_size:
        img = img.resize((image_size, image_size), Image.Resampling.BILINEAR)
    return np.array(img, dtype=np.uint8)


def read_split(folder: Path, image_size: int, dataset: str = "folder", layout: str = LAYOUT,
               allow_empty: bool = False) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Images uint8 [N, 3, H, W], labels and class names of one ImageFolder tree (`dataset`
    and its `layout` name it in errors); with `allow_empty`, a class folder may hold no
    image (a site that has none of that class still names it)."""
    if not folder.is_dir():
        raise RuntimeError(f"dataset {dataset!r}: no folder {folder}; lay the images out as "
                           f"{layout}, or set run-config key 'data-dir' to where they are")
    try:
        tree = ImageFolder(str(folder), loader=lambda path: path,  # read below, one by one
                           allow_empty=allow_empty)
    except FileNotFoundError as err:  # no class folder, or a class folder without images
        raise RuntimeError(f"dataset {dataset!r}: {folder}: {err}; every class needs a "
                           f"folder with at least one image ({layout})") from None
    images, first = [], None
    for path, _ in tree.samples:
        try:
            with Image.open(path) as img:
                pixels = rgb_pixels(img, image_size)
        except (UnidentifiedImageError, OSError) as err:
            raise RuntimeError(f"dataset {dataset!r}: cannot read image {path} ({err}); remove or "
                               "replace it") from None
        if first is None:
            first = (path, pixels.shape)
        elif pixels.shape != first[1]:
            raise RuntimeError(
                f"dataset {dataset!r}: images differ in size: {first[0]} is "
                f"{first[1][1]}x{first[1][0]}, {path} is {pixels.shape[1]}x{pixels.shape[0]}; "
                "set run-config key 'image-size' to resize them all to one side")
        images.append(torch.from_numpy(pixels).permute(2, 0, 1))
    if not images:
        raise RuntimeError(f"dataset {dataset!r}: {folder} holds no image ({layout})")
    labels = torch.tensor([label for _, label in tree.samples], dtype=torch.long)
    return torch.stack(images), labels, tree.classes


SITE_LAYOUT = "<dataset-path>/<class>/<image>, every class of the federation a folder"


def load_site(path: Path, image_size: int) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """A deployment node's own data S_k (`--node-config dataset-path=...`): an ImageFolder
    tree of class folders (or its train/ subfolder); a class folder may be empty."""
    path = Path(path)
    folder = path / "train" if (path / "train").is_dir() else path
    return read_split(folder, image_size, "dataset-path", SITE_LAYOUT, allow_empty=True)


def read_tree(root: Path, image_size: int, dataset: str = "folder", layout: str = LAYOUT,
              test: str = "test", check_classes=None):
    """(train x, train y, test x, test y, class names) of the ImageFolder trees root/train and
    root/<test>: the same class folders and image shape in both; `check_classes(folder,
    classes)`, when given, vets each tree's classes as soon as it is read."""
    splits = []
    for name in ("train", test):
        x, y, classes = read_split(Path(root) / name, image_size, dataset, layout)
        if check_classes is not None:
            check_classes(Path(root) / name, classes)
        splits.append((x, y, classes))
    (train_x, train_y, classes), (test_x, test_y, test_classes) = splits
    if test_classes != classes:
        raise RuntimeError(f"dataset {dataset!r}: the class folders of {Path(root) / test} "
                           f"({', '.join(test_classes)}) differ from those of "
                           f"{Path(root) / 'train'} ({', '.join(classes)})")
    if test_x.shape[1:] != train_x.shape[1:]:
        raise RuntimeError(f"dataset {dataset!r}: {test} images are {tuple(test_x.shape[2:])}, "
                           f"training images {tuple(train_x.shape[2:])}; set run-config key "
                           "'image-size' to resize them all to one side")
    return train_x, train_y, test_x, test_y, tuple(classes)


def load_folder(root: Path, image_size: int):
    """(train x, train y, test x, test y, class names) of an ImageFolder dataset at `root`."""
    return read_tree(root, image_size)
