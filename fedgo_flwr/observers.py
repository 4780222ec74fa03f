"""Watch a run live: observers (the strategies' `observers` keyword) that send every round to
TensorBoard or MLflow while it runs.

    from fedgo_flwr.observers import MLflowTracker, TensorBoardTracker
    strategy = FedGO(..., observers=[TensorBoardTracker("runs/fedgo")])
    strategy = FedGO(..., observers=[MLflowTracker(experiment="fedgo")])

Per round (the step is the round): the metrics the round returns (the clients' train loss,
the server update's: distillation loss, the guard's choice, ...) and any an observer before
this one added (the app's ensemble score and diagnostics), the seconds of each stage, bytes,
the clients sampled, usable, failed and rejected, and the left-out replies counted by
reason (`reason_kind`); after `evaluate_fn`, what it returned (the
server's accuracy and loss). The pre-FL stage (round 0): its seconds and bytes, each D_k's
accuracy and loss (step: the client's key) and the generator's loss curve (step: its step).
At `start`, the strategy's settings (its numbers, strings and flags) and `params` as
hyper-parameters, so runs compare in the tool's own table.

A tracker never stops a run: the first error (disk full, server gone) is logged once as a
warning and the tracker is off for the rest of the run. A missing package raises ImportError
naming the extra to install, when the tracker is made (before the run)."""

from __future__ import annotations

import math
import queue
import re
import threading
import time
from collections.abc import Callable, Mapping
from logging import WARNING
from pathlib import Path

from flwr.common.logger import log

from fedgo_flwr.replies import FAILED

RoundReport = object  # fedgo_flwr.strategies.rounds.RoundReport (not imported: no cycle)


def numbers(prefix: str, tree: Mapping) -> dict[str, float]:
    """The finite numbers of a nested mapping, as {"prefix/a/b": value}."""
    out = {}
    for key, value in tree.items():
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            out.update(numbers(name, value))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) \
                and math.isfinite(value):
            out[name] = float(value)
    return out


def reason_kind(why: str) -> str:
    """What a left-out reply's reason is about, for counting: the reason before its first
    colon, numbers as N ("failed", "no ArrayRecord ['arrays']", "N MetricRecords, expected
    one", "arrays" for an array that does not fit)."""
    return re.sub(r"-?\d+(\.\d+)?", "N", why.split(":")[0]).strip()[:60]


def round_values(report: RoundReport) -> dict[str, float]:
    """What a tracker shows of one round (see the module's docstring)."""
    failed = sum(why.startswith(FAILED) for why in report.left_out.values())
    why_counts: dict[str, float] = {}
    for why in report.left_out.values():
        kind = f"clients/left-out/{reason_kind(why)}"
        why_counts[kind] = why_counts.get(kind, 0.0) + 1
    return {**numbers("round", report.metrics), **numbers("seconds", report.seconds),
            **numbers("bytes", report.bytes), "clients/sampled": float(len(report.sampled)),
            "clients/usable": float(len(report.clients)), "clients/failed": float(failed),
            "clients/rejected": float(len(report.left_out) - failed), **why_counts}


def stage_series(report: RoundReport) -> dict[str, dict[int, float]]:
    """The pre-FL stage's curves, {name: {step: value}}: each D_k's accuracy and loss by its
    client's key (an integer key; else its order) and the generator's loss curve."""
    series: dict[str, dict[int, float]] = {}
    received = report.details.get("discriminators", {})
    for i, (key, metrics) in enumerate(sorted(received.items(), key=lambda kv: str(kv[0]))):
        step = key if isinstance(key, int) else i
        for name in ("discriminator-train-acc", "discriminator-loss"):
            if isinstance(metrics.get(name), (int, float)) and math.isfinite(metrics[name]):
                series.setdefault(f"pre-fl/{name}", {})[step] = float(metrics[name])
    curve = report.details.get("generator_curve")
    for name in ("generator-loss", "wasserstein-estimate") if curve else ():
        series[f"pre-fl/{name}"] = dict(zip(curve["step"], map(float, curve[name])))
    return series


def settings(strategy) -> dict[str, object]:
    """The strategy's public settings that a tracker can show: numbers, strings and flags."""
    return {k: v for k, v in vars(strategy).items() if not k.startswith("_")
            and isinstance(v, (int, float, str, bool)) and not callable(v)}


class Tracker:
    """What every tracker does; a backend writes scalars (`write`), hyper-parameters
    (`write_params`) and closes (`close`)."""

    def __init__(self, params: Mapping[str, object] | None = None):
        """`params`: hyper-parameters of your own (your run config, say), shown beside the
        strategy's settings."""
        self.params, self.off, self.last = dict(params or {}), False, {}

    def safely(self, what: Callable, *args) -> None:
        if self.off:
            return
        try:
            what(*args)
        except Exception as err:  # a tracker must never end a run
            self.off = True
            log(WARNING, "%s is off for the rest of the run: %s: %s", type(self).__name__,
                type(err).__name__, err)

    # what the strategy calls
    def started(self, strategy) -> None:
        self.safely(self.write_params, {**settings(strategy), **self.params})

    def __call__(self, report: RoundReport) -> None:
        self.safely(self.observe, report)

    def evaluated(self, server_round: int, metrics: Mapping | None) -> None:
        if metrics:
            self.last = numbers("eval", metrics)
            self.safely(self.write, self.last, server_round)

    def finished(self) -> None:
        self.safely(self.close)

    def observe(self, report: RoundReport) -> None:
        self.write(round_values(report), report.server_round)
        for name, points in stage_series(report).items() if report.server_round == 0 else ():
            for step, value in points.items():
                self.write({name: value}, step)

    # what a backend does
    def write(self, values: dict[str, float], step: int) -> None:
        raise NotImplementedError

    def write_params(self, params: dict[str, object]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class TensorBoardTracker(Tracker):
    """Event files in `log_dir` (`tensorboard --logdir` its parent to compare runs), through
    `torch.utils.tensorboard`; needs the `tensorboard` package (the `tensorboard` extra)."""

    def __init__(self, log_dir: str | Path, params: Mapping[str, object] | None = None):
        super().__init__(params)
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            raise ImportError("TensorBoardTracker needs the tensorboard package: pip install "
                              "'fedgo-flwr[tensorboard]'") from err
        self.writer, self.settings = SummaryWriter(str(log_dir)), None

    def write(self, values, step):
        for name, value in values.items():
            self.writer.add_scalar(name, value, step)

    def write_params(self, params):
        self.writer.add_text("settings", "  \n".join(f"{k}: {v}" for k, v in params.items()))
        self.settings = params

    def close(self):
        """The settings into TensorBoard's HPARAMS table, against the last evaluation."""
        if self.settings is not None:
            self.writer.add_hparams(self.settings, {f"hparam/{k}": v for k, v in
                                                    self.last.items()}, run_name=".")
        self.writer.flush()
        self.writer.close()


class MLflowTracker(Tracker):
    """One MLflow run: the rounds as metrics, the settings as params. `tracking_uri` is any
    MLflow store or server (None: MLflow's default, MLFLOW_TRACKING_URI or a local sqlite
    file); `experiment` groups runs (a plan's, say). Needs the `mlflow` extra."""

    def __init__(self, tracking_uri: str | None = None, experiment: str = "fedgo-flwr",
                 run_name: str | None = None, params: Mapping[str, object] | None = None):
        super().__init__(params)
        try:
            from mlflow.tracking import MlflowClient
        except ImportError as err:
            raise ImportError("MLflowTracker needs mlflow: pip install "
                              "'fedgo-flwr[mlflow]'") from err
        self.client = MlflowClient(tracking_uri=tracking_uri)
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(
            experiment)
        self.run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
        # writes go through one thread: a slow tracking server never holds up a round
        self.queue: queue.Queue = queue.Queue()
        threading.Thread(target=self.send, daemon=True).start()

    def send(self) -> None:
        while (job := self.queue.get()) is not None:
            self.safely(*job)
            self.queue.task_done()
        self.queue.task_done()

    def write(self, values, step):
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        metrics = [Metric(re.sub(r"[^\w\-. :/]", "_", name), value, now, step)  # "+" etc.
                   for name, value in values.items()]
        for i in range(0, len(metrics), 1000):  # MLflow's batch limit
            self.queue.put((self.client.log_batch, self.run_id, metrics[i:i + 1000]))

    def write_params(self, params):
        from mlflow.entities import Param
        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):  # MLflow's batch limit for params
            self.queue.put((self.client.log_batch, self.run_id, [], items[i:i + 100]))

    def close(self, wait: float = 60.0):
        """What is queued sent (for at most `wait` seconds), then the run ended."""
        self.queue.put((self.client.set_terminated, self.run_id))
        self.queue.put(None)
        deadline = time.monotonic() + wait
        while self.queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.05)


def tell(observers, hook: str, *args) -> None:
    """Call `hook` (`started`, `evaluated`, `finished`) on each observer that has it."""
    for observe in observers:
        if hasattr(observe, hook):
            getattr(observe, hook)(*args)


def watched(observers, evaluate_fn):
    """`evaluate_fn`, its metrics also given to each observer that takes them."""
    if evaluate_fn is None:
        return None

    def evaluate(server_round, arrays):
        metrics = evaluate_fn(server_round, arrays)
        tell(observers, "evaluated", server_round, metrics)
        return metrics
    return evaluate
