"""FedBPG (seed 004) in the app: the library's FedBPG (fedgo_flwr/strategies/fedbpg.py, whose
docstring gives the reconstruction from the appendix, every choice named), with the run
config (fedbpg-*) as its keywords, its clients' steps (`personalised_update`,
`personalised_evaluate`) given S_k, the node's state and the personal test split
(`personal-test-fraction`), and G's and the tuning's figures put into the record by an
observer. The global accuracy is the server's test accuracy of omega-bar, as for every
strategy.
"""

from __future__ import annotations

from dataclasses import dataclass

from flwr.app import ConfigRecord, Message

from fedgo_app.client_context import Local, config_of
from fedgo_flwr.keys import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, check, key
from fedgo_flwr.seeds import client_seed
from fedgo_app.server.record import RunRecord
from fedgo_app.strategies.base import CLIENT, FedAvgStrategy, ServerSetup
from fedgo_app.strategies.clients import library_step
from fedgo_app.strategies.registry import StrategySpec
from fedgo_flwr.strategies.fedbpg import (ALPHAS, FUSION_ALPHA, GENERATOR_SECONDS,
                                          LOCAL_MODEL, TRAIN_FEDBPG)
from fedgo_flwr.strategies.fedbpg import FedBPG as LibraryFedBPG
from fedgo_flwr.strategies.fedbpg import personalised_evaluate as personalised_evaluate_on
from fedgo_flwr.strategies.fedbpg import personalised_update as personalised_update_on

# ALPHAS and LOCAL_MODEL, the node's state keys, are the library's, named here too.
__all__ = ["ALPHAS", "FEDBPG", "LOCAL_MODEL", "FedBPGApp", "FedBPGKeys", "personal_evaluate"]


@dataclass(frozen=True)
class FedBPGKeys:
    """Run-config keys fedbpg-* (the appendix searches both lambdas in {0, 0.5, ..., 2} and
    finds the middle best; the rest are this reconstruction's choices)."""
    ensemble_distillation: bool = key(True, "ED: train G(z, y) and tune the global model on "
                                      "its pseudo-data; false = the ablation w/o ED "
                                      "(FedAvg's global model)")
    adaptive_fusion: bool = key(True, "AF: clients fuse the global model with their local "
                                "one layer by layer; false = the ablation w/o AF (they start "
                                "from the global model)")
    deep_personalisation: bool = key(True, "DP: the personal model's last layer fine-tuned "
                                     "on the client's data before use; false = w/o DP")
    generator_steps: int = key(50, "Adam steps on G(z, y) a round", NON_NEGATIVE)
    generator_lr: float = key(3e-4, "G's learning rate (Adam, betas 0.5, 0.999)", POSITIVE)
    noise_dim: int = key(32, "G's noise width", AT_LEAST_ONE)
    batch_size: int = key(64, "pseudo-samples a step of G's training and of the tuning",
                          AT_LEAST_ONE)
    lambda_div: float = key(1.0, "lambda_div, weight of the diversity loss (Eq. 3)",
                            NON_NEGATIVE)
    lambda_eff: float = key(1.0, "lambda_eff, weight of the effectiveness term (Eq. 4, "
                            "maximised)", NON_NEGATIVE)
    tune_steps: int = key(50, "E: Adam steps of the global model's tuning a round",
                          NON_NEGATIVE)
    tune_lr: float = key(1e-4, "the tuning's learning rate (Adam)", POSITIVE)
    zeta: float = key(1.0, "zeta, the pseudo-data's quality threshold: a pseudo-sample whose "
                      "consensus loss xi is below it is retained (when the consensus beats the "
                      "global model) or adds the empirical loss (when not); 0 = neither",
                      NON_NEGATIVE)
    retain_max: int = key(1024, "most pseudo-samples retained for the next round",
                          NON_NEGATIVE)
    fusion_steps: int = key(20, "SGD steps a client takes on its fusion weights alpha",
                            NON_NEGATIVE)
    fusion_lr: float = key(0.1, "the alphas' learning rate", POSITIVE)
    dp_epochs: int = key(1, "epochs of DP's last-layer fine-tuning", AT_LEAST_ONE)

    def validate(self, cfg, strategies) -> None:
        check("personal-test-fraction", cfg.strategy != "fedbpg" or cfg.personal_test_fraction > 0,
              "must be > 0 with strategy fedbpg: its clients' personalised accuracy is "
              "measured on that held-out split (0.25 in its presets)")


# ---------------------------------------------------------------------------- server side
class FedBPGApp(FedAvgStrategy, LibraryFedBPG):
    """The library's FedBPG (its server update: G(z, y) trained on the round's models, then
    omega-bar tuned on its pseudo-data, Algorithm 1); the app's clients personalise with the
    run config, and an observer puts G's and the tuning's figures into the record."""
    # G is one image space's generator and the consensus one architecture's: not mixed.
    mixes_architectures = False

    def __init__(self, setup: ServerSetup, record: RunRecord):
        super().__init__(setup, record, image_shape=setup.image_shape,
                         num_classes=setup.num_classes, **setup.cfg.keywords("fedbpg"))
        self.observers.append(self.record_tuning)

    def personal_config(self, server_round: int) -> ConfigRecord:
        """What each client's personalised evaluation reads: the training settings, the
        run's seed, and the fusion's and DP's (the library's `personal_settings`)."""
        conf = self.train_config()
        conf.update({"server-round": server_round, "seed": self.cfg.seed,
                     **self.personal_settings()})
        return conf

    def record_tuning(self, report) -> None:
        """The clients' mean alpha (the appendix's Figure 5), G's losses and the tuning's
        figures, with the same round's averaged model untuned beside it (what ED adds is
        server_test_acc minus averaged_test_acc)."""
        entry, metrics = self.record.round(report.server_round), report.metrics
        if FUSION_ALPHA in metrics:
            entry["fusion_alpha"] = metrics[FUSION_ALPHA]
        if self.generator is None:
            return
        generator = {k[len("generator-"):]: v for k, v in metrics.items()
                     if k.startswith("generator-") and k != GENERATOR_SECONDS}
        if generator:
            entry["generator"] = generator
        tuning = {k[len("tuning-"):].replace("-", "_"): v for k, v in metrics.items()
                  if k.startswith("tuning-")}
        tuning["averaged_test_acc"] = self.test_metrics(report.averaged.to_torch_state_dict())[0]
        entry["tuning"] = tuning
        seconds = metrics.get(GENERATOR_SECONDS, 0.0)
        self.record.time("generator_training", seconds, report.server_round)
        self.record.time("distillation", metrics["distill-seconds"] - seconds,
                         report.server_round)


# ---------------------------------------------------------------------------- client side
# The fusion, omega_k's keeping in the node's state and DP are the library's steps
# (fedgo_flwr/strategies/fedbpg.py), given S_k, the node's state and the personal test split.
def personal_evaluate(message: Message, local: Local) -> Message:
    """The personal model's accuracy and loss on the personal test split (S_k without one)."""
    test = (local.test_x, local.test_y) if len(local.test_y) else None
    return personalised_evaluate_on(
        message, local.classifier(message), (local.x, local.y), local.state, test_data=test,
        device=local.device, seed=client_seed(int(config_of(message)["seed"]),
                                              local.partition_id))


FEDBPG = StrategySpec(
    "fedbpg", FedBPGApp,
    {**CLIENT, TRAIN_FEDBPG: library_step(personalised_update_on, state=True),
     "evaluate": personal_evaluate},
    keys=FedBPGKeys,
    marks=(("fedbpg-ensemble-distillation", True, "w/o ED"),
           ("fedbpg-adaptive-fusion", True, "w/o AF"),
           ("fedbpg-deep-personalisation", True, "w/o DP")))
