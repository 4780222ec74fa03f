"""The server update every ensemble-distillation strategy shares (FedGO's Algorithm 2, lines
8-13): FedAvg's n_k-weighted average theta_s^t, then the weighted ensemble of this round's
client models pseudo-labels the distillation set U once,

    y~(u) = softmax(sum_k w_k(u) f(u; theta_k^t)),

and theta_s^t is distilled toward it for E_s passes (KL(y~ || f(u; theta)), Adam, the learning
rate cosine-annealed over the T rounds). Strategies differ only in the weights w_k(u) and in
what they score U with (FedDF: 1/|A_t|; FedGO: the odds of the clients' discriminators;
DaFKD: its clients' domain discriminators, on a set its generator draws)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from logging import INFO, WARNING

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords
from torch import nn

from fedgo_flwr.distill import ENSEMBLE_SPACES, cosine_lr, distill, draw_batches, view_pseudo_labels
from fedgo_flwr.inputs import images_of
from fedgo_flwr.seeds import round_seed
from fedgo_flwr.teachers import teacher_logits
from fedgo_flwr.train import OPTIMIZERS, resolve_device
from fedgo_flwr.weighting import WeightRule

SCHEDULES = ("cosine", "constant")


@dataclass
class ClientModel:
    """theta_k^t of one usable train reply: its node, n_k, weights, metrics and any other
    arrays the strategy asked for (DaFKD's discriminator head and generator)."""
    node_id: int
    num_examples: int
    content: RecordDict  # the model and metrics only: what FedAvg averages
    extras: dict[str, ArrayRecord] = field(default_factory=dict)

    @property
    def state(self) -> dict[str, torch.Tensor]:
        return next(iter(self.content.array_records.values())).to_torch_state_dict()


def state_problem(arrays: ArrayRecord | None, template: dict[str, torch.Tensor]) -> str | None:
    """Why `arrays` cannot be loaded as a model shaped like `template`, or None."""
    if arrays is None:
        return "no ArrayRecord"
    state = arrays.to_torch_state_dict()
    if set(state) != set(template):
        missing, unexpected = sorted(set(template) - set(state)), sorted(set(state) - set(template))
        return (f"array names differ from the model's (missing {missing[:3]}, unexpected "
                f"{unexpected[:3]})")
    for name, t in template.items():
        if state[name].shape != t.shape:
            return f"{name} has shape {tuple(state[name].shape)}, expected {tuple(t.shape)}"
        if state[name].is_floating_point() and not torch.isfinite(state[name]).all():
            return f"{name} holds NaN or infinite values"
    return None


def examples_problem(metrics: MetricRecord | None, key: str) -> str | None:
    value = None if metrics is None else metrics.get(key)
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return f"metric {key!r} is {value!r}, not a positive number"
    return None


class EnsembleDistillation(FedAvg):
    """FedAvg followed by ensemble distillation of the average on an unlabeled set.

    Parameters
    ----------
    unlabeled_data : Tensor | Dataset | DataLoader
        The server's unlabeled set U, images [N, C, H, W]: uint8 pixels (taken to [-1, 1]) or
        floats as the model takes them (fedgo_flwr.inputs). Labels, if any, are ignored.
    model_fn : Callable[[], nn.Module]
        Builds the global model (the architecture of `initial_arrays`).
    weighting : Callable (default: set by the strategy)
        w_k(u): (logits [K, B, C], log-odds [K, B], n_k [K]) -> weights [K, B]
        (fedgo_flwr.weighting).
    distill_epochs : int (default: 10)
        E_s, passes over U per round (the paper's App. E.2).
    distill_batch_size : int (default: 64)
    distill_lr : float (default: 1e-3)
    distill_optimizer : str (default: "adam")
        "adam", or "sgd" with `distill_momentum`.
    distill_momentum : float (default: 0.9)
    distill_schedule : str (default: "cosine")
        "cosine" anneals the learning rate over the `num_rounds` given to `start`;
        "constant" keeps it.
    ensemble_space : str (default: "logits")
        Where the weights mix the clients: "logits" (Algorithm 2) or "probabilities"
        (Theorem 3.4).
    flip_views : bool (default: True)
        U is seen as is and mirrored (each pass takes a random view of each image).
    seed : int (default: 0)
        Seeds the distillation batches of each round.
    device : str | torch.device | None (default: None)
        Where the server distils: None picks CUDA when visible, else the CPU.
    aggregate_fn : Callable[[list[RecordDict], str], ArrayRecord] | None (default: None)
        How the round's client models are combined before distillation, given the usable
        replies' contents and `weighted_by_key`: None is FedAvg's n_k-weighted mean
        (Flower's `aggregate_arrayrecords`); a robust rule of your own goes here.
    **kwargs
        Every keyword Flower's `FedAvg` takes (fraction_train, min_available_nodes, ...).
    """

    def __init__(self, *, unlabeled_data=None, model_fn: Callable[[], nn.Module],
                 weighting: WeightRule, distill_epochs: int = 10, distill_batch_size: int = 64,
                 distill_lr: float = 1e-3, distill_optimizer: str = "adam",
                 distill_momentum: float = 0.9, distill_schedule: str = "cosine",
                 ensemble_space: str = "logits", flip_views: bool = True, seed: int = 0,
                 device: str | torch.device | None = None,
                 aggregate_fn: Callable[[list[RecordDict], str], ArrayRecord] | None = None,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        for name, value, allowed in (("distill_optimizer", distill_optimizer, OPTIMIZERS),
                                     ("distill_schedule", distill_schedule, SCHEDULES),
                                     ("ensemble_space", ensemble_space, ENSEMBLE_SPACES)):
            if value not in allowed:
                raise ValueError(f"{name} is {value!r}; allowed: {', '.join(allowed)}")
        if distill_epochs < 0 or distill_batch_size < 1 or distill_lr <= 0:
            raise ValueError("distill_epochs >= 0, distill_batch_size >= 1 and distill_lr > 0 "
                             f"are needed; got {distill_epochs}, {distill_batch_size}, "
                             f"{distill_lr}")
        self.u = None if unlabeled_data is None else images_of(unlabeled_data)
        self.model_fn, self.weighting = model_fn, weighting
        self.distill_epochs, self.distill_batch_size = distill_epochs, distill_batch_size
        self.distill_lr, self.distill_optimizer = distill_lr, distill_optimizer
        self.distill_momentum, self.distill_schedule = distill_momentum, distill_schedule
        self.ensemble_space, self.views, self.seed = ensemble_space, 2 if flip_views else 1, seed
        self.device = resolve_device(str(device)) if device is not None else resolve_device()
        self.num_rounds = 1  # set by start(): the cosine schedule's T
        self.template = model_fn().state_dict()
        self.aggregate_fn = aggregate_fn or aggregate_arrayrecords

    def summary(self) -> None:
        super().summary()
        log(INFO, "\t└──> Distillation: %d epoch(s) of batch %d, %s lr %g (%s), %s space, on "
            "%s", self.distill_epochs, self.distill_batch_size, self.distill_optimizer,
            self.distill_lr, self.distill_schedule, self.ensemble_space, self.device)

    # --- the run
    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3,
              timeout: float = 3600, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
              ) -> Result:
        """Flower's `Strategy.start`, after the strategy's pre-FL stage (`pre_fl`)."""
        if problem := state_problem(initial_arrays, self.template):
            raise ValueError(f"initial_arrays do not fit model_fn's model: {problem}")
        self.num_rounds = num_rounds
        self.pre_fl(grid, timeout)
        return super().start(grid=grid, initial_arrays=initial_arrays, num_rounds=num_rounds,
                             timeout=timeout, train_config=train_config,
                             evaluate_config=evaluate_config, evaluate_fn=evaluate_fn)

    def pre_fl(self, grid: Grid, timeout: float) -> None:
        """What runs before round 1 (FedGO: generator out, discriminators back)."""

    # --- the round
    def extra_arrays(self, server_round: int) -> tuple[str, ...]:
        """The ArrayRecords a train reply carries besides the model (DaFKD's)."""
        return ()

    def client_models(self, server_round: int, replies: Iterable[Message]
                      ) -> list[ClientModel]:
        """The usable train replies; each other is logged with why it is left out."""
        models, seen, extras = [], set(), self.extra_arrays(server_round)
        for reply in replies:
            node = reply.metadata.src_node_id
            why = ("failed: " + str(reply.error.reason) if reply.has_error()
                   else "duplicate reply" if node in seen else self.reply_problem(reply, extras))
            if why:
                log(WARNING, "train reply of node %d left out: %s", node, why)
                continue
            seen.add(node)
            content = reply.content
            (name, metrics), = content.metric_records.items()
            model = RecordDict({self.arrayrecord_key: content.array_records[self.arrayrecord_key],
                                name: metrics})
            models.append(ClientModel(node, int(metrics[self.weighted_by_key]), model,
                                      {k: content.array_records[k] for k in extras}))
        return models

    def reply_problem(self, reply: Message, extras: tuple[str, ...] = ()) -> str | None:
        """Why a train reply cannot be used, or None."""
        content = reply.content
        if len(content.metric_records) != 1:
            return f"{len(content.metric_records)} MetricRecords, expected one"
        (metrics,) = content.metric_records.values()
        missing = [k for k in (self.arrayrecord_key, *extras)
                   if k not in content.array_records]
        if missing:
            return f"no ArrayRecord {missing}"
        return (examples_problem(metrics, self.weighted_by_key)
                or state_problem(content.array_records[self.arrayrecord_key], self.template))

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """theta_s^t = sum_k n_k theta_k^t / sum_k n_k, then the server update."""
        models = self.client_models(server_round, replies)
        log(INFO, "aggregate_train: %d usable client model(s)", len(models))
        if not models:
            return None, None
        contents = [m.content for m in models]
        averaged = self.aggregate_fn(contents, self.weighted_by_key)
        metrics = self.train_metrics_aggr_fn(contents, self.weighted_by_key)
        arrays, info = self.server_update(server_round, averaged, models)
        for key, value in info.items():
            metrics[key] = value
        return arrays, metrics

    def server_update(self, server_round: int, averaged: ArrayRecord,
                      models: list[ClientModel]) -> tuple[ArrayRecord, dict[str, float]]:
        """Pseudo-label the distillation set once with the weighted ensemble of the round's
        teachers and distil the average toward it; returns the new global model and the
        round's distillation metrics."""
        teachers = self.teachers(models)
        u = self.distillation_set(server_round)
        if not teachers or u is None or not len(u) or self.distill_epochs == 0:
            log(WARNING, "round %d: no teacher or nothing to distil on; the average is kept",
                server_round)
            return averaged, {}
        nets = [self.load(m.state) for m in teachers]
        n_k = torch.tensor([m.num_examples for m in teachers], dtype=torch.float32)
        batches = draw_batches(len(u), self.views, epochs=self.distill_epochs,
                               batch_size=self.distill_batch_size,
                               seed=round_seed(self.seed, server_round))
        start = time.perf_counter()
        targets = view_pseudo_labels(lambda v, s: self.scores(teachers, nets, u, s, v),
                                     len(u), n_k, self.weighting, batches, views=self.views,
                                     space=self.ensemble_space)
        labelling = time.perf_counter() - start
        student, lr = self.load(averaged.to_torch_state_dict()), self.server_lr(server_round)
        info = distill(student, u, targets, batches=batches, lr=lr, device=self.device,
                       amp=self.device.type == "cuda", optimizer=self.distill_optimizer,
                       momentum=self.distill_momentum)
        log(INFO, "round %d: %d teachers pseudo-labelled %d images (%.1fs); distilled, KL "
            "%.4f (%.1fs)", server_round, len(teachers), len(u), labelling,
            info["distill_loss"], info["seconds"])
        return ArrayRecord(student.cpu().state_dict()), {
            "distill-loss": info["distill_loss"], "distill-lr": lr,
            "distill-teachers": len(teachers), "pseudo-label-seconds": labelling,
            "distill-seconds": info["seconds"]}

    # --- what a strategy changes
    def teachers(self, models: list[ClientModel]) -> list[ClientModel]:
        """The round's models the ensemble weights (FedGO: those with a discriminator)."""
        return models

    def distillation_set(self, server_round: int) -> torch.Tensor | None:
        """The images distilled on this round (U; DaFKD draws its own)."""
        return self.u

    def scores(self, teachers: list[ClientModel], nets: list[nn.Module], u: torch.Tensor,
               samples: torch.Tensor, view: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The teachers' logits [K, S, C] and log-odds log Phi_k [K, S] on these samples of
        view `view` of the distillation set u (1: mirrored); without discriminators the
        log-odds are 0."""
        logits = teacher_logits(nets, u[samples], device=self.device, flip=view == 1,
                                amp=self.device.type == "cuda")
        return logits, torch.zeros(logits.shape[:2])

    def server_lr(self, server_round: int) -> float:
        if self.distill_schedule == "constant":
            return self.distill_lr
        return cosine_lr(self.distill_lr, server_round, max(self.num_rounds, server_round))

    def load(self, state: dict[str, torch.Tensor]) -> nn.Module:
        model = self.model_fn()
        model.load_state_dict(state)
        return model
