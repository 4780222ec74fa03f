"""Keyword sets for FedGO (and FedDF, DaFKD: the ensemble options are theirs too), so that a
benchmarked row is one constructor call: `FedGO(unlabeled_data=u, model_fn=Net, **BEST_ROW)`.

- `AS_PUBLISHED`: the paper's FedGO: every keyword at its default but the mirrored views of
  its App. E.2 (`flip_views=True`, off by default: drop it for images a mirror changes, such
  as digits, letters or scans).
- `BEST_ROW`: the README's best row over 50 rounds, "calibrated FedGO on FedProx's clients
  with the clients' guard, the disagreement budget with its probe and 3 past teachers" (none
  of it in the paper): clients hold out a tenth of their images to calibrate their
  discriminators (Platt), the ensemble mixes probabilities (Theorem 3.4), the clients add
  FedProx's term with mu = 0.001 (the client's train handler must read "proximal-mu", as it
  does for Flower's FedProx), clients that did not train keep or reject each distilled model,
  distillation takes the share of its steps that is the average's disagreement with the
  pseudo-labels (measured on the first 1,024 images), and the last 3 global models teach too;
  with the paper's mirrored views, as benchmarked (Fashion-MNIST).
"""

from __future__ import annotations

from fedgo_flwr.guard import ClientsGuard

AS_PUBLISHED: dict = dict(flip_views=True)

BEST_ROW: dict = dict(calibration_fraction=0.1, ensemble_space="probabilities",
                      proximal_mu=0.001, guard=ClientsGuard(), distill_budget="disagreement",
                      budget_probe=1024, past_teachers=3, flip_views=True)
