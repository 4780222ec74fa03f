"""The ClientApp's handlers every strategy starts from (query, train, evaluate, the guard's
candidates, the library's partition query); a strategy adds or replaces its own."""

from __future__ import annotations

from typing import Callable

import torch
from flwr.app import ConfigRecord, Message

from fedgo_app.client_context import Local, config_of, reply
from fedgo_flwr.guard import EVALUATE_CANDIDATES
from fedgo_flwr.guard import evaluate_candidates as evaluate_library_candidates
from fedgo_flwr.models import create_classifier
from fedgo_flwr.sampling import PARTITION_ID, QUERY_PARTITION, partition_reply
from fedgo_flwr.seeds import client_seed
from fedgo_flwr.strategies.client_methods import local_update
from fedgo_flwr.strategies.fedgkd import TRAIN_FEDGKD
from fedgo_flwr.strategies.feduv import TRAIN_FEDUV
from fedgo_flwr.strategies.scaffold import TRAIN_SCAFFOLD
from fedgo_flwr.train import evaluate


def info(message: Message, local: Local) -> Message:
    """Partition id, partition count and n_k (the server keys clients by these), the class
    names (the server refuses a node whose classes are not its own) and the architecture it
    runs; the label histogram only when the server's config asks (diagnostics)."""
    reply_ = {"partition-id": local.partition_id, "num-partitions": local.num_partitions,
              "num-examples": len(local.y)}
    if config_of(message).get("label-histogram"):
        reply_["label-histogram"] = torch.bincount(local.y, minlength=local.num_classes).tolist()
    answer = reply(message, reply_, key="info")
    answer.content.config_records["classes"] = ConfigRecord({"names": list(local.classes)})
    answer.content.config_records["model"] = ConfigRecord({"name": local.model})
    return answer


def evaluate_local(message: Message, local: Local) -> Message:
    """The global classifier's loss and accuracy on the client's personal test split
    (personal-test-fraction), or on S_k without one."""
    x, y = (local.test_x, local.test_y) if len(local.test_y) else (local.x, local.y)
    acc, loss = evaluate(local.classifier(message), x, y, device=local.device)
    return reply(message, {"num-examples": len(y), "eval-acc": acc, "eval-loss": loss})


def evaluate_candidates(message: Message, local: Local) -> Message:
    """The guard's question (fedgo_flwr.guard): each classifier the server sent scored on
    S_k, in this client's architecture."""
    c, h, _ = local.image_shape
    return evaluate_library_candidates(
        message, lambda: create_classifier(local.model or local.cfg.model, c,
                                           local.num_classes, h),
        (local.x, local.y), device=local.device)


def library_step(client_step: Callable[..., Message], state: bool = False
                 ) -> Callable[[Message, Local], Message]:
    """The handler of a method whose client step is the library's (SCAFFOLD's, FedUV's, ...):
    `client_step` on S_k with this client's architecture, seeded by the partition id, and given the
    node's state where the method keeps one there."""
    def handler(message: Message, local: Local) -> Message:
        seed = client_seed(int(config_of(message)["seed"]), local.partition_id)
        kept = (local.state,) if state else ()
        return client_step(message, local.classifier(message), (local.x, local.y), *kept,
                           device=local.device, seed=seed)
    return handler


# The train messages of the library's client methods: `train` under their own types.
CLIENT_METHOD_TYPES = (TRAIN_SCAFFOLD, TRAIN_FEDUV, TRAIN_FEDGKD)

# ClientUpdate: the library's one client step (fedgo_flwr.strategies.client_methods), with
# FedProx's term where the train config has "proximal-mu" and the terms of the clients'
# method it names (SCAFFOLD's, FedUV's, FedGKD's), under any server.
train = library_step(local_update, state=True)


def partition(message: Message, local: Local) -> Message:
    """The library's partition query (`client_key="partition-id"`)."""
    return partition_reply(message, {PARTITION_ID: local.partition_id})


CLIENT = {"query": info, "train": train, "evaluate": evaluate_local,
          EVALUATE_CANDIDATES: evaluate_candidates, QUERY_PARTITION: partition,
          **{t: train for t in CLIENT_METHOD_TYPES}}
