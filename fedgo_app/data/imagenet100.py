"""ImageNet100 (FedGO's third dataset): the 100 ImageNet classes of CMC (Tian et al. 2019,
the list github.com/HobbitLong/CMC/imagenet100.txt, also that of the Kaggle ImageNet100 the
paper cites), downsampled as Chrabaszcz et al. (2017) did, stored as an ImageFolder tree:

    <data-dir>/imagenet100/train/<wnid>/<image>   and   <data-dir>/imagenet100/val/<wnid>/<image>

at 32x32 or 64x64 (the downsampled ImageNet files are numpy batches: write them out as images
once). The class folders are checked against the list: a missing or extra synset fails the run
naming them."""

from __future__ import annotations

from pathlib import Path

from fedgo_app.data.folder import read_tree

CLASSES = tuple("""
n02869837 n01749939 n02488291 n02107142 n13037406 n02091831 n04517823 n04589890
n03062245 n01773797 n01735189 n07831146 n07753275 n03085013 n04485082 n02105505
n01983481 n02788148 n03530642 n04435653 n02086910 n02859443 n13040303 n03594734
n02085620 n02099849 n01558993 n04493381 n02109047 n04111531 n02877765 n04429376
n02009229 n01978455 n02106550 n01820546 n01692333 n07714571 n02974003 n02114855
n03785016 n03764736 n03775546 n02087046 n07836838 n04099969 n04592741 n03891251
n02701002 n03379051 n02259212 n07715103 n03947888 n04026417 n02326432 n03637318
n01980166 n02113799 n02086240 n03903868 n02483362 n04127249 n02089973 n03017168
n02093428 n02804414 n02396427 n04418357 n02172182 n01729322 n02113978 n03787032
n02089867 n02119022 n03777754 n04238763 n02231487 n03032252 n02138441 n02104029
n03837869 n03494278 n04136333 n03794056 n03492542 n02018207 n04067472 n03930630
n03584829 n02123045 n04229816 n02100583 n03642806 n04336792 n03259280 n02116738
n02108089 n03424325 n01855672 n02090622
""".split())


def load_imagenet100(root: Path, image_size: int):
    """(train x, train y, test x, test y, class names) of ImageNet100 under `root`."""
    return read_tree(Path(root) / "imagenet100", image_size, "imagenet100",
                     "<data-dir>/imagenet100/{train,val}/<wnid>/<image>", test="val",
                     check_classes=check_classes)


def check_classes(folder: Path, found: list[str]) -> None:
    missing, extra = sorted(set(CLASSES) - set(found)), sorted(set(found) - set(CLASSES))
    if missing or extra:
        raise RuntimeError(
            f"dataset 'imagenet100': the class folders of {folder} are not ImageNet100's 100 "
            f"synsets ({len(missing)} missing: {', '.join(missing[:3]) or '-'}; {len(extra)} "
            f"not in the list: {', '.join(extra[:3]) or '-'}); see fedgo_app/data/imagenet100.py")
