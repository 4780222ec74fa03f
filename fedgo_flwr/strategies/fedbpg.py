"""FedBPG (seed 004; only its appendix exists): personalised FL in which every client ends with
its own model, fused layer by layer from the global model and its local one, while the server
tunes the averaged global model on pseudo-data of a label-conditional generator G(z, y).
Reconstructed from the appendix; every choice is named (fedgo_flwr/bpg.py holds the server's
losses, fedgo_flwr/fusion.py the fusion).

Client k (`personalised_update`): it keeps its local model omega_k from its last round in
Flower's `context.state` (the global model where it has none yet). Adaptive fusion (AF)
learns one alpha per layer and kind of tensor (weight, bias) on its own data, from its last
round's alphas (1 at first), and fuses theta = alpha omega_k + (1 - alpha) omega-bar; theta is
trained as FedAvg's clients train and becomes omega_k, the shared model it uploads with its
label counts |D_k^y|. Without AF it starts from omega-bar, as FedAvg's clients do.

Server: omega-bar = the n_k-weighted average. With ensemble distillation (ED) it then trains
G(z, y) (Eqs. 1-5: authenticity, diversity, effectiveness; y from the clients' label
proportions) for `generator_steps` Adam steps, kept across rounds, and tunes omega-bar for
`tune_steps` steps on Eq. 13 (KL to the exp(-CE) consensus of the shared models, plus the
empirical loss where the consensus does not beat omega-bar on a pseudo-sample of quality
xi < zeta), the retained pseudo-data of the last round first (Algorithm 1). Without ED the
global model is FedAvg's (the appendix's "FedAvg+" of its Table 6).

Personalised accuracy (`personalised_evaluate`, the federated evaluation's message
`evaluate.fedbpg`): the client's personal model, the fusion of the new global model and
omega_k (its alphas learned anew from its last ones, not stored), with deep personalisation
(DP) its last linear layer then fine-tuned on its own training data for `dp_epochs` epochs (a
choice: the appendix says only that DP is extra, per-client personalisation that leaves the
client's participation unchanged)."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from logging import INFO

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from torch import nn

from fedgo_flwr.bpg import generator_step, tune_global
from fedgo_flwr.fusion import fuse, learn_fusion
from fedgo_flwr.inputs import labelled
from fedgo_flwr.checks import check_model
from fedgo_flwr.models import ConditionalGenerator
from fedgo_flwr.seeds import round_seed
from fedgo_flwr.strategies.messages import message_seed, retyped
from fedgo_flwr.strategies.label_counts import (LABEL_COUNTS, TRAINING, LabelCountFedAvg,
                                                label_prior, train_as_configured,
                                                trained_reply)
from fedgo_flwr.train import evaluate
from fedgo_flwr.weighting import label_shares

TRAIN_FEDBPG, EVALUATE_FEDBPG = "train.fedbpg", "evaluate.fedbpg"
LOCAL_MODEL, ALPHAS = "fedbpg-local-model", "fedbpg-alphas"  # in the node's context.state
FUSION_ALPHA = "fusion-alpha"  # a train reply's mean alpha (the appendix's Figure 5)
GENERATOR_SECONDS = "generator-seconds"  # G's training, of the round's distill-seconds


def fit_generator(generator: nn.Module, optimizer: torch.optim.Optimizer,
                  clients: list[nn.Module], global_model: nn.Module, shares: torch.Tensor,
                  prior: torch.Tensor, *, steps: int, batch_size: int, lambda_div: float,
                  lambda_eff: float, rng: torch.Generator, device: torch.device
                  ) -> dict[str, float]:
    """Eq. 5: `steps` Adam steps of G(z, y) on L_gen = L_aut + lambda_div L_div - lambda_eff
    L_eff, y ~ prior (fedgo_flwr.bpg.generator_step); the means of the three parts
    (authenticity, diversity, effectiveness), {} without steps."""
    parts = [generator_step(generator, optimizer, clients, global_model, shares, prior,
                            batch_size=batch_size, lambda_div=lambda_div,
                            lambda_eff=lambda_eff, rng=rng, device=device)
             for _ in range(steps)]
    return {name: sum(p[name] for p in parts) / len(parts) for name in parts[0]} if parts else {}


class FedBPG(LabelCountFedAvg):
    """FedBPG: personal models fused from the global and the local one (AF, DP), and the
    average tuned on a generator's pseudo-data (ED). Its federated evaluation scores the
    clients' personal models.

    Parameters
    ----------
    model_fn : Callable[[], nn.Module]
        Builds the global model omega-bar (and each client's omega_k).
    image_shape : tuple[int, int, int]
        (C, H, W) of the clients' images, any size; with ED, G(z, y) makes such images in
        [-1, 1].
    num_classes : int | None (default: None)
        C; None reads it off the model's output.
    ensemble_distillation, adaptive_fusion, deep_personalisation : bool (default: True)
        ED, AF and DP; False is the appendix's ablation w/o ED (FedAvg's global model), w/o
        AF (clients start from the global model), w/o DP (no last-layer fine-tuning).
    generator_steps : int (default: 50)
        Adam steps on G(z, y) a round (betas 0.5, 0.999).
    generator_lr : float (default: 3e-4)
    noise_dim, generator_width : int (default: 32, 64)
        G's noise z and width.
    batch_size : int (default: 64)
        Pseudo-samples a step of G's training and of the tuning.
    lambda_div, lambda_eff : float (default: 1.0, 1.0)
        Weights of the diversity loss (Eq. 3) and of the effectiveness term (Eq. 4,
        maximised).
    tune_steps : int (default: 50)
        E, Adam steps of omega-bar's tuning a round (Algorithm 1).
    tune_lr : float (default: 1e-4)
    zeta : float (default: 1.0)
        The pseudo-data's quality threshold: a pseudo-sample whose consensus loss xi is below
        it is retained (when the consensus beats omega-bar) or adds the empirical loss (when
        not); 0 = neither.
    retain_max : int (default: 1024)
        Most pseudo-samples retained for the next round.
    fusion_steps : int (default: 20)
        SGD steps a client takes on its fusion weights alpha.
    fusion_lr : float (default: 0.1)
    dp_epochs : int (default: 1)
        Epochs of DP's last-layer fine-tuning.
    seed, device, **kwargs
        As in `LabelCountFedAvg` (fedgo_flwr.strategies.label_counts), and Flower's
        `FedAvg` keywords.
    """

    train_type, reported = TRAIN_FEDBPG, (LABEL_COUNTS, FUSION_ALPHA)

    def __init__(self, *, model_fn: Callable[[], nn.Module], image_shape: tuple[int, int, int],
                 num_classes: int | None = None, ensemble_distillation: bool = True,
                 adaptive_fusion: bool = True, deep_personalisation: bool = True,
                 generator_steps: int = 50, generator_lr: float = 3e-4, noise_dim: int = 32,
                 generator_width: int = 64, batch_size: int = 64, lambda_div: float = 1.0,
                 lambda_eff: float = 1.0, tune_steps: int = 50, tune_lr: float = 1e-4,
                 zeta: float = 1.0, retain_max: int = 1024, fusion_steps: int = 20,
                 fusion_lr: float = 0.1, dp_epochs: int = 1, **kwargs) -> None:
        c, h, w = image_shape
        if min(generator_steps, tune_steps, retain_max, fusion_steps) < 0 or min(
                batch_size, dp_epochs) < 1:
            raise ValueError("the step counts and retain_max must be >= 0, batch_size and "
                             "dp_epochs >= 1")
        classes = check_model(model_fn, torch.zeros(2, c, h, w),
                              f"images of image_shape {tuple(image_shape)}")
        if num_classes not in (None, classes):
            raise ValueError(f"num_classes is {num_classes}, and model_fn's model gives "
                             f"{classes} logits")
        num_classes = classes
        super().__init__(model_fn=model_fn, num_classes=num_classes, **kwargs)
        self.generator = None
        if ensemble_distillation:
            with torch.random.fork_rng():
                torch.manual_seed(self.seed)
                self.generator = ConditionalGenerator(noise_dim, num_classes, c, (h, w),
                                                      generator_width).to(self.device)
            # On its device before Adam exists, so that Adam's state lives there too.
            self.optimizer = torch.optim.Adam(self.generator.parameters(), lr=generator_lr,
                                              betas=(0.5, 0.999))
            self.carried = ("generator", "optimizer", "retained")  # (w/o ED: nothing)
        self.retained = (torch.empty(0, c, h, w), torch.empty(0, dtype=torch.long))
        self.generation = dict(steps=generator_steps, batch_size=batch_size,
                               lambda_div=lambda_div, lambda_eff=lambda_eff)
        self.tuning = dict(steps=tune_steps, batch_size=batch_size, lr=tune_lr, zeta=zeta,
                           retain_max=retain_max)
        self.fusion = {"adaptive-fusion": adaptive_fusion, "fusion-steps": fusion_steps,
                       "fusion-lr": fusion_lr}
        self.personalisation = {"deep-personalisation": deep_personalisation,
                                "dp-epochs": dp_epochs}
        self.training: dict = {}  # the caller's training settings, for DP's fine-tuning

    def summary(self) -> None:
        super().summary()
        log(INFO, "\t└──> FedBPG: ED %s (G %d steps, tuning %d steps), AF %s, DP %s, on %s",
            self.generator is not None, self.generation["steps"], self.tuning["steps"],
            self.fusion["adaptive-fusion"], self.personalisation["deep-personalisation"],
            self.device)

    # --- what the clients receive
    def train_payload(self, server_round: int, arrays: ArrayRecord):
        extra, settings = super().train_payload(server_round, arrays)
        return extra, {**settings, **self.fusion}

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> list[Message]:
        self.training = {k: v for k, v in config.items() if k in TRAINING}
        return super().configure_train(server_round, arrays, config, grid)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> list[Message]:
        """FedAvg's sampling; the messages as evaluate.fedbpg, with the fusion's and DP's
        settings and (where the evaluate config lacks them) the train config's."""
        return retyped(super().configure_evaluate(server_round, arrays, config, grid),
                       EVALUATE_FEDBPG, {}, self.personal_settings(), self.configrecord_key,
                       {"seed": self.seed, **self.training})

    def personal_settings(self) -> dict:
        """What a client's personalised evaluation reads besides the training settings: the
        fusion's (AF) and DP's."""
        return {**self.fusion, **self.personalisation}

    # --- the round
    def server_update(self, server_round, averaged, models, report):
        """The clients' mean alpha; with ED, omega-bar tuned on G's pseudo-data."""
        alphas = [m.metrics[FUSION_ALPHA] for m in models
                  if isinstance(m.metrics.get(FUSION_ALPHA), float)]
        info = {FUSION_ALPHA: sum(alphas) / len(alphas)} if alphas else {}
        if self.generator is None:
            return averaged, info
        arrays, distilled = self.distil(server_round, averaged, models)
        return arrays, {**info, **distilled}

    def distil(self, server_round: int, averaged: ArrayRecord, models
               ) -> tuple[ArrayRecord, dict[str, float]]:
        """ED: G(z, y) trained on the shared models (Eqs. 1-5), then omega-bar tuned on its
        pseudo-data, the last round's retained pool first (Algorithm 1)."""
        counts = self.counts(models)
        shares, prior = label_shares(counts), label_prior(counts)
        clients = [self.load(m.state) for m in models]
        global_model = self.load(averaged.to_torch_state_dict())
        rng = torch.Generator().manual_seed(round_seed(self.seed, server_round))
        start = time.perf_counter()
        parts = fit_generator(self.generator, self.optimizer, clients, global_model, shares,
                              prior, rng=rng, device=self.device, **self.generation)
        generator_seconds = time.perf_counter() - start
        self.retained, tuning = tune_global(global_model, clients, self.generator, prior,
                                            self.retained, rng=rng, device=self.device,
                                            **self.tuning)
        self.generator.cpu()
        seconds = time.perf_counter() - start
        log(INFO, "round %d: G's authenticity %.3f, diversity %.3f, effectiveness %.3f; tuning "
            "KL %.4f, %d pseudo-samples retained (%.1fs)", server_round,
            *(parts.get(n, float("nan")) for n in ("authenticity", "diversity", "effectiveness")),
            tuning.get("kl", float("nan")), tuning["retained"], seconds)
        metrics = {f"generator-{name}": value for name, value in parts.items()}
        metrics.update({f"tuning-{name.replace('_', '-')}": value
                        for name, value in tuning.items()})
        metrics[GENERATOR_SECONDS], metrics["distill-seconds"] = generator_seconds, seconds
        return ArrayRecord(global_model.cpu().state_dict()), metrics


# ---------------------------------------------------------------------------- client side
def stored_alphas(state: RecordDict) -> dict[str, float] | None:
    """The alphas of this client's last fusion (name -> alpha), None before its first."""
    stored = state.config_records.get(ALPHAS)
    return dict(zip(stored["names"], stored["values"])) if stored else None


def keep_personal(state: RecordDict, model: nn.Module, alphas: dict[str, float]) -> None:
    """omega_k (and the alphas it was fused with, if any) kept in the node's state."""
    state[LOCAL_MODEL] = ArrayRecord(model.cpu().state_dict())
    if alphas:
        state[ALPHAS] = ConfigRecord({"names": list(alphas), "values": list(alphas.values())})


def adaptive_fusion(own: nn.Module, global_model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                    *, start: dict[str, float] | None, steps: int, lr: float, batch_size: int,
                    seed: int, device: torch.device) -> dict[str, float]:
    """AF: the alphas learned on (x, y) from `start` (fedgo_flwr.fusion.learn_fusion); `own`
    (omega_k) becomes alpha omega_k + (1 - alpha) omega-bar. Returns the alphas."""
    alphas = learn_fusion(own, global_model, x, y, steps=steps, lr=lr, batch_size=batch_size,
                          seed=seed, start=start, device=device)
    fused = fuse({k: v.detach().cpu() for k, v in own.state_dict().items()},
                 {k: v.detach().cpu() for k, v in global_model.state_dict().items()},
                 {k: torch.tensor(a) for k, a in alphas.items()})
    own.load_state_dict(fused)
    return alphas


def deep_personalise(model: nn.Module, train: Callable[[nn.Module], object]) -> None:
    """DP: `train(model)` with only the model's last linear layer trainable."""
    linear = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linear:
        raise TypeError(f"DP fine-tunes the last nn.Linear layer; {type(model).__name__} "
                        "has none (deep_personalisation=False leaves it out)")
    model.requires_grad_(False)
    linear[-1].requires_grad_(True)
    try:
        train(model)
    finally:
        model.requires_grad_(True)


def personal_start(message: Message, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                   state: RecordDict, *, seed: int, device: torch.device
                   ) -> tuple[nn.Module, dict[str, float]]:
    """(the model the client personalises from, its alphas): with AF and an omega_k of an
    earlier round in `state`, their fusion, alphas learned on (x, y) from its last ones; else
    `model` with the received omega-bar (no alphas)."""
    conf = message.content.config_records["config"]
    model.load_state_dict(message.content.array_records["arrays"].to_torch_state_dict())
    own = state.array_records.get(LOCAL_MODEL)
    if not conf.get("adaptive-fusion", True) or own is None:
        return model, {}
    own_model = copy.deepcopy(model)
    own_model.load_state_dict(own.to_torch_state_dict())
    alphas = adaptive_fusion(own_model, model, x, y, start=stored_alphas(state),
                             steps=int(conf.get("fusion-steps", 20)),
                             lr=float(conf.get("fusion-lr", 0.1)),
                             batch_size=int(conf.get("batch-size", 64)), seed=seed,
                             device=device)
    return own_model, alphas


def personalised_update(message: Message, model: nn.Module, data, state: RecordDict, *,
                        device: str | torch.device = "cpu", seed: int | None = None
                        ) -> Message:
    """A FedBPG client's round: fuse (AF) the received omega-bar with omega_k from `state` (the
    node's context.state), train as FedAvg's clients do on `data` (labelled: (images,
    labels), a Dataset or a DataLoader; settings as label_counts.TRAINING reads them), keep
    the result in `state` as omega_k and upload it. The reply holds ArrayRecord "arrays" and
    MetricRecord "metrics" (num-examples, train-loss, train-seconds, label-counts and, when
    fused, fusion-alpha, the mean alpha)."""
    conf, device = message.content.config_records["config"], torch.device(device)
    x, y = labelled(data)
    if LOCAL_MODEL not in state.array_records and int(conf.get("server-round", 1)) > 1:
        log(INFO, "node %d has no local model of an earlier round (its first round, or a new or "
            "restarted node): it starts from the global model", message.metadata.dst_node_id)
    seed = message_seed(message) if seed is None else seed
    model, alphas = personal_start(message, model, x, y, state, seed=seed, device=device)
    result = train_as_configured(model, x, y, conf, seed=seed, device=device)
    keep_personal(state, model, alphas)
    if alphas:
        result[FUSION_ALPHA] = sum(alphas.values()) / len(alphas)
    return trained_reply(message, model, y, result, int(conf["num-classes"]))


def personalised_evaluate(message: Message, model: nn.Module, data, state: RecordDict, *,
                          test_data=None, device: str | torch.device = "cpu",
                          seed: int | None = None) -> Message:
    """The personal model's accuracy and loss on `test_data` (labelled; `data`, the training
    data, when None): omega-bar fused with omega_k from `state` (AF), then with DP its last
    linear layer fine-tuned on `data` for "dp-epochs". The reply holds MetricRecord "metrics"
    (num-examples, eval-acc, eval-loss)."""
    conf, device = message.content.config_records["config"], torch.device(device)
    x, y = labelled(data)
    seed = message_seed(message) if seed is None else seed
    personal, _ = personal_start(message, model, x, y, state, seed=seed, device=device)
    if conf.get("deep-personalisation", True):
        dp = ConfigRecord({**conf, "local-epochs": int(conf.get("dp-epochs", 1))})
        deep_personalise(personal, lambda m: train_as_configured(m, x, y, dp, seed=seed,
                                                                 device=device))
    tx, ty = (x, y) if test_data is None else labelled(test_data)
    acc, loss = evaluate(personal, tx, ty, device=device)
    return Message(RecordDict({"metrics": MetricRecord(
        {"num-examples": len(ty), "eval-acc": acc, "eval-loss": loss})}), reply_to=message)
