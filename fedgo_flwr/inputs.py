"""The data the library takes from a user: images as a tensor, a torch `Dataset` or a
`DataLoader`, with or without labels, gathered into tensors once.

Images are [N, C, H, W]: uint8 pixels (mapped to [-1, 1], the paper's App. E.2), or floats
already in the range the user's model takes. FedGO's generator ends in tanh, so a user whose
model takes other floats than [-1, 1] should give uint8 images or normalise to [-1, 1].
A batch may be a tensor, an (images, labels) pair, or a dict as Hugging Face datasets give
it (keys below, as Flower's quickstarts name them)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch.utils.data import DataLoader, Dataset

IMAGE_KEYS = ("img", "image", "x", "pixel_values")
LABEL_KEYS = ("label", "labels", "y", "fine_label")


def _split(item) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(images, labels or None) of one item or batch."""
    if isinstance(item, torch.Tensor):
        return item, None
    if isinstance(item, Mapping):
        x = next((item[k] for k in IMAGE_KEYS if k in item), None)
        if x is None:
            raise ValueError(f"a batch with keys {sorted(item)} has no images under any of "
                             f"{IMAGE_KEYS}: pass (images, labels) tensors instead")
        return x, next((item[k] for k in LABEL_KEYS if k in item), None)
    if isinstance(item, (tuple, list)) and item:
        return item[0], item[1] if len(item) > 1 else None
    raise TypeError(f"cannot read images from a {type(item).__name__}; give a tensor, a "
                    "Dataset or a DataLoader of tensors, (images, labels) or dicts")


def _gather(data) -> tuple[torch.Tensor, torch.Tensor | None]:
    if isinstance(data, torch.Tensor):
        return data, None
    if isinstance(data, (tuple, list)) and len(data) == 2 and all(
            isinstance(t, torch.Tensor) for t in data):
        return data[0], data[1]
    if isinstance(data, DataLoader):
        batches = [_split(b) for b in data]
    elif isinstance(data, Dataset):
        items = [_split(data[i]) for i in range(len(data))]  # type: ignore[arg-type]
        batches = [(torch.stack([torch.as_tensor(x) for x, _ in items]),
                    None if items[0][1] is None else torch.as_tensor([y for _, y in items]))]
    else:
        raise TypeError(f"cannot read images from a {type(data).__name__}; give a tensor, "
                        "an (images, labels) pair, a torch Dataset or a DataLoader")
    if not batches:
        raise ValueError("the data holds no images")
    x = torch.cat([torch.as_tensor(b[0]) for b in batches])
    y = None if batches[0][1] is None else torch.cat([torch.as_tensor(b[1]) for b in batches])
    return x, y


def images_of(data) -> torch.Tensor:
    """The images of `data` as one tensor [N, C, H, W] (labels, if any, dropped)."""
    x, _ = _gather(data)
    if x.dim() != 4:
        raise ValueError(f"images must be [N, C, H, W]; got shape {tuple(x.shape)}")
    return x


def labelled(data) -> tuple[torch.Tensor, torch.Tensor]:
    """(images [N, C, H, W], labels [N]) of labelled `data`."""
    x, y = _gather(data)
    if y is None:
        raise ValueError("the data has no labels: give (images, labels) pairs")
    if x.dim() != 4 or len(x) != len(y):
        raise ValueError(f"images {tuple(x.shape)} and labels {tuple(y.shape)} do not match "
                         "as [N, C, H, W] and [N]")
    return x, y.long()
