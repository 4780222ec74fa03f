"""Generator files (FedGO's G2, an off-the-shelf generator): written, exported from a cache
entry, and refused, naming both sides, when they do not fit the run."""

import pytest
import torch

from fedgo_app.generator_cache import save_generator
from fedgo_app.generators import load_generator_file, save_generator_file
from fedgo_flwr.gan import draw_images
from fedgo_flwr.keys import ConfigError
from fedgo_flwr.models import Generator
from fedgo_lab.export_generator import export


def _generator(seed=0, channels=1, side=28):
    torch.manual_seed(seed)
    return Generator(16, channels, side, dim=8).eval()


def _same(a, b):
    return all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())


def test_a_generator_file_loads_back_the_same_generator(tmp_path):
    g = _generator()
    path = save_generator_file(tmp_path / "g.pt", g, channels=1)
    loaded = load_generator_file(path, (1, 28, 28))
    assert _same(g, loaded)
    images = draw_images(loaded, 10, seed=3, device=torch.device("cpu"))
    assert images.shape == (10, 1, 28, 28) and images.dtype == torch.uint8
    assert torch.equal(images, draw_images(g, 10, seed=3, device=torch.device("cpu")))


def test_a_generator_cache_entry_exports_to_a_file(tmp_path):
    g = _generator(seed=4, channels=3, side=32)
    description = {"latent_dim": 16, "generator_width": 8, "u_shape": [50, 3, 32, 32]}
    entry = save_generator(tmp_path / "cache", description, g, {"steps": 2})
    path = export(entry, tmp_path / "exported.pt")
    assert _same(g, load_generator_file(path, (3, 32, 32)))


@pytest.mark.parametrize("damage,message", [
    ("shape", r"makes \[1, 28, 28\] images, the dataset has \[3, 32, 32\]"),
    ("range", r"outputs lie in \[0.0, 1.0\], the models take \[-1.0, 1.0\]"),
    ("architecture", r"architecture 'stylegan-xl'; known: wgan-gp"),
    ("weights", r"its weights do not fit architecture 'wgan-gp'"),
    ("format", r"format 'something-else', expected 'fedgo-generator/1'"),
    ("missing", r"no such file; write one with python -m fedgo_lab.export_generator"),
])
def test_a_generator_file_that_does_not_fit_names_both_sides(tmp_path, damage, message):
    path = save_generator_file(tmp_path / "g.pt", _generator(), channels=1)
    entry = torch.load(path, weights_only=True)
    shape = (1, 28, 28)
    if damage == "shape":
        shape = (3, 32, 32)
    elif damage == "range":
        entry["value_range"] = [0.0, 1.0]
    elif damage == "architecture":
        entry["architecture"] = "stylegan-xl"
    elif damage == "weights":
        entry["state"]["out.weight"] = torch.zeros(3, 3)
    elif damage == "format":
        entry["format"] = "something-else"
    elif damage == "missing":
        path = tmp_path / "none.pt"
    if damage != "missing":
        torch.save(entry, path)
    with pytest.raises(ConfigError, match=message):
        load_generator_file(path, shape)


def test_a_pretrained_stand_in_learns_only_from_images_no_run_of_its_seed_reads(
        tiny_config, tmp_path, capsys):
    """G2's stand-in (python -m fedgo_lab.pretrain_generator): trained on the server's half
    outside U and the validation split, never on a client's images; its file loads for the
    run's images."""
    from fedgo_app import data
    from fedgo_lab.pretrain_generator import main, pretraining_indices
    cfg = tiny_config.replace(strategy="feddf", feddf_published=True, distill_size=100,
                              val_size=50, seed=1)
    idx = pretraining_indices(cfg, 300)
    assert len(set(idx)) == 300
    assert not set(idx) & set(data.distillation_indices(cfg))
    assert not set(idx) & set(data.validation_indices(cfg))
    for p in range(4):
        assert not set(idx) & set(data.client_indices(cfg, p, 4))
    with pytest.raises(ValueError, match="only 350 images of the server's half"):
        pretraining_indices(cfg, 351)
    dest = tmp_path / "g2.pt"
    assert main([str(dest), "--images", "64", "--config", f'data-dir="{cfg.data_dir}"',
                 'strategy="feddf"', "feddf-published=true", "distill-size=100",
                 "val-size=50", "seed=1", "generator-steps=2",
                 "generator-width=8"]) == 0
    assert "64 images, 2 steps" in capsys.readouterr().out
    g = load_generator_file(dest, (1, 28, 28))
    assert g.dim == 8 and g.latent_dim == cfg.latent_dim
