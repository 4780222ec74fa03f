"""FedGO (Algorithm 2): a pre-FL stage that gives every client the generator G once and gets
back its discriminator D_k (Algorithm 3, the client handler `train.discriminator` below), then
FedAvg rounds each followed by ensemble distillation on U with the odds weights
w_k(u) = n_k Phi_k(u) / sum_i n_i Phi_i(u)."""

from __future__ import annotations

import time
from logging import INFO, WARNING

import torch
from flwr.app import ArrayRecord, Message, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedgo_flwr.client_context import Local, config_of, reply
from fedgo_flwr.diagnostics import phi_stats
from fedgo_flwr.gan import log_odds, train_discriminator, train_wgan_gp
from fedgo_flwr.generator_cache import generator_description, load_generator, save_generator
from fedgo_flwr.models import Critic, Discriminator, Generator
from fedgo_flwr.seeds import client_seed
from fedgo_flwr.server.clients import config_record
from fedgo_flwr.server.record import RunRecord
from fedgo_flwr.server.replies import payload_bytes
from fedgo_flwr.strategies.base import CLIENT, ClientModel, ServerSetup
from fedgo_flwr.strategies.ensemble import MARKS, READS, EnsembleDistillation
from fedgo_flwr.strategies.registry import StrategySpec
from fedgo_flwr.weighting import NEEDS_LABEL_COUNTS, WeightRule, weighting_rule

TRAIN_DISCRIMINATOR = "train.discriminator"


def new_generator(cfg, image_shape) -> Generator:
    c, h, _ = image_shape
    return Generator(cfg.latent_dim, c, h, cfg.generator_width)


def new_discriminator(cfg, image_shape) -> Discriminator:
    c, h, _ = image_shape
    return Discriminator(c, h, cfg.discriminator_width)


class FedGO(EnsembleDistillation):
    has_discriminators = True
    carried = ("row", "cached_u_log_odds", "cached_test_log_odds")  # D_k enter once, as odds

    def __init__(self, setup: ServerSetup, record: RunRecord):
        cfg = setup.cfg
        self.needs_label_counts = cfg.weighting in NEEDS_LABEL_COUNTS
        super().__init__(setup, record, None if self.needs_label_counts else
                         weighting_rule(cfg.weighting, cfg.entropy_tau, cfg.odds_beta))
        self.row: dict[int, int] = {}  # partition id -> row of the cached odds
        self.cached_u_log_odds = torch.empty(0)  # [K, V, |U|]
        self.cached_test_log_odds = torch.empty(0)  # [K, |test|]

    # ------------------------------------------------------------------ pre-FL stage
    def prepare(self, grid: Grid) -> None:
        super().prepare(grid)
        generator = self.obtain_generator()
        discriminators = self.collect_discriminators(grid, generator)
        self.cache_odds(discriminators)

    def obtain_generator(self) -> Generator:
        """(G1): WGAN-GP on the server's unlabeled data; 0 steps = randomly initialised G.
        A generator trained before on the same U with the same settings and seed is reused
        from <results-dir>/generators (`generator-cache`)."""
        cfg, u, dev = self.cfg, self.setup.u, self.setup.device
        torch.manual_seed(cfg.seed)
        generator = new_generator(cfg, self.setup.image_shape)
        cache = cfg.generator_cache and cfg.generator_steps > 0
        description = generator_description(cfg, u, dev)
        root = cfg.results_path / "generators"
        info = load_generator(root, description, generator) if cache else None
        if info is not None:
            log(INFO, "pre-FL: reusing the generator trained for %d steps (%s)",
                cfg.generator_steps, root)
            self.record.data["pre_fl"]["generator"] = {**info, "reused": True}
            return generator.cpu().eval()
        c, h, _ = self.setup.image_shape
        every = max(1, cfg.generator_steps // 10)

        def progress(step: int, w_dist: float, g_loss: float) -> None:
            if step % every == 0 or step == cfg.generator_steps:
                log(INFO, "pre-FL: generator step %d/%d | Wasserstein estimate %.3f",
                    step, cfg.generator_steps, w_dist)

        info = train_wgan_gp(generator, Critic(c, h, cfg.generator_width), u,
                             steps=cfg.generator_steps, critic_steps=cfg.critic_steps,
                             gp_weight=cfg.gp_weight, lr=cfg.gan_lr, batch_size=cfg.gan_batch_size,
                             flip=cfg.flip, seed=cfg.seed, device=dev, progress=progress)
        self.record.time("generator_training", info.pop("seconds"))
        if cache:
            save_generator(root, description, generator, info)
        self.record.data["pre_fl"]["generator"] = {**info, "reused": False}
        return generator.cpu().eval()

    def collect_discriminators(self, grid: Grid, generator: Generator) -> dict[int, Discriminator]:
        """Send G to every client once; each returns D_k trained by Algorithm 3."""
        cfg = self.cfg
        arrays = ArrayRecord(generator.state_dict())
        config = config_record(discriminator_epochs=cfg.discriminator_epochs,
                               discriminator_lr=cfg.discriminator_lr,
                               batch_size=cfg.gan_batch_size, flip=cfg.flip, seed=cfg.seed,
                               latent_dim=cfg.latent_dim, generator_width=cfg.generator_width,
                               discriminator_width=cfg.discriminator_width)
        content = RecordDict({"generator": arrays, "config": config})
        expected = {c.node_id: p for p, c in self.clients.by_partition.items()}
        log(INFO, "pre-FL: sending G to %d clients for %d discriminator epoch(s)",
            len(expected), cfg.discriminator_epochs)
        self.record.sent("pre_fl", "down", arrays.count_bytes() * len(expected))
        start = time.perf_counter()
        replies = self.exchange(
            [Message(content, dst_node_id=n, message_type=TRAIN_DISCRIMINATOR) for n in expected],
            expected, "pre-FL: discriminator", server_round=0)
        self.record.time("discriminator_training", time.perf_counter() - start)
        self.record.sent("pre_fl", "up", payload_bytes(replies))
        template = new_discriminator(cfg, self.setup.image_shape).state_dict()
        received, tally = self.collect(replies, "discriminator", template, expected)
        self.record.data["pre_fl"]["replies"] = tally
        if not received:
            raise RuntimeError("pre-FL: no client returned a usable discriminator")
        left_out = sorted(set(self.clients.partition_ids) - {m.partition_id for m in received})
        if left_out and cfg.require_all_clients:
            raise RuntimeError(f"pre-FL: partitions {left_out} sent no usable discriminator "
                               "(require-all-clients = true)")
        if left_out:
            log(WARNING, "pre-FL: partitions %s sent no usable discriminator: they still train, "
                "and are left out of the odds-weighted ensemble", left_out)
        self.record.data["pre_fl"]["discriminator_loss"] = {
            str(m.partition_id): m.metrics.get("discriminator-loss") for m in received}
        discriminators = {}
        for m in received:
            d = new_discriminator(cfg, self.setup.image_shape)
            d.load_state_dict(m.state)
            discriminators[m.partition_id] = d
        return discriminators

    def cache_odds(self, discriminators: dict[int, Discriminator]) -> None:
        """log Phi_k on every view of U and on the test split, once: D_k never changes."""
        start = time.perf_counter()
        dev, u = self.setup.device, self.setup.u
        self.row = {p: i for i, p in enumerate(sorted(discriminators))}
        on_u, on_test = [], []
        for p in self.row:
            on_u.append(torch.stack([log_odds(discriminators[p], u, device=dev, flip=v == 1)
                                     for v in range(self.views)]))
            on_test.append(log_odds(discriminators[p], self.setup.test_x, device=dev))
            log(INFO, "pre-FL: odds of partition %d on U and the test split (%d/%d)", p,
                len(on_u), len(self.row))
        self.cached_u_log_odds = torch.stack(on_u)
        self.cached_test_log_odds = torch.stack(on_test)
        self.record.time("odds", time.perf_counter() - start)
        stats = phi_stats(self.cached_u_log_odds)
        self.record.data["pre_fl"]["phi_on_u"] = stats
        log(INFO, "pre-FL: odds on U cached for %d clients (Phi in [%.3f, %.3f], mean %.3f, "
            "%.0f%% within 1%% of the cap e)", len(self.row), stats["min"], stats["max"],
            stats["mean"], 100 * stats["share_near_cap"])

    # ------------------------------------------------------------------ main FL
    def teachers(self, models: list[ClientModel]) -> list[ClientModel]:
        return [m for m in models if m.partition_id in self.row]

    def round_weighting(self, models: list[ClientModel]) -> WeightRule:
        if not self.needs_label_counts:
            return self.weighting
        counts = self.clients.label_histograms([m.partition_id for m in models])
        if counts is None:
            raise RuntimeError(f"weighting {self.cfg.weighting!r} needs every client's label "
                               "counts; a client of this round sent none")
        return weighting_rule(self.cfg.weighting, histograms=counts)

    def u_log_odds(self, models: list[ClientModel], view: int) -> torch.Tensor:
        return self.cached_u_log_odds[[self.row[m.partition_id] for m in models], view]

    def test_log_odds(self, models: list[ClientModel]) -> torch.Tensor:
        return self.cached_test_log_odds[[self.row[m.partition_id] for m in models]]


# ---------------------------------------------------------------------------- client side
def discriminator_update(message: Message, local: Local) -> Message:
    """Algorithm 3: D_k trained to tell S_k from samples of the server's generator G."""
    conf = config_of(message)
    c, h, _ = local.image_shape
    generator = Generator(int(conf["latent-dim"]), c, h, int(conf["generator-width"]))
    generator.load_state_dict(message.content.array_records["generator"].to_torch_state_dict())
    seed = client_seed(int(conf["seed"]), local.partition_id)
    torch.manual_seed(seed)  # D_k's initialisation
    discriminator = Discriminator(c, h, int(conf["discriminator-width"]))
    result = train_discriminator(discriminator, generator, local.x,
                                 epochs=int(conf["discriminator-epochs"]),
                                 lr=float(conf["discriminator-lr"]),
                                 batch_size=int(conf["batch-size"]), flip=bool(conf["flip"]),
                                 seed=seed, device=local.device)
    return reply(message, {"num-examples": len(local.x), **result},
                 discriminator=ArrayRecord(discriminator.cpu().state_dict()))


FEDGO = StrategySpec("fedgo", FedGO, {**CLIENT, TRAIN_DISCRIMINATOR: discriminator_update},
                     reads=(*READS, "weighting", "generator", "pre-fl"),
                     marks=(("weighting", "odds", "{}"), ("odds-beta", 1.0, "beta={:g}"), *MARKS))
