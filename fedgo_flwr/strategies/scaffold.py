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
- Under a server update (FedGO's, FedDF's distillation: `client_method=ControlVariates()`),
  c and the c_i are updated from the clients' Delta c_i as above, and x <- x + eta_g (mean
  Delta y_i) is the average the server then distils; the next round's x, which the clients'
  Delta y_i and c_i+ are measured from, is the distilled model.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from flwr.app import ArrayRecord, Message, RecordDict
from torch import nn

from fedgo_flwr.strategies.base import ClientModel, ServerUpdateFedAvg
from fedgo_flwr.strategies.messages import CLIENT_TRAINING
from fedgo_flwr.strategies.client_methods import ClientMethod, LocalTerms
from fedgo_flwr.strategies.label_counts import TRAINING

TRAIN_SCAFFOLD = "train.scaffold"
CONTROL = "control"  # the server's c, sent with each train message
CONTROL_DELTA = "control-delta"  # a client's Delta c_i, in its reply
CLIENT_CONTROL = "scaffold-control"  # c_i in the node's context.state


def zero_control(model: nn.Module) -> dict[str, torch.Tensor]:
    """A control variate of zeros, one tensor per parameter of `model`."""
    return {n: torch.zeros_like(p, device="cpu") for n, p in model.named_parameters()}


class ControlVariates(ClientMethod):
    """SCAFFOLD's clients, under any server: each local step corrected by c - c_i; the
    server steps x + eta_g (mean y_i - x) and c + (1/N) sum Delta c_i.

    Parameters
    ----------
    global_lr : float (default: 1.0)
        eta_g, the server's step on the mean client update (1: the clients' average).
    """

    name = "scaffold"
    message_type = TRAIN_SCAFFOLD

    def __init__(self, global_lr: float = 1.0) -> None:
        if not global_lr > 0:
            raise ValueError(f"global_lr is {global_lr!r}; allowed: > 0")
        self.global_lr = float(global_lr)
        self.sent: dict[str, torch.Tensor] = {}  # x, the model this round started from
        self.known: set = set()  # every client key seen at sampling: N = len(known)

    def bind(self, strategy) -> None:
        super().bind(strategy)
        with torch.random.fork_rng(devices=[]):
            self.control = zero_control(strategy.model_fn())

    def payload(self, server_round, arrays):
        """c, and x kept for the server's step."""
        self.sent = arrays.to_torch_state_dict()
        self.known = set(self.strategy.known_clients())
        return {CONTROL: ArrayRecord(self.control)}, {}

    def reply_templates(self) -> dict[str, dict[str, torch.Tensor]]:
        """A Delta c_i shaped like c."""
        return {CONTROL_DELTA: self.control}

    def server_step(self, server_round: int, averaged: ArrayRecord, models: list[ClientModel]
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

    def state_dict(self) -> dict:
        return {"control": self.control}

    def load_state_dict(self, state: dict) -> None:
        self.control = state["control"]

    # ------------------------------------------------------------------------ client side
    @staticmethod
    def terms(message: Message, model: nn.Module, state: RecordDict,
              device: torch.device) -> LocalTerms:
        """Every step corrected by c - c_i, c_i read from and written back to `state` (zero
        on a first round); the reply's Delta c_i, local-steps and control-kept (1 where c_i
        came from `state`)."""
        conf = message.content.config_records["config"]
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

        def finish() -> tuple[dict[str, ArrayRecord], dict]:
            trained = {n: p.detach().cpu() for n, p in model.named_parameters()}
            new = ({n: c_i[n] - c[n] + (start[n] - trained[n]) / (steps * lr) for n in c}
                   if steps else dict(c_i))
            state.array_records[CLIENT_CONTROL] = ArrayRecord(new)
            delta = {n: new[n] - c_i[n] for n in c}
            return ({CONTROL_DELTA: ArrayRecord(delta)},
                    {"local-steps": steps, "control-kept": int(own is not None)})

        return LocalTerms(after_step=corrected, finish=finish)


class SCAFFOLD(ServerUpdateFedAvg):
    """SCAFFOLD: FedAvg whose clients correct each local step by the control variates c - c_i
    (FedAvg with `client_method=ControlVariates(global_lr)`).

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
    `local_update`): `start` needs "lr", "local-epochs" and "optimizer" in train_config.
    """

    client_training = CLIENT_TRAINING  # its clients' method trains with the library's loop

    def __init__(self, *, model_fn: Callable[[], nn.Module], global_lr: float = 1.0,
                 **kwargs) -> None:
        super().__init__(model_fn=model_fn, client_method=ControlVariates(global_lr),
                         **kwargs)
