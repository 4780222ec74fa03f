import math

import pytest
import torch

from fedgo_flwr.keys import ConfigError
from fedgo_flwr.models import (CLASSIFIERS, Critic, Discriminator, Generator, create_classifier,
                               require_feature_space)


@pytest.mark.parametrize("channels,size", [(1, 28), (3, 32), (3, 64)])
def test_shapes(channels, size):
    g = Generator(16, channels, size, dim=8)
    x = g.sample(3)
    assert x.shape == (3, channels, size, size)
    assert x.min() >= -1 and x.max() <= 1
    assert Critic(channels, size, dim=8)(x).shape == (3,)
    assert Discriminator(channels, size, dim=8)(x).shape == (3,)
    for name in CLASSIFIERS:
        assert create_classifier(name, channels, 10, size)(x).shape == (3, 10)


def test_double_sigmoid_keeps_d_and_odds_bounded():
    d = Discriminator(1, 28, dim=8).eval()
    with torch.no_grad():
        for p in d.parameters():
            p.mul_(1e3)  # drive the logit to huge magnitudes of both signs
        x = torch.randn(64, 1, 28, 28) * 10
        out, log_phi = d(x), d.log_odds(x)
        logits = d.logit(x)
    assert logits.abs().max() > 50
    assert (out >= 0.5).all() and (out <= math.e / (1 + math.e)).all()
    phi = out / (1 - out)
    assert (phi >= 1 - 1e-6).all() and (phi <= math.e + 1e-5).all()
    torch.testing.assert_close(torch.log(phi), log_phi, atol=1e-5, rtol=1e-5)


def test_unknown_model_names_the_registered_ones():
    with pytest.raises(ConfigError, match="'model' is 'vgg'; allowed: cnn, mlp, resnet18"):
        create_classifier("vgg", 1, 10, 28)


@pytest.mark.parametrize("name,params", [("resnet18", 11_173_962), ("vgg11-bn", 9_231_114),
                                         ("resnet50", 23_520_842)])
def test_parameter_counts_are_the_known_figures(name, params):
    """The CIFAR variants at 10 classes: ResNet-18 about 11.2 M, VGG11-BN about 9.2 M,
    ResNet-50 about 23.5 M parameters."""
    model = create_classifier(name, 3, 10, 32)
    assert sum(p.numel() for p in model.parameters()) == params
    # and it trains as the clients and the server use it: a step in the channels-last format
    # (a whole round of each runs in tests/test_runs_in_process.py, but for ResNet-50's)
    from fedgo_flwr.train import train_classifier
    x = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    before = [p.detach().clone() for p in model.parameters()]
    info = train_classifier(model, x, torch.tensor([0, 1, 2, 3]), epochs=1, batch_size=4,
                            lr=1e-3, flip=True, seed=0, device=torch.device("cpu"))
    assert info["train-loss"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


USER_MODEL = """
from torch import nn

def Net(channels, num_classes, image_size):
    return nn.Sequential(nn.Flatten(), nn.Linear(channels * image_size ** 2, num_classes))

def NotAModel(channels, num_classes, image_size):
    return "a model"
"""


def test_a_users_classifier_is_imported_by_path(tmp_path, monkeypatch):
    (tmp_path / "my_nets.py").write_text(USER_MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    model = create_classifier("my_nets:Net", 1, 10, 28)
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    with pytest.raises(ConfigError, match="'my_nets:Missing', which cannot be imported"):
        create_classifier("my_nets:Missing", 1, 10, 28)
    with pytest.raises(ConfigError, match="'no_such_module:Net', which cannot be imported"):
        create_classifier("no_such_module:Net", 1, 10, 28)
    with pytest.raises(ConfigError, match="returned a str, not a torch nn.Module"):
        create_classifier("my_nets:NotAModel", 1, 10, 28)
    # no latent layer: refused for the strategies that need one, saying what to add
    with pytest.raises(ConfigError, match="lacks features, head, latent_dim: give it"):
        require_feature_space(model, "fedgen", "my_nets:Net")


@pytest.mark.parametrize("name", sorted(CLASSIFIERS))
def test_every_classifier_is_its_head_over_its_latent_layer(name):
    torch.manual_seed(0)
    model = create_classifier(name, 3, 10, 32).eval()
    x = torch.rand(2, 3, 32, 32) * 2 - 1
    z = model.features(x)
    assert z.shape == (2, model.latent_dim)
    assert torch.allclose(model.head(z), model(x), atol=1e-6)


def test_a_dataset_the_model_cannot_take_fails_naming_both():
    from fedgo_flwr.models import classifier_fits
    classifier_fits("cnn", (3, 32, 32), 10, "cifar10")  # fits
    with pytest.raises(ConfigError, match=r"'vgg11-bn' cannot take the 3x8x8 images of "
                                          r"dataset 'folder' .*'image-size'"):
        classifier_fits("vgg11-bn", (3, 8, 8), 10, "folder")
