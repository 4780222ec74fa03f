"""The ServerApp: Flower's PyTorch quickstart with FedGO in place of FedAvg. To compare
methods, change the import below to FedDF, DaFKD or the FedGO paper's other baselines
(SCAFFOLD, FedDisco, FedUV, FedGKD, FedTGP): nothing else changes. To run the README's best
row (calibrated FedGO on FedProx's clients with the clients' guard, the disagreement budget
and 3 past teachers), import BEST_ROW instead of AS_PUBLISHED."""

import json
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

from fedgo_example.task import Net, server_data, test
from fedgo_flwr import EnsembleDistillation
from fedgo_flwr import FedGO as Strategy
from fedgo_flwr.observers import TensorBoardTracker
from fedgo_flwr.presets import AS_PUBLISHED as PRESET

app = ServerApp()


def own_settings(run_config, strategy) -> dict:
    """The run-config table of this strategy ([tool.flwr.app.config.fedgo]) as keywords."""
    prefix = strategy.__name__.lower() + "."
    return {k[len(prefix):].replace("-", "_"): v for k, v in run_config.items()
            if k.startswith(prefix)}


def training(cfg) -> dict:
    """What the train handler (task.train) uses, sent with every train message: DaFKD's
    client step, which replaces the handler, trains the same way and names its loss as the
    handler does."""
    return {"lr": cfg["lr"], "local-epochs": cfg["local-epochs"], "optimizer": "sgd",
            "momentum": 0.9, "batch-size": 32, "train-loss-key": "train_loss"}


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    u, (test_x, test_y) = server_data(cfg)
    # The methods that distil on the server's unlabeled data (FedGO, FedDF, DaFKD, FedGKD)
    # take U, the shared distillation budget and the preset; the others take none of them.
    distilling = dict(unlabeled_data=u, distill_epochs=cfg["distill-epochs"],
                      distill_batch_size=cfg["distill-batch-size"], **PRESET) if issubclass(
        Strategy, EnsembleDistillation) else {}
    # Watch it in TensorBoard (`flwr run . --run-config 'tensorboard-dir="runs"'`, then
    # `tensorboard --logdir runs`; needs `pip install 'fedgo-flwr[tensorboard]'`)
    watch = [TensorBoardTracker(cfg["tensorboard-dir"], params=dict(cfg))] \
        if cfg["tensorboard-dir"] else []
    strategy = Strategy(model_fn=Net, fraction_train=cfg["fraction-train"],
                        fraction_evaluate=cfg["fraction-evaluate"], observers=watch,
                        **distilling, **own_settings(cfg, Strategy))

    def central_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = Net()
        model.load_state_dict(arrays.to_torch_state_dict())
        acc, loss = test(model, test_x, test_y, torch.device("cpu"))
        return MetricRecord({"accuracy": acc, "loss": loss})

    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(Net().state_dict()),
                            train_config=ConfigRecord(training(cfg)),
                            num_rounds=cfg["num-server-rounds"], evaluate_fn=central_evaluate)

    out = Path(cfg["output-dir"] or ".")
    out.mkdir(parents=True, exist_ok=True)
    torch.save(result.arrays.to_torch_state_dict(), out / "final_model.pt")
    (out / "result.json").write_text(json.dumps({
        "strategy": Strategy.__name__, "preset": sorted(PRESET) if distilling else [],
        "train": {t: dict(m) for t, m in result.train_metrics_clientapp.items()},
        "evaluate_clientapp": {t: dict(m) for t, m in result.evaluate_metrics_clientapp.items()},
        "evaluate_serverapp": {t: dict(m) for t, m in result.evaluate_metrics_serverapp.items()},
    }, indent=1))
