"""FedDF (Lin et al., 2020): ensemble distillation with uniform weights w_k = 1/|A_t|, the
plain mean of the client logits, from this round's n_k-weighted average, at temperature 1.
It distils with the budget every ensemble strategy here shares (E_s passes over U, Adam, the
cosine schedule, no labelled data), as the FedGO paper trains its baselines (App. F.6.2)."""

from __future__ import annotations

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
    """

    def __init__(self, *, unlabeled_data, model_fn, **kwargs) -> None:
        super().__init__(unlabeled_data=unlabeled_data, model_fn=model_fn,
                         weighting=uniform_weights, **kwargs)
