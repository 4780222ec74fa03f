"""Adaptive layer-wise fusion (FedBPG's "AF", fedgo_flwr/fusion.py): the learnable alphas move
toward whichever of the two models serves the client's data better."""

import pytest
import torch
from torch import nn

from fedgo_flwr.batches import to_unit_range
from fedgo_flwr.fusion import fuse, fusion_keys, learn_fusion

pytestmark = pytest.mark.unit


def _data(n=256, seed=0):
    """4x4 images whose class (0-3) is the brightest quadrant."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=gen)
    x = torch.randint(0, 60, (n, 1, 4, 4), generator=gen, dtype=torch.uint8)
    for i, c in enumerate(y.tolist()):
        r, col = divmod(c, 2)
        x[i, 0, 2 * r:2 * r + 2, 2 * col:2 * col + 2] += 190
    return x, y


def _net(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))


def _trained(x, y, seed=0):
    net = _net(seed)
    opt = torch.optim.Adam(net.parameters(), lr=0.05)
    for _ in range(150):
        opt.zero_grad()
        nn.functional.cross_entropy(net(to_unit_range(x)), y).backward()
        opt.step()
    return net


def _accuracy(net, x, y):
    with torch.no_grad():
        return (net(to_unit_range(x)).argmax(1) == y).float().mean().item()


def test_fuse_mixes_each_tensor_by_its_alpha_and_keeps_the_rest_local():
    local = {"w": torch.ones(2), "b": torch.zeros(1), "running": torch.full((1,), 7.0)}
    global_ = {"w": torch.zeros(2), "b": torch.ones(1), "running": torch.zeros(1)}
    out = fuse(local, global_, {"w": torch.tensor(0.25), "b": torch.tensor(1.0)})
    assert torch.equal(out["w"], torch.full((2,), 0.25)) and torch.equal(out["b"], torch.zeros(1))
    assert torch.equal(out["running"], local["running"])
    assert fusion_keys(_net(0)) == ["1.weight", "1.bias", "3.weight", "3.bias"]


@pytest.mark.parametrize("good", ["global", "local"])
def test_the_alphas_move_toward_the_better_model(good):
    x, y = _data()
    trained, untrained = _trained(x, y), _net(1)
    local, global_ = (untrained, trained) if good == "global" else (trained, untrained)
    alphas = learn_fusion(local, global_, x, y, steps=60, lr=0.2)
    weights = [a for name, a in alphas.items() if name.endswith("weight")]
    mean = sum(weights) / len(weights)  # the weights carry the models' difference; the
    assert all(0 <= a <= 1 for a in alphas.values())  # small biases barely matter
    fused = _net(2)
    fused.load_state_dict(fuse(local.state_dict(), global_.state_dict(),
                               {k: torch.tensor(v) for k, v in alphas.items()}))
    if good == "global":  # from 1 (all local) toward the global model, and better than local
        assert mean < 0.5
        assert _accuracy(fused, x, y) >= _accuracy(global_, x, y) - 0.05 > _accuracy(
            local, x, y) + 0.3
    else:  # the local model is right: the alphas stay near it
        assert mean > 0.8
        assert _accuracy(fused, x, y) >= _accuracy(local, x, y) - 0.05
