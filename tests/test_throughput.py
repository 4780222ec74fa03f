"""The client-training throughput benchmark prints one row per thread count and setting."""

import pytest

from fedgo_lab.throughput import main

pytestmark = pytest.mark.unit


def test_each_setting_is_measured_against_the_first(capsys):
    assert main(["--images", "128", "--epochs", "1", "--threads", "1", "--repeats", "1",
                 "--settings", "plain", "channels-last"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 1 |")]
    assert [r.split(" | ")[1] for r in rows] == ["plain", "channels-last"]
    assert rows[0].split(" | ")[3] == "1.00x" and rows[0].endswith("| 0.0e+00 |")
    # the same training in another memory layout: float noise at most
    assert float(rows[1].split(" | ")[5].rstrip(" |")) < 1e-3


def test_training_in_channels_last_hands_back_a_contiguous_model_of_the_same_fit():
    import copy

    import torch

    from fedgo_flwr.models import CNN
    from fedgo_flwr.train import train_classifier
    torch.manual_seed(0)
    start = CNN()
    x = torch.randint(0, 256, (256, 1, 28, 28), dtype=torch.uint8)
    y = torch.randint(0, 10, (256,))
    fits = {}
    for channels_last in (False, True):
        model = copy.deepcopy(start)
        fits[channels_last] = train_classifier(
            model, x, y, epochs=1, batch_size=64, lr=1e-3, flip=True, seed=0,
            device=torch.device("cpu"), channels_last_format=channels_last)["train-loss"]
        assert all(t.is_contiguous() for t in model.state_dict().values())
    assert abs(fits[True] - fits[False]) < 1e-3
