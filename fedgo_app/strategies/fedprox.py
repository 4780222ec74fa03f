"""FedProx (Li et al., 2020): each client minimises its loss plus the proximal term
(mu / 2) ||w - w^t||^2, w^t being the global model it received; the server averages as FedAvg.
mu = 0.001 as tuned in the FedGO paper (App. E.2).

The proximal term is a change to the clients alone, so it composes with any server:
`fedprox-base` names the strategy whose server (and other client handlers) it runs under:
"fedavg" is FedProx as published, "fedgo" is FedGO with proximal local training.
"""

from __future__ import annotations

from dataclasses import dataclass

from flwr.app import Message

from fedgo_app.client_context import Local, config_of
from fedgo_flwr.keys import POSITIVE, choice, key
from fedgo_app.strategies.base import CLIENT, local_update
from fedgo_app.strategies.registry import StrategySpec
from fedgo_flwr.client import proximal_term


@dataclass(frozen=True)
class FedProxKeys:
    """Run-config keys fedprox-*."""
    mu: float = key(0.001, "the proximal coefficient mu (tuned in FedGO's App. E.2); mu = 0 "
                    "would be the base strategy itself", POSITIVE)
    base: str = key("fedavg", "the strategy whose server and other client handlers FedProx "
                    "runs under: fedavg is FedProx as published; fedgo (or feddf) gives that "
                    "server with proximal local training")

    def validate(self, cfg, strategies) -> None:
        # The proximal term replaces the plain ClientUpdate: it composes with the strategies
        # whose clients train as FedAvg's do (not with FedGen's own local objective).
        choice("fedprox-base", self.base, [name for name, spec in strategies.items()
                                           if spec.handlers.get("train") is CLIENT["train"]])


# ---------------------------------------------------------------------------- server side
def server(setup, record, base: StrategySpec):
    """The base strategy's server with the library's `proximal_mu`: mu goes out as
    "proximal-mu" in every train config, as Flower's FedProx sends it."""
    mu = setup.cfg.keys("fedprox").mu

    class FedProx(base.server):
        def __init__(self, setup, record):
            super().__init__(setup, record)
            self.proximal_mu = mu

    FedProx.__qualname__ = f"FedProx[{base.server.__name__}]"
    return FedProx(setup, record)


# ---------------------------------------------------------------------------- client side
def proximal_update(message: Message, local: Local) -> Message:
    """ClientUpdate with the proximal term around the received model."""
    model = local.classifier(message)
    anchor = [w.detach().clone().to(local.device) for w in model.parameters()]
    mu = float(config_of(message)["proximal-mu"])
    return local_update(message, local, model,
                        extra_loss=lambda m: proximal_term(m, anchor, mu))


# The base strategy's handlers, with the proximal ClientUpdate for `train`.
FEDPROX = StrategySpec("fedprox", server, {"train": proximal_update}, keys=FedProxKeys,
                       wraps="base")
