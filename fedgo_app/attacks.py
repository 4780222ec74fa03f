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
    alie, ipm          colluding liars send theta_g + ByzFL's ALittleIsEnough (tau = s) or
                       InnerProductManipulation (tau = s) of the round's honest updates

The liars: `byzantine-clients = N`, a seeded choice of N of the K partitions, or
`byzantine-partitions = "0,3,7"`, those. Only floating-point tensors are changed (BatchNorm's
counters stay as trained).

ALIE and IPM are omniscient: the liars craft their update from the honest updates of the
round, which no client sees. In this simulation the server stands in for the colluders: it
replaces the liars' replies before aggregating (`colluded`, the one attack step outside the
clients). They use ByzFL's implementations, an optional extra: pip install
'fedgo-flwr[byzantine]'; every other attack works without it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np
import torch
from flwr.app import ArrayRecord, Message, RecordDict

from fedgo_app.client_context import Local, config_of
from fedgo_flwr.seeds import client_seed
from fedgo_flwr.strategies.dafkd import TRAIN_DAFKD
from fedgo_flwr.strategies.fedbpg import TRAIN_FEDBPG
from fedgo_flwr.strategies.fedgen import TRAIN_FEDGEN
from fedgo_flwr.strategies.fedgkd import TRAIN_FEDGKD
from fedgo_flwr.strategies.fedtgp import TRAIN_FEDTGP
from fedgo_flwr.strategies.feduv import TRAIN_FEDUV
from fedgo_flwr.strategies.rounds import ClientModel
from fedgo_flwr.strategies.scaffold import TRAIN_SCAFFOLD

# Every message type that trains the classifier: what a Byzantine client lies in.
MODEL_TRAINING = frozenset({"train", TRAIN_SCAFFOLD, TRAIN_FEDUV, TRAIN_FEDGKD, TRAIN_DAFKD,
                            TRAIN_FEDGEN, TRAIN_FEDTGP, TRAIN_FEDBPG})

COLLUDING = ("alie", "ipm")  # crafted from the round's honest updates: `colluded`
ATTACKS = ("none", "discriminator-max", "sign-flip", "scale", "gaussian", "label-flip",
           "inflate-examples", *COLLUDING)
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


def byzfl_problem() -> str | None:
    """Why the colluding attacks cannot run here, or None."""
    try:
        import byzfl  # noqa: F401
    except ImportError:
        return ("needs ByzFL, an optional extra: pip install 'fedgo-flwr[byzantine]' "
                "(or pip install byzfl==0.0.11)")
    return None


def colluded(attack: str, s: float, states: list[dict[str, torch.Tensor]], liars: list[bool],
             sent: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """ALIE / IPM: each liar's model replaced by theta_g + ByzFL's attack vector on the
    honest updates theta_k - theta_g (floating-point tensors, flattened as one vector)."""
    from byzfl import ALittleIsEnough, InnerProductManipulation
    honest = [s_ for s_, liar in zip(states, liars) if not liar]
    if not any(liars) or len(honest) < 2:  # ALIE needs a spread of honest updates
        return states
    names = [n for n, v in sent.items() if v.is_floating_point()]
    flat = lambda state: torch.cat([(state[n] - sent[n]).flatten().double()  # noqa: E731
                                    for n in names])
    craft = {"alie": ALittleIsEnough, "ipm": InnerProductManipulation}[attack](tau=float(s))
    vector = craft([flat(h) for h in honest])
    crafted, start = {}, 0
    for n in names:
        size = sent[n].numel()
        crafted[n] = sent[n] + vector[start:start + size].reshape(sent[n].shape).to(sent[n].dtype)
        start += size
    return [{**state, **crafted} if liar else state for state, liar in zip(states, liars)]


def colluded_models(cfg, models: list[ClientModel], liars: set[int],
                    previous: dict[str, dict], architecture_of: Callable[[int], str]
                    ) -> list[ClientModel]:
    """The round's usable models with the colluders' (`cfg.attack` of COLLUDING) as they
    would send them: the simulation stands in for the colluders, who know the honest models
    of their architecture and its theta_g (`previous`: {architecture: theta_g})."""
    by_key = {}
    for a, sent in previous.items():
        group = [m for m in models if architecture_of(m.key) == a]
        states = colluded(cfg.attack, cfg.attack_scale, [m.state for m in group],
                          [m.key in liars for m in group], sent)
        by_key.update((m.key, with_state(m, s)) for m, s in zip(group, states))
    return [by_key[m.key] for m in models]


def with_state(model: ClientModel, state: dict[str, torch.Tensor]) -> ClientModel:
    """`model` carrying other arrays (its metrics as they were)."""
    (key, _), = model.content.array_records.items()
    return replace(model, content=RecordDict({key: ArrayRecord(state),
                                              **model.content.metric_records}))


def attacked(cfg, message_type: str, handler: Handler) -> Handler:
    """`handler`, lying as `attack` says on the Byzantine partitions."""
    if cfg.attack in ("none", *COLLUDING):  # colluders answer honestly; see `colluded`
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
    if attack == "label-flip" and message_type in MODEL_TRAINING:
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
    elif attack in ("sign-flip", "scale", "gaussian") and message_type in MODEL_TRAINING:
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
