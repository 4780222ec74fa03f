"""FedGO in someone else's app (issue 91): images of any size and channel count, the user's own
generator and discriminator, every check at construction, a run that cannot learn saying so,
swapped methods that train as the user's handler does, mirrored views off by default and
progress a user can follow. The user's app here: its own small MLP, its own SGD train
handler reporting `train_loss`, its own tiny data; the library's `register` beside it."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch import nn

from fedgo_flwr import (SCAFFOLD, DaFKD, FedBPG, FedDF, FedDisco, FedGen, FedGKD, FedGO,
                        FedTGP, FedUV)
from fedgo_flwr.client import register
from fedgo_flwr.models import Critic, Discriminator, Generator
from fedgo_flwr.presets import AS_PUBLISHED, BEST_ROW
from fedgo_flwr.progress import Progress
from fedgo_lab.inprocess import InProcessGrid

pytestmark = pytest.mark.app

NODES, CLASSES = 3, 4
TINY_GAN = dict(generator_steps=2, generator_width=4, latent_dim=8, gan_batch_size=8,
                discriminator_epochs=1, discriminator_width=4)
SMALL = dict(distill_epochs=1, distill_batch_size=16, fraction_evaluate=0.0, device="cpu")
TRAINING = ConfigRecord({"lr": 0.1, "local-epochs": 2, "optimizer": "sgd"})


def tiny_data(shape: tuple[int, int, int], n: int, seed: int):
    """n uint8 images of `shape`, CLASSES classes: each a bright band of rows of its own."""
    g = torch.Generator().manual_seed(seed)
    c, h, w = shape
    y = torch.arange(n) % CLASSES
    x = torch.randint(0, 60, (n, c, h, w), generator=g)
    band = max(1, h // CLASSES)
    for i, label in enumerate(y.tolist()):
        x[i, :, label * band:(label + 1) * band, :] = 230
    return x.to(torch.uint8), y


class MLP(nn.Module):
    """The user's model, with the latent layer DaFKD, FedGen and FedBPG read."""

    def __init__(self, shape):
        super().__init__()
        self.latent_dim = 16
        self.trunk = nn.Sequential(nn.Flatten(), nn.Linear(shape[0] * shape[1] * shape[2], 16),
                                   nn.ReLU())
        self.fc = nn.Linear(16, CLASSES)

    def features(self, x):
        return self.trunk(x)

    def head(self, z):
        return self.fc(z)

    def forward(self, x):
        return self.head(self.features(x))


def as_input(x):
    return x.float() / 127.5 - 1


def user_app(shape, *, fail=False, **register_kwargs) -> ClientApp:
    """The user's ClientApp: own data, own SGD train handler (reporting `train_loss`)."""
    app = ClientApp()
    parts = [tiny_data(shape, 48, seed=pid) for pid in range(NODES)]

    def data(context):
        x, y = parts[int(context.node_config["partition-id"])]
        return as_input(x), y

    @app.train()
    def train(msg, context):
        if fail:
            raise RuntimeError("CUDA error: the user's GPU is gone")
        model = MLP(shape)
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        x, y = data(context)
        opt = torch.optim.SGD(model.parameters(), lr=float(msg.content["config"]["lr"]))
        for _ in range(int(msg.content["config"]["local-epochs"])):
            for i in range(0, len(x), 16):
                loss = F.cross_entropy(model(x[i:i + 16]), y[i:i + 16])
                opt.zero_grad()
                loss.backward()
                opt.step()
        return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()),
                                   "metrics": MetricRecord({"num-examples": len(y),
                                                            "train_loss": loss.item()})}),
                       reply_to=msg)

    register(app, model_fn=lambda: MLP(shape), data_fn=data, device="cpu", **register_kwargs)
    return app


def accuracy(shape):
    x, y = tiny_data(shape, 64, seed=99)

    def evaluate(server_round, arrays):
        model = MLP(shape)
        model.load_state_dict(arrays.to_torch_state_dict())
        with torch.no_grad():
            return MetricRecord({"accuracy": (model(as_input(x)).argmax(1) == y)
                                 .float().mean().item()})
    return evaluate


def run(strategy, shape, rounds=1, app=None, train_config=TRAINING):
    grid = InProcessGrid(app or user_app(shape), {}, NODES)
    torch.manual_seed(0)
    return strategy.start(grid=grid, initial_arrays=ArrayRecord(MLP(shape).state_dict()),
                          num_rounds=rounds, train_config=train_config,
                          evaluate_fn=accuracy(shape))


SHAPES = [(1, 8, 8), (1, 13, 21), (3, 96, 96)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fedgo_runs_on_images_of_any_size_and_channel_count(shape):
    u, _ = tiny_data(shape, 32, seed=7)
    strategy = FedGO(unlabeled_data=u, model_fn=lambda: MLP(shape), **SMALL, **TINY_GAN)
    result = run(strategy, shape)
    assert tuple(strategy.generator.sample(2).shape[1:]) == shape
    assert len(strategy.log_odds) == NODES  # every client's D_k, trained on its own images
    assert result.train_metrics_clientapp[1]["distill-teachers"] == NODES


@pytest.mark.parametrize("shape", [(1, 8, 8), (1, 13, 21), (2, 5, 40), (3, 96, 96)])
def test_the_librarys_gan_models_take_any_shape(shape):
    c, h, w = shape
    g = Generator(8, c, (h, w), 4).eval()
    images = g(torch.randn(3, 8))
    assert images.shape == (3, *shape) and images.abs().max() <= 1
    assert Critic(c, (h, w), 4)(images).shape == (3,)
    if min(h, w) >= 8:
        assert Discriminator(c, (h, w), 4).eval()(images).shape == (3,)
    else:
        with pytest.raises(ValueError, match="at least 8x8 pixels, not 5x40: pad or resize "
                                             "them, or give a discriminator of your own"):
            Discriminator(c, (h, w), 4)


def test_dafkd_and_fedbpg_generate_images_of_the_clients_size():
    shape = (1, 13, 21)
    dafkd = DaFKD(model_fn=lambda: MLP(shape), image_shape=shape, latent_dim=8,
                  generator_width=4, device="cpu")
    assert tuple(dafkd.generator.sample(2).shape[1:]) == shape
    fedbpg = FedBPG(model_fn=lambda: MLP(shape), image_shape=shape, generator_width=4,
                    device="cpu")
    z, y = torch.randn(2, fedbpg.generator.noise_dim), torch.tensor([0, 1])
    assert tuple(fedbpg.generator.eval()(z, y).shape[1:]) == shape


class OwnGenerator(nn.Module):
    """A user's generator under the protocol: latent_dim; z -> images in [-1, 1]."""

    latent_dim = 6

    def __init__(self, shape=(1, 8, 8)):
        super().__init__()
        self.shape = shape
        self.net = nn.Linear(self.latent_dim, shape[0] * shape[1] * shape[2])

    def forward(self, z):
        return torch.tanh(self.net(z)).view(-1, *self.shape)


class OwnDiscriminator(nn.Module):
    """A user's discriminator under the protocol: logit(x) -> [n]."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 1))

    def logit(self, x):
        return self.net(x).flatten()


def test_fedgo_takes_the_users_own_generator_and_discriminator():
    shape = (1, 8, 8)
    u, _ = tiny_data(shape, 32, seed=7)
    strategy = FedGO(unlabeled_data=u, model_fn=lambda: MLP(shape), generator=OwnGenerator(),
                     discriminator_fn=OwnDiscriminator, **SMALL, **TINY_GAN)
    app = user_app(shape, generator_fn=OwnGenerator, discriminator_fn=OwnDiscriminator)
    run(strategy, shape, app=app)
    assert len(strategy.log_odds) == NODES
    # a client app without the generator's maker says what to pass, and the stage fails so
    strategy = FedGO(unlabeled_data=u, model_fn=lambda: MLP(shape), generator=OwnGenerator(),
                     discriminator_fn=OwnDiscriminator, **SMALL, **TINY_GAN)
    with pytest.raises(RuntimeError, match="no client returned a usable discriminator.*pass "
                                           "generator_fn"):
        run(strategy, shape, app=user_app(shape, discriminator_fn=OwnDiscriminator))


def test_everything_a_strategy_can_see_is_wrong_fails_at_construction_in_its_words():
    shape = (1, 8, 8)
    u, _ = tiny_data(shape, 32, seed=7)
    net = lambda: MLP(shape)  # noqa: E731
    cases = [
        (dict(unlabeled_data=u.permute(0, 2, 3, 1).repeat(1, 1, 1, 3)),
         ValueError, r"looks channels-last \[N, H, W, C\]; give \[N, C, H, W\] "
                     r"\(x.permute\(0, 3, 1, 2\)\)"),
        (dict(unlabeled_data=u.double()), ValueError,
         "unlabeled_data is torch.float64; give uint8 pixels"),
        (dict(unlabeled_data=u.float() / 16), ValueError,
         r"holds floats in \[0, 14.375\], and the generator FedGO trains on it makes images "
         r"in \[-1, 1\]"),
        (dict(unlabeled_data=tiny_data((1, 28, 28), 8, 0)[0]), ValueError,
         r"model_fn's model cannot take unlabeled_data's images, of shape \(1, 28, 28\) "
         r"\(mat1 and mat2"),
        (dict(generator=OwnGenerator((1, 9, 9))), ValueError,
         r"the generator makes images of shape \(1, 9, 9\), unlabeled_data's are \(1, 8, 8\)"),
        (dict(generator=nn.Linear(4, 64)), TypeError, "an int attribute latent_dim"),
        (dict(discriminator_fn=nn.Identity), TypeError, r"without logit\(x\)"),
    ]
    for kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            FedGO(**{"unlabeled_data": u, "model_fn": net, **kwargs})
    with pytest.raises(TypeError, match=r"FedDF does not take generator_steps \(FedBPG, FedGO, "
                                        r"FedGen take it\)"):
        FedDF(unlabeled_data=u, model_fn=net, generator_steps=2000)
    with pytest.raises(TypeError, match=r"FedGO does not take min_evaluate_clients \(no "
                                        r"strategy of fedgo_flwr takes it\)"):
        FedGO(unlabeled_data=u, model_fn=net, min_evaluate_clients=2)


def test_a_run_that_cannot_learn_raises_with_the_clients_first_error(caplog):
    shape = (1, 8, 8)
    u, _ = tiny_data(shape, 32, seed=7)
    strategy = FedDF(unlabeled_data=u, model_fn=lambda: MLP(shape), max_failed_rounds=2,
                     **SMALL)
    with caplog.at_level(logging.WARNING):
        with pytest.raises(RuntimeError, match="2 rounds in a row without a usable client reply "
                                               r"\(max_failed_rounds\); the first of round 2: "
                                               "failed: .*the user's GPU is gone"):
            run(strategy, shape, rounds=5, app=user_app(shape, fail=True))
    assert "round 1: none of the 3 replies is usable" in caplog.text


SWAPS = {
    "dafkd": lambda shape, u: DaFKD(model_fn=lambda: MLP(shape), unlabeled_data=u,
                                    latent_dim=8, generator_width=4, **SMALL),
    "fedgen": lambda shape, u: FedGen(model_fn=lambda: MLP(shape), num_classes=CLASSES,
                                      fraction_evaluate=0.0, device="cpu"),
    "fedbpg": lambda shape, u: FedBPG(model_fn=lambda: MLP(shape), image_shape=shape,
                                      generator_width=4, generator_steps=2, tune_steps=2,
                                      fraction_evaluate=0.0, device="cpu"),
}


@pytest.mark.parametrize("method", SWAPS)
def test_a_swapped_method_trains_as_the_users_handler_or_says_what_to_add(method):
    shape = (1, 8, 8)
    u, _ = tiny_data(shape, 32, seed=7)
    with pytest.raises(ValueError, match=r"clients train with the library's loop in place of "
                                         r"your train handler, reading lr, local-epochs, "
                                         r"optimizer .* it lacks local-epochs, optimizer"):
        run(SWAPS[method](shape, u), shape, train_config=ConfigRecord({"lr": 0.1}))
    config = ConfigRecord({**TRAINING, "train-loss-key": "train_loss"})
    result = run(SWAPS[method](shape, u), shape, rounds=3, train_config=config)
    assert "train_loss" in result.train_metrics_clientapp[3]  # the user's metric name
    assert result.evaluate_metrics_serverapp[3]["accuracy"] > 2 / CLASSES  # chance: 1/4


def test_mirrored_views_are_the_users_choice():
    shape = (1, 8, 8)
    u, _ = tiny_data(shape, 32, seed=7)
    plain = FedGO(unlabeled_data=u, model_fn=lambda: MLP(shape), **TINY_GAN)
    assert plain.views == 1 and plain.discriminator_config["flip"] is False
    for preset in (AS_PUBLISHED, BEST_ROW):  # the paper's and the benchmarks' mirrored views
        assert FedGO(unlabeled_data=u, model_fn=lambda: MLP(shape), **TINY_GAN,
                     **preset).views == 2


def test_long_work_logs_its_rate_time_left_and_an_estimate(caplog):
    with caplog.at_level(logging.INFO):
        bar = Progress("pre-FL: generator", 100_000, every=0, estimate_after=0,
                       hint="fewer generator_steps")
        bar.start -= 2.0  # two seconds spent on the first step: 100,000 take days
        bar.step(1, "Wasserstein estimate 0.5")
    warning = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "100000 steps will take about 2d07h" in warning[0].getMessage()
    assert "for less: fewer generator_steps" in warning[0].getMessage()
    assert "1/100000 steps | 0.50/s | 2d07h left | Wasserstein" in caplog.text


def test_the_pre_fl_stage_counts_the_discriminators_in(caplog):
    shape = (1, 8, 8)
    u, _ = tiny_data(shape, 32, seed=7)
    with caplog.at_level(logging.INFO):
        run(FedGO(unlabeled_data=u, model_fn=lambda: MLP(shape), **SMALL, **TINY_GAN), shape)
    assert f"in: {NODES} of {NODES}" in caplog.text


def test_the_guides_table_of_what_each_method_asks_is_true():
    """docs/library.md's table: the model attributes a method refuses to go without, the
    message types it sends (and whether the user's own train handler still runs), the train
    config keys `start` requires: each row against a one-round run of the method."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "library.md").read_text()
    rows = {r.split("|")[1].strip(" `"): r.split("|")[2:6] for r in text.splitlines()
            if re.match(r"\| `(Fed|DaFKD|SCAFFOLD)", r)}
    shape = (1, 8, 8)
    u, _ = tiny_data(shape, 32, seed=7)
    flat = lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, CLASSES))  # noqa: E731
    builds = {"FedGO": lambda m: FedGO(unlabeled_data=u, model_fn=m, **TINY_GAN),
              "FedDF": lambda m: FedDF(unlabeled_data=u, model_fn=m),
              "DaFKD": lambda m: DaFKD(unlabeled_data=u, model_fn=m, latent_dim=8,
                                       generator_width=4),
              "FedGen": lambda m: FedGen(model_fn=m, num_classes=CLASSES),
              "FedBPG": lambda m: FedBPG(model_fn=m, image_shape=shape, generator_width=4,
                                         generator_steps=2, tune_steps=2),
              "SCAFFOLD": lambda m: SCAFFOLD(model_fn=m),
              "FedDisco": lambda m: FedDisco(model_fn=m, num_classes=CLASSES),
              "FedGKD": lambda m: FedGKD(unlabeled_data=u, model_fn=m),
              "FedUV": lambda m: FedUV(model_fn=m),
              "FedTGP": lambda m: FedTGP(model_fn=m, num_classes=CLASSES, server_epochs=2)}
    assert sorted(rows) == sorted(builds)
    for name, (model, client, training, _) in rows.items():
        needs_latent = "`features`" in model
        try:
            builds[name](flat)
            refused = False
        except TypeError:
            refused = True
        assert refused == needs_latent, name
        app = user_app(shape)
        strategy = builds[name](lambda: MLP(shape))
        strategy.fraction_evaluate, strategy.device = 1.0, torch.device("cpu")
        grid = InProcessGrid(app, {}, NODES)
        strategy.start(grid=grid, initial_arrays=ArrayRecord(MLP(shape).state_dict()),
                       num_rounds=1, train_config=ConfigRecord({**TRAINING}))
        sent = {m.metadata.message_type for m in grid.sent}
        own = {t for t in sent if t not in ("train", "evaluate", "query.partition")}
        assert own == set(re.findall(r"`((?:train|evaluate|query)\.\w+)`", client)), name
        replaced = re.search(r"replaces? your `train`( and `evaluate`)?", client)
        assert ("train" in sent) == (replaced is None), name
        assert ("evaluate" in sent) == (replaced is None or replaced.group(1) is None), name
        assert set(re.findall(r"`([\w-]+)`", training)) == set(strategy.client_training), name
