"""FedProx (Li et al., 2020): each client minimises its loss plus the proximal term
(mu / 2) ||w - w^t||^2, w^t being the global model it received; the server averages as FedAvg.
mu = 0.001 as tuned in the FedGO paper (App. E.2).

The proximal term is a change to the clients alone, so it composes with any server:
`fedprox-base` names the strategy whose server (and other client handlers) it runs under:
"fedavg" is FedProx as published, "fedgo" is FedGO with proximal local training.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedgo_app.strategies.registry import StrategySpec
from fedgo_flwr.keys import POSITIVE, choice, key


@dataclass(frozen=True)
class FedProxKeys:
    """Run-config keys fedprox-*."""
    mu: float = key(0.001, "the proximal coefficient mu (tuned in FedGO's App. E.2); mu = 0 "
                    "would be the base strategy itself", POSITIVE)
    base: str = key("fedavg", "the strategy whose server and other client handlers FedProx "
                    "runs under: fedavg is FedProx as published; fedgo (or feddf) gives that "
                    "server with proximal local training")

    def validate(self, cfg, strategies) -> None:
        # The proximal term joins the library's client step: any server whose clients take
        # a client method (not FedGen's own local objective, not another client method).
        choice("fedprox-base", self.base, [name for name in strategies
                                           if strategies.takes_client_method(name)])


# ---------------------------------------------------------------------------- server side
def proximal(cfg) -> dict:
    """FedProx's clients as the library's keyword: mu goes out as "proximal-mu" in every
    train config, as Flower's FedProx sends it."""
    return {"proximal_mu": cfg.keys("fedprox").mu}


def server(setup, record, base: StrategySpec):
    """The base strategy's server on FedProx's clients: fedprox-base = X is X with
    client-method = fedprox (tests/test_client_methods.py checks the two are one run)."""
    setup.client_keywords = proximal(setup.cfg)
    return base.server(setup, record)


# The base strategy's handlers: its `train` adds the proximal term where the train config
# has "proximal-mu" (fedgo_app/strategies/clients.py).
FEDPROX = StrategySpec("fedprox", server, {}, keys=FedProxKeys, wraps="base",
                       clients=proximal)
