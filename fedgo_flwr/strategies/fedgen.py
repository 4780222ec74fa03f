"""FedGen (Zhu et al., ICML 2021): data-free knowledge distillation in FEATURE space.

Each round the server averages the client models as FedAvg does (nothing is distilled into
the global model), then trains a label-conditioned generator z = G_w(y, eps) so that the
clients' predictors theta_k^p (the model's `head`) classify its features as y (eq. 4, with
the per-label weights lambda_k^y = c_k^y / sum_i c_i^y of the paper's appendix and a
diversity term), y drawn from the label prior p^(y) built from the label counters c_k the
clients upload with their models (Algorithm 1, lines 11-13). From the next round the clients
receive G_w and p^(y) with the model and add alpha_t CE(theta_k^p(G_w(y^, eps)), y^),
y^ ~ p^(y), to their loss (eq. 5).

Where the paper is silent this follows its public code: Adam (lr 3e-4, weight decay 1e-2) on
G_w kept across rounds with its learning rate decayed 0.98 a round, 50 steps a round; the
diversity term exp(-mean_ij d(eps_i, eps_j) d(z_i, z_j)) with weight 1; alpha_t = 10 * 0.98^t.
The public code's second client term (a KL between the predictor's outputs on real and
generated features) is left out: the paper's objective (5) has only the cross-entropy. The
latent layer is the classifier's own (`features`, `latent_dim` wide)."""

from __future__ import annotations

import time
from collections.abc import Callable
from logging import INFO

import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, Message
from flwr.common.logger import log
from torch import nn

from fedgo_flwr.diversity import diversity_loss
from fedgo_flwr.inputs import labelled
from fedgo_flwr.models import FeatureGenerator
from fedgo_flwr.seeds import round_seed
from fedgo_flwr.strategies.dafkd import feature_space_problem
from fedgo_flwr.strategies.messages import message_seed
from fedgo_flwr.strategies.label_counts import (LabelCountFedAvg, label_prior, num_classes_of,
                                                train_as_configured, trained_reply)
from fedgo_flwr.weighting import label_shares

TRAIN_FEDGEN = "train.fedgen"  # its clients' local step, not Flower's plain "train"
GENERATOR = "generator"  # the ArrayRecord of G_w


def train_feature_generator(generator: FeatureGenerator, classifiers: list[nn.Module],
                            label_weights: torch.Tensor, prior: torch.Tensor, *, steps: int,
                            batch_size: int, optimizer: torch.optim.Optimizer,
                            diversity_weight: float, gen: torch.Generator,
                            device: torch.device) -> dict[str, float]:
    """Eq. 4 with per-label weights: minimise sum_k lambda_k^y CE(theta_k^p(G_w(y, eps)), y)
    over y ~ prior, plus the diversity term. classifiers: the round's client models, frozen,
    of which only `head` is used; label_weights [K, C], each column summing to 1 over the
    clients holding that label."""
    generator.to(device).train()
    for net in classifiers:
        net.to(device).eval().requires_grad_(False)
    weights = label_weights.to(device)
    teacher_total = diversity_total = 0.0
    for _ in range(steps):
        y = torch.multinomial(prior, batch_size, replacement=True, generator=gen).to(device)
        eps = generator.noise(batch_size, gen).to(device)
        z = generator(y, eps)
        ce = torch.stack([F.cross_entropy(net.head(z), y, reduction="none")
                          for net in classifiers])
        teacher = (weights[:, y] * ce).sum(0).mean()
        diversity = diversity_loss(eps, z)
        loss = teacher + diversity_weight * diversity
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        teacher_total += teacher.item()
        diversity_total += diversity.item()
    n = max(steps, 1)
    return {"generator_loss": teacher_total / n, "diversity_loss": diversity_total / n}


class FedGen(LabelCountFedAvg):
    """FedGen: FedAvg, then the server trains the feature generator G_w on the clients'
    predictors; from the next round the clients learn from its features too.

    Parameters
    ----------
    model_fn : Callable[[], nn.Module]
        Builds the global model; it must have `features(x) -> z` (theta^f), `head(z) ->
        logits` (the predictor theta^p) and `latent_dim` (z's width, G_w's output).
    num_classes : int | None (default: None)
        C; None reads it off the model's head.
    generator_steps : int (default: 50)
        The server's Adam steps on G_w a round (eq. 4; weight decay 1e-2).
    generator_lr : float (default: 3e-4)
        G_w's learning rate (the paper's alpha in Algorithm 1), times `decay` a round.
    generator_batch_size : int (default: 32)
        Labels y ~ p^(y) a step of G_w's training.
    noise_dim, hidden_dim : int (default: 32, 256)
        G_w's noise eps and hidden widths.
    diversity_weight : float (default: 1.0)
        Weight of G_w's diversity term.
    alpha : float (default: 10.0)
        alpha_t = alpha decay^t weighs the clients' generated-feature term of eq. 5 (the
        public code's generative_alpha; eq. 5 prints no weight).
    decay : float (default: 0.98)
        Per-round decay of alpha_t and of G_w's learning rate.
    seed, device, **kwargs
        As in `LabelCountFedAvg` (fedgo_flwr.strategies.label_counts), and Flower's
        `FedAvg` keywords.
    """

    train_type = TRAIN_FEDGEN
    carried = ("generator", "optimizer", "schedule", "prior")

    def __init__(self, *, model_fn: Callable[[], nn.Module], num_classes: int | None = None,
                 generator_steps: int = 50, generator_lr: float = 3e-4,
                 generator_batch_size: int = 32, noise_dim: int = 32, hidden_dim: int = 256,
                 diversity_weight: float = 1.0, alpha: float = 10.0, decay: float = 0.98,
                 **kwargs) -> None:
        model = model_fn()
        if why := feature_space_problem(model):
            raise TypeError(f"FedGen works on the model's latent layer: {why}")
        if generator_steps < 0 or generator_batch_size < 1 or alpha < 0 or not 0 < decay <= 1:
            raise ValueError("generator_steps >= 0, generator_batch_size >= 1, alpha >= 0 and "
                             f"0 < decay <= 1 are needed; got {generator_steps}, "
                             f"{generator_batch_size}, {alpha}, {decay}")
        num_classes = num_classes or num_classes_of(model, torch.zeros(2, model.latent_dim),
                                                    head=True)
        super().__init__(model_fn=model_fn, num_classes=num_classes, **kwargs)
        with torch.random.fork_rng():
            torch.manual_seed(self.seed)
            self.generator = FeatureGenerator(num_classes, model.latent_dim, noise_dim,
                                              hidden_dim).to(self.device)
        # On its device before Adam exists, so that Adam's state lives there too.
        self.optimizer = torch.optim.Adam(self.generator.parameters(), lr=generator_lr,
                                          weight_decay=1e-2)
        self.schedule = torch.optim.lr_scheduler.ExponentialLR(self.optimizer, decay)
        self.generator_steps, self.generator_batch_size = generator_steps, generator_batch_size
        self.noise_dim, self.hidden_dim = noise_dim, hidden_dim
        self.diversity_weight, self.alpha, self.decay = diversity_weight, alpha, decay
        self.prior: torch.Tensor | None = None  # p^(y), once a round's counts arrived

    def summary(self) -> None:
        super().summary()
        log(INFO, "\t└──> FedGen: G_w %d steps of batch %d a round (lr %g), noise %d, hidden "
            "%d; alpha_t = %g * %g^t, on %s", self.generator_steps, self.generator_batch_size,
            self.optimizer.param_groups[0]["lr"], self.noise_dim, self.hidden_dim, self.alpha,
            self.decay, self.device)

    def train_payload(self, server_round: int, arrays: ArrayRecord):
        """LabelCountFedAvg's, and G_w, p^(y) and alpha_t once G_w has been trained on a
        round's predictors."""
        extra, settings = super().train_payload(server_round, arrays)
        if self.prior is None:
            return extra, settings
        return {**extra, GENERATOR: ArrayRecord(self.generator.state_dict())}, {
            **settings, "fedgen-alpha": self.alpha * self.decay ** server_round,
            "label-prior": self.prior.tolist(), "noise-dim": self.noise_dim,
            "hidden-dim": self.hidden_dim}

    def server_update(self, server_round, averaged, models, report):
        """p^(y) and lambda_k^y from the round's label counts, then G_w trained on the round's
        predictors (eq. 4); the global model is the average."""
        counts = self.counts(models)
        self.prior = label_prior(counts)
        classifiers = [self.load(m.state) for m in models]
        gen = torch.Generator().manual_seed(round_seed(self.seed, server_round))
        lr, start = self.optimizer.param_groups[0]["lr"], time.perf_counter()
        info = train_feature_generator(
            self.generator, classifiers, label_shares(counts), self.prior,
            steps=self.generator_steps, batch_size=self.generator_batch_size,
            optimizer=self.optimizer, diversity_weight=self.diversity_weight, gen=gen,
            device=self.device)
        self.schedule.step()
        self.generator.cpu()
        seconds = report.seconds["generator_training"] = time.perf_counter() - start
        report.details["generator"] = info
        log(INFO, "round %d: feature generator loss %.4f, diversity %.4f (%.1fs)", server_round,
            info["generator_loss"], info["diversity_loss"], seconds)
        return averaged, {"generator-loss": info["generator_loss"],
                          "diversity-loss": info["diversity_loss"], "generator-lr": lr,
                          "generator-seconds": seconds}


# ---------------------------------------------------------------------------- client side
def received_generator(message: Message, latent_dim: int
                       ) -> tuple[FeatureGenerator, torch.Tensor]:
    """(G_w, p^(y) [C]) as the message carries them."""
    conf = message.content.config_records["config"]
    prior = torch.tensor(conf["label-prior"], dtype=torch.float32)
    generator = FeatureGenerator(len(prior), latent_dim, int(conf["noise-dim"]),
                                 int(conf["hidden-dim"]))
    generator.load_state_dict(message.content.array_records[GENERATOR].to_torch_state_dict())
    return generator, prior


def generated_feature_loss(generator: FeatureGenerator, prior: torch.Tensor, *, alpha: float,
                           batch_size: int, seed: int, device: torch.device
                           ) -> Callable[[nn.Module], torch.Tensor]:
    """The second term of eq. 5 as a function of the client's model: alpha_t
    CE(theta_k^p(z), y^) on a fresh batch z = G_w(y^, eps), y^ ~ p^(y), at every call; G_w is
    fixed (evaluation mode, no gradient)."""
    generator.to(device).eval()
    gen = torch.Generator().manual_seed(seed)

    def loss(model: nn.Module) -> torch.Tensor:
        y = torch.multinomial(prior, batch_size, replacement=True, generator=gen).to(device)
        with torch.no_grad():
            z = generator(y, generator.noise(batch_size, gen).to(device))
        return alpha * F.cross_entropy(model.head(z), y)

    return loss


def generated_feature_update(message: Message, model: nn.Module, data, *,
                             device: str | torch.device = "cpu",
                             seed: int | None = None) -> Message:
    """A FedGen client's round (eq. 5): `model` (the user's, given the received weights)
    trained on `data` (labelled: (images, labels), a Dataset or a DataLoader) as FedAvg's
    clients train, plus alpha_t CE(head(G_w(y^, eps)), y^) once the message carries G_w.
    Reads "local-epochs" (1), "batch-size" (64), "lr" (1e-3), "flip" (True), "seed" (0; `seed`
    overrides it with the node's own), ... from the message's config (label_counts.TRAINING). The reply holds ArrayRecord "arrays"
    and MetricRecord "metrics" (num-examples, train-loss, train-seconds and label-counts,
    the client's label counter c_k)."""
    conf, device = message.content.config_records["config"], torch.device(device)
    x, y = labelled(data)
    model.load_state_dict(message.content.array_records["arrays"].to_torch_state_dict())
    seed, extra_loss = message_seed(message) if seed is None else seed, None
    if GENERATOR in message.content.array_records:
        generator, prior = received_generator(message, model.latent_dim)
        extra_loss = generated_feature_loss(
            generator, prior, alpha=float(conf["fedgen-alpha"]),
            batch_size=int(conf.get("batch-size", 64)), seed=seed + 1, device=device)
    result = train_as_configured(model, x, y, conf, seed=seed, device=device,
                                 extra_loss=extra_loss)
    return trained_reply(message, model, y, result, int(conf["num-classes"]))
