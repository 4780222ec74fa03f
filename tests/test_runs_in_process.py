"""Each dataset with another model, each row of FedGO's Table 2 and two architectures in one
federation, as whole runs of the real ServerApp and ClientApp in process: every message and
reply crosses Flower's protobuf serialisation (fedgo_lab.inprocess.wire), so these prove what
a real run's would without a SuperLink and Ray's start-up each; each node's Context crosses it
between messages too. What only the real runtime shows stays there: a user's model module
on Ray's workers and node state kept on them (tests/test_flwr_run.py), kill and resume
(tests/test_first_run.py)."""

import json
import logging
import tomllib

import pytest
import torch
from flwr.common.config import parse_config_args

from conftest import REPO
from test_datasets import write_cifar, write_folder

pytestmark = pytest.mark.app


USER_NET = """
import torch.nn.functional as F
from torch import nn


class TinyNet(nn.Module):
    def __init__(self, channels, num_classes, image_size):
        super().__init__()
        self.conv = nn.Conv2d(channels, 8, 3, padding=1)
        self.fc = nn.Linear(8 * (image_size // 2) ** 2, num_classes)

    def forward(self, x):
        return self.fc(F.max_pool2d(F.relu(self.conv(x)), 2).flatten(1))
"""


def _write_hub(root):
    import datasets
    import numpy as np
    from PIL import Image
    features = datasets.Features({"img": datasets.Image(),
                                  "label": datasets.ClassLabel(names=list("abcd"))})
    rng = np.random.default_rng(0)
    (root / "data").mkdir(parents=True)
    for split, n in (("train", 48), ("test", 12)):
        rows = {"img": [Image.fromarray(p) for p in
                        rng.integers(0, 256, (n, 28, 28, 3), dtype=np.uint8)],
                "label": [i % 4 for i in range(n)]}
        datasets.Dataset.from_dict(rows, features=features).to_parquet(
            root / "data" / f"{split}-00000-of-00001.parquet")


def write_imagenet100(root):
    from PIL import Image
    from fedgo_app.data.imagenet100 import CLASSES
    for split in ("train", "val"):
        for i, wnid in enumerate(CLASSES):
            (root / "imagenet100" / split / wnid).mkdir(parents=True)
            for j in range(2 if split == "train" else 1):
                Image.new("RGB", (64, 64), (i, 2 * i, 40 * j)).save(
                    root / "imagenet100" / split / wnid / f"{j}.png")


# Each dataset, each with another model (tests/test_runs_in_process.py): name -> (writer of
# its files under data-dir, overrides). The CNN on Fashion-MNIST is every other run.
DATA_RUNS = {
    "cifar10-resnet18": (lambda d: write_cifar(d, 10), 'dataset="cifar10" model="resnet18"'),
    "cifar100-vgg11-bn": (lambda d: write_cifar(d, 100, per_batch=40),
                          'dataset="cifar100" model="vgg11-bn" optimizer="sgd" lr=0.01'),
    # (ResNet-50 itself: tests/test_models.py; a round of it here took minutes)
    "imagenet100-mlp": (lambda d: write_imagenet100(d),
                        'dataset="imagenet100" model="mlp" image-size=32'),
    "folder-user-model": (lambda d: write_folder(d, per_class=8, size=(28, 28)),
                          'dataset="folder" model="user_nets:TinyNet"'),
    "hub-cnn": (lambda d: _write_hub(d / "set"), 'model="cnn"'),
}


def run_in_process(overrides: dict, partitions: int = 3) -> tuple[dict, str]:
    """A whole run of the app on `overrides` (over its defaults); its record and its log."""
    from client_app.app import app as client_app
    from fedgo_app.config import Config
    from fedgo_lab.inprocess import InProcessGrid
    from server_app.app import run

    cfg = Config.from_run_config({**Config().to_run_config(), **overrides})
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger("flwr")
    logger.addHandler(handler)
    try:
        path = run(InProcessGrid(client_app, cfg.to_run_config(), partitions), cfg)
    finally:
        logger.removeHandler(handler)
    return json.loads(path.read_text()), "\n".join(lines)


@pytest.mark.parametrize("name", DATA_RUNS)
def test_each_dataset_and_model_runs(name, tmp_path, monkeypatch):
    """One FedGO round of each dataset (tiny files in its real format) with another model."""
    data, results = tmp_path / "data", tmp_path / "results"
    data.mkdir()
    write, overrides = DATA_RUNS[name]
    write(data)
    if name == "hub-cnn":
        overrides = f'dataset="hub:{data / "set"}" {overrides}'
    (tmp_path / "user_nets.py").write_text(USER_NET)
    monkeypatch.syspath_prepend(str(tmp_path))
    common = (f'data-dir="{data}" results-dir="{results}" run-name="real" strategy="fedgo" '
              'num-server-rounds=1 fraction-train=0.7 local-epochs=1 server-epochs=1 '
              'generator-steps=1 generator-width=8 discriminator-width=8 '
              'discriminator-epochs=1 distill-size=0 test-size=0 partitioner="iid" ')
    record, _ = run_in_process(parse_config_args([common + overrides]))
    assert record["config"]["model"] in overrides
    assert record["clients"]["num_partitions"] == 3
    assert record["rounds"][1]["ensemble_test_acc"] >= 0
    assert (results / "real" / "model.pt").is_file()


def table2_row(row: str, data_dir, tmp_path) -> dict:
    """The run config of Table 2's row `row` (conf/table2/) at a tiny scale."""
    from fedgo_app.generators import save_generator_file
    from fedgo_flwr.models import Generator
    preset = tomllib.loads((REPO / "conf" / "table2" / f"{row}.toml").read_text())
    preset.update({"data-dir": str(data_dir), "results-dir": str(tmp_path / "results"),
                   "run-name": "row", "num-server-rounds": 1, "fraction-train": 0.7,
                   "local-epochs": 1, "server-epochs": 1, "generator-steps": 2,
                   "generator-width": 8, "discriminator-width": 8, "discriminator-epochs": 1,
                   "fedgan-rounds": 1, "fedgan-epochs": 1, "alpha": 0.5,
                   "distill-size": 64 if preset["distill-set"] == "generated" else 0})
    if preset["generator-source"] == "load":
        torch.manual_seed(0)
        preset["generator-file"] = str(save_generator_file(
            tmp_path / "g.pt", Generator(128, 1, 28, dim=8), 1))
    return preset


def check_table2_record(record: dict, preset: dict) -> None:
    """The row's generator and distillation set are the ones its preset names."""
    assert record["pre_fl"]["generator"].get("source", "train-on-u") == preset["generator-source"]
    assert ("distillation_set" in record["pre_fl"]) == (preset["distill-set"] == "generated")
    assert record["rounds"][1]["ensemble_test_acc"] >= 0


@pytest.mark.parametrize("row", ["s1-g1-d1", "s1-g2-d1", "s2-g2-d2", "s2-g3-d2"])
def test_each_row_of_table_2_runs(row, tiny_data_dir, tmp_path):
    """Each preset of FedGO's Table 2, on a tiny configuration: the generator from U, from a
    file, or from the clients (FedGAN); distilled on U or on a generated set."""
    preset = table2_row(row, tiny_data_dir, tmp_path)
    check_table2_record(run_in_process(preset)[0], preset)


def mixed_overrides(strategy: str, data_dir, results) -> str:
    """Half the clients the CNN, half a user's network (user_nets.py, USER_NET), one round."""
    return (f'data-dir="{data_dir}" results-dir="{results}" run-name="mixed" '
            f'strategy="{strategy}" client-models="cnn:0.5,user_nets:TinyNet:0.5" '
            'num-server-rounds=1 fraction-train=1.0 local-epochs=1 server-epochs=1 '
            'generator-steps=1 generator-width=8 discriminator-width=8 discriminator-epochs=1 '
            'distill-size=0 test-size=0 alpha=0.5')


def check_mixed_run(results, log: str) -> None:
    """Both global models trained and distilled from the ensemble of all three clients;
    user_nets must be importable."""
    from fedgo_flwr.models import create_classifier
    record = json.loads((results / "mixed" / "record.json").read_text())
    assert sorted(set(record["clients"]["architectures"].values())) == [
        "cnn", "user_nets:TinyNet"]
    assert set(record["rounds"][1]["architectures"]) == {"cnn", "user_nets:TinyNet"}
    assert record["rounds"][1]["ensemble_test_acc"] >= 0
    model = torch.load(results / "mixed" / "model.pt")
    assert {name.split("/")[0] for name in model} == {"cnn", "user_nets:TinyNet"}
    assert "3 teachers pseudo-labelled" in log  # the ensemble spans both architectures
    for arch in ("cnn", "user_nets:TinyNet"):  # each global model moved from its start
        torch.manual_seed(0)
        start = create_classifier(arch, 1, 10, 28).state_dict()
        assert any(not torch.equal(model[f"{arch}/{k}"], v) for k, v in start.items())


@pytest.mark.parametrize("strategy", ["fedgo", "feddf"])
def test_two_architectures_in_one_federation(strategy, tiny_data_dir, tmp_path, monkeypatch):
    results = tmp_path / "results"
    (tmp_path / "user_nets.py").write_text(USER_NET)
    monkeypatch.syspath_prepend(str(tmp_path))
    _, log = run_in_process(parse_config_args([mixed_overrides(strategy, tiny_data_dir,
                                                               results)]))
    check_mixed_run(results, log)


def test_a_100_client_federation_runs_two_rounds_as_seeded(tmp_path):
    """The paper's many-client setting (App. F.1): K = 100 partitions of the paper's split
    (Lin et al.'s Dirichlet groups of 10, alpha 0.05), C = 0.4, FedGO with a small model, two
    rounds in process: every partition answers the pre-FL stage, each round trains the 40
    partitions the seed draws, and all of them reply."""
    from conftest import write_tiny_fmnist
    from fedgo_flwr.sampling import sample_clients

    data = tmp_path / "data"
    write_tiny_fmnist(data / "FashionMNIST" / "raw", n_train=4000, n_test=100)
    overrides = parse_config_args([
        f'data-dir="{data}" results-dir="{tmp_path / "results"}" run-name="k100" '
        'strategy="fedgo" model="mlp" num-server-rounds=2 fraction-train=0.4 local-epochs=1 '
        'server-epochs=1 generator-steps=1 generator-width=8 discriminator-width=8 '
        'discriminator-epochs=1 distill-size=0 test-size=0 alpha=0.05 dirichlet-group=10 '
        'seed=3 diagnostics=false'])
    record, _ = run_in_process(overrides, partitions=100)
    assert record["clients"]["num_partitions"] == 100
    assert record["pre_fl"]["replies"]["usable"] == 100
    for t in (1, 2):
        entry = record["rounds"][t]
        assert entry["clients"] == sample_clients(range(100), 0.4, 3, t)
        assert len(entry["clients"]) == 40 and entry["replies"]["usable"] == 40
        assert entry["distill_steps"] > 0 and entry["server_test_acc"] >= 0


def test_teachers_per_image_labels_and_scores_with_the_top_odds_teachers(tiny_config):
    """teachers-per-image = 1 through the app: the round records the weight left out and its
    CPU seconds, and the run differs from the paper's (every teacher), which records none."""
    records = {}
    for m in (1, 0):
        cfg = tiny_config.replace(num_server_rounds=1, fraction_train=1.0, diagnostics=False,
                                  teachers_per_image=m, run_name=f"top{m}")
        records[m], _ = run_in_process(cfg.to_run_config(), partitions=4)
    top, every = (next(r for r in records[m]["rounds"] if r["round"] == 1) for m in (1, 0))
    assert 0 < top["dropped_weight"] < 1 and "dropped_weight" not in every
    assert top["cpu_seconds"] > 0 and 0 <= top["ensemble_test_acc"] <= 1
    assert top["distill_loss"] != every["distill_loss"]
