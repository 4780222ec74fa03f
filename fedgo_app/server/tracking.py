"""The run watched live in TensorBoard or MLflow (`tensorboard-dir`, `mlflow-uri`): the
library's trackers (fedgo_flwr.observers), given the run config as hyper-parameters."""

from __future__ import annotations

from pathlib import Path

from fedgo_app.config import Config


def trackers(cfg: Config, run_name: str) -> list:
    """The trackers the run config turns on (made now: a missing package fails before the
    pre-FL stage, naming the extra to install)."""
    from fedgo_flwr.observers import MLflowTracker, TensorBoardTracker
    params = cfg.to_run_config()
    made = []
    if cfg.tensorboard_dir:
        made.append(TensorBoardTracker(Path(cfg.tensorboard_dir).expanduser() / run_name,
                                       params))
    if cfg.mlflow_uri:
        made.append(MLflowTracker(cfg.mlflow_uri, cfg.mlflow_experiment, run_name, params))
    return made
