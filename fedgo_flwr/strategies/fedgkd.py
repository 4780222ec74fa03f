"""FedGKD+ (Yao et al., "Local-Global Knowledge Distillation in Heterogeneous Federated
Learning with Non-IID Data", 2021, as the FedGO paper runs it: App. E.2, M = 5, tau = 3,
gamma = 0.001), one of its Table 3 baselines.

FedGKD: the server keeps a buffer of its last M global models and sends their parameter
average with each round; each client adds to its cross-entropy the distillation from that
historical model on the same minibatch,

    (gamma / 2) * KL(softmax(f_hist(x) / tau) || softmax(f(x) / tau)).

The "+": the FedGO paper lists FedGKD+ among the methods "that incorporate ensemble
distillation" beside FedDF and DaFKD, so the server then distils the average toward the
clients' uniform ensemble on U, FedDF's update with every budget of the shared protocol
(`distill_epochs=0` leaves it out: FedGKD as its own paper has it).

What the papers leave open, and what this module does: the buffer holds the model each
round starts from (the initial model in round 1, then each round's new global model), M of
them at most; integer buffers (BatchNorm's counters) are the newest model's; the
distillation term carries no tau^2 factor (the FedGO paper's description: the loss times
gamma / 2) and is part of the reported training loss.
"""

from __future__ import annotations

import copy
from collections import deque

import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, Message, RecordDict
from torch import nn

from fedgo_flwr.strategies.client_methods import ClientMethod, LocalTerms
from fedgo_flwr.strategies.messages import CLIENT_TRAINING
from fedgo_flwr.strategies.feddf import FedDF

TRAIN_FEDGKD = "train.fedgkd"
HISTORICAL = "historical"  # the buffer's average, sent with each train message


def buffer_average(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The parameter average of the buffered models (integer tensors: the newest's)."""
    newest = states[-1]
    return {k: (torch.stack([s[k].double() for s in states]).mean(0).to(v.dtype)
                if v.is_floating_point() else v.clone()) for k, v in newest.items()}


class HistoricalTeacher(ClientMethod):
    """FedGKD's clients, under any server: each round's model joins a buffer of the last M,
    whose average every train message carries; the clients add (gamma / 2) KL(p_hist || p)
    at temperature tau to their cross-entropy.

    Parameters
    ----------
    buffer_size : int (default: 5)
        M, the global models kept.
    kd_temperature : float (default: 3.0)
        tau.
    kd_weight : float (default: 0.001)
        gamma; the term is weighted gamma / 2.
    """

    name = "fedgkd"
    message_type = TRAIN_FEDGKD

    def __init__(self, buffer_size: int = 5, kd_temperature: float = 3.0,
                 kd_weight: float = 0.001) -> None:
        if buffer_size < 1 or kd_temperature <= 0 or kd_weight < 0:
            raise ValueError(f"buffer_size >= 1, kd_temperature > 0 and kd_weight >= 0 are "
                             f"needed; got {buffer_size}, {kd_temperature}, {kd_weight}")
        self.buffer: deque = deque(maxlen=buffer_size)
        self.kd = {"kd-temperature": float(kd_temperature), "kd-weight": float(kd_weight)}

    def payload(self, server_round, arrays):
        """The round's model into the buffer; the buffer's average, tau and gamma."""
        self.buffer.append(arrays.to_torch_state_dict())
        return {HISTORICAL: ArrayRecord(buffer_average(list(self.buffer)))}, self.kd

    def state_dict(self) -> dict:
        return {"buffer": list(self.buffer)}

    def load_state_dict(self, state: dict) -> None:
        self.buffer.clear()
        self.buffer.extend(state["buffer"])

    # ------------------------------------------------------------------------ client side
    @staticmethod
    def terms(message: Message, model: nn.Module, state: RecordDict,
              device: torch.device) -> LocalTerms:
        """(kd-weight / 2) KL(p_hist || p) at kd-temperature, p_hist the received historical
        model's softened output on the same minibatch."""
        conf = message.content.config_records["config"]
        teacher = copy.deepcopy(model)
        teacher.load_state_dict(message.content.array_records[HISTORICAL].to_torch_state_dict())
        teacher.to(device).eval()
        tau, gamma = float(conf["kd-temperature"]), float(conf["kd-weight"])

        def distillation(inputs: torch.Tensor, logits: torch.Tensor, _: torch.Tensor
                         ) -> torch.Tensor:
            with torch.no_grad():
                target = F.softmax(teacher(inputs) / tau, dim=1)
            return gamma / 2 * F.kl_div(F.log_softmax(logits / tau, dim=1), target,
                                        reduction="batchmean")

        return LocalTerms(batch_term=distillation)


class FedGKD(FedDF):
    """FedGKD+: clients distil from the average of the last M global models; the server
    distils the average toward the clients' ensemble on U (FedDF with
    `client_method=HistoricalTeacher(buffer_size, kd_temperature, kd_weight)`).

    Parameters
    ----------
    buffer_size, kd_temperature, kd_weight : (default: 5, 3.0, 0.001)
        M, tau and gamma, as in `HistoricalTeacher`.
    unlabeled_data, model_fn, distill_*, ... and every other keyword
        As in `FedDF` (fedgo_flwr.strategies.feddf); `distill_epochs=0` is FedGKD without "+".

    Its clients train with the library's loop (`fedgo_flwr.client.register` adds
    `local_update`): `start` needs "lr", "local-epochs" and "optimizer" in train_config.
    """

    client_training = CLIENT_TRAINING  # its clients' method trains with the library's loop

    def __init__(self, *, buffer_size: int = 5, kd_temperature: float = 3.0,
                 kd_weight: float = 0.001, **kwargs) -> None:
        super().__init__(client_method=HistoricalTeacher(buffer_size, kd_temperature,
                                                         kd_weight), **kwargs)
