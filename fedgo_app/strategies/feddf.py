"""FedDF (Lin et al., 2020) in the app: the library's FedDF (fedgo_flwr.strategies.feddf),
ensemble distillation with UNIFORM weights. The student starts from this round's n_k-weighted
average; the teacher is the plain mean of the client logits; KL(teacher || student) at
temperature 1.

By default FedDF distils exactly as every other ensemble strategy here (E_s passes over U, the
shared optimiser and schedule, no labelled data), as the FedGO paper trains its baselines
(App. F.6.2). `feddf-published = true` gives FedDF's own server update instead: Adam with
cosine annealing over a step budget restarted every round, batch 128, gradient norm clipped at
5, and, with `val-size` > 0, early stopping on that many LABELLED server images, keeping the
best checkpoint."""

from __future__ import annotations

from dataclasses import dataclass
from logging import INFO

from flwr.common.logger import log

from fedgo_flwr.keys import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, check, key
from fedgo_app.server.record import RunRecord
from fedgo_app.strategies.base import ServerSetup
from fedgo_app.strategies.ensemble import ENSEMBLE_CLIENT, MARKS, READS, EnsembleApp
from fedgo_app.strategies.registry import StrategySpec
from fedgo_flwr.strategies.feddf import FedDF as LibraryFedDF


@dataclass(frozen=True)
class FedDFKeys:
    """Run-config keys feddf-*: FedDF's server update as published, instead of the shared one."""
    published: bool = key(False, "FedDF's own server update instead of the shared one (the "
                          "keys below; val-size labelled images)")
    steps: int = key(500, "its step budget a round (1e4 in its paper)", NON_NEGATIVE)
    batch_size: int = key(128, "its batch size", AT_LEAST_ONE)
    eval_every: int = key(100, "validate every N steps", AT_LEAST_ONE)
    patience: int = key(1000, "stop after this many steps without a better validation "
                        "accuracy, restoring the best checkpoint", AT_LEAST_ONE)
    clip_norm: float = key(5.0, "gradient norm clip", POSITIVE)

    def validate(self, cfg, strategies) -> None:
        check("feddf-published", not self.published or cfg.strategy == "feddf",
              f"is true, but strategy is {cfg.strategy!r}: it switches FedDF (strategy = "
              "\"feddf\") to its published server update")
        check("val-size", cfg.val_size == 0 or self.published
              or cfg.distillation_guard == "labelled-val",
              "is > 0, but only FedDF's published server update and distillation-guard = "
              "\"labelled-val\" read labelled server data: set feddf-published = true (and "
              "strategy = \"feddf\"), distillation-guard = \"labelled-val\" or val-size = 0")


class FedDFApp(EnsembleApp, LibraryFedDF):
    """The library's FedDF, its published update behind `feddf-published`."""

    def __init__(self, setup: ServerSetup, record: RunRecord):
        keys = setup.cfg.keys("feddf")
        validation = ((setup.val_x, setup.val_y) if keys.published and len(setup.val_y)
                      else None)
        super().__init__(setup, record, None, published=keys.published,
                         published_steps=keys.steps, published_batch_size=keys.batch_size,
                         clip_norm=keys.clip_norm, validation_data=validation,
                         eval_every=keys.eval_every, patience=keys.patience)
        if keys.published:
            log(INFO, "FedDF as published: %d steps of batch %d a round, %s", keys.steps,
                keys.batch_size, f"early stopping on {len(setup.val_y)} labelled images"
                if len(setup.val_y) else "no early stopping (val-size = 0)")


def row_name(config) -> str:
    """FedDF's published update is its own row, whose name says what it has beyond the others:
    labelled data when it read some, and its own step budget a round."""
    if not config.get("feddf-published"):
        return "feddf"
    steps = f"{config.get('feddf-steps', FedDFKeys.steps)} steps"
    return f"feddf-published ({'labelled val, ' if config.get('val-size') else ''}{steps})"


FEDDF = StrategySpec("feddf", FedDFApp, ENSEMBLE_CLIENT, keys=FedDFKeys, reads=READS, marks=MARKS,
                     row_name=row_name)
