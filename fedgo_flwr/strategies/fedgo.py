"""FedGO (Algorithm 2 of "Provably Near-Optimal Federated Ensemble Distillation with
Negligible Overhead"): before round 1 the server sends the generator G to every client once
and gets back its discriminator D_k (Algorithm 3, `discriminator_update` below); each round,
FedAvg's average is distilled toward the ensemble weighted by the odds

    w_k(u) = n_k Phi_k(u) / sum_i n_i Phi_i(u),   Phi_k = D_k / (1 - D_k),

computed once on U since D_k never changes. A node seen first after the pre-FL stage gets G at
the next round's start; a late D_k joins the odds when it arrives (till then, its client's
model is averaged but does not teach)."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from logging import INFO, WARNING

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy.strategy_utils import sample_nodes
from torch import nn

from fedgo_flwr.checks import check_discriminator, check_generator, check_unit_range
from fedgo_flwr.calibration import PlattCalibration, calibrate_discriminator, hold_out
from fedgo_flwr.gan import (LIBRARY, NEGATIVES, OWN, SERVER_SAMPLE, KeptDiscriminators,
                            log_odds, received_discriminator, received_negatives,
                            server_sample, train_discriminator, wgan_generator)
from fedgo_flwr.inputs import images_of
from fedgo_flwr.models import Discriminator, Generator
from fedgo_flwr.defences import OddsScreen
from fedgo_flwr.replies import examples_problem, payload_bytes, state_problem
from fedgo_flwr.strategies.base import ClientModel, RoundReport
from fedgo_flwr.strategies.messages import message_seed
from fedgo_flwr.strategies.ensemble import EnsembleDistillation
from fedgo_flwr.teachers import top_teacher_logits
from fedgo_flwr.weighting import unlabelled_rule

TRAIN_DISCRIMINATOR = "train.discriminator"  # the pre-FL stage's message type
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
        G: a trained generator (the library's `fedgo_flwr.models.Generator`, an off-the-shelf
        or data-free one, or a module of your own under the protocol of
        fedgo_flwr.models.gan: `latent_dim`, z -> images of U's shape in [-1, 1]; clients then
        build it with the `generator_fn` given to `register`), or None to train the library's
        on U with WGAN-GP before round 1 (the paper's G1), for any image size.
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
    discriminator_fn : Callable[[], nn.Module] | None (default: None)
        D_k's architecture: None is the library's `Discriminator` (images of 8x8 pixels or
        more); a function of your own builds a module with `logit(x)` -> [n] (the protocol of
        fedgo_flwr.models.gan), and the clients' `register` gets the same function.
    calibration_fraction : float (default: 0.0)
        Above 0 (not in the paper): each client holds out this share of its data, fits
        Platt's calibration of D_k on it and the odds are a * logit + b, uncapped
        (fedgo_flwr.calibration).
    discriminator_negatives : str (default: "generator")
        What D_k learns against: "generator" (G, the paper) or "server-sample" (not in the
        paper: `server_sample_size` images of U, drawn by the seed, sent instead of G).
    server_sample_size : int (default: 1000)
    odds_screen : float | None (default: None)
        Not in the paper: after the pre-FL stage, leave out of the odds each D_k whose odds
        on U are saturated, constant, or more than this many robust z-scores from the
        others' (fedgo_flwr.defences.OddsScreen); its client still trains. None keeps
        every D_k. With the screen on, late discriminators are not taken.
    teachers_per_image : int (default: 0)
        Not in the paper: above 0, only this many teachers of largest w_k(u) (known from the
        odds before any classifier runs) label an image, the rest weighted 0 (metric
        "dropped-weight": the weight left out); 0: all, the paper. Needs weighting "odds".

    Each pre-FL stage (and each D_k that joins later) goes to the `observers` as a
    `RoundReport` of round 0: `details` holds the usable D_k's metrics by client key
    ("discriminators"), the failed and rejected replies, "missing", "screened", "joined_late".
    """

    # D_k enter once, as odds on U; they are kept to score other distillation sets
    carried = (*EnsembleDistillation.carried, "log_odds", "discriminators")

    def __init__(self, *, unlabeled_data, model_fn, weighting="odds", generator=None,
                 generator_steps: int = 100_000, latent_dim: int = 128,
                 generator_width: int = 64, critic_steps: int = 5, gp_weight: float = 10.0,
                 gan_lr: float = 2e-4, gan_batch_size: int = 64, discriminator_epochs: int = 30,
                 discriminator_lr: float = 2e-4, discriminator_width: int = 64,
                 discriminator_fn: Callable[[], nn.Module] | None = None,
                 calibration_fraction: float = 0.0, discriminator_negatives: str = "generator",
                 server_sample_size: int = 1000, odds_screen: float | None = None,
                 teachers_per_image: int = 0, **kwargs) -> None:
        self.teachers_per_image, self.dropped = teachers_per_image, []  # and its weight left out
        super().__init__(unlabeled_data=unlabeled_data, model_fn=model_fn,
                         weighting=unlabelled_rule(weighting, teachers_per_image), **kwargs)
        if generator is not None:
            check_generator(generator, self.u)
        elif discriminator_negatives == "generator":
            check_unit_range(self.u, "the generator FedGO trains on it")
        self.calibration = PlattCalibration(calibration_fraction) if calibration_fraction \
            else None
        if discriminator_negatives not in NEGATIVES:
            raise ValueError(f"discriminator_negatives is {discriminator_negatives!r}; "
                             f"allowed: {', '.join(NEGATIVES)}")
        self.negatives, self.server_sample_size = discriminator_negatives, server_sample_size
        self.odds_screen = OddsScreen(odds_screen) if odds_screen is not None else None
        self.generator, self.odds_seconds = generator, 0.0
        self.gan = dict(steps=generator_steps, latent_dim=latent_dim, width=generator_width,
                        critic_steps=critic_steps, gp_weight=gp_weight, lr=gan_lr,
                        batch_size=gan_batch_size)
        self.discriminator_config = ConfigRecord({
            "discriminator-epochs": discriminator_epochs, "discriminator-lr": discriminator_lr,
            "discriminator-width": discriminator_width, "batch-size": gan_batch_size,
            "flip": self.views == 2, "seed": self.seed,
            "calibration-fraction": calibration_fraction,
            "discriminator": LIBRARY if discriminator_fn is None else OWN})
        self.discriminator_fn = discriminator_fn or partial(
            Discriminator, self.u.shape[1], tuple(self.u.shape[2:]), discriminator_width)
        self.discriminator_template = check_discriminator(self.discriminator_fn(), self.u)
        # client key -> log Phi_k on U [V, |U|]; client key -> (D_k, its calibration or None)
        self.log_odds, self.discriminators = {}, KeptDiscriminators(self.discriminator_fn)
        self.round_odds: tuple[torch.Tensor | None, dict] = (None, {})
        # client keys that were sent G; message id -> (node, key) of the replies awaited
        self.asked, self.pending = set(), {}
        self.stage: RoundReport | None = None  # the pre-FL stage of this `start`

    # --- pre-FL stage
    def pre_fl(self, grid: Grid, timeout: float) -> None:
        """G (trained on U unless given), sent to every node; their D_k back, as odds on U."""
        self.stage = report = RoundReport(0, {}, [], {}, None, None, {})
        if self.negatives == "generator" and self.generator is None:
            start = time.perf_counter()
            self.generator = self.train_generator()
            report.seconds["generator_training"] = time.perf_counter() - start
        if hasattr(self.generator, "curve"):  # a G trained here: its WGAN-GP loss curve
            report.details["generator_curve"] = self.generator.curve
        _, nodes = sample_nodes(grid, self.min_available_nodes, 0)
        report.sampled = self.client_keys.keys(grid, nodes)
        log(INFO, "pre-FL: sending the %s to %d clients for their discriminators",
            self.negatives, len(report.sampled))
        start = time.perf_counter()
        self.send_generator(grid, report.sampled, report)
        deadline = time.monotonic() + timeout
        while self.pending and time.monotonic() < deadline:
            self.receive_discriminators(grid, report)
            time.sleep(POLL_SECONDS if self.pending else 0)
        report.seconds["discriminator_training"] = time.perf_counter() - start
        report.details["missing"] = sorted(key for _, key in self.pending.values())
        if not self.log_odds:
            raise RuntimeError(f"pre-FL: no client returned a usable discriminator "
                               f"(left out: {report.left_out or 'none answered'})")
        if self.odds_screen is not None:  # D_k far from the others leave the odds
            report.details["screened"] = self.odds_screen.apply(
                self.log_odds, self.discriminators, capped=self.calibration is None)
        log(INFO, "pre-FL: %d of %d discriminators in%s", len(self.log_odds), len(nodes),
            f"; {len(self.pending)} may still come" if self.pending else "")
        self.notify(report)

    def train_generator(self) -> Generator:
        """G1: WGAN-GP on U, seeded."""
        g = self.gan
        return wgan_generator(self.u, g["steps"], latent_dim=g["latent_dim"], width=g["width"],
                              critic_steps=g["critic_steps"], gp_weight=g["gp_weight"],
                              lr=g["lr"], batch_size=g["batch_size"], flip=self.views == 2,
                              seed=self.seed, device=self.device)

    def negatives_record(self) -> tuple[str, ArrayRecord, ConfigRecord]:
        """What the clients' D_k learn against, and the stage's config."""
        if self.negatives == "server-sample":
            images = server_sample(self.u, self.server_sample_size, self.seed)
            return SERVER_SAMPLE, ArrayRecord({"images": images}), self.discriminator_config
        g = self.generator
        config = {"generator": OWN} if not isinstance(g, Generator) else {
            "generator": LIBRARY, "latent-dim": g.latent_dim, "generator-width": g.dim}
        return "generator", ArrayRecord(g.state_dict()), ConfigRecord({
            **self.discriminator_config, **config})

    def send_generator(self, grid: Grid, keys: dict[int, object],
                       report: RoundReport | None = None) -> None:
        """Push G (or the server's sample) to the clients of these nodes (node id -> key)
        not asked yet, without waiting; their replies are pulled later."""
        keys = {n: k for n, k in keys.items() if k not in self.asked}
        if not keys:
            return
        name, arrays, config = self.negatives_record()
        content = RecordDict({name: arrays, "config": config})
        messages = [Message(content, dst_node_id=n, message_type=TRAIN_DISCRIMINATOR)
                    for n in keys]
        self.pending.update(zip(grid.push_messages(messages), keys.items()))
        self.asked.update(keys.values())
        if report is not None:
            report.bytes["down"] = report.bytes.get("down", 0) + arrays.count_bytes() * len(keys)

    def receive_discriminators(self, grid: Grid, report: RoundReport | None = None) -> None:
        """Pull whatever D_k has come back and turn each usable one into odds on U; after
        the stage (no `report`), those that join are reported to the observers."""
        late = report is None
        report = report or RoundReport(0, {}, [], {}, None, None, {})
        for reply in grid.pull_messages(list(self.pending)):
            node, key = self.pending.pop(reply.metadata.reply_to_message_id, (None, None))
            if node is None:
                continue
            report.bytes["up"] = report.bytes.get("up", 0) + payload_bytes([reply])
            why = (f"failed: {reply.error.reason}" if reply.has_error()
                   else "the odds screen is on: it weighs every D_k of the stage at once"
                   if late and self.odds_screen is not None
                   else self.discriminator_problem(reply))
            if why:
                log(WARNING, "discriminator of client %s (node %d) left out: %s", key, node, why)
                report.left_out[key] = why
                report.details.setdefault("failed" if reply.has_error() else "rejected",
                                          {})[key] = why
                continue
            start = time.perf_counter()
            self.log_odds[key] = self.odds_on_u(key, reply)
            report.seconds["odds"] = report.seconds.get("odds", 0.0) + time.perf_counter() - start
            report.details.setdefault("discriminators", {})[key] = dict(
                reply.content.metric_records["metrics"])
            log(INFO, "discriminator of client %s in: %d of %d", key,
                len(self.log_odds), len(self.asked))
        if late and report.details.get("discriminators"):
            report.details["joined_late"] = sorted(report.details["discriminators"])
            self.notify(report)

    def discriminator_problem(self, reply: Message) -> str | None:
        content = reply.content
        metrics = content.metric_records.get("metrics")
        why = (state_problem(content.array_records.get("discriminator"),
                             self.discriminator_template)
               or examples_problem(metrics, "num-examples"))
        return why or (self.calibration.problem(metrics) if self.calibration else None)

    def odds_on_u(self, key, reply: Message) -> torch.Tensor:
        """log Phi_k on every view of U, [V, |U|] (D_k kept for other distillation sets)."""
        metrics = reply.content.metric_records["metrics"]
        calibration = self.calibration.of(metrics) if self.calibration else None
        d = self.discriminators.keep(key, reply.content.array_records[
            "discriminator"].to_torch_state_dict(), calibration)
        return self.odds_on(d, calibration, self.u)

    def odds_on(self, d: nn.Module, calibration, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([log_odds(d, x, device=self.device, flip=v == 1,
                                     calibration=calibration) for v in range(self.views)])

    def odds(self, key, u: torch.Tensor) -> torch.Tensor:
        """log Phi_k on every view of the distillation set u: cached on U, computed once a
        round on a set of `distillation_sets`."""
        if u is self.u:
            return self.log_odds[key]
        if self.round_odds[0] is not u:
            self.round_odds = (u, {})
        cached = self.round_odds[1]
        if key not in cached:
            start = time.perf_counter()
            cached[key] = self.odds_on(*self.discriminators[key], u)
            self.odds_seconds += time.perf_counter() - start
        return cached[key]

    # --- main FL
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid):
        """FedAvg's, after taking in late discriminators and sending G to new nodes."""
        self.take_latecomers(grid)
        return super().configure_train(server_round, arrays, config, grid)

    def take_latecomers(self, grid: Grid) -> None:
        """Late D_k join the odds; a client seen first now is sent G (not with the odds
        screen, nor in a `start` that had no pre-FL stage: nothing to send)."""
        self.receive_discriminators(grid)
        if self.stage is not None and self.odds_screen is None:
            self.send_generator(grid, self.client_keys.keys(grid, grid.get_node_ids()))

    def teachers(self, models: list[ClientModel]) -> list[ClientModel]:
        return [m for m in models if m.key in self.log_odds]

    def server_update(self, server_round, averaged, models, report):
        self.odds_seconds, self.dropped = 0.0, []
        arrays, info = super().server_update(server_round, averaged, models, report)
        if self.odds_seconds:  # a set of `distillation_sets` scored by the D_k
            report.seconds["odds"] = self.odds_seconds
        if self.dropped:  # teachers_per_image's weight left out, mean over images
            info["dropped-weight"] = torch.cat(self.dropped).mean().item()
        return arrays, {**info, "discriminators": len(self.log_odds)}

    def scores(self, teachers, nets, u, samples, view):
        log_odds = torch.stack([self.odds(m.key, u)[view, samples] for m in teachers])
        if not 0 < self.teachers_per_image < len(teachers):
            return super().scores(teachers, nets, u, samples, view)[0], log_odds
        n_k = torch.tensor([float(m.num_examples) for m in teachers])
        logits, log_odds, dropped = top_teacher_logits(
            nets, u[samples], log_odds, n_k, self.teachers_per_image, device=self.device,
            flip=view == 1, amp=self.device.type == "cuda")
        self.dropped.append(dropped)
        return logits, log_odds


# ---------------------------------------------------------------------------- client side
def discriminator_update(message: Message, data, *, device: str | torch.device = "cpu",
                         seed: int | None = None,
                         discriminator_fn: Callable[[], nn.Module] | None = None,
                         generator_fn: Callable[[], nn.Module] | None = None) -> Message:
    """Algorithm 3 on a client: D_k trained to tell its images (`data`: a tensor, Dataset or
    DataLoader, see fedgo_flwr.inputs) from samples of the received G (or, where the message
    carries ArrayRecord "server-sample" instead, from those images of the server: not in the
    paper). `seed` seeds D_k and its batches (default: the message's seed and this node's id).
    `discriminator_fn` and `generator_fn` build the server's own D_k and G, where it has
    its own (FedGO's `discriminator_fn`, its `generator`'s maker). The reply holds
    ArrayRecord "discriminator" and MetricRecord "metrics" (num-examples, discriminator-loss,
    -train-acc (its last pass's) and -seconds; with calibration odds-scale, odds-shift)."""
    conf, device = message.content.config_records["config"], torch.device(device)
    x = images_of(data)
    negatives = received_negatives(message, tuple(x.shape[1:]), bool(conf["flip"]), device,
                                   generator_fn)
    if seed is None:
        seed = message_seed(message)
    train, held_out = hold_out(x, float(conf["calibration-fraction"]), seed)
    torch.manual_seed(seed)
    discriminator = received_discriminator(conf, tuple(x.shape[1:]), discriminator_fn)
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
