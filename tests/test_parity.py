"""One FedGO (issue 90): the library's `FedGO`, built by hand with the keywords a Flower user
passes for the README's best row (`fedgo_flwr.presets.BEST_ROW`: calibrated FedGO on
FedProx's clients, the clients' guard, the disagreement budget with its probe and 3 past
teachers), started on the in-process grid against this repository's ClientApp, gives the
per-round results of `server_app` run with the equivalent run config: the app adds
configuration and records, nothing to the algorithm."""

import json

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord

from fedgo_flwr import FedGO
from fedgo_flwr.models import create_classifier
from fedgo_flwr.presets import BEST_ROW
from fedgo_flwr.train import evaluate

pytestmark = pytest.mark.app

NODES, ROUNDS = 4, 4
# The best row as run-config keys (conf/bench/fmnist-long.yaml's fedprox-fedgo-cal-guard-...)
BEST_ROW_CONFIG = dict(strategy="fedprox", fedprox_base="fedgo", fedprox_mu=0.001,
                       discriminator_calibration="platt", calibration_fraction=0.1,
                       ensemble_space="probabilities", distillation_guard="clients",
                       distill_budget="disagreement", budget_probe=1024, past_teachers=3)


def small_config(data_dir, results):
    from fedgo_app.config import Config
    return Config().replace(
        data_dir=str(data_dir), results_dir=str(results), run_name="app",
        num_server_rounds=ROUNDS, fraction_train=0.5, local_epochs=1, server_epochs=2,
        generator_steps=2, discriminator_epochs=1, distill_size=0, test_size=0,
        generator_width=8, discriminator_width=8, alpha=0.5, generator_cache=False,
        model="mlp", **BEST_ROW_CONFIG)


def library_fedgo(cfg, u) -> FedGO:
    """What a user writes: FedGO with the best row's keywords and the run's budget."""
    return FedGO(
        unlabeled_data=u, model_fn=lambda: create_classifier(cfg.model, 1, 10, 28),
        seed=cfg.seed, device="cpu", client_key="partition-id",
        fraction_train=cfg.fraction_train, fraction_evaluate=0.0,
        generator_steps=cfg.generator_steps, latent_dim=cfg.latent_dim,
        generator_width=cfg.generator_width, critic_steps=cfg.critic_steps,
        gp_weight=cfg.gp_weight, gan_lr=cfg.gan_lr, gan_batch_size=cfg.gan_batch_size,
        discriminator_epochs=cfg.discriminator_epochs, discriminator_lr=cfg.discriminator_lr,
        discriminator_width=cfg.discriminator_width, distill_epochs=cfg.server_epochs,
        distill_batch_size=cfg.server_batch_size, distill_lr=cfg.server_lr,
        distill_optimizer=cfg.optimizer, distill_momentum=cfg.momentum, **BEST_ROW)


def test_the_librarys_fedgo_is_the_apps_best_row(tiny_data_dir, tmp_path):
    from client_app.app import app as client_app
    from fedgo_app.data import server_data
    from fedgo_lab.inprocess import InProcessGrid
    from server_app.app import run
    torch.set_num_threads(1)
    cfg = small_config(tiny_data_dir, tmp_path)
    record = json.loads(run(InProcessGrid(client_app, cfg.to_run_config(), NODES),
                            cfg).read_text())
    app = {r["round"]: r for r in record["rounds"]}

    u, test_x, test_y = server_data(cfg)
    strategy = library_fedgo(cfg, u)
    torch.manual_seed(cfg.seed)  # theta_s^0 as the app draws it
    initial = ArrayRecord(create_classifier(cfg.model, 1, 10, 28).state_dict())
    train_config = ConfigRecord({  # the clients' budget, as the app's train config gives it
        "local-epochs": cfg.local_epochs, "batch-size": cfg.batch_size, "lr": cfg.lr,
        "flip": cfg.flip, "random-crop": cfg.random_crop, "optimizer": cfg.optimizer,
        "momentum": cfg.momentum})

    def central(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = create_classifier(cfg.model, 1, 10, 28)
        model.load_state_dict(arrays.to_torch_state_dict())
        acc, loss = evaluate(model, test_x, test_y, device=torch.device("cpu"))
        return MetricRecord({"acc": acc, "loss": loss})

    result = strategy.start(grid=InProcessGrid(client_app, cfg.to_run_config(), NODES),
                            initial_arrays=initial, num_rounds=ROUNDS,
                            train_config=train_config, evaluate_fn=central)
    library = result.evaluate_metrics_serverapp
    assert sorted(library) == sorted(app) == list(range(ROUNDS + 1))
    kept = []
    for t in range(ROUNDS + 1):
        assert library[t]["acc"] == pytest.approx(app[t]["server_test_acc"], abs=1e-9), t
        assert library[t]["loss"] == pytest.approx(app[t]["server_test_loss"], rel=1e-6), t
        if t == 0:
            continue
        metrics = result.train_metrics_clientapp[t]
        assert metrics["distill-loss"] == pytest.approx(app[t]["distill_loss"], rel=1e-6)
        assert metrics["disagreement"] == pytest.approx(app[t]["disagreement"], rel=1e-9)
        assert metrics["guard-kept-distilled"] == int(app[t]["guard"]["kept"] == "distilled")
        assert metrics["past-teachers"] == min(t - 1, 3)
        kept.append(app[t]["guard"]["kept"])
    # the odds the ensemble was weighted by: every client's discriminator, as the app's
    odds = torch.stack([strategy.log_odds[n] for n in sorted(strategy.log_odds)])
    assert odds.shape[0] == NODES and torch.isfinite(odds).all()
    assert app[ROUNDS]["server_test_acc"] != app[0]["server_test_acc"]  # the model moved
