"""FedTGP (Zhang et al., "FedTGP: Trainable Global Prototypes with Adaptive-Margin-Enhanced
Contrastive Learning for Data and Model Heterogeneity in Federated Learning", AAAI 2024), one
of the FedGO paper's Table 3 baselines (App. E.2: batch 10, lr 0.005, 1,000 epochs, margin
threshold tau = 100, weight lambda = 0.001).

Clients add to their cross-entropy a pull of each representation z = features(x) toward the
global prototype P_y of its label, lambda * MSE(z, P_y), and after training send their class
prototypes: the mean z of each class over their data. The server keeps the trainable global
prototypes (TGP): a learnt embedding per class through Linear-ReLU-Linear gives P_c. Each
round it trains them on the round's client prototypes q (label c) with the adaptive-margin
contrastive loss

    L = CE over classes of -(||q - P_j|| + delta [j = c]),
    delta = min(max_c min_{c' != c} ||Q_c - Q_c'||, tau),

Q_c the mean of the round's prototypes of class c, and sends P with the next round.

FedTGP's own paper has no global model: each client keeps its own (possibly another
architecture) and classifies by the nearest prototype. The FedGO paper scores a server model
for every method, on one architecture, so here the models are also averaged as FedAvg does
and the average is the server model; the prototypes shape the clients' training.

What the papers leave open, and what this module does (following the authors' code): the
term's MSE is the mean over the minibatch's B x D entries, rows whose label has no prototype
yet adding 0 (there is none in round 1); prototypes are computed in eval mode without
augmentation; Q_c weighs every client alike; TGP trains with SGD, the embedding's width the
prototypes' and the hidden layer's `hidden_dim` (default: the same), seeded by `seed`, and is
kept across rounds; a class gets a prototype once some client has sent one. The FedGO
paper's "contrastive loss weighted by lambda = 0.001" is read as the clients' term, the only
one weighed against the task's loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, Message
from torch import nn

from fedgo_flwr.inputs import labelled
from fedgo_flwr.strategies.base import ClientModel, RoundReport, ServerUpdateFedAvg
from fedgo_flwr.strategies.messages import CLIENT_TRAINING, message_seed, model_reply
from fedgo_flwr.strategies.feduv import Encoded, needs_encoder
from fedgo_flwr.strategies.label_counts import train_as_configured
from fedgo_flwr.train import apply_in_batches

TRAIN_FEDTGP = "train.fedtgp"
GLOBAL = "global-prototypes"  # P (and which classes have one), sent with each round
LOCAL = "prototypes"  # a client's class means and counts, sent back


class TrainablePrototypes(nn.Module):
    """TGP: P_c = W2 ReLU(W1 e_c + b1) + b2 from a learnt embedding e_c per class."""

    def __init__(self, num_classes: int, dim: int, hidden_dim: int):
        super().__init__()
        self.embedding = nn.Embedding(num_classes, dim)
        self.net = nn.Sequential(nn.Linear(dim, hidden_dim), nn.ReLU(),
                                 nn.Linear(hidden_dim, dim))

    def forward(self) -> torch.Tensor:
        return self.net(self.embedding.weight)  # [C, D]


def adaptive_margin(prototypes: torch.Tensor, labels: torch.Tensor, tau: float) -> float:
    """delta = min(max_c min_{c' != c} ||Q_c - Q_c'||, tau), Q_c the mean prototype of class c
    (0 where fewer than two classes came)."""
    classes = labels.unique()
    if len(classes) < 2:
        return 0.0
    q = torch.stack([prototypes[labels == c].mean(0) for c in classes])
    d = torch.cdist(q, q).fill_diagonal_(float("inf"))
    return min(d.min(1).values.max().item(), tau)


def contrastive_loss(q: torch.Tensor, labels: torch.Tensor, p: torch.Tensor,
                     margin: float) -> torch.Tensor:
    """CE over classes of -(||q - P_j|| + margin [j = label]): each prototype q [B, D] nearer
    its class's P than any other by at least the margin."""
    distances = torch.cdist(q, p) + margin * F.one_hot(labels, len(p))
    return F.cross_entropy(-distances, labels)


def train_prototypes(tgp: TrainablePrototypes, q: torch.Tensor, labels: torch.Tensor, *,
                     epochs: int, batch_size: int, lr: float, tau: float,
                     generator: torch.Generator) -> dict[str, float]:
    """The server's round of TGP: `epochs` shuffled passes over the client prototypes."""
    margin = adaptive_margin(q, labels, tau)
    opt = torch.optim.SGD(tgp.parameters(), lr=lr)
    loss = torch.zeros(())
    for _ in range(epochs):
        for idx in torch.randperm(len(q), generator=generator).split(batch_size):
            loss = contrastive_loss(q[idx], labels[idx], tgp(), margin)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return {"tgp-loss": loss.item(), "tgp-margin": margin}


class FedTGP(ServerUpdateFedAvg):
    """FedTGP: FedAvg whose clients are pulled toward trainable global prototypes.

    Parameters
    ----------
    model_fn : Callable[[], nn.Module]
        The global model, with `features(x) -> z` and `head(z) -> logits`.
    num_classes : int
        C.
    prototype_weight : float (default: 0.001)
        lambda, the clients' prototype term's weight (App. E.2).
    margin_threshold : float (default: 100.0)
        tau, the adaptive margin's cap.
    server_epochs, server_batch_size, server_lr : (default: 1000, 10, 0.005)
        TGP's training each round (App. E.2).
    hidden_dim : int | None (default: None)
        TGP's hidden width; None is the prototypes' width.
    feature_dim : int | None (default: None)
        D, the width of features(x); None: read from the first prototypes that come.
    seed, device, aggregate_fn, client_key, num_examples_fn, observers, max_failed_rounds
        As in `ServerUpdateFedAvg`, and every keyword Flower's `FedAvg` takes.

    Its clients train with the library's loop (`fedgo_flwr.client.register` adds
    `prototype_update`): `start` needs "lr", "local-epochs" and "optimizer" in train_config.
    """

    client_training = CLIENT_TRAINING
    own_client_step = True
    train_type = TRAIN_FEDTGP
    carried = ("tgp", "known")  # the trainable prototypes, the classes that have one

    def __init__(self, *, model_fn, num_classes: int, prototype_weight: float = 0.001,
                 margin_threshold: float = 100.0, server_epochs: int = 1000,
                 server_batch_size: int = 10, server_lr: float = 0.005,
                 hidden_dim: int | None = None, feature_dim: int | None = None,
                 **kwargs) -> None:
        super().__init__(model_fn=model_fn, **kwargs)
        needs_encoder(model_fn, "FedTGP pulls the model's representations toward prototypes")
        if num_classes < 2 or prototype_weight < 0 or margin_threshold < 0 or \
                server_epochs < 0 or server_batch_size < 1 or server_lr <= 0:
            raise ValueError(
                f"FedTGP needs num_classes >= 2, prototype_weight >= 0, margin_threshold >= 0, "
                f"server_epochs >= 0, server_batch_size >= 1, server_lr > 0; got "
                f"{num_classes}, {prototype_weight}, {margin_threshold}, {server_epochs}, "
                f"{server_batch_size}, {server_lr}")
        self.num_classes, self.hidden_dim = num_classes, hidden_dim
        self.lam, self.tau = float(prototype_weight), float(margin_threshold)
        self.tgp_training = dict(epochs=server_epochs, batch_size=server_batch_size,
                                 lr=server_lr, tau=self.tau)
        # TGP, built when the first prototypes come unless D is given
        self.tgp = self.build(feature_dim) if feature_dim else None
        self.known = torch.zeros(num_classes, dtype=torch.bool)  # classes with a prototype

    def train_payload(self, server_round: int, arrays: ArrayRecord):
        """FedAvg's, and P once there is one, and lambda."""
        extra, settings = super().train_payload(server_round, arrays)
        return {**extra, **self.global_prototypes()}, {**settings, **self.settings()}

    def global_prototypes(self) -> dict[str, ArrayRecord]:
        """What a train message carries: P and which classes have one, once there is one."""
        if self.tgp is None or not self.known.any():
            return {}
        return {GLOBAL: ArrayRecord({"prototypes": self.tgp().detach(),
                                     "known": self.known.float()})}

    def settings(self) -> dict:
        return {"prototype-weight": self.lam, "num-classes": self.num_classes}

    def extra_arrays(self, server_round: int) -> dict:
        return {**super().extra_arrays(server_round), LOCAL: None}  # prototypes_problem

    def reply_problem(self, reply: Message, extras: dict | None = None) -> str | None:
        """FedAvg's checks, and the client's prototypes."""
        return super().reply_problem(reply, extras) or (
            self.prototypes_problem(reply) if LOCAL in (extras or {}) else None)

    def prototypes_problem(self, reply: Message) -> str | None:
        """Why a reply's prototypes cannot be used: [C, D] finite, counts [C] >= 0."""
        local = reply.content.array_records[LOCAL].to_torch_state_dict()
        p, n = local.get("prototypes"), local.get("counts")
        if p is None or n is None or p.dim() != 2 or len(p) != self.num_classes or \
                tuple(n.shape) != (self.num_classes,) or (n < 0).any() or \
                not torch.isfinite(p).all():
            return (f"prototypes must be a finite [{self.num_classes}, D] tensor with counts "
                    f"[{self.num_classes}] >= 0")
        if self.tgp is not None and p.shape[1] != self.tgp.embedding.embedding_dim:
            return f"prototypes of width {p.shape[1]}; P has {self.tgp.embedding.embedding_dim}"
        return None

    def load_state_dict(self, state: dict) -> None:
        """The library's; TGP built first where it comes when the first prototypes do."""
        if self.tgp is None and state["tgp"] is not None:
            self.tgp = self.build(state["tgp"]["embedding.weight"].shape[1])
        super().load_state_dict(state)

    def build(self, dim: int) -> TrainablePrototypes:
        """TGP for prototypes of width `dim`, initialised by the seed."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return TrainablePrototypes(self.num_classes, dim, self.hidden_dim or dim)

    def server_update(self, server_round: int, averaged: ArrayRecord,
                      models: list[ClientModel], report: RoundReport
                      ) -> tuple[ArrayRecord, dict[str, float]]:
        """The average is the server model; TGP trains on the round's client prototypes."""
        q, labels = [], []
        for m in models:
            local = m.extras[LOCAL].to_torch_state_dict()
            present = local["counts"] > 0
            q.append(local["prototypes"][present].float())
            labels.append(present.nonzero().squeeze(1))
        q, labels = torch.cat(q), torch.cat(labels)
        if not len(q):
            return averaged, {}
        if self.tgp is None:
            self.tgp = self.build(q.shape[1])
        self.known[labels] = True
        generator = torch.Generator().manual_seed(self.seed * 100_003 + server_round)
        info = train_prototypes(self.tgp, q, labels, generator=generator, **self.tgp_training)
        return averaged, {**info, "prototypes-known": int(self.known.sum())}


# ---------------------------------------------------------------------------- client side
def class_prototypes(model: nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int, *,
                     device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean representation features(x) of each class, [C, D] (0 for absent classes), and
    the class counts [C], in eval mode without augmentation."""
    model.eval()
    z = apply_in_batches(lambda xb: model.features(xb).flatten(1), x, device=device).float()
    counts = torch.bincount(y, minlength=num_classes)
    sums = torch.zeros(num_classes, z.shape[1]).index_add_(0, y, z)
    return sums / counts.clamp(min=1)[:, None], counts


def prototype_term(encoded: Encoded, p: torch.Tensor, known: torch.Tensor, lam: float):
    """The minibatch's lambda MSE(z, P_y): the mean over its B x D entries, rows whose label
    has no prototype (known 0) adding 0."""
    def term(_: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        z = encoded.z.flatten(1)
        return lam * ((z - p[labels]).pow(2) * known[labels, None]).sum() / z.numel()
    return term


def prototype_update(message: Message, model: nn.Module, data, *,
                     device: str | torch.device = "cpu", seed: int | None = None) -> Message:
    """A FedTGP client's round: `model` (the user's, with features and head, given the
    received weights) trained on `data` (labelled) with cross-entropy plus lambda MSE(z, P_y)
    where the message carries P (settings from the train config as label_counts.TRAINING
    reads them). The reply holds ArrayRecord "arrays", ArrayRecord "prototypes" (the class
    means of features(x) after training, "prototypes" [C, D] and "counts" [C]) and
    MetricRecord "metrics" (num-examples, the loss under "train-loss-key", train-seconds)."""
    conf, device = message.content.config_records["config"], torch.device(device)
    x, y = labelled(data)
    records = message.content.array_records
    model.load_state_dict(records["arrays"].to_torch_state_dict())
    encoded, term = Encoded(model), None
    if GLOBAL in records:
        sent = records[GLOBAL].to_torch_state_dict()
        term = prototype_term(encoded, sent["prototypes"].to(device),
                              (sent["known"] > 0).float().to(device),
                              float(conf["prototype-weight"]))
    result = train_as_configured(encoded, x, y, conf, device=device, batch_term=term,
                                 seed=message_seed(message) if seed is None else seed)
    prototypes, counts = class_prototypes(model, x, y, int(conf["num-classes"]), device=device)
    return model_reply(message, model, len(y), result, arrays={LOCAL: ArrayRecord(
        {"prototypes": prototypes, "counts": counts})})
