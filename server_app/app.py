"""ServerApp: config -> data, models, strategy -> Flower's `start` (the pre-FL stage, or a
checkpoint's state, then the rounds, each checkpointed) -> record and table."""

from __future__ import annotations

import logging
import re
from datetime import datetime, timezone
from logging import INFO, WARNING
from pathlib import Path

import numpy as np
import torch
from flwr.app import ArrayRecord, Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from fedgo_flwr.architectures import parse_client_models
from fedgo_app.config import Config, ConfigError
from fedgo_app.data import dataset, server_data, validation_data
from fedgo_flwr.models import classifier_fits
from fedgo_app.server import checkpoint
from fedgo_app.server.record import RunRecord, format_table
from fedgo_app.server.tracking import trackers
from fedgo_app.strategies import STRATEGIES, RoundGrid, ServerSetup
from fedgo_flwr.train import device_name, resolve_device

app = ServerApp()


class BadValueInOneLine(logging.Filter):
    """Flower logs whatever ends a ServerApp with its traceback. A bad run-config value is the
    user's input, not a defect: one line names the key, the value and what is allowed (the
    run still ends finished:failed, with that line as its details). Flower's exit report
    ("Exit Code: ...", a help link) comes after it: the line is repeated at its end, so that
    it is the last thing the user reads."""

    bad: ConfigError | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, ConfigError):
            self.bad = error
            record.msg, record.args, record.exc_info = "bad run config: %s", (error,), None
        elif self.bad is not None and str(record.msg).startswith("Exit Code:"):
            record.msg, record.args = f"{record.getMessage()}\nbad run config: {self.bad}", ()
        return True


_flwr_logger = logging.getLogger("flwr")
if not any(isinstance(f, BadValueInOneLine) for f in _flwr_logger.filters):
    _flwr_logger.addFilter(BadValueInOneLine())


@app.main()
def main(grid: Grid, context: Context) -> None:
    run(grid, Config.from_run_config(context.run_config))


def run(grid: Grid, cfg: Config) -> Path:
    """Run one experiment over `grid` (or go on with one, `resume-from`); returns the path
    of its record.json."""
    resumed = None
    if cfg.resume_from:
        path, resumed = checkpoint.load(cfg.resume_from)
        check_resumable(cfg, resumed["record"]["data"]["config"], path)
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    data_name = re.sub(r"[^\w.-]+", "-", cfg.dataset)  # hub:org/name -> hub-org-name
    run_name = cfg.run_name or (f"{cfg.strategy}-{data_name}-a{cfg.alpha:g}-s{cfg.seed}-"
                                f"{datetime.now().strftime('%Y%m%d-%H%M%S')}")
    record = (RunRecord.restore(resumed["record"]) if resumed
              else RunRecord(cfg.to_run_config(), run_name))
    run_name = record.run_name
    # which device made it (a table keeps to one: docs/benchmarks.md); a resume elsewhere says so
    device = resolve_device(cfg.server_device)
    here = device_name(device)
    before = record.data.get("device", here)
    record.data["device"] = here if before == here else f"{before}, then {here}"
    log(INFO, "fedgo-flwr: %s on %s, alpha=%g, seed=%d, %d rounds -> %s", cfg.strategy,
        cfg.dataset, cfg.alpha, cfg.seed, cfg.num_server_rounds, cfg.results_path / run_name)
    unread = cfg.unread_keys()
    record.data["unread_keys"] = unread
    if unread:
        log(WARNING, "run-config key(s) %s are set but strategy %r never reads them: they have "
            "no effect on this run", ", ".join(unread), cfg.strategy)

    data = dataset(cfg)
    mixed = parse_client_models(cfg.client_models) if cfg.client_models.strip() else []
    for model in {cfg.model, *(name for name, _ in mixed)}:
        classifier_fits(model, data.image_shape, data.num_classes, cfg.dataset)
    u, test_x, test_y = server_data(cfg)
    val_x, val_y = validation_data(cfg)
    setup = ServerSetup(cfg, u, test_x, test_y, data.num_classes, device, val_x, val_y,
                        data.classes)
    log(INFO, "server: |U| = %d unlabeled, %d labelled validation, %d test images, device %s",
        len(u), len(val_y), len(test_y), setup.device)

    strategy = STRATEGIES.server(setup, record)
    strategy.observers += trackers(cfg, run_name)  # after the record's: they see its values
    run_dir = cfg.results_path / run_name
    strategy.discover(grid)  # node ids change between runs; partition ids do not
    if resumed:
        strategy.load_state_dict(resumed["strategy"])  # its rounds done: no pre-FL stage
        arrays = ArrayRecord(resumed["model"])
        record.data.setdefault("resumed", []).append(
            {"after_round": resumed["round"], "from": str(path),
             "at": datetime.now(timezone.utc).isoformat(timespec="seconds")})
        checkpoint.set_rng_states(resumed["rng"])
        log(INFO, "resuming %s after round %d from %s", run_name, resumed["round"], path)
    else:
        arrays = strategy.initial_model()  # theta_s^0 (of each architecture): the seed alone

    def evaluate(server_round: int, arrays: ArrayRecord):
        """Flower's evaluate_fn (given the run's round): the round's evaluation, then its
        checkpoint."""
        metrics = strategy.evaluate_round(server_round, arrays)
        if server_round:
            checkpoint.save(run_dir, server_round, {
                "model": arrays.to_torch_state_dict(), "strategy": strategy.state_dict(),
                "record": record.snapshot()}, keep=cfg.checkpoint_keep)
        return metrics

    result = strategy.start(grid=RoundGrid(strategy), initial_arrays=arrays,
                            num_rounds=cfg.num_server_rounds - strategy.rounds_done,
                            timeout=cfg.round_timeout, train_config=strategy.train_config(),
                            evaluate_fn=evaluate)
    final = result.arrays if result.arrays is not None else arrays

    path = record.finish(cfg.results_path)
    torch.save(final.to_torch_state_dict(), path.parent / "model.pt")
    log(INFO, "\n%s", format_table(record.rounds))
    log(INFO, "stage seconds: %s", {k: round(v, 1) for k, v in record.data["timings"].items()})
    log(INFO, "bytes sent: %s", dict(record.data["bytes"]))
    log(INFO, "record written to %s", path)
    return path


# Where things are, which may differ on the machine that resumes.
LOCATION_KEYS = ("resume-from", "data-dir", "results-dir", "tensorboard-dir", "mlflow-uri",
                 "mlflow-experiment")


def check_resumable(given: Config, saved: dict, path: Path) -> None:
    """Fail unless `given` is the checkpointed run's config but for where things are: the
    clients read their partition from the run config `flwr run` gives them. The error names
    the values to give."""
    now = given.to_run_config()
    differ = {k: saved.get(k) for k in sorted(now)
              if k not in LOCATION_KEYS and now[k] != saved.get(k)}
    if differ:
        raise ConfigError(
            f"resume-from {path}: run-config key(s) {sorted(differ)} differ from the "
            f"checkpointed run's; run again with the same config, i.e. with {differ}")
