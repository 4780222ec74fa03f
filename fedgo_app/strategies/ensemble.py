"""The server update every ensemble-distillation strategy shares (Algorithm 1, lines 8-13):
pseudo-label U once with a weighted ensemble of this round's client models, distill the
averaged model on it for E_s passes (Adam, `server-lr`, `server-batch-size`, the learning rate
cosine-annealed over the T rounds or constant), and evaluate the ensemble on the test split
(`ensemble-test`, which no algorithm reads).

Strategies differ only in the weighting rule and the discriminator log-odds it sees (FedDF:
uniform, no discriminators; FedGO: odds). `averaged-share` > 0 (not in the papers) makes the
round's averaged model one more teacher with that share of the weight; `distillation-guard =
clients` (not in the papers either) keeps the averaged model where clients that did not train
score it above the distilled one (`labelled-val`: the server's own labelled images score it);
`teacher-floor` keeps the averaged model's own label where it
is surer than the ensemble, `confidence-threshold` distils only on sure pseudo-labels,
`distill-budget = disagreement` takes the share of the steps that is the averaged model's
disagreement with the pseudo-labels, and `past-teachers` makes the last global models more
teachers (none in the papers; the diagnostics score or measure each on the run's own models
every round). FedDF's published update (step budget, clipping, early stopping on labelled
data) overrides `distill_batches` and `distill_student` behind `feddf-published`.
"""

from __future__ import annotations

import hashlib
import math
import time
from logging import INFO, WARNING

import torch
from flwr.app import ArrayRecord, Message, RecordDict
from flwr.common.logger import log

from fedgo_flwr.diagnostics import (PAST_TEACHERS, ensemble_diagnostics, lasting_diagnostics,
                                     per_class_diagnostics)
from fedgo_flwr.distill import (budgeted_pseudo_labels, confident_batches, cosine_lr,
                                disagreement, distill, draw_batches, ensemble_log_probs,
                                floored, view_pseudo_labels)
from fedgo_app.generators import generator_arguments, obtain_generator
from fedgo_flwr.gan import draw_images
from fedgo_flwr.models import Generator
from fedgo_flwr.seeds import round_seed
from fedgo_app.server.record import RunRecord
from fedgo_flwr.replies import payload_bytes
from fedgo_flwr.guard import kept as guard_choice
from fedgo_flwr.guard import scores_problem, weighted_accuracy
from fedgo_app.strategies.base import (CLIENT, EVALUATE_CANDIDATES, ClientModel,
                                        FedAvgStrategy, ServerSetup)
from fedgo_app.strategies.fedgan import TRAIN_FEDGAN, fedgan_generator, fedgan_update
from fedgo_flwr.teachers import PastTeachers, teacher_logits
from fedgo_flwr.train import accuracy_and_loss
from fedgo_flwr.weighting import WeightRule, past_member_shares, with_members


# What every ensemble strategy reads and how a results table marks its departures.
READS = ("distillation",)
MARKS = (("ensemble-space", "logits", "probabilities"), ("distill-schedule", "cosine", "{} lr"),
         ("averaged-share", 0.0, "averaged {:g}"), ("distillation-guard", "none", "{} guard"),
         ("generator-source", "train-on-u", "G: {}"), ("distill-set", "server-data", "{} set"),
         ("redraw-distill-set", False, "redrawn"), ("view-draw", "per-pass", "views {}"),
         ("teacher-floor", False, "server floor"), ("confidence-threshold", 0.0, "confident {:g}"),
         ("distill-budget", "full", "{} budget"), ("budget-probe", 0, "probe {}"),
         ("past-teachers", 0, "past {}"))

# Every ensemble strategy's clients: FedAvg's, and FedGAN's local step (a generator source).
ENSEMBLE_CLIENT = {**CLIENT, TRAIN_FEDGAN: fedgan_update}


class EnsembleDistillation(FedAvgStrategy):
    has_ensemble = True
    has_discriminators = False
    draws_distillation_set = True  # DaFKD draws its own from its own G every round

    def __init__(self, setup: ServerSetup, record: RunRecord, weighting: WeightRule | None):
        super().__init__(setup, record)
        self.weighting = weighting
        self.views = 2 if self.cfg.flip else 1  # U as is, and mirrored
        self.u = setup.u  # the distillation set (DaFKD generates a new one every round)
        self._generator: Generator | None = None
        self._grid = None  # the pre-FL stage's, for a generator the clients train (FedGAN)
        # theta_s of the last rounds (`past-teachers`, or the diagnostics')
        self.past = PastTeachers(self.cfg.past_teachers
                                 or (PAST_TEACHERS if self.cfg.diagnostics else 0))

    # --- the generator and the distillation set (FedGO's Table 2)
    def generator(self) -> Generator:
        """G from `generator-source`, obtained once per run (FedGAN's during the pre-FL
        stage, with the clients)."""
        if self._generator is None:
            self._generator = (fedgan_generator(self, self._grid)
                               if self.cfg.generator_source == "fedgan"
                               else obtain_generator(self.cfg, self.setup, self.record))
        return self._generator

    @property
    def generated_set(self) -> bool:
        return self.cfg.distill_set == "generated" and self.draws_distillation_set

    def prepare(self, grid) -> None:
        """The pre-FL stage: with `distill-set = generated` the distillation set,
        `distill-size` images drawn from G once (seeded)."""
        super().prepare(grid)
        self._grid = grid
        if self.generated_set:
            self.u = draw_images(self.generator(), self.cfg.distill_size, self.cfg.seed,
                                 self.setup.device)
            self.record.data["pre_fl"]["distillation_set"] = {
                "generated": len(self.u), "redrawn": self.cfg.redraw_distill_set,
                # equal digests: two runs distilled on the same images (FedGO and FedDF)
                "sha256": hashlib.sha256(self.u.numpy().tobytes()).hexdigest()}
            log(INFO, "pre-FL: distillation set of %d images drawn from G", len(self.u))

    def redraw_distillation_set(self, server_round: int) -> None:
        """`redraw-distill-set`: a new set from G for this round (seeded by the round)."""
        self.u = draw_images(self.generator(), self.cfg.distill_size,
                             round_seed(self.cfg.seed, server_round), self.setup.device)
        self.distillation_set_changed(server_round)

    def distillation_set_changed(self, server_round: int) -> None:
        """What a strategy recomputes on a new distillation set (FedGO: the odds on it)."""

    # A generated distillation set goes into the checkpoints: a resumed run skips the pre-FL
    # stage that drew it; with redraws, so does G (FedGAN's would need the clients again).
    def state_dict(self) -> dict:
        state = super().state_dict()
        if self.past.states:
            state["past_globals"] = self.past.states
        if self.generated_set:
            state["distillation_set"] = self.u
        if self.generated_set and self.cfg.redraw_distill_set:
            g = self.generator()
            state["distillation_generator"] = {
                "arguments": generator_arguments(g, self.setup.image_shape[0]),
                "state": g.state_dict()}
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.past.states = state.get("past_globals", [])
        if "distillation_set" in state:
            self.u = state["distillation_set"]
        if "distillation_generator" in state:
            saved = state["distillation_generator"]
            self._generator = Generator(**saved["arguments"])
            self._generator.load_state_dict(saved["state"])
            self._generator.eval()

    # --- what a strategy with discriminators provides
    def u_log_odds(self, models: list[ClientModel], view: int) -> torch.Tensor:
        """log Phi_k on view `view` of U, [K, |U|]; rules without discriminators ignore it."""
        return torch.zeros(len(models), len(self.u))

    def test_log_odds(self, models: list[ClientModel]) -> torch.Tensor:
        return torch.zeros(len(models), len(self.setup.test_y))

    def view_scores(self, models: list[ClientModel], nets: list[torch.nn.Module], view: int,
                    samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The teachers' logits [K, S, C] and log Phi_k [K, S] on these samples of view
        `view` of U."""
        logits = teacher_logits(nets, self.u[samples], device=self.setup.device,
                                flip=view == 1, amp=self.setup.amp)
        return logits, self.u_log_odds(models, view)[:, samples]

    def test_scores(self, models: list[ClientModel], nets: list[torch.nn.Module]
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The teachers' logits [K, N, C] and log Phi_k [K, N] on the test split."""
        logits = teacher_logits(nets, self.setup.test_x, device=self.setup.device,
                                amp=self.setup.amp)
        return logits, self.test_log_odds(models)

    def teachers(self, models: list[ClientModel]) -> list[ClientModel]:
        """The round's models the ensemble weights (FedGO: those with a discriminator)."""
        return models

    def round_weighting(self, models: list[ClientModel]) -> WeightRule:
        """The weighting rule of this round's teachers (a rule that reads the clients' label
        counts gets theirs bound here)."""
        return self.weighting

    def logits_of(self, nets: list[torch.nn.Module], x: torch.Tensor, flip: bool = False
                  ) -> torch.Tensor:
        """The server's own models' logits on images x, [M, N, C], as the teachers' are
        computed."""
        return teacher_logits(nets, x, device=self.setup.device, flip=flip, amp=self.setup.amp)

    def past_teachers(self, server_round: int) -> list[dict[str, torch.Tensor]]:
        """Keeps theta_s^{t-1}, the global model this round's clients started from (from
        round 1's on), and returns the `past-teachers` last ones."""
        if self.past.keep and server_round > 1:
            (sent,) = self.globals_of(self._sent_state).values()
            self.past.add(sent)
        return self.past.last(self.cfg.past_teachers)

    def past_logits(self, past: list[dict[str, torch.Tensor]], x: torch.Tensor,
                    samples: torch.Tensor | None = None, flip: bool = False) -> torch.Tensor:
        """The past global models' logits on images x[samples] (all: None), [P, S, C]
        (computed once an image and model)."""
        return self.past.logits(past, x, lambda s: self.setup.new_classifier(state=s),
                                samples=samples, device=self.setup.device, flip=flip,
                                amp=self.setup.amp)

    # --- the shared distillation protocol
    def server_lr(self, server_round: int) -> float:
        """The distillation learning rate of round t: cosine-annealed over the T rounds
        (the paper's main tables) or constant (its Table 11)."""
        cfg = self.cfg
        if cfg.distill_schedule == "constant":
            return cfg.server_lr
        return cosine_lr(cfg.server_lr, server_round, cfg.num_server_rounds)

    def distill_batches(self, server_round: int) -> list[torch.Tensor]:
        """This round's distillation minibatches: E_s shuffled passes over U."""
        return self.draw_round_batches(server_round, epochs=self.cfg.server_epochs,
                                       batch_size=self.cfg.server_batch_size)

    def draw_round_batches(self, server_round: int, *, epochs: int,
                           batch_size: int) -> list[torch.Tensor]:
        """`epochs` passes over U with random views (`view-draw`), seeded by the run's seed
        and the round."""
        return draw_batches(len(self.u), self.views, epochs=epochs, batch_size=batch_size,
                            seed=round_seed(self.cfg.seed, server_round),
                            view_draw=self.cfg.view_draw)

    def distill_student(self, server_round: int, student: torch.nn.Module,
                        targets: torch.Tensor, batches: list[torch.Tensor]) -> dict:
        """One Adam (or SGD) step per batch on KL(y~ || student); returns distill_loss,
        distill_steps, distill_lr and seconds."""
        lr = self.server_lr(server_round)
        info = distill(student, self.u, targets, batches=batches, lr=lr,
                       device=self.setup.device, amp=self.setup.amp,
                       optimizer=self.cfg.optimizer, momentum=self.cfg.momentum)
        return {**info, "distill_steps": len(batches), "distill_lr": lr}

    # --- the shared round
    def update_average(self, server_round: int, averaged: dict[str, torch.Tensor],
                       models: list[ClientModel]) -> dict[str, torch.Tensor]:
        (arch,) = self.architectures
        return self.update_architectures(server_round, {arch: averaged}, models)[arch]

    def mixed_problem(self) -> str | None:
        cfg = self.cfg
        unsupported = [key for key, on in (
            ("diagnostics", cfg.diagnostics), ("averaged-share", cfg.averaged_share > 0),
            ("past-teachers", cfg.past_teachers > 0), ("teacher-floor", cfg.teacher_floor),
            ("distill-budget", cfg.distill_budget != "full"),
            ("distillation-guard", cfg.distillation_guard != "none")) if on]
        if unsupported:
            return (f"{', '.join(unsupported)} need one averaged model; a mixed federation has "
                    "one per architecture: turn them off")
        return super().mixed_problem()

    def update_architectures(self, server_round: int, averaged: dict[str, dict],
                             models: list[ClientModel]) -> dict[str, dict]:
        """Pseudo-label the distillation set once with the ensemble of all the round's
        teachers (whatever their architecture) and distil each architecture's average on
        it; `averaged`: {architecture: its average} (one entry in a homogeneous run)."""
        if self.generated_set and self.cfg.redraw_distill_set and server_round > 1:
            self.redraw_distillation_set(server_round)  # round 1 uses the pre-FL stage's
        u, cfg = self.u, self.cfg
        entry = self.record.round(server_round)
        models = self.teachers(models)
        if not models:
            log(WARNING, "round %d: no client model can be weighted; the server keeps the "
                "average", server_round)
            return averaged
        nets = [self.setup.new_classifier(self.architecture(m.partition_id), m.state)
                for m in models]
        n_k = torch.tensor([m.num_examples for m in models], dtype=torch.float32)
        client_rule = self.round_weighting(models)
        mixed = self.heterogeneous  # no server-held teacher, diagnostics or guard
        past: list[dict[str, torch.Tensor]] = []
        if not mixed:
            (single,) = averaged.values()
            average = self.setup.new_classifier(state=single)
            past = self.past_teachers(server_round)
        # the teachers the server holds come after the clients': past global models, then
        # the averaged model (its share taken first)
        member = cfg.averaged_share > 0
        weighting = client_rule
        if past:
            weighting = with_members(weighting, past_member_shares(len(models), len(past)))
        if member:
            weighting = with_members(weighting, [cfg.averaged_share])
        students = {arch: self.setup.new_classifier(arch, state)
                    for arch, state in averaged.items()}
        batches = self.distill_batches(server_round)

        def view_scores(v: int, samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            logits, log_odds = self.view_scores(models, nets, v, samples)
            rows = [logits]
            if past:
                rows.append(self.past_logits(past, u, samples, flip=v == 1))
            if member or cfg.teacher_floor:  # last row(s): the teacher, then the floor
                own = self.logits_of([average], u[samples], flip=v == 1)
                rows += [own] * (member + cfg.teacher_floor)
            return torch.cat(rows), log_odds

        def label(batches: list[torch.Tensor], targets: torch.Tensor | None) -> torch.Tensor:
            return view_pseudo_labels(  # once per round, not once per epoch
                view_scores, len(u), n_k, weighting, batches, views=self.views,
                space=cfg.ensemble_space, floor=cfg.teacher_floor, targets=targets)

        def share_of(targets: torch.Tensor) -> float:
            return disagreement(average, u, targets, device=self.setup.device,
                                amp=self.setup.amp)

        if batches:
            start = time.perf_counter()
            if cfg.distill_budget == "disagreement":  # the share of its steps it takes
                targets, batches, entry["disagreement"] = budgeted_pseudo_labels(
                    label, share_of, batches, probe=cfg.budget_probe)
            else:
                targets = label(batches, None)
                if cfg.diagnostics and not mixed:  # the share the budget would take
                    entry["disagreement"] = share_of(targets)
            seconds = time.perf_counter() - start
            self.record.time("pseudo_labelling", seconds, server_round)
            if cfg.confidence_threshold > 0:
                met = sum(len(b) for b in batches)
                batches = confident_batches(batches, targets, cfg.confidence_threshold)
                entry["distill_kept"] = sum(len(b) for b in batches) / max(met, 1)
            log(INFO, "round %d: pseudo-labels of %d teachers on U (%.1fs); distilling, %d "
                "steps", server_round, len(models), seconds, len(batches))
            for arch, student in students.items():
                info = self.distill_student(server_round, student, targets, batches)
                self.record.time("distillation", info["seconds"], server_round)
                log(INFO, "round %d: distilled%s (%.1fs)", server_round,
                    f" {arch}" if mixed else "", info.pop("seconds"))
                if mixed:
                    entry.setdefault("distill_by_architecture", {})[arch] = info
                else:
                    entry.update(info)

        if cfg.ensemble_test or cfg.diagnostics:
            self.score_ensemble(server_round, models, nets, n_k, weighting, client_rule,
                                None if mixed else (single, average), past)
        distilled = {arch: {k: v.detach().cpu() for k, v in student.state_dict().items()}
                     for arch, student in students.items()}
        if cfg.distillation_guard != "none" and batches:
            (arch,) = distilled
            return {arch: self.guard(server_round, single, distilled[arch])}
        return distilled

    def score_ensemble(self, server_round: int, models: list[ClientModel],
                       nets: list[torch.nn.Module], n_k: torch.Tensor, weighting: WeightRule,
                       client_rule: WeightRule,
                       averaged: tuple[dict[str, torch.Tensor], torch.nn.Module] | None,
                       past: list[dict[str, torch.Tensor]]) -> None:
        """The weighted ensemble's test accuracy and loss (`ensemble-test`), and with
        `diagnostics` every rule on the same teachers; `averaged`: the round's averaged
        state and model (None in a mixed federation), `past`: its past global models."""
        cfg, entry = self.cfg, self.record.round(server_round)
        member = cfg.averaged_share > 0
        start = time.perf_counter()
        test_logits, log_odds = self.test_scores(models, nets)
        average_logits = (self.logits_of([averaged[1]], self.setup.test_x)
                          if member or cfg.teacher_floor or cfg.diagnostics else None)
        past_logits = self.past_logits(past, self.setup.test_x) if past else None
        teachers = torch.cat([test_logits] + [past_logits] * bool(past)
                             + [average_logits] * member)
        weights = weighting(teachers, log_odds, n_k)
        log_probs = ensemble_log_probs(teachers, weights, cfg.ensemble_space)
        if cfg.teacher_floor:
            log_probs = floored(log_probs, average_logits[0])
        acc, loss = accuracy_and_loss(log_probs, self.setup.test_y)
        entry.update(ensemble_test_acc=acc, ensemble_test_loss=loss)
        if cfg.diagnostics:
            active = (client_rule(test_logits, log_odds, n_k) if len(teachers) > len(nets)
                      else weights)
            histograms = self.clients.label_histograms([m.partition_id for m in models])
            entry["diagnostics"] = ensemble_diagnostics(
                test_logits, log_odds if self.has_discriminators else None, n_k,
                self.setup.test_y, entropy_tau=cfg.entropy_tau,
                active=active, histograms=histograms, averaged_logits=average_logits[0],
                capped=not cfg.calibrated_odds)
            # the options that keep a lead, each as it would act alone on these models
            if not past and self.past.states:  # the diagnostics' own past teachers
                past_logits = self.past_logits(self.past.states, self.setup.test_x)
            with_past = None
            if past_logits is not None:
                members = torch.cat([test_logits, past_logits])
                with_past = ensemble_log_probs(members, with_members(
                    lambda *_: active, past_member_shares(len(nets), len(past_logits)))(
                        members, log_odds, n_k), cfg.ensemble_space)
            own = ensemble_log_probs(test_logits, active, cfg.ensemble_space)
            entry["diagnostics"]["lasting"] = lasting_diagnostics(
                own, average_logits[0], self.setup.test_y, with_past)
            if histograms is not None:  # where the teacher falls behind, by class
                entry["diagnostics"]["per_class"] = per_class_diagnostics(
                    own, average_logits[0], self.setup.test_y, histograms, active)
            # what FedAvg keeps this round, where distillation started (`averaged` is unchanged)
            avg_acc, avg_loss = self.test_metrics(averaged[0])
            entry["diagnostics"]["averaged"] = {"acc": avg_acc, "loss": avg_loss}
        self.record.time("evaluation", time.perf_counter() - start, server_round)

    def guard(self, server_round: int, averaged: dict[str, torch.Tensor],
              distilled: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The distillation guard (not in the papers): the server keeps the distilled model
        only if it scores higher than the averaged one, scored by clients that did not train
        this round (`clients`) or on the server's labelled images (`labelled-val`); with no
        usable score it keeps the distilled model, as the papers do."""
        start = time.perf_counter()
        candidates = {"averaged": averaged, "distilled": distilled}
        if self.cfg.distillation_guard == "labelled-val":
            acc = {name: self.test_metrics(state, on=(self.setup.val_x, self.setup.val_y))[0]
                   for name, state in candidates.items()}
            entry = {"val_images": len(self.setup.val_y)}
            judges = f"{len(self.setup.val_y)} labelled server images"
        else:
            acc, entry = self.clients_score(server_round, candidates)
            judges = f"partitions {entry['scored']}"
        usable = not any(math.isnan(a) for a in acc.values())
        kept = guard_choice(acc)
        entry = self.record.round(server_round)["guard"] = {
            **entry, "averaged_acc": acc["averaged"], "distilled_acc": acc["distilled"],
            "kept": kept}
        if self.cfg.diagnostics:  # what the test split says of the same choice
            entry["test_acc"] = {name: self.test_metrics(state)[0]
                                 for name, state in candidates.items()}
        self.record.time("guard", time.perf_counter() - start, server_round)
        if not usable:
            log(WARNING, "round %d: no usable guard score; the distilled model is kept",
                server_round)
        log(INFO, "round %d: guard on %s: averaged %.4f, distilled %.4f -> keeps the %s model",
            server_round, judges, acc["averaged"], acc["distilled"], kept)
        return candidates[kept]

    def clients_score(self, server_round: int, candidates: dict[str, dict[str, torch.Tensor]]
                      ) -> tuple[dict[str, float], dict]:
        """`distillation-guard = clients`: as many clients as trained, drawn from those that
        did not train this round (none of this round's models saw their data), score the
        candidates on their own data; their n_k-weighted accuracies (NaN with no usable
        reply) and who was asked, who answered and who was rejected."""
        trained = set(self._sampled.values())
        pool = [p for p in self.clients.partition_ids if p not in trained | self.absent]
        if not pool:
            log(WARNING, "round %d: every client trained; the guard asks them instead",
                server_round)
            pool = sorted(trained)
        order = torch.randperm(len(pool), generator=torch.Generator().manual_seed(
            round_seed(self.cfg.seed, server_round)))
        pids = sorted(pool[i] for i in order[:len(trained)].tolist())
        expected = {self.clients.by_partition[p].node_id: p for p in pids}
        content = RecordDict({name: ArrayRecord(state) for name, state in candidates.items()})
        self.record.sent("guard", "down", payload_bytes([content]) * len(pids), server_round)
        replies = self.exchange(
            [Message(content, dst_node_id=n, message_type=EVALUATE_CANDIDATES) for n in expected],
            expected, f"round {server_round}: guard", server_round)
        scored, rejected = {}, {}
        for r in replies:
            pid = expected.get(self.mailbox.node_of(r))
            why = ("not asked" if pid is None else "duplicate reply" if pid in scored
                   else scores_problem(r, list(content)))
            if why:
                log(WARNING, "round %d: guard reply of partition %s rejected: %s",
                    server_round, pid, why)
                rejected[str(pid)] = why
                continue
            scored[pid] = dict(r.content.metric_records["metrics"])
        acc = weighted_accuracy(list(scored.values()), content)
        return acc, {"clients": pids, "scored": sorted(scored), "rejected": rejected}
