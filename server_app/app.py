"""ServerApp: config -> data, models, strategy -> pre-FL stage -> rounds -> record and table."""

from __future__ import annotations

from datetime import datetime
from logging import INFO
from pathlib import Path

import numpy as np
import torch
from flwr.app import ArrayRecord, Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from fedgo_flwr.config import Config
from fedgo_flwr.data import load_dataset, server_data, validation_data
from fedgo_flwr.results import RunRecord, format_table
from fedgo_flwr.strategies import STRATEGIES, ServerSetup
from fedgo_flwr.train import resolve_device

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    run(grid, Config.from_run_config(context.run_config))


def run(grid: Grid, cfg: Config) -> Path:
    """Run one experiment over `grid`; returns the path of its record.json."""
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    run_name = cfg.run_name or (f"{cfg.strategy}-{cfg.dataset}-a{cfg.alpha:g}-s{cfg.seed}-"
                                f"{datetime.now().strftime('%Y%m%d-%H%M%S')}")
    record = RunRecord(cfg.to_run_config(), run_name)
    log(INFO, "fedgo-flwr: %s on %s, alpha=%g, seed=%d, %d rounds -> %s", cfg.strategy,
        cfg.dataset, cfg.alpha, cfg.seed, cfg.num_server_rounds, cfg.results_path / run_name)

    data = load_dataset(cfg.dataset, cfg.data_path)
    u, test_x, test_y = server_data(cfg)
    val_x, val_y = validation_data(cfg)
    setup = ServerSetup(cfg, u, test_x, test_y, data.num_classes,
                        resolve_device(cfg.server_device), val_x, val_y)
    log(INFO, "server: |U| = %d unlabeled, %d labelled validation, %d test images, device %s",
        len(u), len(val_y), len(test_y), setup.device)

    strategy = STRATEGIES[cfg.strategy].server(setup, record)
    strategy.prepare(grid)
    torch.manual_seed(cfg.seed)  # theta_s^0 depends on the seed alone
    initial = ArrayRecord(setup.new_classifier().state_dict())
    result = strategy.start(grid, initial, num_rounds=cfg.num_server_rounds,
                            timeout=cfg.round_timeout, evaluate_fn=strategy.evaluate_global)

    path = record.finish(cfg.results_path)
    torch.save(result.arrays.to_torch_state_dict(), path.parent / "model.pt")
    log(INFO, "\n%s", format_table(record.rounds))
    log(INFO, "stage seconds: %s", {k: round(v, 1) for k, v in record.data["timings"].items()})
    log(INFO, "bytes sent: %s", dict(record.data["bytes"]))
    log(INFO, "record written to %s", path)
    return path
