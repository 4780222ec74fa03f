"""DaFKD (Wang et al., CVPR 2023), domain-aware federated knowledge distillation, data-free.

Each round a sampled client trains its classifier together with a discriminator D_k, a linear
head on the classifier's latent layer (`features`), that tells its data from samples of the
global generator G; in the first `gan_rounds` rounds it also trains G against D_k. The server
averages the classifiers, the heads and (in those rounds) G by n_k, draws the round's
distillation set from G, and distils the average toward the ensemble weighted by
w_k(x) = D_k(x) / sum_i D_i(x) (the FedGO paper's summary of DaFKD). Where that summary is
silent this follows DaFKD's public code (../shared/notes/algorithms.md); the distillation is
the one every ensemble strategy here shares (temperature 1, no labelled data)."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from torch import nn

from fedgo_flwr.aggregation import mean_of_replies
from fedgo_flwr.batches import augment, to_unit_range
from fedgo_flwr.checks import check_model
from fedgo_flwr.gan import draw_images
from fedgo_flwr.inputs import labelled
from fedgo_flwr.models import Generator
from fedgo_flwr.seeds import round_seed
from fedgo_flwr.strategies.base import ClientModel
from fedgo_flwr.strategies.messages import CLIENT_TRAINING, message_seed, model_reply
from fedgo_flwr.strategies.client_methods import LocalTerms, terms_of
from fedgo_flwr.strategies.ensemble import EnsembleDistillation
from fedgo_flwr.strategies.feduv import Encoded
from fedgo_flwr.teachers import server_autocast
from fedgo_flwr.train import apply_in_batches, classifier_optimizer, minibatch_descent
from fedgo_flwr.weighting import domain_aware_weights

TRAIN_DAFKD = "train.dafkd"  # its clients' local step, not Flower's plain "train"
GENERATOR, HEAD = "generator", "discriminator-head"
FEATURE_SPACE = ("features", "head", "latent_dim")


def feature_space_problem(model: nn.Module) -> str | None:
    """Why DaFKD (or FedGen) cannot work on this model's latent layer, or None."""
    missing = [a for a in FEATURE_SPACE if not hasattr(model, a)]
    if missing:
        return (f"{type(model).__name__} lacks {', '.join(missing)}: give it features(x) -> z, "
                "head(z) -> logits (forward = head(features(x))) and latent_dim = z's width")
    return None


def discriminator_head(latent_dim: int) -> nn.Module:
    """D_k's head on the classifier's latent layer: one logit, D_k(x) = sigmoid(logit)."""
    return nn.Linear(latent_dim, 1)


def train_domain_aware(model: nn.Module, head: nn.Module, generator: Generator,
                       x: torch.Tensor, y: torch.Tensor, *, epochs: int, batch_size: int,
                       lr: float, gan_lr: float, train_generator: bool, flip: bool, seed: int,
                       device: torch.device, crop: int = 0, optimizer: str = "adam",
                       momentum: float = 0.9, terms: LocalTerms | None = None
                       ) -> dict[str, float]:
    """Local training of one DaFKD client. Each minibatch: one Adam step of the classifier and
    its discriminator head on CE(f(x), y) + BCE(D(x), 1) + BCE(D(G(z)), 0); then, when
    `train_generator`, one step of G on BCE(D(G(z)), 1). `terms`, a client method's
    (fedgo_flwr.strategies.client_methods), add to the classifier's loss and step as in the
    plain local loop."""
    start = time.perf_counter()
    gen = torch.Generator().manual_seed(seed)
    terms = terms or LocalTerms()
    net = terms.module if isinstance(terms.module, Encoded) else Encoded(model)
    model.to(device).train()
    head.to(device).train()
    generator.to(device).train(train_generator)
    opt = classifier_optimizer([*model.parameters(), *head.parameters()], lr, optimizer,
                               momentum)
    if terms.after_step is not None:
        opt.register_step_post_hook(lambda *_: terms.after_step())
    generator_step = generator_trainer(model, head, generator, gan_lr)
    g_losses = []

    def batch_loss(idx: torch.Tensor) -> torch.Tensor:
        xb = augment(to_unit_range(x[idx]).to(device), gen, flip=flip, crop=crop)
        # At least two fakes: G's BatchNorm cannot train on the one-image last batch that a
        # partition of n_k = 1 mod batch-size ends with.
        z = torch.randn(max(len(idx), 2), generator.latent_dim, generator=gen).to(device)
        if train_generator:  # G's step against the current D (which the step below then updates)
            g_losses.append(generator_step(z))
        with torch.no_grad():
            fake = generator(z)
        logits, yb = net(xb), y[idx].to(device)
        d_real = head(net.z).squeeze(1)
        d_fake = head(model.features(fake)).squeeze(1)
        loss = (F.cross_entropy(logits, yb)
                + F.binary_cross_entropy_with_logits(d_real, torch.ones_like(d_real))
                + F.binary_cross_entropy_with_logits(d_fake, torch.zeros_like(d_fake)))
        if terms.batch_term is not None:  # on the real minibatch, before D's fakes
            loss = loss + terms.batch_term(xb, logits, yb)
        return loss if terms.extra_loss is None else loss + terms.extra_loss(model)

    loss = minibatch_descent(opt, len(y), epochs=epochs, batch_size=batch_size, gen=gen,
                             batch_loss=batch_loss)
    out = {"train-loss": loss, "train-seconds": time.perf_counter() - start}
    if g_losses:
        out["generator-loss"] = sum(g_losses) / len(g_losses)
    return out


def generator_trainer(model: nn.Module, head: nn.Module, generator: Generator, lr: float):
    """One Adam step (betas 0.5, 0.999) of G on BCE(D(G(z)), 1) against the current D, as a
    function of the latents z returning the loss."""
    opt = torch.optim.Adam(generator.parameters(), lr=lr, betas=(0.5, 0.999))

    def step(z: torch.Tensor) -> float:
        logits = head(model.features(generator(z))).squeeze(1)
        loss = F.binary_cross_entropy_with_logits(logits, torch.ones_like(logits))
        opt.zero_grad(set_to_none=True)
        loss.backward(inputs=list(generator.parameters()))
        opt.step()
        return loss.item()

    return step


def both_heads(net: nn.Module, head: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """[f(x); logit D(x)] of a classifier and its discriminator head, [N, C + 1]."""
    z = net.features(x)
    return torch.cat([net.head(z), head(z)], dim=1)


class DaFKD(EnsembleDistillation):
    """DaFKD: FedAvg, then distillation on images of a collaboratively trained generator,
    weighted by each client's domain discriminator. Needs no server data.

    Parameters
    ----------
    model_fn : Callable[[], nn.Module]
        The global model; it must have `features(x) -> z`, `head(z) -> logits` and
        `latent_dim` (D_k is a head on z).
    unlabeled_data : Tensor | Dataset | DataLoader | None (default: None)
        Never distilled on (DaFKD is data-free); when given, it sets `image_shape` and
        `distill_size`, so that DaFKD takes the arguments the other strategies take and
        distils on as many images as they do.
    image_shape : tuple[int, int, int] | None (default: None)
        (C, H, W) of the clients' images (any size), when `unlabeled_data` is not given.
    distill_size : int | None (default: None)
        Images drawn from G for each round's distillation: |U|, or 3000 without U.
    gan_rounds : int (default: 5)
        Rounds in which the clients also train G (it is sent every round).
    latent_dim, generator_width, gan_lr : (default: 128, 64, 2e-4)
        G's shape and the clients' learning rate for it.
    distill_*, ensemble_space, flip_views, view_draw, teacher_floor,
    confidence_threshold, seed, device, **kwargs
        As in `EnsembleDistillation`, and Flower's `FedAvg` keywords.
    """

    client_training = CLIENT_TRAINING
    train_type = TRAIN_DAFKD  # its clients' local step, not Flower's plain "train"
    carried = (*EnsembleDistillation.carried, "generator", "head")  # the global G and head

    def __init__(self, *, model_fn, unlabeled_data=None,
                 image_shape: tuple[int, int, int] | None = None,
                 distill_size: int | None = None, gan_rounds: int = 5, latent_dim: int = 128,
                 generator_width: int = 64, gan_lr: float = 2e-4, **kwargs) -> None:
        super().__init__(model_fn=model_fn, unlabeled_data=unlabeled_data,
                         weighting=domain_aware_weights, **kwargs)
        if self.u is not None:
            image_shape, distill_size = tuple(self.u.shape[1:]), distill_size or len(self.u)
        if image_shape is None:
            raise ValueError("DaFKD needs image_shape (C, H, W), or unlabeled_data to take it "
                             "from")
        c, h, w = image_shape
        if self.u is None:  # what the generator will make, through the user's model
            check_model(model_fn, torch.zeros(2, c, h, w),
                        f"images of image_shape {tuple(image_shape)}")
        with torch.random.fork_rng():  # G, then the model, then the head: from the seed alone
            torch.manual_seed(self.seed)
            self.generator = Generator(latent_dim, c, (h, w), generator_width)
            model = model_fn()
            if why := feature_space_problem(model):
                raise TypeError(f"DaFKD works on the model's latent layer: {why}")
            self.head = discriminator_head(model.latent_dim)
        self.distill_size, self.gan_rounds, self.gan_lr = distill_size or 3000, gan_rounds, gan_lr

    def trains_generator(self, server_round: int) -> bool:
        return server_round <= self.gan_rounds

    def train_payload(self, server_round: int, arrays: ArrayRecord):
        """FedAvg's, and G, the global head and G's settings."""
        extra, settings = super().train_payload(server_round, arrays)
        extra.update({GENERATOR: ArrayRecord(self.generator.state_dict()),
                      HEAD: ArrayRecord(self.head.state_dict())})
        settings.update({"train-generator": self.trains_generator(server_round),
                         "latent-dim": self.generator.latent_dim,
                         "generator-width": self.generator.dim, "gan-lr": self.gan_lr})
        return extra, settings

    def extra_arrays(self, server_round: int) -> dict:
        """The clients' method's, D_k's head and, in the generator rounds, G: each shaped
        as the server's."""
        need = {**super().extra_arrays(server_round), HEAD: self.head.state_dict()}
        if self.trains_generator(server_round):
            need[GENERATOR] = self.generator.state_dict()
        return need

    def server_update(self, server_round, averaged, models, report):
        """The heads and (in the generator rounds) G averaged by n_k, then the shared
        distillation on images of the new global G."""
        self.head.load_state_dict(self.average(models, HEAD))
        if self.trains_generator(server_round):
            self.generator.load_state_dict(self.average(models, GENERATOR))
        return super().server_update(server_round, averaged, models, report)

    def distillation_set(self, server_round: int) -> torch.Tensor:
        """The round's |U| images of the global G (seeded by the round)."""
        return draw_images(self.generator, self.distill_size,
                           round_seed(self.seed, server_round), self.device)

    def average(self, models: list[ClientModel], key: str) -> dict[str, torch.Tensor]:
        parts = [RecordDict({key: m.extras[key], "metrics": MetricRecord(
            {self.weighted_by_key: m.num_examples})}) for m in models]
        return mean_of_replies(parts, self.weighted_by_key).to_torch_state_dict()

    def scores(self, teachers, nets, u, samples, view):
        heads = [m.extras[HEAD].to_torch_state_dict() for m in teachers]
        return domain_scores(nets, heads, u[samples], flip=view == 1, device=self.device,
                             amp=self.device.type == "cuda")


def domain_scores(nets: list[nn.Module], heads: list[dict[str, torch.Tensor]], x: torch.Tensor,
                  *, flip: bool, device: torch.device, amp: bool
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each client's class logits [K, N, C] and logit D_k(x) [K, N] on images x (mirrored when
    `flip`), from one pass of its trunk: D_k is a head (state dict in `heads`) on its own
    latent layer."""
    logits, log_odds = [], []
    for net, state in zip(nets, heads):
        head = discriminator_head(net.latent_dim)
        head.load_state_dict(state)
        net.to(device).eval()
        head.to(device)
        with server_autocast(device, amp):
            out = apply_in_batches(lambda xb: both_heads(net, head, xb), x, device=device,
                                   flip=flip)
        logits.append(out[:, :-1])
        log_odds.append(out[:, -1])
    return torch.stack(logits), torch.stack(log_odds)


# ---------------------------------------------------------------------------- client side
def domain_aware_update(message: Message, model: nn.Module, data,
                        state: RecordDict | None = None, *,
                        device: str | torch.device = "cpu", seed: int | None = None) -> Message:
    """A DaFKD client's round: `model` (the user's, given the received weights) and D_k's head
    trained on `data` (labelled: (images, labels), a Dataset or a DataLoader) against the
    received G, and G against D_k in the generator rounds. Reads from the message's config,
    where given: "local-epochs" (1), "lr" (1e-3), "batch-size" (64), "optimizer" ("adam"),
    "momentum" (0.9), "flip" (false), "random-crop" (0) and "seed" (0; `seed` overrides it
    with the node's own). Where the config names a "client-method" (SCAFFOLD's, FedUV's,
    FedGKD's), its terms join the classifier's training, its state in `state` (the node's
    context.state). The reply holds ArrayRecords "arrays", "discriminator-head" (and
    "generator" when it trained G, and the method's own) and MetricRecord "metrics"
    (num-examples, the loss under the config's "train-loss-key" ("train-loss"), ...)."""
    conf, records = message.content.config_records["config"], message.content.array_records
    x, y = labelled(data)
    model.load_state_dict(records["arrays"].to_torch_state_dict())
    head = discriminator_head(model.latent_dim)
    head.load_state_dict(records[HEAD].to_torch_state_dict())
    generator = Generator(int(conf["latent-dim"]), x.shape[1], tuple(x.shape[2:]),
                          int(conf["generator-width"]))
    generator.load_state_dict(records[GENERATOR].to_torch_state_dict())
    trains_g = bool(conf["train-generator"])
    if seed is None:
        seed = message_seed(message)
    terms = terms_of(message, model, state, torch.device(device))  # a method's, FedProx's
    result = train_domain_aware(
        model, head, generator, x, y, epochs=int(conf.get("local-epochs", 1)),
        batch_size=int(conf.get("batch-size", 64)), lr=float(conf.get("lr", 1e-3)),
        gan_lr=float(conf["gan-lr"]), train_generator=trains_g,
        flip=bool(conf.get("flip", False)), crop=int(conf.get("random-crop", 0)),
        optimizer=str(conf.get("optimizer", "adam")),
        momentum=float(conf.get("momentum", 0.9)), seed=seed, device=torch.device(device),
        terms=terms)
    arrays, metrics = terms.finish() if terms.finish else ({}, {})
    arrays[HEAD] = ArrayRecord(head.cpu().state_dict())
    if trains_g:
        arrays[GENERATOR] = ArrayRecord(generator.cpu().state_dict())
    return model_reply(message, model, len(y), result, arrays, metrics)
