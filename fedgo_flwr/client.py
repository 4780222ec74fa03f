"""What a client of each method does, over the user's own model and data: plain functions a
ClientApp handler calls, and `register`, which adds them to a user's `ClientApp` at once.

A FedDF client trains as FedAvg's does (Flower's own `train` handler); a client of Flower's own
`FedProx` adds `proximal_term` to its loss. FedGO's server sends message type
`train.discriminator` once (Algorithm 3); DaFKD's sends `train.dafkd` instead of `train`
every round, FedGen's `train.fedgen`, FedTGP's `train.fedtgp`; the client methods' (under
any server, fedgo_flwr.strategies.client_methods) FedGKD's `train.fedgkd`, FedUV's
`train.feduv`, SCAFFOLD's `train.scaffold` (the clients' control variates kept in
`context.state`), all answered by `local_update`;
FedBPG's `train.fedbpg` and, for its clients' personal models, `evaluate.fedbpg` instead of
`evaluate`; FedDisco asks each client once `query.label_counts`. The distillation guard's
`ClientsGuard` sends `evaluate.candidates`; `client_key="partition-id"` sends
`query.partition` once a node. docs/protocol.md lists every message and record key."""

from __future__ import annotations

from collections.abc import Callable

import torch
from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from torch import nn

from fedgo_flwr.guard import EVALUATE_CANDIDATES, evaluate_candidates
from fedgo_flwr.sampling import QUERY_PARTITION, partition_reply
from fedgo_flwr.seeds import client_seed
from fedgo_flwr.strategies.dafkd import TRAIN_DAFKD, domain_aware_update
from fedgo_flwr.strategies.feddisco import QUERY_LABEL_COUNTS, label_counts_reply
from fedgo_flwr.strategies.client_methods import local_update, proximal_term
from fedgo_flwr.strategies.fedgkd import TRAIN_FEDGKD
from fedgo_flwr.strategies.fedtgp import TRAIN_FEDTGP, prototype_update
from fedgo_flwr.strategies.feduv import TRAIN_FEDUV
from fedgo_flwr.strategies.fedbpg import (EVALUATE_FEDBPG, TRAIN_FEDBPG, personalised_evaluate,
                                          personalised_update)
from fedgo_flwr.strategies.fedgen import TRAIN_FEDGEN, generated_feature_update
from fedgo_flwr.strategies.fedgo import TRAIN_DISCRIMINATOR, discriminator_update
from fedgo_flwr.strategies.scaffold import TRAIN_SCAFFOLD

__all__ = ["discriminator_update", "domain_aware_update",
           "evaluate_candidates", "generated_feature_update", "local_update",
           "label_counts_reply", "partition_reply", "personalised_evaluate",
           "personalised_update", "proximal_term", "register"]


def partition_seed(message: Message, context: Context) -> int | None:
    """This client's seed from the message's "seed" and the node's partition id, where its
    node_config has one: the same seed for a client in every run, whatever id its node gets
    (None: the helpers fall back on the node id)."""
    pid = context.node_config.get("partition-id")
    if pid is None:
        return None
    return client_seed(int(message.content.config_records["config"].get("seed", 0)), int(pid))


def register(app: ClientApp, *, model_fn: Callable[[], nn.Module],
             data_fn: Callable[[Context], object],
             device: str | torch.device | None = None,
             test_data_fn: Callable[[Context], object] | None = None,
             discriminator_fn: Callable[[], nn.Module] | None = None,
             generator_fn: Callable[[], nn.Module] | None = None) -> None:
    """Add the handlers of FedGO's, DaFKD's, FedGen's and FedBPG's own messages, the
    guard's and the partition query's to `app`, beside its train and evaluate handlers.

    Parameters
    ----------
    app : ClientApp
        The user's ClientApp.
    model_fn : Callable[[], nn.Module]
        Builds the user's model (DaFKD's, FedGen's and FedBPG's clients train it with the
        received weights).
    data_fn : Callable[[Context], data]
        The node's labelled training data: (images, labels) tensors, a torch Dataset or a
        DataLoader (fedgo_flwr.inputs).
    device : str | torch.device | None (default: None)
        Where clients train: None picks CUDA when visible, else the CPU.
    test_data_fn : Callable[[Context], data] | None (default: None)
        The node's labelled test data, on which FedBPG's clients score their personal
        models; None scores them on the training data.
    discriminator_fn, generator_fn : Callable[[], nn.Module] | None (default: None)
        Build FedGO's D_k and G where the server uses modules of its own (its FedGO's
        `discriminator_fn`, its `generator`'s maker); None: the library's, built for the
        client's image size.
    """
    handlers = client_handlers(model_fn, data_fn, device, test_data_fn, discriminator_fn,
                               generator_fn)
    for message_type, handler in handlers.items():
        kind, _, name = message_type.partition(".")
        getattr(app, kind)(name)(handler)


def client_handlers(model_fn: Callable[[], nn.Module], data_fn: Callable[[Context], object],
                    device, test_data_fn, discriminator_fn, generator_fn
                    ) -> dict[str, Callable[[Message, Context], Message]]:
    """Each message type's handler over the user's model and data (`register`'s keywords)."""
    def where() -> torch.device:
        return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))

    def trains(update, state: bool = False, seeded: bool = True):
        """A handler running a method's client step on the user's model and data (and the
        node's context.state), seeded by the partition where the node has one."""
        def handler(message: Message, context: Context) -> Message:
            seed = {"seed": partition_seed(message, context)} if seeded else {}
            kept = (context.state,) if state else ()
            return update(message, model_fn(), data_fn(context), *kept, device=where(), **seed)
        return handler

    def discriminator(message: Message, context: Context) -> Message:
        return discriminator_update(message, data_fn(context), device=where(),
                                    seed=partition_seed(message, context),
                                    discriminator_fn=discriminator_fn, generator_fn=generator_fn)

    def fedbpg_evaluate(message: Message, context: Context) -> Message:
        test = test_data_fn(context) if test_data_fn is not None else None
        return personalised_evaluate(message, model_fn(), data_fn(context), context.state,
                                     test_data=test, device=where())

    def candidates(message: Message, context: Context) -> Message:
        return evaluate_candidates(message, model_fn, data_fn(context), device=where())

    return {TRAIN_DISCRIMINATOR: discriminator, EVALUATE_CANDIDATES: candidates,
            QUERY_PARTITION: lambda m, context: partition_reply(m, context.node_config),
            QUERY_LABEL_COUNTS: lambda m, context: label_counts_reply(m, data_fn(context)),
            TRAIN_DAFKD: trains(domain_aware_update, state=True),  # a client method's c_i
            TRAIN_FEDGEN: trains(generated_feature_update),
            # the client methods' (SCAFFOLD's, FedGKD's, FedUV's): one step, its terms named
            # by the train config
            **{t: trains(local_update, state=True) for t in (TRAIN_SCAFFOLD, TRAIN_FEDGKD,
                                                              TRAIN_FEDUV)},
            TRAIN_FEDTGP: trains(prototype_update),
            TRAIN_FEDBPG: trains(personalised_update, state=True, seeded=False),
            EVALUATE_FEDBPG: fedbpg_evaluate}
