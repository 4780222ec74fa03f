"""Heterogeneous clients (fedgo_flwr/architectures.py): which client runs which architecture,
one global model per architecture, the ensemble of all of them distilled into each, resume,
and the strategies that refuse a mixed federation."""

import json
import logging

import pytest
import torch

import client_app.app as client_module
from fedgo_flwr.architectures import architecture_of, join, parse_client_models, split
from fedgo_app.config import ConfigError
from fedgo_flwr.models import create_classifier
from fedgo_app.server import checkpoint
from fedgo_lab.inprocess import InProcessGrid
from server_app.app import run

MLP = "mixed_mlp:Net"


@pytest.fixture
def mlp(tmp_path, monkeypatch):
    """A second architecture: a user's MLP by import path."""
    (tmp_path / "mixed_mlp.py").write_text(
        "from torch import nn\n\n"
        "def Net(channels, num_classes, image_size):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(channels * image_size ** 2, 32),\n"
        "                         nn.ReLU(), nn.Linear(32, num_classes))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return MLP


@pytest.mark.unit
def test_shares_assign_partitions_by_the_seed():
    spec = "cnn:0.5,resnet18:0.25,vgg11-bn:0.25"
    archs = [architecture_of(spec, "cnn", p, 8, seed=3) for p in range(8)]
    assert sorted(archs) == ["cnn"] * 4 + ["resnet18"] * 2 + ["vgg11-bn"] * 2
    assert archs == [architecture_of(spec, "cnn", p, 8, seed=3) for p in range(8)]
    assert archs != [architecture_of(spec, "cnn", p, 8, seed=4) for p in range(8)]
    assert architecture_of("", "cnn", 5, 8, 0) == "cnn"
    assert parse_client_models("pkg.mod:Net:2,cnn:1") == [("pkg.mod:Net", 2.0), ("cnn", 1.0)]
    for bad, why in [("cnn", "not <model>:<share>"), ("cnn:x", "not a number"),
                     ("cnn:0", "shares are > 0"), ("cnn:1,cnn:1", "named twice")]:
        with pytest.raises(ValueError, match=why):
            parse_client_models(bad)
    state = {"a": {"w": torch.ones(1)}, "b.c": {"w": torch.zeros(2)}}
    assert split(join(state), ["a", "b.c"]) == state


@pytest.mark.unit
def test_a_bad_client_models_value_fails_naming_the_key(tiny_config):
    with pytest.raises(ConfigError, match="'client-models' is 'cnn:0.5,nope:0.5'"):
        tiny_config.replace(client_models="cnn:0.5,nope:0.5").validate()


def _run(cfg, grid=None):
    grid = grid or InProcessGrid(client_module.app, cfg.to_run_config(), 4)
    path = run(grid, cfg)
    return json.loads(path.read_text()), torch.load(path.parent / "model.pt"), grid


@pytest.mark.app
@pytest.mark.parametrize("strategy", ["feddf", "fedgo"])
def test_two_architectures_train_and_distil_from_the_ensemble_of_all(tiny_config, mlp,
                                                                      strategy, caplog):
    cfg = tiny_config.replace(strategy=strategy, client_models=f"cnn:0.5,{mlp}:0.5",
                              fraction_train=1.0, num_server_rounds=1)
    with caplog.at_level(logging.INFO, logger="flwr"):
        record, model, grid = _run(cfg)
    archs = record["clients"]["architectures"]
    assert sorted(archs.values()) == ["cnn", "cnn", MLP, MLP]
    # every client got its own architecture's global model
    for msg in (m for m in grid.sent if m.metadata.message_type == "train"):
        pid = (msg.metadata.dst_node_id - 1000) // 17
        sent = msg.content.array_records["arrays"]
        want = create_classifier(archs[str(pid)], 1, 10, 28).state_dict()
        assert set(sent) == set(want)
    # the pseudo-labels come from all four clients, whatever their architecture
    assert "4 teachers pseudo-labelled" in caplog.text
    # each architecture's global model changed from its start
    for arch in ("cnn", MLP):
        torch.manual_seed(cfg.seed)
        start = create_classifier(arch, 1, 10, 28).state_dict()
        final = {k[len(arch) + 1:]: v for k, v in model.items() if k.startswith(arch + "/")}
        assert set(final) == set(start)
        assert any(not torch.equal(final[k], start[k]) for k in start), arch
    scores = record["rounds"][1]["architectures"]
    assert set(scores) == {"cnn", MLP}
    assert record["rounds"][1]["server_test_acc"] == pytest.approx(
        sum(s["server_test_acc"] for s in scores.values()) / 2)
    assert set(record["rounds"][1]["distill_by_architecture"]) == {"cnn", MLP}
    by_arch = record["rounds"][1]["bytes_by_architecture"]
    assert sum(b["down"] for b in by_arch.values()) == record["rounds"][1]["bytes"]["down"]
    assert sum(b["up"] for b in by_arch.values()) == record["rounds"][1]["bytes"]["up"]
    assert by_arch["cnn"]["down"] > by_arch[MLP]["down"]  # two CNNs outweigh two small MLPs


@pytest.mark.app
def test_a_mixed_run_resumed_ends_with_the_uninterrupted_models(tiny_config, mlp, tmp_path):
    cfg = tiny_config.replace(strategy="feddf", client_models=f"cnn:0.5,{mlp}:0.5",
                              num_server_rounds=2, checkpoint_keep=2)
    record, model, _ = _run(cfg)
    again = cfg.replace(results_dir=str(tmp_path / "elsewhere"),
                        resume_from=str(checkpoint.path_of(cfg.results_path / "tiny", 1)))
    resumed, resumed_model, _ = _run(again)
    assert set(resumed_model) == set(model)
    for name, tensor in model.items():
        assert torch.allclose(resumed_model[name].double(), tensor.double(), atol=1e-6), name
    for arch, scores in record["rounds"][2]["architectures"].items():
        assert resumed["rounds"][2]["architectures"][arch] == pytest.approx(scores)


@pytest.mark.app
@pytest.mark.parametrize("strategy,extra,why", [
    ("fedgen", {}, "works in one model's feature space"),
    ("dafkd", {}, "works in one model's feature space"),
    ("fedgo", {"diagnostics": True}, "diagnostics need one averaged model"),
])
def test_what_cannot_mix_architectures_says_why(tiny_config, mlp, strategy, extra, why):
    cfg = tiny_config.replace(strategy=strategy, client_models=f"cnn:0.5,{mlp}:0.5",
                              num_server_rounds=1, **extra)
    with pytest.raises(ConfigError, match=f"the clients run cnn, {MLP}: .*{why}"):
        _run(cfg)


@pytest.mark.app
def test_fedavg_averages_each_architecture_among_its_own_clients(tiny_config, mlp):
    cfg = tiny_config.replace(strategy="fedavg", client_models=f"cnn:0.5,{mlp}:0.5",
                              fraction_train=1.0, num_server_rounds=1)
    record, model, _ = _run(cfg)
    assert {k.split("/")[0] for k in model} == {"cnn", MLP}
    assert all(0 <= s["server_test_acc"] <= 1
               for s in record["rounds"][1]["architectures"].values())


@pytest.mark.app
def test_a_node_chooses_its_own_architecture(tiny_config):
    """In deployment a SuperNode's --node-config "model=..." picks its architecture."""
    cfg = tiny_config.replace(strategy="feddf", num_server_rounds=1, fraction_train=1.0,
                              model="cnn")
    grid = InProcessGrid(client_module.app, cfg.to_run_config(), 4)
    for node in list(grid.nodes)[2:]:
        grid.nodes[node].node_config["model"] = "mlp"
    record, model, _ = _run(cfg, grid)
    assert record["clients"]["architectures"] == {"0": "cnn", "1": "cnn", "2": "mlp",
                                                  "3": "mlp"}
    assert {k.split("/")[0] for k in model} == {"cnn", "mlp"}


@pytest.mark.unit
def test_the_report_gives_each_architectures_global_model():
    from fedgo_lab.report import of_architecture
    mixed = {"config": {"strategy": "feddf", "model": "cnn"}, "rounds": [
        {"round": 0, "server_test_acc": 0.3,
         "architectures": {"cnn": {"server_test_acc": 0.2}, "mlp": {"server_test_acc": 0.4}}}]}
    alone = {"config": {"strategy": "fedavg", "model": "mlp"},
             "rounds": [{"round": 0, "server_test_acc": 0.5}]}
    other = {"config": {"strategy": "fedavg", "model": "cnn"},
             "rounds": [{"round": 0, "server_test_acc": 0.6}]}
    mlp = of_architecture([mixed, alone, other], "mlp")
    assert [r["rounds"][0]["server_test_acc"] for r in mlp] == [0.4, 0.5]
