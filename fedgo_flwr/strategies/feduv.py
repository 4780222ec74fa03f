"""FedUV (Son et al., "FedUV: Uniformity and Variance for Heterogeneous Federated Learning",
CVPR 2024), one of the FedGO paper's Table 3 baselines (App. E.2: lambda = 0.5, alpha = 2.5).

FedAvg whose clients add two regularisers to their cross-entropy, on each minibatch, to train
as if their data were IID:

- classifier variance: the per-class standard deviation over the minibatch of the softmax
  outputs should reach that of one-hot labels spread evenly over the C classes (gamma_C, the
  standard deviation of a column of the C x C identity): alpha * mean_c ReLU(gamma_C - std_c);
- encoder uniformity: the encoder's representations z = features(x) spread on the
  hypersphere's Gaussian-potential sense: lambda * mean_{i<j} exp(-||z_i - z_j||^2 / sigma),
  sigma the median of the non-zero squared distances of the minibatch.

The model needs `features(x)` and `head(z)` (as DaFKD's does): the client computes z once a
minibatch and the logits as head(z). What the paper leaves open, and what this module does
(following the authors' code): the standard deviations are the unbiased ones, a minibatch of
one image adds no term, and both terms are part of the reported training loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from flwr.app import Message, RecordDict
from torch import nn

from fedgo_flwr.strategies.base import ServerUpdateFedAvg
from fedgo_flwr.strategies.messages import CLIENT_TRAINING
from fedgo_flwr.strategies.client_methods import ClientMethod, LocalTerms

TRAIN_FEDUV = "train.feduv"


def variance_term(logits: torch.Tensor) -> torch.Tensor:
    """mean_c ReLU(gamma_C - std_c(softmax(logits))) over a minibatch [B, C]."""
    classes = logits.shape[1]
    gamma = torch.eye(classes).std(dim=0).mean().item()
    return F.relu(gamma - F.softmax(logits, dim=1).std(dim=0)).mean()


def uniformity_term(z: torch.Tensor) -> torch.Tensor:
    """mean over pairs of exp(-||z_i - z_j||^2 / sigma), sigma the median non-zero one."""
    d2 = torch.pdist(z.flatten(1), p=2).pow(2)
    nonzero = d2[d2 != 0]
    if not len(nonzero):
        return d2.sum() * 0.0
    return d2.mul(-1 / nonzero.median()).exp().mean()


def needs_encoder(model_fn, why: str) -> None:
    """A TypeError saying `why` unless model_fn's model has features and head."""
    with torch.random.fork_rng(devices=[]):
        model = model_fn()
    if missing := [a for a in ("features", "head") if not callable(getattr(model, a, None))]:
        raise TypeError(f"{why}: model_fn's model lacks {', '.join(missing)} (features(x) -> "
                        "z, head(z) -> logits, forward = head(features(x)))")


class Encoded(nn.Module):
    """The user's model as features then head, keeping the minibatch's z for the terms."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model, self.z = model, None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.z = self.model.features(x)
        return self.model.head(self.z)


class UniformVariance(ClientMethod):
    """FedUV's clients, under any server: cross-entropy plus alpha times the variance term
    and lambda times the uniformity term on every minibatch (the model needs features and
    head).

    Parameters
    ----------
    variance_weight : float (default: 2.5)
        alpha, the classifier variance term's weight.
    uniformity_weight : float (default: 0.5)
        lambda, the encoder uniformity term's weight.
    """

    name = "feduv"
    message_type = TRAIN_FEDUV

    def __init__(self, variance_weight: float = 2.5, uniformity_weight: float = 0.5) -> None:
        if variance_weight < 0 or uniformity_weight < 0:
            raise ValueError(f"variance_weight and uniformity_weight must be >= 0; got "
                             f"{variance_weight}, {uniformity_weight}")
        self.weights = {"variance-weight": float(variance_weight),
                        "uniformity-weight": float(uniformity_weight)}

    def bind(self, strategy) -> None:
        super().bind(strategy)
        needs_encoder(strategy.model_fn, "FedUV regularises the model's encoder and classifier")

    def payload(self, server_round, arrays):
        """alpha and lambda."""
        return {}, self.weights

    # ------------------------------------------------------------------------ client side
    @staticmethod
    def terms(message: Message, model: nn.Module, state: RecordDict,
              device: torch.device) -> LocalTerms:
        """The model trained as features then head; both terms on every minibatch of two or
        more images."""
        conf = message.content.config_records["config"]
        encoded = Encoded(model)
        alpha, lam = float(conf["variance-weight"]), float(conf["uniformity-weight"])

        def regularisers(_: torch.Tensor, logits: torch.Tensor, __: torch.Tensor
                         ) -> torch.Tensor:
            if len(logits) < 2:
                return logits.sum() * 0.0
            return alpha * variance_term(logits) + lam * uniformity_term(encoded.z)

        return LocalTerms(module=encoded, batch_term=regularisers)


class FedUV(ServerUpdateFedAvg):
    """FedUV: FedAvg whose clients add the variance and uniformity regularisers (FedAvg with
    `client_method=UniformVariance(variance_weight, uniformity_weight)`).

    Parameters
    ----------
    model_fn : Callable[[], nn.Module]
        The global model, with `features(x) -> z` and `head(z) -> logits`.
    variance_weight : float (default: 2.5)
        alpha, the classifier variance term's weight.
    uniformity_weight : float (default: 0.5)
        lambda, the encoder uniformity term's weight.
    seed, device, aggregate_fn, client_key, num_examples_fn, observers, max_failed_rounds
        As in `ServerUpdateFedAvg`, and every keyword Flower's `FedAvg` takes.

    Its clients train with the library's loop (`fedgo_flwr.client.register` adds
    `local_update`): `start` needs "lr", "local-epochs" and "optimizer" in train_config.
    """

    client_training = CLIENT_TRAINING  # its clients' method trains with the library's loop

    def __init__(self, *, model_fn, variance_weight: float = 2.5,
                 uniformity_weight: float = 0.5, **kwargs) -> None:
        super().__init__(model_fn=model_fn, client_method=UniformVariance(
            variance_weight, uniformity_weight), **kwargs)
