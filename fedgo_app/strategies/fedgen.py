"""FedGen (Zhu et al., 2021): data-free knowledge distillation in FEATURE space.

Each round the server averages the client models as FedAvg does (no distillation into the
global model), then trains a label-conditioned generator z = G_w(y, eps) so that the clients'
heads (their last layer, `head` in the model registry) classify its features as y (eq. 4, with
the per-label weights lambda_k^y = n_k^y / sum_i n_i^y of App. 9 and a diversity term), y being
drawn from the label prior p^(y) built from the label counts the clients upload with their
models. From the next round the clients receive G_w and p^(y) with the model and add
alpha_t * CE(head(G_w(y^, eps)), y^), y^ ~ p^(y), to their loss (eq. 5).

The algorithm's pieces (G_w's training, the clients' loss, the label counts) are the
library's (fedgo_flwr/strategies/fedgen.py); this module runs them with the run config and
record. Where the paper is silent this follows its public code: Adam (lr 3e-4, weight decay
1e-2) on G_w kept across rounds with its learning rate decayed 0.98 a round,
`fedgen-generator-steps` steps a round; the diversity term
exp(-mean_ij d(eps_i, eps_j) d(z_i, z_j)) (mean squared and mean absolute differences) with
weight 1; alpha_t = 10 * 0.98^t. The public code's second
client term (a KL between the heads' outputs on real and generated features) is left out:
the paper's objective (5) has only the cross-entropy. The latent layer is the classifier's own
(512 wide for the CNN), not the paper's 32-wide MLP.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from logging import INFO

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.common.logger import log

from fedgo_app.client_context import Local, config_of
from fedgo_flwr.keys import AT_LEAST_ONE, FRACTION, NON_NEGATIVE, POSITIVE, key
from fedgo_flwr.models import FeatureGenerator
from fedgo_flwr.seeds import client_seed, round_seed
from fedgo_app.server.record import RunRecord
from fedgo_app.strategies.base import (CLIENT, ClientModel, FedAvgStrategy, ServerSetup,
                                        local_update)
from fedgo_app.strategies.registry import StrategySpec
from fedgo_flwr.strategies.fedgen import (GENERATOR, generated_feature_loss, received_generator,
                                          train_feature_generator)
from fedgo_flwr.strategies.label_counts import LABEL_COUNTS, label_counts, label_prior
from fedgo_flwr.weighting import label_shares


@dataclass(frozen=True)
class FedGenKeys:
    """Run-config keys fedgen-*."""
    generator_steps: int = key(50, "the server's Adam steps on its feature generator G_w a "
                               "round (weight decay 1e-2)", NON_NEGATIVE)
    generator_lr: float = key(3e-4, "G_w's learning rate (times fedgen-decay a round)",
                              POSITIVE)
    generator_batch_size: int = key(32, "G_w's batch size", AT_LEAST_ONE)
    noise_dim: int = key(32, "G_w's noise width", AT_LEAST_ONE)
    hidden_dim: int = key(256, "G_w's hidden width (its output is the classifier's latent "
                          "layer)", AT_LEAST_ONE)
    diversity_weight: float = key(1.0, "weight of G_w's diversity term", NON_NEGATIVE)
    alpha: float = key(10.0, "clients add alpha decay^t CE(head(G_w(y, eps)), y), y from the "
                       "label prior", NON_NEGATIVE)
    decay: float = key(0.98, "per-round decay of alpha and of G_w's learning rate", FRACTION)


# ---------------------------------------------------------------------------- server side
class FedGenApp(FedAvgStrategy):
    mixes_architectures = False  # G_w generates features of one architecture's latent space
    carried = ("generator", "optimizer", "schedule", "prior")
    label_counts_in_replies = True

    def __init__(self, setup: ServerSetup, record: RunRecord):
        super().__init__(setup, record)
        self.keys = keys = setup.cfg.keys("fedgen")
        latent = setup.latent_dim("fedgen")
        with torch.random.fork_rng():
            torch.manual_seed(setup.cfg.seed)
            self.generator = FeatureGenerator(setup.num_classes, latent, keys.noise_dim,
                                              keys.hidden_dim).to(setup.device)
        # On its device before Adam exists: a resumed run's Adam state loads onto it.
        self.optimizer = torch.optim.Adam(self.generator.parameters(), lr=keys.generator_lr,
                                          weight_decay=1e-2)
        self.schedule = torch.optim.lr_scheduler.ExponentialLR(self.optimizer, keys.decay)
        self.prior: torch.Tensor | None = None  # p^(y), once a round's counts arrived

    def train_content(self, server_round: int, arrays: ArrayRecord) -> RecordDict:
        content = super().train_content(server_round, arrays)
        if self.prior is not None:  # G_w is trained from the first round's heads on
            content[GENERATOR] = ArrayRecord(self.generator.state_dict())
        return content

    def train_config(self, server_round: int) -> ConfigRecord:
        conf = super().train_config(server_round)
        if self.prior is not None:
            keys = self.keys
            conf.update({"fedgen-alpha": keys.alpha * keys.decay ** server_round,
                         "label-prior": self.prior.tolist(), "noise-dim": keys.noise_dim,
                         "hidden-dim": keys.hidden_dim})
        return conf

    def update_average(self, server_round: int, averaged: dict[str, torch.Tensor],
                       models: list[ClientModel]) -> dict[str, torch.Tensor]:
        counts = torch.tensor([m.metrics[LABEL_COUNTS] for m in models], dtype=torch.float64)
        self.prior = label_prior(counts)
        label_weights = label_shares(counts)  # lambda_k^y
        classifiers = [self.setup.new_classifier(state=m.state) for m in models]
        gen = torch.Generator().manual_seed(round_seed(self.cfg.seed, server_round))
        start = time.perf_counter()
        info = train_feature_generator(
            self.generator, classifiers, label_weights, self.prior, steps=self.keys.generator_steps,
            batch_size=self.keys.generator_batch_size, optimizer=self.optimizer,
            diversity_weight=self.keys.diversity_weight, gen=gen, device=self.setup.device)
        self.schedule.step()
        self.generator.cpu()
        self.record.time("generator_training", time.perf_counter() - start, server_round)
        self.record.round(server_round).update(info)
        log(INFO, "round %d: feature generator loss %.4f, diversity %.4f", server_round,
            info["generator_loss"], info["diversity_loss"])
        return averaged


# ---------------------------------------------------------------------------- client side
def generated_feature_update(message: Message, local: Local) -> Message:
    """Eq. 5: ClientUpdate plus alpha_t CE(head(G_w(y^, eps)), y^), y^ ~ p^(y), once the server
    sends G_w (fedgo_flwr's generated-feature loss); the reply also carries the label counts
    c_k."""
    conf = config_of(message)
    model = local.classifier(message)
    extra_loss = None
    if GENERATOR in message.content.array_records:
        generator, prior = received_generator(message, model.latent_dim)
        extra_loss = generated_feature_loss(
            generator, prior, alpha=float(conf["fedgen-alpha"]),
            batch_size=int(conf["batch-size"]),
            seed=client_seed(int(conf["seed"]), local.partition_id) + 1, device=local.device)
    reply = local_update(message, local, model, extra_loss=extra_loss)
    reply.content.metric_records["metrics"][LABEL_COUNTS] = label_counts(local.y,
                                                                         local.num_classes)
    return reply


FEDGEN = StrategySpec("fedgen", FedGenApp, {**CLIENT, "train": generated_feature_update},
                      keys=FedGenKeys)
