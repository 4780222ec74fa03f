"""FedDF (Lin et al., 2020): ensemble distillation with uniform weights w_k = 1/|A_t|, the
plain mean of the client logits, from this round's n_k-weighted average, at temperature 1.
By default it distils with the budget every ensemble strategy here shares (E_s passes over U,
Adam, the cosine schedule, no labelled data), as the FedGO paper trains its baselines
(App. F.6.2). `published=True` gives FedDF's own server update instead: Adam with cosine
annealing over a step budget restarted every round, gradient norm clipping, and with
`validation_data` early stopping on those LABELLED server images, keeping the best
checkpoint (a row that uses them reads labels the others do not)."""

from __future__ import annotations

import math

import torch
from torch import nn

from fedgo_flwr.distill import distill_early_stopping, draw_batches
from fedgo_flwr.inputs import labelled
from fedgo_flwr.seeds import round_seed
from fedgo_flwr.strategies.ensemble import EnsembleDistillation
from fedgo_flwr.weighting import uniform_weights


class FedDF(EnsembleDistillation):
    """FedDF: FedAvg, then distillation toward the unweighted ensemble. Its clients train as
    FedAvg's do: nothing to add to a ClientApp.

    Parameters
    ----------
    unlabeled_data, model_fn, distill_*, ensemble_space, flip_views, view_draw, teacher_floor,
    confidence_threshold, seed, device, **kwargs
        As in `EnsembleDistillation` (fedgo_flwr.strategies.ensemble), and Flower's `FedAvg`
        keywords.
    published : bool (default: False)
        FedDF's own server update (the keywords below) instead of the shared one.
    published_steps : int (default: 500)
        Its step budget a round (1e4 in its paper), over shuffled passes of U.
    published_batch_size : int (default: 128)
    clip_norm : float (default: 5.0)
        The gradient norm clip.
    validation_data : (images, labels) | Dataset | DataLoader | None (default: None)
        Labelled server images: validate every `eval_every` steps, stop after `patience`
        steps without a better accuracy and keep the best checkpoint; None: no early
        stopping.
    eval_every, patience : int (default: 100, 1000)
    """

    def __init__(self, *, unlabeled_data, model_fn, published: bool = False,
                 published_steps: int = 500, published_batch_size: int = 128,
                 clip_norm: float = 5.0, validation_data=None, eval_every: int = 100,
                 patience: int = 1000, **kwargs) -> None:
        super().__init__(unlabeled_data=unlabeled_data, model_fn=model_fn,
                         weighting=uniform_weights, **kwargs)
        if validation_data is not None and not published:
            raise ValueError("validation_data is given, but published is False: only FedDF's "
                             "published server update reads labelled server data")
        self.published = published
        self.published_steps, self.published_batch_size = published_steps, published_batch_size
        self.clip_norm, self.eval_every, self.patience = clip_norm, eval_every, patience
        self.validation = None if validation_data is None else labelled(validation_data)

    def distill_batches(self, server_round: int, u: torch.Tensor) -> list[torch.Tensor]:
        """Published: the step budget, `published_steps` minibatches of shuffled passes."""
        if not self.published:
            return super().distill_batches(server_round, u)
        n, size = len(u), self.published_batch_size
        epochs = math.ceil(self.published_steps / math.ceil(n / size)) if n else 0
        return draw_batches(n, self.views, epochs=epochs, batch_size=size,
                            seed=round_seed(self.seed, server_round),
                            view_draw=self.view_draw)[:self.published_steps]

    def distill_student(self, server_round: int, student: nn.Module, u: torch.Tensor,
                        targets: torch.Tensor, batches: list[torch.Tensor]) -> dict:
        """Published: the learning rate restarted every round and annealed over the budget,
        clipped, with early stopping on `validation_data`."""
        if not self.published:
            return super().distill_student(server_round, student, u, targets, batches)
        info = distill_early_stopping(
            student, u, targets, batches=batches, lr=self.distill_lr, device=self.device,
            validation=self.validation, eval_every=self.eval_every, patience=self.patience,
            clip_norm=self.clip_norm, amp=self.device.type == "cuda",
            optimizer=self.distill_optimizer, momentum=self.distill_momentum)
        return {**info, "distill_lr": self.distill_lr}
