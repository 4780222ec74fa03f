"""Each ClientApp handler, called as the runtime calls it: client_app(message, context)."""

import math

import pytest
import torch
from flwr.app import ArrayRecord, Message, RecordDict

from client_app.app import app as client_app
from fedgo_flwr.models import Discriminator, Generator, create_classifier
from fedgo_app.server.clients import config_record
from fedgo_lab.inprocess import InProcessGrid


def _call(tiny_config, message_type, content, partition=1):
    grid = InProcessGrid(client_app, tiny_config.to_run_config(), num_partitions=4)
    node = list(grid.nodes)[partition]
    msg = Message(content, dst_node_id=node, message_type=message_type)
    reply, = grid.send_and_receive([msg])
    assert not reply.has_error(), reply.error.reason
    return reply.content


def test_query_reports_partition_and_size(tiny_config):
    info = _call(tiny_config, "query", RecordDict())["info"]
    assert info["partition-id"] == 1 and info["num-partitions"] == 4 and info["num-examples"] > 0


def test_train_discriminator_returns_d_k(tiny_config):
    g = Generator(16, 1, 28, dim=8)
    out = _call(tiny_config, "train.discriminator",
                RecordDict({"generator": ArrayRecord(g.state_dict()), "config": _d_conf(0.0)}))
    d = Discriminator(1, 28, dim=8)
    d.load_state_dict(out["discriminator"].to_torch_state_dict())  # same architecture
    assert out["metrics"]["num-examples"] > 0
    assert math.isfinite(out["metrics"]["discriminator-loss"])
    assert "odds-scale" not in out["metrics"]  # the paper's D_k: no calibration


def _d_conf(calibration_fraction):
    return config_record(discriminator_epochs=1, discriminator_lr=2e-4, batch_size=32, flip=True,
                         seed=0, latent_dim=16, generator_width=8, discriminator_width=8,
                         calibration_fraction=calibration_fraction)


def test_a_calibrated_discriminator_against_the_servers_images(tiny_config):
    """The options beyond the paper: negatives from a sample of U instead of G, and a Platt
    calibration fitted on held-out images; n_k still counts every image."""
    images = torch.randint(0, 256, (50, 1, 28, 28), dtype=torch.uint8)
    content = RecordDict({"server-sample": ArrayRecord({"images": images}),
                          "config": _d_conf(0.2)})
    metrics = _call(tiny_config, "train.discriminator", content)["metrics"]
    info = _call(tiny_config, "query", RecordDict())["info"]
    assert metrics["num-examples"] == info["num-examples"]
    assert metrics["odds-scale"] > 0 and math.isfinite(metrics["odds-shift"])
    wrong = RecordDict({"server-sample": ArrayRecord({"images": images[:, :, :20, :20]}),
                        "config": _d_conf(0.2)})
    with pytest.raises(Exception, match="shape"):
        _call(tiny_config, "train.discriminator", wrong)


def _train_content(model):
    conf = config_record(local_epochs=1, batch_size=32, lr=1e-3, flip=False, random_crop=0,
                         optimizer="adam", momentum=0.9, seed=1)
    return RecordDict({"arrays": ArrayRecord(model.state_dict()), "config": conf})


def test_train_changes_the_model_and_reports_n_k(tiny_config):
    torch.manual_seed(0)
    model = create_classifier(tiny_config.model, 1, 10, 28)
    out = _call(tiny_config, "train", _train_content(model))
    new = out["arrays"].to_torch_state_dict()
    assert set(new) == set(model.state_dict())
    assert not torch.equal(new["fc2.weight"], model.state_dict()["fc2.weight"])
    info = _call(tiny_config, "query", RecordDict())["info"]
    assert out["metrics"]["num-examples"] == info["num-examples"]
    again = _call(tiny_config, "train", _train_content(model))["arrays"].to_torch_state_dict()
    assert torch.equal(new["fc2.weight"], again["fc2.weight"])  # seeded


def test_evaluate_reports_accuracy_on_local_data(tiny_config):
    out = _call(tiny_config, "evaluate", RecordDict({"arrays": ArrayRecord(
        create_classifier(tiny_config.model, 1, 10, 28).state_dict())}))
    assert 0 <= out["metrics"]["eval-acc"] <= 1 and out["metrics"]["eval-loss"] > 0


def test_missing_node_config_is_a_clear_error(tiny_config):
    grid = InProcessGrid(client_app, tiny_config.to_run_config(), num_partitions=2)
    node = list(grid.nodes)[0]
    grid.nodes[node].node_config.clear()
    reply, = grid.send_and_receive([Message(RecordDict(), dst_node_id=node, message_type="query")])
    assert reply.has_error() and "--node-config" in reply.error.reason
