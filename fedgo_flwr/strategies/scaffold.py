"""SCAFFOLD (Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated
Learning", ICML 2020, Algorithm 1 with option II), one of the FedGO paper's Table 3 baselines.

The server keeps the model x and a control variate c (one tensor per model parameter), each
client its own c_i (zero until its first round) in the node's `context.state`, so that it
survives Ray workers and the rounds a client sits out. A sampled client starts from y_i = x
and takes its K local steps on g_i(y_i) - c_i + c, then

    c_i+ = c_i - c + (x - y_i) / (K eta_l)          (option II: no extra gradient pass)

and sends Delta y_i = y_i - x (as y_i) and Delta c_i = c_i+ - c_i. The server takes

    x <- x + eta_g * (mean of the Delta y_i),   c <- c + (1 / N) * (sum of the Delta c_i),

N being the clients known so far (the nodes connected at any round's sampling).

What the paper leaves open, and what this module does:
- The mean of the Delta y_i is weighted by n_k, as FedAvg's (the paper writes a plain mean over
  the sampled clients; `aggregate_fn` replaces it), and BatchNorm's buffers are averaged as
  FedAvg averages them (the paper's models have none); c covers the parameters only.
- The correction is applied after each of the client's optimiser steps, y <- y - eta_l
  (c - c_i), eta_l the train config's "lr": with plain SGD exactly the paper's step on
  g_i - c_i + c. The paper covers plain SGD only; with momentum or Adam (train config
  "optimizer") the correction stays in the units option II measures the variates in, the
  optimiser's mean step per unit eta_l. (Added to the gradient instead, with SGD and
  momentum 0.9 the corrections were amplified tenfold and the example's federation fell
  from 70 % to 0 % accuracy in round 2.) The reported loss is the task's alone.
- Clients the server has not seen send a Delta c_i as well (from c_i = 0).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid
from torch import nn

from fedgo_flwr.inputs import labelled
from fedgo_flwr.replies import state_problem
from fedgo_flwr.strategies.base import (CLIENT_TRAINING, ClientModel, RoundReport,
                                        ServerUpdateFedAvg, message_seed, model_reply, retyped)
from fedgo_flwr.strategies.label_counts import TRAINING, train_as_configured

TRAIN_SCAFFOLD = "train.scaffold"
CONTROL = "control"  # the server's c, sent with each train message
CONTROL_DELTA = "control-delta"  # a client's Delta c_i, in its reply
CLIENT_CONTROL = "scaffold-control"  # c_i in the node's context.state


def zero_control(model: nn.Module) -> dict[str, torch.Tensor]:
    """A control variate of zeros, one tensor per parameter of `model`."""
    return {n: torch.zeros_like(p, device="cpu") for n, p in model.named_parameters()}


class SCAFFOLD(ServerUpdateFedAvg):
    """SCAFFOLD: FedAvg whose clients correct each local step by the control variates c - c_i.

    Parameters
    ----------
    model_fn : Callable[[], nn.Module]
        Builds the global model (the architecture of `initial_arrays`).
    global_lr : float (default: 1.0)
        eta_g, the server's step on the mean client update (1: the clients' average).
    seed, device, aggregate_fn, client_key, num_examples_fn, observers, max_failed_rounds
        As in `ServerUpdateFedAvg` (fedgo_flwr.strategies.base), and every keyword Flower's
        `FedAvg` takes.

    Its clients train with the library's loop (fedgo_flwr.client.register adds
    `controlled_update`): `start` needs "lr", "local-epochs" and "optimizer" in train_config.
    """

    client_training = CLIENT_TRAINING

    def __init__(self, *, model_fn: Callable[[], nn.Module], global_lr: float = 1.0,
                 **kwargs) -> None:
        super().__init__(model_fn=model_fn, **kwargs)
        if not global_lr > 0:
            raise ValueError(f"global_lr is {global_lr!r}; allowed: > 0")
        self.global_lr = float(global_lr)
        with torch.random.fork_rng(devices=[]):
            self.control = zero_control(model_fn())
        self.sent: dict[str, torch.Tensor] = {}  # x, the model this round started from
        self.known: set = set()  # every client key seen at sampling: N = len(known)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> list[Message]:
        """FedAvg's sampling; each message carries c, as message type train.scaffold."""
        self.sent = arrays.to_torch_state_dict()
        messages = super().configure_train(server_round, arrays, config, grid)
        self.known.update(self.client_keys.keys(grid, grid.get_node_ids()).values())
        return retyped(messages, TRAIN_SCAFFOLD, {CONTROL: ArrayRecord(self.control)}, {},
                       self.configrecord_key)

    def extra_arrays(self, server_round: int) -> tuple[str, ...]:
        return (CONTROL_DELTA,)

    def reply_problem(self, reply: Message, extras: tuple[str, ...] = ()) -> str | None:
        """FedAvg's checks, and a Delta c_i shaped like c."""
        return super().reply_problem(reply, extras) or (
            None if CONTROL_DELTA not in extras else state_problem(
                reply.content.array_records.get(CONTROL_DELTA), self.control))

    def server_update(self, server_round: int, averaged: ArrayRecord,
                      models: list[ClientModel], report: RoundReport
                      ) -> tuple[ArrayRecord, dict[str, float]]:
        """x + eta_g (mean y_i - x), and c + (1/N) sum Delta c_i."""
        mean = averaged.to_torch_state_dict()
        x = self.sent or mean
        new = {k: (x[k] + self.global_lr * (v - x[k])) if v.is_floating_point() else v
               for k, v in mean.items()}
        n = max(len(self.known), len(models))
        for m in models:
            for name, delta in m.extras[CONTROL_DELTA].to_torch_state_dict().items():
                self.control[name] += delta / n
        norm = float(torch.sqrt(sum((c.double() ** 2).sum() for c in self.control.values())))
        return ArrayRecord(new), {"control-norm": norm, "clients-known": n}


# ---------------------------------------------------------------------------- client side
def controlled_update(message: Message, model: nn.Module, data, state: RecordDict, *,
                      device: str | torch.device = "cpu", seed: int | None = None) -> Message:
    """A SCAFFOLD client's round: `model` (the user's, given the received x) trained on `data`
    (labelled: (images, labels), a Dataset or a DataLoader) with every step corrected by
    c - c_i, c_i read from and written back to `state` (the node's context.state; zero on a
    first round). Settings from the train config as label_counts.TRAINING reads them. The
    reply holds ArrayRecords "arrays" (y_i) and "control-delta" (Delta c_i) and MetricRecord
    "metrics" (num-examples, the loss under "train-loss-key", train-seconds, local-steps and
    control-kept, 1 where c_i came from `state`)."""
    conf, device = message.content.config_records["config"], torch.device(device)
    x, y = labelled(data)
    model.load_state_dict(message.content.array_records["arrays"].to_torch_state_dict())
    start = {n: p.detach().cpu().clone() for n, p in model.named_parameters()}
    c = message.content.array_records[CONTROL].to_torch_state_dict()
    own = state.array_records.get(CLIENT_CONTROL)
    c_i = own.to_torch_state_dict() if own is not None else zero_control(model)
    lr = float(conf.get("lr", TRAINING["lr"]))
    shift = {n: (lr * (c[n] - c_i[n])).to(device) for n in c}
    params = dict(model.named_parameters())
    steps = 0

    @torch.no_grad()
    def corrected() -> None:  # after each local step: y <- y - eta_l (c - c_i)
        nonlocal steps
        steps += 1
        for n, p in params.items():
            p.sub_(shift[n])

    result = train_as_configured(model, x, y, conf, device=device, after_step=corrected,
                                 seed=message_seed(message) if seed is None else seed)
    step = steps * lr
    trained = {n: p.detach().cpu() for n, p in model.named_parameters()}
    new = ({n: c_i[n] - c[n] + (start[n] - trained[n]) / step for n in c} if steps
           else dict(c_i))
    state.array_records[CLIENT_CONTROL] = ArrayRecord(new)
    delta = {n: new[n] - c_i[n] for n in c}
    return model_reply(message, model, len(y), result, {CONTROL_DELTA: ArrayRecord(delta)},
                       {"local-steps": steps, "control-kept": int(own is not None)})
