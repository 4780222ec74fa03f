"""FedBPG (seed 004; only its appendix exists): personalised FL in which every client ends with
its own model, fused layer by layer from the global model and its local one, while the server
tunes the averaged global model on pseudo-data of a label-conditional generator G(z, y).

Each round (reconstructed from the appendix; every choice is named, see also fedgo_flwr/bpg.py
for the server's losses and fedgo_flwr/fusion.py for the fusion):

Client k (`personalised_update`): it holds its local model omega_k from its last round (in
Flower's context.state; the global model where it has none yet). Adaptive fusion (AF) learns
one alpha per layer and kind of tensor (weight, bias) on its own data, starting from its last
round's alphas (1 at first), and fuses theta = alpha omega_k + (1 - alpha) omega-bar; theta is
trained as FedAvg's clients train and becomes omega_k, the shared model it uploads with its
label counts |D_k^y|. Without AF it starts from omega-bar, as FedAvg's clients do.

Server (the library's `FedBPG.server_update`): omega-bar = the n_k-weighted average. With
ensemble distillation (ED) it then trains G(z, y) (Eqs. 1-5: authenticity, diversity,
effectiveness; y from the clients' label proportions) for `fedbpg-generator-steps` Adam steps, kept across rounds, and tunes omega-bar
for `fedbpg-tune-steps` steps on Eq. 13 (KL to the exp(-CE) consensus of the shared models,
plus the empirical loss where the consensus does not beat omega-bar on a pseudo-sample of
quality xi < zeta), the retained pseudo-data of the last round first (Algorithm 1). Without ED
the global model is FedAvg's (the appendix's "FedAvg+" of Table 6 is FedBPG without ED).

Personalised accuracy (`personalised_evaluate`, asked by the server after each round on the
client's personal test split): the client's personal model, the fusion of the new global
model and omega_k (its alphas learned anew from its last ones, not stored), with deep
personalisation (DP) its last linear layer then fine-tuned on its own training data for
`fedbpg-dp-epochs` epochs (a choice: the appendix says only that DP is extra, per-client
personalisation that leaves the client's participation unchanged). The global accuracy is the
server's test accuracy of omega-bar, as for every strategy.
"""

from __future__ import annotations

from dataclasses import dataclass
from logging import WARNING

from flwr.app import Message
from flwr.common.logger import log
from torch import nn

from fedgo_app.client_context import Local, config_of, reply
from fedgo_flwr.keys import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, check, key
from fedgo_flwr.seeds import client_seed
from fedgo_app.server.record import RunRecord
from fedgo_app.strategies.base import CLIENT, FedAvgStrategy, ServerSetup, local_update
from fedgo_app.strategies.registry import StrategySpec
from fedgo_flwr.strategies.fedbpg import (ALPHAS, FUSION_ALPHA, GENERATOR_SECONDS,
                                          LOCAL_MODEL, adaptive_fusion, deep_personalise,
                                          keep_personal, stored_alphas)
from fedgo_flwr.strategies.fedbpg import FedBPG as LibraryFedBPG
from fedgo_flwr.strategies.label_counts import LABEL_COUNTS, label_counts
from fedgo_flwr.train import evaluate, train_classifier

# ALPHAS and LOCAL_MODEL, the node's state keys, are the library's, named here too.
__all__ = ["ALPHAS", "FEDBPG", "LOCAL_MODEL", "FedBPGApp", "FedBPGKeys", "personalised_evaluate",
           "personalised_update"]


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
    carried = ("generator", "optimizer", "retained")
    label_counts_in_replies = True  # |D_k^y|, for L_aut's and L_eff's shares and p(y)

    def __init__(self, setup: ServerSetup, record: RunRecord):
        keys = setup.cfg.keys("fedbpg")
        super().__init__(setup, record, image_shape=setup.image_shape,
                         num_classes=setup.num_classes,
                         ensemble_distillation=keys.ensemble_distillation,
                         adaptive_fusion=keys.adaptive_fusion,
                         deep_personalisation=keys.deep_personalisation,
                         generator_steps=keys.generator_steps, generator_lr=keys.generator_lr,
                         noise_dim=keys.noise_dim, batch_size=keys.batch_size,
                         lambda_div=keys.lambda_div, lambda_eff=keys.lambda_eff,
                         tune_steps=keys.tune_steps, tune_lr=keys.tune_lr, zeta=keys.zeta,
                         retain_max=keys.retain_max, fusion_steps=keys.fusion_steps,
                         fusion_lr=keys.fusion_lr, dp_epochs=keys.dp_epochs)
        if self.generator is None:  # w/o ED: nothing carries
            self.carried = ()
        self.observers.append(self.record_tuning)

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
# The fusion, omega_k's keeping in the node's state and DP are the library's
# (fedgo_flwr/strategies/fedbpg.py); these handlers run them with the run config.


def personal_start(message: Message, local: Local, seed: int
                   ) -> tuple[nn.Module, dict[str, float]]:
    """(the model the client personalises from, its fusion alphas): with AF and a local model
    of its last round, alpha omega_k + (1 - alpha) omega-bar with alphas learned on its data;
    else the global model as received (no alphas)."""
    keys = local.cfg.keys("fedbpg")
    global_model = local.classifier(message)
    own = local.state.array_records.get(LOCAL_MODEL)
    if not keys.adaptive_fusion or own is None:
        return global_model, {}
    own_model = local.load_classifier(own)
    alphas = adaptive_fusion(own_model, global_model, local.x, local.y,
                             start=stored_alphas(local.state), steps=keys.fusion_steps,
                             lr=keys.fusion_lr, batch_size=int(local.cfg.batch_size), seed=seed,
                             device=local.device)
    return own_model, alphas


def personalised_update(message: Message, local: Local) -> Message:
    """Fuse (AF), train as FedAvg's clients do, keep the result as omega_k and upload it with
    the label counts and the mean alpha."""
    conf = config_of(message)
    if LOCAL_MODEL not in local.state.array_records and int(conf["server-round"]) > 1:
        log(WARNING, "partition %d has no local model of an earlier round (its first round, or a "
            "new or restarted node): it starts from the global model", local.partition_id)
    model, alphas = personal_start(message, local,
                                   client_seed(int(conf["seed"]), local.partition_id))
    answer = local_update(message, local, model)
    keep_personal(local.state, model, alphas)
    metrics = answer.content.metric_records["metrics"]
    metrics[LABEL_COUNTS] = label_counts(local.y, local.num_classes)
    if alphas:
        metrics[FUSION_ALPHA] = sum(alphas.values()) / len(alphas)
    return answer


def personalised_evaluate(message: Message, local: Local) -> Message:
    """The personal model's accuracy and loss on the client's personal test split; with DP
    its last linear layer is first fine-tuned on S_k."""
    keys, cfg = local.cfg.keys("fedbpg"), local.cfg
    seed = client_seed(cfg.seed, local.partition_id)
    model, _ = personal_start(message, local, seed)
    if keys.deep_personalisation:
        deep_personalise(model, lambda m: train_classifier(
            m, local.x, local.y, epochs=keys.dp_epochs, batch_size=cfg.batch_size, lr=cfg.lr,
            flip=cfg.flip, crop=cfg.random_crop, optimizer=cfg.optimizer,
            momentum=cfg.momentum, seed=seed, device=local.device))
    x, y = (local.test_x, local.test_y) if len(local.test_y) else (local.x, local.y)
    acc, loss = evaluate(model, x, y, device=local.device)
    return reply(message, {"num-examples": len(y), "eval-acc": acc, "eval-loss": loss})


FEDBPG = StrategySpec(
    "fedbpg", FedBPGApp, {**CLIENT, "train": personalised_update, "evaluate": personalised_evaluate},
    keys=FedBPGKeys,
    marks=(("fedbpg-ensemble-distillation", True, "w/o ED"),
           ("fedbpg-adaptive-fusion", True, "w/o AF"),
           ("fedbpg-deep-personalisation", True, "w/o DP")))
