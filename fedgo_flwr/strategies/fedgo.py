"""FedGO (Algorithm 2 of "Provably Near-Optimal Federated Ensemble Distillation with
Negligible Overhead"): before round 1 the server sends the generator G to every client once
and gets back its discriminator D_k (Algorithm 3, `discriminator_update` below); each round,
FedAvg's average is distilled toward the ensemble weighted by the odds

    w_k(u) = n_k Phi_k(u) / sum_i n_i Phi_i(u),   Phi_k = D_k / (1 - D_k),

computed once on U since D_k never changes. A node seen first after the pre-FL stage, or whose
D_k comes after the stage's wait, gets G at the next round's start; its D_k joins the odds
when it arrives. Until then its model is averaged but does not teach."""

from __future__ import annotations

import math
import time
from logging import INFO, WARNING

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy.strategy_utils import sample_nodes

from fedgo_flwr.gan import (Negatives, calibrate_discriminator, generator_negatives, hold_out,
                            image_negatives, log_odds, train_discriminator, train_wgan_gp)
from fedgo_flwr.inputs import images_of
from fedgo_flwr.models import Critic, Discriminator, Generator
from fedgo_flwr.replies import examples_problem, state_problem
from fedgo_flwr.strategies.base import ClientModel, message_seed
from fedgo_flwr.strategies.ensemble import EnsembleDistillation
from fedgo_flwr.weighting import WEIGHTINGS

TRAIN_DISCRIMINATOR = "train.discriminator"  # the pre-FL stage's message type
SERVER_SAMPLE = "server-sample"  # an ArrayRecord of the server's images, sent instead of G
POLL_SECONDS = 0.5


class FedGO(EnsembleDistillation):
    """FedGO: FedAvg, then distillation toward the odds-weighted ensemble.

    Parameters
    ----------
    unlabeled_data, model_fn, distill_*, ensemble_space, flip_views, view_draw, teacher_floor,
    confidence_threshold, seed, device
        As in `EnsembleDistillation` (fedgo_flwr.strategies.ensemble).
    weighting : str | Callable (default: "odds")
        The rule w_k(u): "odds" (the paper's eq. 9) or another of fedgo_flwr.weighting's
        rules that needs no label counts, or a function of your own.
    generator : nn.Module | None (default: None)
        G: a trained `fedgo_flwr.models.Generator` (an off-the-shelf or data-free one), or
        None to train one on U with WGAN-GP before round 1 (the paper's G1).
    generator_steps : int (default: 100000)
        WGAN-GP generator steps when G is trained here (App. E.2: 1e5).
    latent_dim, generator_width : int (default: 128, 64)
        G's shape when trained here.
    critic_steps, gp_weight, gan_lr, gan_batch_size : (default: 5, 10.0, 2e-4, 64)
        WGAN-GP's settings.
    discriminator_epochs : int (default: 30)
        Each client's passes over its data in Algorithm 3.
    discriminator_lr : float (default: 2e-4)
    discriminator_width : int (default: 64)
    calibration_fraction : float (default: 0.0)
        Above 0 (not in the paper): each client holds out this share of its data, fits
        Platt's calibration of D_k on it and the odds are a * logit + b, uncapped.
    """

    def __init__(self, *, unlabeled_data, model_fn, weighting="odds", generator=None,
                 generator_steps: int = 100_000, latent_dim: int = 128,
                 generator_width: int = 64, critic_steps: int = 5, gp_weight: float = 10.0,
                 gan_lr: float = 2e-4, gan_batch_size: int = 64, discriminator_epochs: int = 30,
                 discriminator_lr: float = 2e-4, discriminator_width: int = 64,
                 calibration_fraction: float = 0.0, **kwargs) -> None:
        if isinstance(weighting, str):
            if weighting not in WEIGHTINGS or weighting.startswith("class-count"):
                raise ValueError(f"weighting {weighting!r}; allowed: " + ", ".join(
                    w for w in WEIGHTINGS if not w.startswith("class-count")))
            weighting = WEIGHTINGS[weighting]
        super().__init__(unlabeled_data=unlabeled_data, model_fn=model_fn,
                         weighting=weighting, **kwargs)
        if generator is not None and not isinstance(generator, Generator):
            raise TypeError("generator must be a fedgo_flwr.models.Generator (clients rebuild "
                            f"it from its weights), not {type(generator).__name__}")
        if not 0.0 <= calibration_fraction < 1.0:
            raise ValueError(f"calibration_fraction is {calibration_fraction}; allowed: [0, 1)")
        self.generator = generator
        self.gan = dict(steps=generator_steps, latent_dim=latent_dim, width=generator_width,
                        critic_steps=critic_steps, gp_weight=gp_weight, lr=gan_lr,
                        batch_size=gan_batch_size)
        self.discriminator_config = ConfigRecord({
            "discriminator-epochs": discriminator_epochs, "discriminator-lr": discriminator_lr,
            "discriminator-width": discriminator_width, "batch-size": gan_batch_size,
            "flip": self.views == 2, "seed": self.seed,
            "calibration-fraction": calibration_fraction})
        c, h = self.u.shape[1], self.u.shape[2]
        self.discriminator_template = Discriminator(c, h, discriminator_width).state_dict()
        self.log_odds: dict[int, torch.Tensor] = {}  # node id -> log Phi_k on U, [V, |U|]
        self.discriminators: dict[int, tuple[Discriminator, tuple | None]] = {}
        self.round_odds: tuple[torch.Tensor | None, dict[int, torch.Tensor]] = (None, {})
        self.asked: set[int] = set()  # nodes that were sent G
        self.pending: dict[str, int] = {}  # message id -> node id, D_k not yet back

    # --- pre-FL stage
    def pre_fl(self, grid: Grid, timeout: float) -> None:
        """G (trained on U unless given), sent to every node; their D_k back, as odds on U."""
        if self.generator is None:
            self.generator = self.train_generator()
        _, nodes = sample_nodes(grid, self.min_available_nodes, 0)
        log(INFO, "pre-FL: sending G to %d nodes for their discriminators", len(nodes))
        self.send_generator(grid, nodes)
        deadline = time.monotonic() + timeout
        while self.pending and time.monotonic() < deadline:
            self.receive_discriminators(grid)
            time.sleep(POLL_SECONDS if self.pending else 0)
        log(INFO, "pre-FL: %d of %d discriminators in%s", len(self.log_odds), len(nodes),
            f"; {len(self.pending)} may still come" if self.pending else "")

    def train_generator(self) -> Generator:
        """G1: WGAN-GP on U, seeded."""
        g, (c, h) = self.gan, (self.u.shape[1], self.u.shape[2])
        torch.manual_seed(self.seed)
        generator = Generator(g["latent_dim"], c, h, g["width"])
        every = max(1, g["steps"] // 10)

        def progress(step: int, w_dist: float, _: float) -> None:
            if step % every == 0:
                log(INFO, "pre-FL: generator step %d/%d | Wasserstein estimate %.3f", step,
                    g["steps"], w_dist)

        info = train_wgan_gp(
            generator, Critic(c, h, g["width"]), self.u, steps=g["steps"],
            critic_steps=g["critic_steps"], gp_weight=g["gp_weight"], lr=g["lr"],
            batch_size=g["batch_size"], flip=self.views == 2, seed=self.seed,
            device=self.device, progress=progress)
        log(INFO, "pre-FL: generator trained in %.1fs", info["seconds"])
        return generator.cpu().eval()

    def send_generator(self, grid: Grid, nodes) -> None:
        """Push G to these nodes without waiting; their replies are pulled later."""
        nodes = [n for n in nodes if n not in self.asked]
        if not nodes:
            return
        config = ConfigRecord({**self.discriminator_config,
                               "latent-dim": self.generator.latent_dim,
                               "generator-width": self.generator.dim})
        content = RecordDict({"generator": ArrayRecord(self.generator.state_dict()),
                              "config": config})
        messages = [Message(content, dst_node_id=n, message_type=TRAIN_DISCRIMINATOR)
                    for n in nodes]
        self.pending.update(zip(grid.push_messages(messages), nodes))
        self.asked.update(nodes)

    def receive_discriminators(self, grid: Grid) -> None:
        """Pull whatever D_k has come back and turn each usable one into odds on U."""
        for reply in grid.pull_messages(list(self.pending)):
            node = self.pending.pop(reply.metadata.reply_to_message_id, None)
            if node is None:
                continue
            why = (f"failed: {reply.error.reason}" if reply.has_error()
                   else self.discriminator_problem(reply))
            if why:
                log(WARNING, "discriminator of node %d left out: %s", node, why)
                continue
            self.log_odds[node] = self.odds_on_u(node, reply)
            log(INFO, "discriminator of node %d in (%d in all)", node, len(self.log_odds))

    def discriminator_problem(self, reply: Message) -> str | None:
        content = reply.content
        metrics = content.metric_records.get("metrics")
        why = (state_problem(content.array_records.get("discriminator"),
                             self.discriminator_template)
               or examples_problem(metrics, "num-examples"))
        if why or not self.discriminator_config["calibration-fraction"]:
            return why
        a, b = metrics.get("odds-scale"), metrics.get("odds-shift")
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (a, b)) or a <= 0:
            return f"calibration (odds-scale, odds-shift) is ({a}, {b}); expected a > 0, b finite"
        return None

    def odds_on_u(self, node: int, reply: Message) -> torch.Tensor:
        """log Phi_k on every view of U, [V, |U|] (D_k kept for other distillation sets)."""
        c, h = self.u.shape[1], self.u.shape[2]
        d = Discriminator(c, h, int(self.discriminator_config["discriminator-width"]))
        d.load_state_dict(reply.content.array_records["discriminator"].to_torch_state_dict())
        metrics = reply.content.metric_records["metrics"]
        calibration = ((float(metrics["odds-scale"]), float(metrics["odds-shift"]))
                       if self.discriminator_config["calibration-fraction"] else None)
        self.discriminators[node] = (d.eval(), calibration)
        return self.odds_on(d, calibration, self.u)

    def odds_on(self, d: Discriminator, calibration, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([log_odds(d, x, device=self.device, flip=v == 1,
                                     calibration=calibration) for v in range(self.views)])

    def odds(self, node: int, u: torch.Tensor) -> torch.Tensor:
        """log Phi_k on every view of the distillation set u: cached on U, computed once a
        round on a set of `distillation_sets`."""
        if u is self.u:
            return self.log_odds[node]
        if self.round_odds[0] is not u:
            self.round_odds = (u, {})
        cached = self.round_odds[1]
        if node not in cached:
            cached[node] = self.odds_on(*self.discriminators[node], u)
        return cached[node]

    # --- main FL
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid):
        """FedAvg's, after taking in late discriminators and sending G to new nodes."""
        self.receive_discriminators(grid)
        self.send_generator(grid, grid.get_node_ids())
        return super().configure_train(server_round, arrays, config, grid)

    def teachers(self, models: list[ClientModel]) -> list[ClientModel]:
        return [m for m in models if m.node_id in self.log_odds]

    def server_update(self, server_round, averaged, models, report):
        arrays, info = super().server_update(server_round, averaged, models, report)
        return arrays, {**info, "discriminators": len(self.log_odds)}

    def scores(self, teachers, nets, u, samples, view):
        logits, _ = super().scores(teachers, nets, u, samples, view)
        return logits, torch.stack([self.odds(m.node_id, u)[view, samples] for m in teachers])


# ---------------------------------------------------------------------------- client side
def discriminator_update(message: Message, data, *, device: str | torch.device = "cpu",
                         seed: int | None = None) -> Message:
    """Algorithm 3 on a client: D_k trained to tell its images (`data`: a tensor, Dataset or
    DataLoader, see fedgo_flwr.inputs) from samples of the received G (or, where the message
    carries ArrayRecord "server-sample" instead, from those images of the server: not in the
    paper). `seed` seeds D_k and its batches (default: the message's seed and this node's id).
    The reply holds ArrayRecord "discriminator" and MetricRecord "metrics" (num-examples,
    discriminator-loss, discriminator-seconds, and with calibration odds-scale and
    odds-shift)."""
    conf, device = message.content.config_records["config"], torch.device(device)
    x = images_of(data)
    negatives = received_negatives(message, tuple(x.shape[1:]), bool(conf["flip"]), device)
    if seed is None:
        seed = message_seed(message)
    train, held_out = hold_out(x, float(conf["calibration-fraction"]), seed)
    torch.manual_seed(seed)
    discriminator = Discriminator(x.shape[1], x.shape[2], int(conf["discriminator-width"]))
    start = time.perf_counter()
    result = train_discriminator(discriminator, negatives, train,
                                 epochs=int(conf["discriminator-epochs"]),
                                 lr=float(conf["discriminator-lr"]),
                                 batch_size=int(conf["batch-size"]), flip=bool(conf["flip"]),
                                 seed=seed, device=device)
    if len(held_out):
        a, b = calibrate_discriminator(discriminator, negatives, held_out, seed=seed + 1,
                                       device=device)
        result.update({"odds-scale": a, "odds-shift": b})
    result["discriminator-seconds"] = time.perf_counter() - start  # calibration included
    return Message(RecordDict({
        "discriminator": ArrayRecord(discriminator.cpu().state_dict()),
        "metrics": MetricRecord({"num-examples": len(x), **result})}), reply_to=message)


def received_negatives(message: Message, image_shape: tuple[int, ...], flip: bool,
                       device: torch.device) -> Negatives:
    """What D_k learns against: samples of the received G, or the server's sample of U."""
    conf, records = message.content.config_records["config"], message.content.array_records
    if SERVER_SAMPLE in records:
        images = records[SERVER_SAMPLE].to_torch_state_dict()["images"]
        if tuple(images.shape[1:]) != image_shape:
            raise ValueError(f"the server's sample has images of shape {tuple(images.shape[1:])}"
                             f", this client's are {image_shape}")
        return image_negatives(images, flip=flip)
    c, h = image_shape[0], image_shape[1]
    generator = Generator(int(conf["latent-dim"]), c, h, int(conf["generator-width"]))
    generator.load_state_dict(records["generator"].to_torch_state_dict())
    return generator_negatives(generator.to(device))
