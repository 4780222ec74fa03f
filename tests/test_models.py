import math

import pytest
import torch

from fedgo_flwr.models import CLASSIFIERS, Critic, Discriminator, Generator, create_classifier


@pytest.mark.parametrize("channels,size", [(1, 28), (3, 32)])
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
    with pytest.raises(KeyError, match="cnn"):
        create_classifier("vgg", 1, 10, 28)


@pytest.mark.parametrize("name", sorted(CLASSIFIERS))
def test_every_classifier_is_its_head_over_its_latent_layer(name):
    torch.manual_seed(0)
    model = create_classifier(name, 3, 10, 32).eval()
    x = torch.rand(2, 3, 32, 32) * 2 - 1
    z = model.features(x)
    assert z.shape == (2, model.latent_dim)
    assert torch.allclose(model.head(z), model(x), atol=1e-6)
