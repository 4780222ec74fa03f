"""FedGO (Algorithm 2): a pre-FL stage that gives every client the generator G once and gets
back its discriminator D_k (Algorithm 3, the client handler `train.discriminator` below), then
FedAvg rounds each followed by ensemble distillation on U with the odds weights
w_k(u) = n_k Phi_k(u) / sum_i n_i Phi_i(u).

A partition first seen after the pre-FL stage is asked for its D_k when it joins, and a D_k
that comes after the stage's wait joins the odds when it comes.

Beyond the paper, behind keys whose defaults are the paper's: a sample of U instead of G as
the discriminators' negatives (`discriminator-negatives`), and Platt-calibrated odds without
the cap e (`discriminator-calibration`)."""

from __future__ import annotations

import math
import time
from logging import INFO, WARNING

import torch
from flwr.app import ArrayRecord, Message, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedgo_app.client_context import Local, config_of
from fedgo_flwr.defences import screen_odds
from fedgo_flwr.diagnostics import phi_stats
from fedgo_flwr.gan import log_odds
from fedgo_flwr.models import Discriminator, generator_fits
from fedgo_flwr.seeds import client_seed
from fedgo_app.server.clients import config_record
from fedgo_app.server.record import RunRecord
from fedgo_flwr.replies import payload_bytes
from fedgo_app.strategies.base import ServerSetup
from fedgo_app.strategies.ensemble import ENSEMBLE_CLIENT, MARKS, READS, EnsembleDistillation
from fedgo_app.strategies.registry import StrategySpec
from fedgo_flwr.strategies.base import ClientModel as LibraryModel
from fedgo_flwr.strategies.fedgo import SERVER_SAMPLE, TRAIN_DISCRIMINATOR
from fedgo_flwr.strategies.fedgo import discriminator_update as discriminator_update_on
from fedgo_flwr.weighting import NEEDS_LABEL_COUNTS, WeightRule, weighting_rule

Calibration = tuple[float, float]  # Platt's (a, b): log Phi_k = a * logit + b


def server_sample(u: torch.Tensor, size: int, seed: int) -> torch.Tensor:
    """The seeded sample of U sent instead of G (discriminator-negatives = server-sample)."""
    order = torch.randperm(len(u), generator=torch.Generator().manual_seed(seed))
    return u[order[:size]].clone()


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
        # D_k, kept only to score a distillation set redrawn every round
        self.discriminators: dict[int, tuple[Discriminator, Calibration | None]] = {}
        self.cached_u_log_odds = torch.empty(0)  # [K, V, |U|]
        self.cached_test_log_odds = torch.empty(0)  # [K, |test|]
        self.calibrated = cfg.calibrated_odds
        self.request: RecordDict | None = None  # what the pre-FL stage sent (G and config)
        self.asked: set[int] = set()  # partitions that were sent it
        if cfg.discriminator_negatives == "generator" and cfg.generator_source == "train-on-u":
            generator_fits(setup.image_shape[1], cfg.dataset)

    # ------------------------------------------------------------------ pre-FL stage
    def prepare(self, grid: Grid) -> None:
        super().prepare(grid)
        discriminators = self.collect_discriminators(grid, self.negatives())
        self.cache_odds(discriminators)
        if self.cfg.discriminator_screen == "odds":
            discriminators = self.screen(discriminators)
        if self.cfg.redraw_distill_set:
            self.discriminators = discriminators

    def negatives(self) -> tuple[str, ArrayRecord]:
        """What the discriminators learn against: G (the paper), or a seeded sample of U."""
        cfg, u = self.cfg, self.setup.u
        if cfg.discriminator_negatives == "server-sample":
            sample = server_sample(u, cfg.server_sample_size, cfg.seed)
            self.record.data["pre_fl"]["server_sample"] = len(sample)
            log(INFO, "pre-FL: %d images of U stand in for G", len(sample))
            return SERVER_SAMPLE, ArrayRecord({"images": sample})
        return "generator", ArrayRecord(self.generator().state_dict())

    def collect_discriminators(self, grid: Grid, negatives: tuple[str, ArrayRecord]
                               ) -> dict[int, tuple[Discriminator, Calibration | None]]:
        """Send the negatives (G) to every client once; each returns D_k trained by
        Algorithm 3 (and its calibration)."""
        cfg = self.cfg
        kind, arrays = negatives
        # G's own shape: a loaded generator need not have the run's latent-dim and width
        g = self.generator() if kind == "generator" else None
        config = config_record(discriminator_epochs=cfg.discriminator_epochs,
                               discriminator_lr=cfg.discriminator_lr,
                               batch_size=cfg.gan_batch_size, flip=cfg.flip, seed=cfg.seed,
                               latent_dim=g.latent_dim if g else cfg.latent_dim,
                               generator_width=g.dim if g else cfg.generator_width,
                               discriminator_width=cfg.discriminator_width,
                               calibration_fraction=cfg.calibration_fraction
                               if self.calibrated else 0.0)
        content = self.request = RecordDict({kind: arrays, "config": config})
        expected = {c.node_id: p for p, c in self.clients.by_partition.items()}
        self.asked.update(expected.values())
        log(INFO, "pre-FL: sending the %s to %d clients for %d discriminator epoch(s)",
            kind, len(expected), cfg.discriminator_epochs)
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
        self.record.client_seconds("discriminators", sum(
            float(m.metrics.get("discriminator-seconds", 0.0)) for m in received))
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
            discriminators[m.partition_id] = (d, calibration_of(m.metrics) if self.calibrated
                                              else None)
        if self.calibrated:
            self.record.data["pre_fl"]["calibration"] = {
                str(p): list(cal) for p, (_, cal) in discriminators.items()}
        return discriminators

    def why_left_out(self, reply: Message, array_key: str, template: dict[str, torch.Tensor],
                     extras: dict[str, dict[str, torch.Tensor]] | None = None) -> str | None:
        why = super().why_left_out(reply, array_key, template, extras)
        if why or array_key != "discriminator" or not self.calibrated:
            return why
        metrics = reply.content.metric_records["metrics"]
        a, b = metrics.get("odds-scale"), metrics.get("odds-shift")
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (a, b)) or a <= 0:
            return (f"calibration (odds-scale, odds-shift) is ({a}, {b}); expected finite "
                    "numbers with odds-scale > 0")
        return None

    def cache_odds(self, discriminators: dict[int, tuple[Discriminator, Calibration | None]]
                   ) -> None:
        """log Phi_k on every view of the distillation set (U, or the set drawn from G) and
        on the test split, once: D_k never changes."""
        start = time.perf_counter()
        self.row = {p: i for i, p in enumerate(sorted(discriminators))}
        self.cached_u_log_odds = self.odds_on(self.u, discriminators, self.views, "U")
        self.cached_test_log_odds = self.odds_on(self.setup.test_x, discriminators, 1,
                                                 "the test split")[:, 0]
        self.record.time("odds", time.perf_counter() - start)
        stats = phi_stats(self.cached_u_log_odds)
        self.record.data["pre_fl"]["phi_on_u"] = stats
        cap = ("calibrated, no cap" if self.calibrated
               else f"{100 * stats['share_near_cap']:.0f}% within 1% of the cap e")
        log(INFO, "pre-FL: odds on U cached for %d clients (Phi in [%.3g, %.3g], mean %.3g, "
            "%s)", len(self.row), stats["min"], stats["max"], stats["mean"], cap)

    def screen(self, discriminators: dict) -> dict:
        """discriminator-screen (fedgo_flwr/defences.py): D_k whose odds on U are saturated,
        constant or far from the rest leave the odds; their clients train on."""
        flagged = screen_odds(self.cached_u_log_odds[:, 0], not self.calibrated,
                              self.cfg.discriminator_screen_z)
        by_row = {row: p for p, row in self.row.items()}
        reasons = {by_row[row]: why for row, why in flagged.items()}
        self.record.data["pre_fl"]["screened"] = {str(p): why for p, why in reasons.items()}
        for p, why in sorted(reasons.items()):
            log(WARNING, "pre-FL: the discriminator of partition %d leaves the odds: %s", p, why)
        kept = [row for row in sorted(by_row) if row not in flagged]
        if not kept:
            raise RuntimeError("pre-FL: the screen left no discriminator: "
                               f"{self.record.data['pre_fl']['screened']}")
        self.cached_u_log_odds = self.cached_u_log_odds[kept]
        self.cached_test_log_odds = self.cached_test_log_odds[kept]
        self.row = {by_row[row]: i for i, row in enumerate(kept)}
        return {p: d for p, d in discriminators.items() if p in self.row}

    def late_reply(self, pid: int, late_round: int, reply: Message) -> bool:
        """A discriminator that came after the pre-FL stage's wait joins the odds now (not
        under the odds screen, which weighs every discriminator against the others at once)."""
        if late_round != 0 or "discriminator" not in reply.content.array_records:
            return False
        template = new_discriminator(self.cfg, self.setup.image_shape).state_dict()
        why = ("its partition has one already" if pid in self.row
               else "the odds screen is on: it needs every discriminator in the pre-FL stage"
               if self.cfg.discriminator_screen != "none"
               else self.why_left_out(reply, "discriminator", template))
        if why:
            log(WARNING, "late discriminator of partition %d left out: %s", pid, why)
            return False
        d = new_discriminator(self.cfg, self.setup.image_shape)
        d.load_state_dict(reply.content.array_records["discriminator"].to_torch_state_dict())
        metrics = reply.content.metric_records["metrics"]
        joined = {pid: (d.eval(), calibration_of(metrics) if self.calibrated else None)}
        self.row[pid] = len(self.row)
        start = time.perf_counter()
        u = self.odds_on(self.u, joined, self.views, "U", "late", rows=[pid])
        test = self.odds_on(self.setup.test_x, joined, 1, "the test split", "late", rows=[pid])
        self.cached_u_log_odds = torch.cat([self.cached_u_log_odds, u])
        self.cached_test_log_odds = torch.cat([self.cached_test_log_odds, test[:, 0]])
        self.record.time("odds", time.perf_counter() - start)
        self.record.data["pre_fl"].setdefault("joined_late", []).append(pid)
        if self.cfg.redraw_distill_set:
            self.discriminators.update(joined)
        return True

    def odds_on(self, x: torch.Tensor, discriminators: dict, views: int, name: str,
                stage: str = "pre-FL", rows: list[int] | None = None) -> torch.Tensor:
        """log Phi_k on each view of images x, [K, views, N], of the partitions `rows`
        (default: all, in self.row's order)."""
        pids, rows = rows or list(self.row), []
        for p in pids:
            d, cal = discriminators[p]
            rows.append(torch.stack([log_odds(d, x, device=self.setup.device, flip=v == 1,
                                              calibration=cal) for v in range(views)]))
            log(INFO, "%s: odds of partition %d on %s (%d/%d)", stage, p, name, len(rows),
                len(pids))
        return torch.stack(rows)

    def distillation_set_changed(self, server_round: int) -> None:
        start = time.perf_counter()
        self.cached_u_log_odds = self.odds_on(self.u, self.discriminators, self.views,
                                              "the redrawn distillation set",
                                              f"round {server_round}")
        self.record.time("odds", time.perf_counter() - start, server_round)

    # With a redrawn set D_k go into the checkpoints too: a resumed run scores its new sets.
    def state_dict(self) -> dict:
        state = super().state_dict()
        if self.discriminators:
            state["discriminators"] = {p: (d.state_dict(), cal)
                                       for p, (d, cal) in self.discriminators.items()}
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        for p, (weights, cal) in state.get("discriminators", {}).items():
            d = new_discriminator(self.cfg, self.setup.image_shape)
            d.load_state_dict(weights)
            self.discriminators[p] = (d.eval(), cal)

    # ------------------------------------------------------------------ main FL
    def configure_train(self, server_round, arrays, config, grid):
        messages = super().configure_train(server_round, arrays, config, grid)
        self.ask_newcomers(self.current_round)
        return messages

    def ask_newcomers(self, server_round: int) -> None:
        """A partition first seen after the pre-FL stage is sent what the stage sent (G)
        now, without waiting: its D_k joins the odds when it comes (`late_reply`). A resumed
        run, or one with the odds screen, asks none."""
        new = [p for p in self.clients.partition_ids if p not in self.asked]
        if not new or self.request is None or self.cfg.discriminator_screen != "none":
            return
        self.asked.update(new)
        expected = {self.clients.by_partition[p].node_id: p for p in new}
        log(INFO, "round %d: partitions %s joined after the pre-FL stage: asking for their "
            "discriminators", server_round, new)
        self.record.sent("pre_fl", "down", payload_bytes([self.request]) * len(new))
        replies = self.mailbox.send_and_receive(
            [Message(self.request, dst_node_id=n, message_type=TRAIN_DISCRIMINATOR)
             for n in expected], timeout=0.0, server_round=0)
        for reply in replies:  # those that answered at once; the others come as late replies
            pid = expected.get(self.mailbox.node_of(reply))
            if pid is not None and not reply.has_error():
                self.late_reply(pid, 0, reply)

    # ------------------------------------------------------------------ the library's hooks
    def teachers(self, models: list[LibraryModel]) -> list[LibraryModel]:
        return [m for m in models if m.key in self.row]

    def round_weighting(self, teachers: list[LibraryModel]) -> WeightRule:
        if not self.needs_label_counts:
            return self.weighting
        counts = self.clients.label_histograms([m.key for m in teachers])
        if counts is None:
            raise RuntimeError(f"weighting {self.cfg.weighting!r} needs every client's label "
                               "counts; a client of this round sent none")
        return weighting_rule(self.cfg.weighting, histograms=counts)

    def u_log_odds(self, keys: list[int], view: int) -> torch.Tensor:
        return self.cached_u_log_odds[[self.row[k] for k in keys], view]

    def test_log_odds(self, keys: list[int]) -> torch.Tensor:
        return self.cached_test_log_odds[[self.row[k] for k in keys]]


# ---------------------------------------------------------------------------- client side
def calibration_of(metrics) -> Calibration:
    """(a, b) of a calibrated D_k, from its reply's metrics."""
    return float(metrics["odds-scale"]), float(metrics["odds-shift"])


def discriminator_update(message: Message, local: Local) -> Message:
    """Algorithm 3 on S_k (fedgo_flwr's client step), seeded by the partition id."""
    seed = client_seed(int(config_of(message)["seed"]), local.partition_id)
    return discriminator_update_on(message, local.x, device=local.device, seed=seed)


def new_local_discriminator(seed: int, image_shape, width: int) -> Discriminator:
    """D_k as client k initialises it (from its client seed)."""
    torch.manual_seed(seed)
    c, h, _ = image_shape
    return Discriminator(c, h, width)


FEDGO = StrategySpec("fedgo", FedGO, {**ENSEMBLE_CLIENT, TRAIN_DISCRIMINATOR: discriminator_update},
                     reads=(*READS, "weighting", "generator", "pre-fl"),
                     marks=(("weighting", "odds", "{}"), ("odds-beta", 1.0, "beta={:g}"),
                            ("discriminator-negatives", "generator", "D vs {}"),
                            ("discriminator-calibration", "none", "{}"),
                            ("discriminator-screen", "none", "{} screen"), *MARKS))
