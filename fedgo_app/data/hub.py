"""Any image classification dataset of the Hugging Face hub, `dataset = "hub:<name>"`
("hub:uoft-cs/cifar10"), or a local folder in a format `datasets.load_dataset` reads
("hub:/data/my-set": parquet or arrow files, an imagefolder), loaded through flwr-datasets'
FederatedDataset (downloads are cached under <data-dir>/hub). Its `train` and `test` splits are
used; the image and label columns are the ones whose features are an Image and a ClassLabel."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from datasets import ClassLabel
from datasets import Image as ImageFeature
from flwr_datasets import FederatedDataset

from fedgo_app.data.folder import rgb_pixels

PREFIX = "hub:"


def column(features, kind, what: str, name: str) -> str:
    found = [c for c, f in features.items() if isinstance(f, kind)]
    if not found:
        raise RuntimeError(f"dataset 'hub:{name}' has no {what} column (features: "
                           f"{', '.join(f'{c}: {type(f).__name__}' for c, f in features.items())})")
    return found[0]


def load_hub(name: str, root: Path, image_size: int):
    """(train x, train y, test x, test y, class names) of hub dataset `name`."""
    fds = FederatedDataset(dataset=name, partitioners={"train": 1}, shuffle=False,
                           cache_dir=str(Path(root) / "hub"))
    try:
        splits = [fds.load_split(s) for s in ("train", "test")]
    except ValueError as err:  # a split it lacks
        raise RuntimeError(f"dataset 'hub:{name}' needs a train and a test split ({err})") \
            from None
    except (OSError, FileNotFoundError) as err:  # not found, or offline
        raise RuntimeError(f"dataset 'hub:{name}' could not be loaded ({' '.join(str(err).split())}"
                           "); check the name on huggingface.co, or give a local folder as "
                           "\"hub:/path\"") from None
    features = splits[0].features
    image = column(features, ImageFeature, "image", name)
    label = column(features, ClassLabel, "class-label", name)
    out = []
    for split in splits:
        pixels = [rgb_pixels(img, image_size) for img in split[image]]
        if len({p.shape for p in pixels}) > 1:
            raise RuntimeError(f"dataset 'hub:{name}': images differ in size; set run-config "
                               "key 'image-size' to resize them all to one side")
        out += [torch.from_numpy(np.stack(pixels)).permute(0, 3, 1, 2).contiguous(),
                torch.tensor(split[label], dtype=torch.long)]
    return (*out, tuple(features[label].names))
