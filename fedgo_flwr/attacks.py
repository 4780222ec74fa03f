"""Byzantine clients: what a lying client does, as a wrapper around the running strategy's client
handlers for the chosen partitions (the registry hands the ClientApp the wrapped handler; no
strategy and no app mentions an attack). `attack` chooses, `attack-scale` is its s:

    none               every client is honest (the default)
    discriminator-max  the paper's Byzantine discriminator (FedGO App. F.8): D_k says "real"
                       with the highest odds on every image
    sign-flip          trains, then sends theta_g - s (theta_k - theta_g)
    scale              trains, then sends theta_g + s (theta_k - theta_g)
    gaussian           sends theta_g + N(0, s^2) on every weight (seeded per round and client)
    label-flip         trains on the labels C - 1 - y
    inflate-examples   reports num-examples = 10^6 in every reply (discovery included)

The liars: `byzantine-clients = N`, a seeded choice of N of the K partitions, or
`byzantine-partitions = "0,3,7"`, those. Only floating-point tensors are changed (BatchNorm's
counters stay as trained). Crafted collusion attacks (ALIE, IPM) need the honest updates of
others; they are not here.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np
import torch
from flwr.app import ArrayRecord, Message

from fedgo_flwr.client_context import Local, config_of
from fedgo_flwr.seeds import client_seed

ATTACKS = ("none", "discriminator-max", "sign-flip", "scale", "gaussian", "label-flip",
           "inflate-examples")
INFLATED_EXAMPLES = 10 ** 6
Handler = Callable[[Message, Local], Message]


def byzantine_partitions(count: int, ids: str, num_partitions: int, seed: int) -> list[int]:
    """The liars' partition ids: `ids` ("0,3,7") when given, else a seeded choice of `count`
    of 0..K-1."""
    if ids.strip():
        chosen = sorted({int(p) for p in ids.split(",")})
        if not 0 <= chosen[0] <= chosen[-1] < num_partitions:
            raise ValueError(f"byzantine-partitions {ids!r} names partitions outside "
                             f"0..{num_partitions - 1}")
        return chosen
    if count > num_partitions:
        raise ValueError(f"byzantine-clients = {count}, but there are {num_partitions} "
                         "partitions")
    rng = np.random.default_rng(seed + 7919)  # apart from the partition and sampling seeds
    return sorted(int(p) for p in rng.choice(num_partitions, count, replace=False))


def well_formed_ids(ids: str) -> bool:
    """Whether `ids` is empty or a comma-separated list of partition ids."""
    return not ids.strip() or all(p.strip().isdigit() for p in ids.split(","))


def attacked(cfg, message_type: str, handler: Handler) -> Handler:
    """`handler`, lying as `attack` says on the Byzantine partitions."""
    if cfg.attack == "none":
        return handler

    def handle(message: Message, local: Local) -> Message:
        liars = byzantine_partitions(cfg.byzantine_clients, cfg.byzantine_partitions,
                                     local.num_partitions, cfg.seed)
        if local.partition_id not in liars:
            return handler(message, local)
        return lie(cfg.attack, cfg.attack_scale, message_type, message, local, handler)
    return handle


def lie(attack: str, s: float, message_type: str, message: Message, local: Local,
        handler: Handler) -> Message:
    if attack == "label-flip" and message_type == "train":
        return handler(message, replace(local, y=local.num_classes - 1 - local.y))
    answer = handler(message, local)
    if answer.has_error():
        return answer
    if attack == "inflate-examples":  # in every record that carries it ("info" at discovery)
        for record in answer.content.metric_records.values():
            if "num-examples" in record:
                record["num-examples"] = INFLATED_EXAMPLES
    elif attack == "discriminator-max" and "discriminator" in answer.content.array_records:
        state = answer.content.array_records["discriminator"].to_torch_state_dict()
        answer.content.array_records["discriminator"] = ArrayRecord(saturated(state))
    elif attack in ("sign-flip", "scale", "gaussian") and message_type == "train":
        sent = message.content.array_records["arrays"].to_torch_state_dict()
        trained = answer.content.array_records["arrays"].to_torch_state_dict()
        noise = torch.Generator().manual_seed(
            client_seed(int(config_of(message)["seed"]), local.partition_id))
        answer.content.array_records["arrays"] = ArrayRecord(
            {name: crafted(attack, s, sent[name], value, noise)
             for name, value in trained.items()})
    return answer


def crafted(attack: str, s: float, sent: torch.Tensor, trained: torch.Tensor,
            noise: torch.Generator) -> torch.Tensor:
    """One tensor of a sign-flipped, scaled or Gaussian update (integers stay as trained)."""
    if not trained.is_floating_point():
        return trained
    if attack == "gaussian":
        return sent + s * torch.randn(sent.shape, generator=noise, dtype=sent.dtype)
    return sent + (-s if attack == "sign-flip" else s) * (trained - sent)


def saturated(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The paper's Byzantine discriminator from an honest one's weights: the last batch norm
    outputs a constant 1 (weight 0, bias 1) and the last convolution sums it with weight 1, so
    the logit is as large as the layer is wide, and D_k(x) is at its maximum, for every x."""
    state = dict(state)
    norm = [n[:-len(".running_mean")] for n in state if n.endswith(".running_mean")][-1]
    state[f"{norm}.weight"] = torch.zeros_like(state[f"{norm}.weight"])
    state[f"{norm}.bias"] = torch.ones_like(state[f"{norm}.bias"])
    last = [n for n in state if n.endswith(".weight") and state[n].dim() == 4][-1]
    state[last] = torch.ones_like(state[last])
    return state
