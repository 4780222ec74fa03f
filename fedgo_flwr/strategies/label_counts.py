"""What FedGen and FedBPG share: a FedAvg whose clients train with the library's own loop,
on a message type of the method's own (so that a user's plain `train` handler is untouched),
and upload their label counter c_k with their model (FedGen's Algorithm 1, line 11; FedBPG's
|D_k^y|), from which the server builds the label prior p^(y) and each client's share of each
label, lambda_k^y = c_k^y / sum_i c_i^y.

A train reply is used only when its model fits the global model, its n_k is a positive
number and its `label-counts` are C non-negative integers summing to n_k; any other reply is
left out of the round, with the reason in the server's log."""

from __future__ import annotations

from collections.abc import Callable

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message
from torch import nn

from fedgo_flwr.strategies.base import ClientModel, ServerUpdateFedAvg
from fedgo_flwr.strategies.messages import CLIENT_TRAINING, model_reply
from fedgo_flwr.train import train_classifier

LABEL_COUNTS = "label-counts"  # the reply's metric: c_k, C integers summing to n_k
# What a client's local training reads from the message's config, and its value where absent.
TRAINING = {"local-epochs": 1, "batch-size": 64, "lr": 1e-3, "flip": False, "random-crop": 0,
            "optimizer": "adam", "momentum": 0.9}


def label_counts(y: torch.Tensor, num_classes: int) -> list[int]:
    """c_k: how many of the labels y [N] are each of the C classes."""
    return torch.bincount(y.long(), minlength=num_classes).tolist()


def label_counts_problem(metrics, num_classes: int,
                         examples_key: str = "num-examples") -> str | None:
    """Why a train reply's `label-counts` (the client's label counter c_k, which FedGen and
    FedBPG weight clients by) are unusable: not num_classes non-negative integers summing to
    the reply's n_k; None when usable."""
    counts, n = metrics.get(LABEL_COUNTS), metrics[examples_key]
    ok = (isinstance(counts, list) and len(counts) == num_classes
          and all(isinstance(c, int) and c >= 0 for c in counts) and sum(counts) == n)
    return None if ok else (f"label-counts {counts!r} are not {num_classes} "
                            f"non-negative integers summing to n_k = {n}")


def label_prior(counts: torch.Tensor) -> torch.Tensor:
    """p^(y), [C]: the round's label counts [K, C] summed over the clients, normalised."""
    counts = counts.to(torch.float64)
    return (counts.sum(0) / counts.sum()).float()


def num_classes_of(model: nn.Module, example: torch.Tensor, head: bool = False) -> int:
    """C: the width of the model's logits (in evaluation mode) for `example`, an input or,
    with `head`, a latent z for `model.head`."""
    model.eval()
    with torch.no_grad():
        return int((model.head if head else model)(example).shape[-1])


class LabelCountFedAvg(ServerUpdateFedAvg):
    """FedAvg whose train messages are of type `train_type` and whose train replies carry
    the clients' label counts; a method adds its server update after the average
    (`server_update`) and what its train messages carry (`train_payload`).

    Parameters
    ----------
    num_classes : int
        C, the length of every client's label counts.
    model_fn, seed, device, aggregate_fn, **kwargs
        As in `ServerUpdateFedAvg` (fedgo_flwr.strategies.base), and every keyword Flower's
        `FedAvg` takes; `seed` also seeds the clients' training where the caller's train
        config has no "seed".
    """

    train_type = "train"
    reported: tuple[str, ...] = (LABEL_COUNTS,)  # kept out of Flower's averaging
    client_training = CLIENT_TRAINING
    own_client_step = True

    def __init__(self, *, model_fn: Callable[[], nn.Module], num_classes: int,
                 **kwargs) -> None:
        super().__init__(model_fn=model_fn, **kwargs)
        if num_classes < 2:
            raise ValueError(f"num_classes is {num_classes}; a classifier needs at least 2")
        self.num_classes = num_classes

    # --- what the clients receive
    def train_payload(self, server_round: int, arrays: ArrayRecord
                      ) -> tuple[dict[str, ArrayRecord], dict]:
        """FedAvg's, and C."""
        extra, settings = super().train_payload(server_round, arrays)
        return extra, {**settings, "num-classes": self.num_classes}

    # --- the round
    def reply_problem(self, reply: Message, extras: dict | None = None) -> str | None:
        """FedAvg's checks, and c_k: C non-negative integers summing to n_k."""
        return super().reply_problem(reply, extras) or label_counts_problem(
            next(iter(reply.content.metric_records.values())), self.num_classes,
            self.weighted_by_key)

    def counts(self, models: list[ClientModel]) -> torch.Tensor:
        """The round's label counts, [K, C]."""
        return torch.tensor([m.metrics[LABEL_COUNTS] for m in models], dtype=torch.float64)


# ---------------------------------------------------------------------------- client side
def train_as_configured(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                        conf: ConfigRecord, *, seed: int, device: torch.device,
                        extra_loss: Callable[[nn.Module], torch.Tensor] | None = None,
                        batch_term: Callable[..., torch.Tensor] | None = None,
                        after_step: Callable[[], None] | None = None) -> dict[str, float]:
    """ClientUpdate: `model` trained on (x, y) with the config's "local-epochs", "batch-size",
    "lr", "flip", "random-crop", "optimizer" and "momentum" (TRAINING's values where
    absent), `extra_loss(model)` added to every minibatch's loss."""
    s = {k: conf.get(k, default) for k, default in TRAINING.items()}
    return train_classifier(model, x, y, epochs=int(s["local-epochs"]),
                            batch_size=int(s["batch-size"]), lr=float(s["lr"]),
                            flip=bool(s["flip"]), crop=int(s["random-crop"]),
                            optimizer=str(s["optimizer"]), momentum=float(s["momentum"]),
                            seed=seed, device=device, extra_loss=extra_loss,
                            batch_term=batch_term, after_step=after_step)


def trained_reply(message: Message, model: nn.Module, y: torch.Tensor, result: dict,
                  num_classes: int) -> Message:
    """The reply to a train message: ArrayRecord "arrays" (the trained model) and MetricRecord
    "metrics" (num-examples, the training's metrics and label-counts)."""
    return model_reply(message, model, len(y), result,
                       metrics={LABEL_COUNTS: label_counts(y, num_classes)})
