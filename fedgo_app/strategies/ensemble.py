"""The app's ensemble strategies on the library's server update (fedgo_flwr.strategies.
ensemble, shared by every ensemble strategy: Algorithm 1, lines 8-13): the run config becomes
its keywords (`distillation_keywords`), the round is recorded and diagnosed by an observer
(fedgo_app.strategies.ensemble_record), and the app adds only what is its own: the
distillation set drawn from a generator source (`distill-set = generated`, redrawn with
`redraw-distill-set`), the odds and scores keyed by partition id, and a mixed federation as a
wrapper (one labelling, each architecture's average distilled).

The options beyond the papers (`averaged-share`, `distillation-guard`, `teacher-floor`,
`confidence-threshold`, `distill-budget`, `budget-probe`, `past-teachers`) are the library's
keywords of the same names; the diagnostics score or measure each on the run's own models
every round. FedDF's published update (step budget, clipping, early stopping on labelled
data) overrides the library's `distill_batches` and `distill_student` behind
`feddf-published`.
"""

from __future__ import annotations

import hashlib
from logging import INFO

import torch
from flwr.app import ArrayRecord
from flwr.common.logger import log

from fedgo_app.generators import generator_arguments, obtain_generator
from fedgo_app.server.record import RunRecord
from fedgo_app.strategies.base import CLIENT, FedAvgStrategy, ServerSetup
from fedgo_app.strategies.ensemble_record import EnsembleRecord
from fedgo_app.fedgan import TRAIN_FEDGAN, fedgan_generator, fedgan_update
from fedgo_flwr.diagnostics import PAST_TEACHERS
from fedgo_flwr.gan import draw_images
from fedgo_flwr.guard import ClientsGuard, LabelledGuard
from fedgo_flwr.models import Generator
from fedgo_flwr.seeds import round_seed
from fedgo_flwr.strategies.base import ClientModel
from fedgo_flwr.strategies.ensemble import EnsembleDistillation as LibraryEnsemble
from fedgo_flwr.teachers import PastTeachers, teacher_logits
from fedgo_flwr.weighting import WeightRule


# What every ensemble strategy reads and how a results table marks its departures.
READS = ("distillation",)
MARKS = (("ensemble-space", "logits", "probabilities"), ("distill-schedule", "cosine", "{} lr"),
         ("averaged-share", 0.0, "averaged {:g}"), ("distillation-guard", "none", "{} guard"),
         ("guard-judges", 0, "{} judges"),
         ("generator-source", "train-on-u", "G: {}"), ("distill-set", "server-data", "{} set"),
         ("redraw-distill-set", False, "redrawn"), ("view-draw", "per-pass", "views {}"),
         ("teacher-floor", False, "server floor"), ("confidence-threshold", 0.0, "confident {:g}"),
         ("distill-budget", "full", "{} budget"), ("budget-probe", 0, "probe {}"),
         ("past-teachers", 0, "past {}"))

def distillation_keywords(setup: ServerSetup) -> dict:
    """The run config as the keywords of the library's EnsembleDistillation."""
    cfg = setup.cfg
    guard = {"none": None, "clients": ClientsGuard(judges=cfg.guard_judges or None),
             "labelled-val": LabelledGuard((setup.val_x, setup.val_y))
             if len(setup.val_y) else None}[cfg.distillation_guard]
    return dict(distill_epochs=cfg.server_epochs, distill_batch_size=cfg.server_batch_size,
                distill_lr=cfg.server_lr, distill_optimizer=cfg.optimizer,
                distill_momentum=cfg.momentum, distill_schedule=cfg.distill_schedule,
                schedule_rounds=cfg.num_server_rounds, ensemble_space=cfg.ensemble_space,
                flip_views=cfg.flip, view_draw=cfg.view_draw, teacher_floor=cfg.teacher_floor,
                confidence_threshold=cfg.confidence_threshold,
                distill_budget=cfg.distill_budget, budget_probe=cfg.budget_probe,
                past_teachers=cfg.past_teachers, averaged_share=cfg.averaged_share,
                guard=guard)


# Every ensemble strategy's clients: FedAvg's, and FedGAN's local step (a generator source).
ENSEMBLE_CLIENT = {**CLIENT, TRAIN_FEDGAN: fedgan_update}


class EnsembleApp(FedAvgStrategy, LibraryEnsemble):
    """The library's ensemble distillation (fedgo_flwr.strategies.ensemble) under the app's
    FedAvg: the run config as its keywords, the round recorded by an observer, a generated
    or redrawn distillation set and a mixed federation as hooks of the library's."""
    has_ensemble = True
    has_discriminators = False
    draws_distillation_set = True  # DaFKD draws its own from its own G every round

    def __init__(self, setup: ServerSetup, record: RunRecord, weighting: WeightRule | None,
                 **keywords):
        """`weighting`: w_k(u), or None for the library strategy's own (FedDF's uniform,
        FedGO's odds); `keywords`: more of the library strategy's (FedGO's, FedDF's)."""
        if weighting is not None:
            keywords["weighting"] = weighting
        super().__init__(setup, record, unlabeled_data=setup.u, **distillation_keywords(setup),
                         **keywords)
        self._generator: Generator | None = None
        # theta_s of the last rounds (`past-teachers`, or the diagnostics')
        self.past = PastTeachers(self.cfg.past_teachers
                                 or (PAST_TEACHERS if self.cfg.diagnostics else 0))
        self.observers.append(EnsembleRecord(self))

    # --- the generator and the distillation set (FedGO's Table 2)
    def source_generator(self) -> Generator:
        """G from `generator-source`, obtained once per run (FedGAN's during the pre-FL
        stage, with the clients)."""
        if self._generator is None:
            self._generator = (fedgan_generator(self, self.grid)
                               if self.cfg.generator_source == "fedgan"
                               else obtain_generator(self.cfg, self.setup, self.record))
        return self._generator

    @property
    def generated_set(self) -> bool:
        return self.cfg.distill_set == "generated" and self.draws_distillation_set

    def pre_fl(self, grid, timeout: float) -> None:
        """Before the library's pre-FL stage: with `distill-set = generated` the distillation
        set, `distill-size` images drawn from G once (seeded)."""
        if self.generated_set:
            self.u = draw_images(self.source_generator(), self.cfg.distill_size, self.cfg.seed,
                                 self.setup.device)
            self.record.data["pre_fl"]["distillation_set"] = {
                "generated": len(self.u), "redrawn": self.cfg.redraw_distill_set,
                # equal digests: two runs distilled on the same images (FedGO and FedDF)
                "sha256": hashlib.sha256(self.u.numpy().tobytes()).hexdigest()}
            log(INFO, "pre-FL: distillation set of %d images drawn from G", len(self.u))
        super().pre_fl(grid, timeout)

    def redrawn_set(self, server_round: int) -> torch.Tensor:
        """`redraw-distill-set`: a new set from G for this round (seeded by the round)."""
        return draw_images(self.source_generator(), self.cfg.distill_size,
                           round_seed(self.cfg.seed, server_round), self.setup.device)

    # A generated distillation set goes into the checkpoints: a resumed run skips the pre-FL
    # stage that drew it; with redraws, so does G (FedGAN's would need the clients again).
    def state_dict(self) -> dict:
        state = super().state_dict()
        if self.generated_set:
            state["distillation_set"] = self.u
        if self.generated_set and self.cfg.redraw_distill_set:
            g = self.source_generator()
            state["distillation_generator"] = {
                "arguments": generator_arguments(g, self.setup.image_shape[0]),
                "state": g.state_dict()}
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if "distillation_set" in state:
            self.u = state["distillation_set"]
        if "distillation_generator" in state:
            saved = state["distillation_generator"]
            self._generator = Generator(**saved["arguments"])
            self._generator.load_state_dict(saved["state"])
            self._generator.eval()

    # --- the library's hooks: what the app's strategies score and teach with
    def test_log_odds(self, keys: list[int]) -> torch.Tensor:
        """log Phi_k on the test split, [K, N]; rules without discriminators ignore it."""
        return torch.zeros(len(keys), len(self.setup.test_y))

    def test_scores(self, teachers: list[ClientModel], nets: list[torch.nn.Module],
                    n_k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The teachers' logits [K, N, C] and log Phi_k [K, N] on the test split (n_k [K]:
        their sizes)."""
        return (self.logits_of(nets, self.setup.test_x),
                self.test_log_odds([m.key for m in teachers]))

    def teacher_nets(self, teachers: list[ClientModel]) -> list[torch.nn.Module]:
        """Each teacher in its own architecture (a mixed federation's are several)."""
        return [self.setup.new_classifier(self.architectures.of(m.key), m.state) for m in teachers]

    def distillation_set(self, server_round: int) -> torch.Tensor:
        """U, the set drawn from G in the pre-FL stage, or (`redraw-distill-set`) a new one
        from round 2 on."""
        if self.generated_set and self.cfg.redraw_distill_set and server_round > 1:
            return self.redrawn_set(server_round)  # round 1 uses the pre-FL stage's
        return self.u

    def logits_of(self, nets: list[torch.nn.Module], x: torch.Tensor, flip: bool = False
                  ) -> torch.Tensor:
        """The server's own models' logits on images x, [M, N, C], as the teachers' are
        computed."""
        return teacher_logits(nets, x, device=self.setup.device, flip=flip, amp=self.setup.amp)

    def past_logits(self, past: list[dict[str, torch.Tensor]], x: torch.Tensor
                    ) -> torch.Tensor:
        """The past global models' logits on images x, [P, N, C] (computed once an image
        and model)."""
        return self.past.logits(past, x, self.load, device=self.setup.device,
                                amp=self.setup.amp)

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

    # --- the round: the library's server update (fedgo_flwr.strategies.ensemble)
    def server_update(self, server_round, averaged, models, report):
        """The library's; a mixed federation's (its wrapper): the ensemble of every
        architecture's teachers pseudo-labels the distillation set once, and each
        architecture's average is distilled on it."""
        if not self.architectures.heterogeneous:
            return super().server_update(server_round, averaged, models, report)
        if (drawn := self.round_set(server_round, models)) is None:
            return averaged, {}
        teachers, u = drawn
        batches = self.distill_batches(server_round, u)
        targets, batches, metrics = self.pseudo_labels(server_round, teachers, u, None,
                                                       batches, report)
        students = {a: self.setup.new_classifier(a, state) for a, state in
                    self.architectures.globals_of(averaged.to_torch_state_dict()).items()}
        report.details["distill_by_architecture"] = {
            a: self.distill_student(server_round, student, u, targets, batches)
            for a, student in students.items()}
        return ArrayRecord(self.architectures.joined(
            {a: {k: v.detach().cpu() for k, v in student.state_dict().items()}
             for a, student in students.items()})), metrics
