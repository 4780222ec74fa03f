"""The strategy registry: run-config `strategy` -> StrategySpec (server strategy, client
handlers, declared keys). A new method is one module and one line here."""

from fedgo_flwr.strategies.base import FEDAVG, FedAvgStrategy, ServerSetup
from fedgo_flwr.strategies.dafkd import DAFKD
from fedgo_flwr.strategies.fedbpg import FEDBPG
from fedgo_flwr.strategies.feddf import FEDDF, FedDF
from fedgo_flwr.strategies.fedgen import FEDGEN
from fedgo_flwr.strategies.fedgo import FEDGO, FedGO
from fedgo_flwr.strategies.fedprox import FEDPROX
from fedgo_flwr.strategies.registry import Registry, StrategySpec

STRATEGIES = Registry()
for spec in (
    FEDAVG,
    FEDDF,
    FEDGO,
    FEDPROX,
    FEDGEN,
    DAFKD,
    FEDBPG,
):
    STRATEGIES.register(spec)

__all__ = ["STRATEGIES", "FedAvgStrategy", "FedDF", "FedGO", "ServerSetup", "StrategySpec"]
