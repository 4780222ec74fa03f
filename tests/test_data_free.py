"""Data-free runs (FedGO's Table 2, S2): a loaded generator (G2) and a distillation set drawn
from it (D2); the server never opens its unlabeled data."""

import hashlib
import json

import numpy as np
import pytest
import torch

import fedgo_app.data as data
from fedgo_flwr.keys import ConfigError
from client_app.app import app as client_app
from fedgo_flwr.gan import log_odds
from fedgo_app.generators import save_generator_file
from fedgo_flwr.gan import draw_images
from fedgo_flwr.models import Generator
from fedgo_flwr.seeds import round_seed
from fedgo_app.server.record import RunRecord
from fedgo_app.strategies import STRATEGIES
from fedgo_app.strategies.base import ServerSetup
from fedgo_flwr.train import resolve_device
from fedgo_lab.inprocess import InProcessGrid
from server_app.app import run


def _run(cfg):
    grid = InProcessGrid(client_app, cfg.to_run_config(), 4)
    return json.loads(run(grid, cfg).read_text())


@pytest.fixture
def generator_file(tmp_path):
    torch.manual_seed(5)
    g = Generator(16, 1, 28, dim=8).eval()
    return save_generator_file(tmp_path / "g.pt", g, channels=1), g


@pytest.mark.parametrize("strategy", ["fedgo", "feddf"])
def test_a_loaded_generator_and_a_generated_set_need_no_server_data(
        tiny_config, generator_file, monkeypatch, strategy):
    path, g = generator_file

    def no_server_data(cfg):
        raise AssertionError("the server opened U")

    monkeypatch.setattr(data, "distillation_indices", no_server_data)
    # the file's G has latent 16 and width 8, not the run's 128 and 8: clients get G's own
    cfg = tiny_config.replace(strategy=strategy, generator_source="load",
                              generator_file=str(path), distill_set="generated",
                              distill_size=40, num_server_rounds=1)
    assert not cfg.reads_server_data
    record = _run(cfg)
    # drawn where the run draws it: one device's float rounding fixes the uint8 images
    drawn = draw_images(g, 40, seed=tiny_config.seed, device=resolve_device(cfg.server_device))
    assert record["pre_fl"]["distillation_set"] == {
        "generated": 40, "redrawn": False,
        "sha256": hashlib.sha256(drawn.numpy().tobytes()).hexdigest()}
    assert record["pre_fl"]["generator"] == {"source": "load", "file": str(path)}
    assert np.isfinite(record["rounds"][1]["server_test_acc"])
    assert record["rounds"][1]["distill_steps"] == 1  # 40 images, batch 64


def test_fedgo_and_feddf_distil_on_the_same_generated_set(tiny_config, generator_file):
    """The set is drawn once, seeded, from G: the same images for every strategy."""
    path, g = generator_file
    expected = draw_images(g, 40, seed=tiny_config.seed, device=torch.device("cpu"))
    seen = {}
    for strategy in ("fedgo", "feddf"):
        cfg = tiny_config.replace(strategy=strategy, generator_source="load",
                                  generator_file=str(path), distill_set="generated",
                                  distill_size=40, num_server_rounds=1, run_name=strategy)
        grid = InProcessGrid(client_app, cfg.to_run_config(), 4)
        u, test_x, test_y = data.server_data(cfg)
        strategy_ = STRATEGIES.server(ServerSetup(cfg, u, test_x, test_y, 10,
                                                  torch.device("cpu")),
                                      RunRecord(cfg.to_run_config(), cfg.run_name))
        strategy_.discover(grid)
        strategy_.pre_fl(grid, 60)
        seen[strategy] = strategy_.u
    assert torch.equal(seen["fedgo"], expected) and torch.equal(seen["feddf"], expected)
    # the set is checkpointed: a resumed run (no pre-FL stage) distils on the same images
    assert torch.equal(strategy_.state_dict()["distillation_set"], expected)
    resumed = STRATEGIES.server(ServerSetup(cfg, u, test_x, test_y, 10, torch.device("cpu")),
                                RunRecord(cfg.to_run_config(), "resumed"))
    assert len(resumed.u) == 0  # the server holds no data of its own
    resumed.load_state_dict(strategy_.state_dict())
    assert torch.equal(resumed.u, expected)


def test_a_redrawn_set_is_new_each_round_and_fedgo_scores_it_after_a_resume(
        tiny_config, generator_file):
    """redraw-distill-set: round t distils on images drawn with the round's seed, FedGO's odds
    are D_k's on them, and a strategy restored from the checkpoint state draws and scores
    the same sets (G and D_k travel in it)."""
    path, g = generator_file
    cfg = tiny_config.replace(generator_source="load", generator_file=str(path),
                              distill_set="generated", distill_size=40,
                              redraw_distill_set=True, num_server_rounds=2)
    record = _run(cfg)
    assert record["pre_fl"]["distillation_set"]["redrawn"]
    assert record["rounds"][2]["seconds"]["odds"] > 0  # the new set scored in round 2
    grid = InProcessGrid(client_app, cfg.to_run_config(), 4)
    u, test_x, test_y = data.server_data(cfg)

    def strategy(name):
        return STRATEGIES.server(ServerSetup(cfg, u, test_x, test_y, 10, torch.device("cpu")),
                                 RunRecord(cfg.to_run_config(), name))

    first = strategy("first")
    first.discover(grid)
    first.pre_fl(grid, 60)
    redrawn = first.distillation_set(2)
    expected = draw_images(g, 40, seed=round_seed(cfg.seed, 2), device=torch.device("cpu"))
    assert torch.equal(redrawn, expected) and not torch.equal(first.u, expected)
    for p, (d, _) in first.discriminators.items():
        for view in (0, 1):
            torch.testing.assert_close(first.odds(p, redrawn)[view],
                                       log_odds(d, expected, device=torch.device("cpu"),
                                                flip=view == 1))
    resumed = strategy("resumed")
    resumed.load_state_dict(first.state_dict())
    again, later = resumed.distillation_set(2), first.distillation_set(3)
    assert torch.equal(again, redrawn) and not torch.equal(later, expected)
    for p in first.discriminators:
        torch.testing.assert_close(resumed.odds(p, again), first.odds(p, redrawn))
        torch.testing.assert_close(resumed.log_odds[p], first.log_odds[p])


def test_only_a_generated_set_can_be_redrawn(tiny_config):
    with pytest.raises(ConfigError, match="'redraw-distill-set' is true and 'distill-set'"):
        tiny_config.replace(redraw_distill_set=True).validate()


@pytest.mark.parametrize("bad_critic", [None, 3])
def test_fedgan_averages_the_clients_generators_and_critics_by_n_k(tiny_config, monkeypatch,
                                                                   bad_critic):
    """Each FedGAN reply's G and critic replaced by constants (its partition id + 1): the G
    FedGO then sends for the discriminators is their n_k-weighted mean, and the run needed no
    server data (S2-G3-D2). A reply whose critic holds a NaN is rejected with its reason and
    left out of both averages."""
    def tamper(reply):
        arrays = reply.content.array_records
        if "critic" in arrays:
            pid = (reply.metadata.src_node_id - 1000) // 17
            for key in ("generator", "critic"):
                value = float("nan") if (key, pid) == ("critic", bad_critic) else pid + 1.0
                state = {k: (torch.full_like(v, value) if v.is_floating_point() else v)
                         for k, v in arrays[key].to_torch_state_dict().items()}
                arrays[key] = type(arrays[key])(state)
        return reply

    monkeypatch.setattr(data, "distillation_indices",
                        lambda cfg: (_ for _ in ()).throw(AssertionError("U opened")))
    cfg = tiny_config.replace(generator_source="fedgan", fedgan_rounds=1, fedgan_epochs=1,
                              distill_set="generated", distill_size=40, fraction_train=1.0,
                              num_server_rounds=1)
    grid = InProcessGrid(client_app, cfg.to_run_config(), 4, tamper=tamper)
    record = json.loads(run(grid, cfg).read_text())
    n = {int(p): k for p, k in record["clients"]["num_examples"].items() if int(p) != bad_critic}
    expected = sum(n[p] * (p + 1) for p in n) / sum(n.values())
    sent = next(m for m in grid.sent if m.metadata.message_type == "train.discriminator")
    g = sent.content.array_records["generator"].to_torch_state_dict()
    torch.testing.assert_close(g["out.weight"], torch.full_like(g["out.weight"], expected))
    stage = record["pre_fl"]["generator"]
    (fedgan_round,) = stage["rounds"]
    assert stage["source"] == "fedgan" and fedgan_round["clients"] == [0, 1, 2, 3]
    assert fedgan_round["usable"] == len(n) and fedgan_round["missing"] == []
    assert list(fedgan_round["rejected"]) == ([] if bad_critic is None else [str(bad_critic)])
    spent = record["pre_fl"]["client_seconds"]
    assert spent["fedgan"] > 0 and spent["discriminators"] > 0
    assert record["bytes"]["pre_fl_up"] > 0
    assert types_of(grid).count("train.fedgan") == 4


def types_of(grid):
    return [m.metadata.message_type for m in grid.sent]
