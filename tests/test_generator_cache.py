"""A trained generator is reused only when everything it depends on matches."""

import logging

import torch

from fedgo_app.data import server_data
from fedgo_app.generator_cache import entry_path, generator_description
from fedgo_app.server.record import RunRecord
from fedgo_app.strategies import FedGOApp, ServerSetup

CPU = torch.device("cpu")


def _obtain(cfg):
    u, test_x, test_y = server_data(cfg)
    record = RunRecord(cfg.to_run_config(), cfg.run_name)
    strategy = FedGOApp(ServerSetup(cfg, u, test_x, test_y, 10, CPU), record)
    generator = strategy.source_generator()
    return generator.state_dict(), record.data["pre_fl"]["generator"]


def _equal(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


def test_reused_only_when_seed_width_and_settings_match(tiny_config):
    cfg = tiny_config.replace(generator_steps=2)
    first, info = _obtain(cfg)
    assert info["reused"] is False
    again, info = _obtain(cfg.replace(run_name="again"))
    assert info["reused"] is True and _equal(first, again)
    for changes in ({"seed": 1}, {"generator_width": 4}, {"generator_steps": 3},
                    {"gan_lr": 1e-3}, {"distill_size": 300}):
        _, info = _obtain(cfg.replace(**changes))
        assert info["reused"] is False, changes  # trained anew
        _, info = _obtain(cfg.replace(**changes))
        assert info["reused"] is True, changes  # and cached under its own key


def test_no_cache_when_switched_off_or_untrained(tiny_config):
    cfg = tiny_config.replace(generator_steps=2, generator_cache=False)
    _obtain(cfg)
    assert _obtain(cfg)[1]["reused"] is False
    assert not (cfg.results_path / "generators").exists()
    _obtain(cfg.replace(generator_steps=0, generator_cache=True))
    assert not (cfg.results_path / "generators").exists()


def test_a_damaged_or_foreign_entry_is_retrained(tiny_config, caplog):
    cfg = tiny_config.replace(generator_steps=2)
    first, _ = _obtain(cfg)
    u = server_data(cfg)[0]
    path = entry_path(cfg.results_path / "generators", generator_description(cfg, u, CPU))
    entry = torch.load(path, weights_only=True)
    entry["description"]["generator_width"] = 64  # claims other settings
    torch.save(entry, path)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        again, info = _obtain(cfg)
    assert info["reused"] is False and "trained with other settings" in caplog.text
    assert _equal(first, again)  # retrained identically, and the entry repaired
    path.write_bytes(b"not a checkpoint")
    assert _obtain(cfg)[1]["reused"] is False
    assert _obtain(cfg)[1]["reused"] is True
