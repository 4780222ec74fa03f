"""The strategy registry: run-config `strategy` -> StrategySpec (server strategy, client
handlers, declared keys). A new method is one module and one line here."""

from fedgo_app.strategies.base import FEDAVG, FedAvgStrategy, RoundGrid, ServerSetup
from fedgo_app.strategies.dafkd import DAFKD
from fedgo_app.strategies.fedbpg import FEDBPG
from fedgo_app.strategies.feddf import FEDDF, FedDFApp
from fedgo_app.strategies.feddisco import FEDDISCO
from fedgo_app.strategies.fedgen import FEDGEN
from fedgo_app.strategies.fedgkd import FEDGKD
from fedgo_app.strategies.fedgo import FEDGO, FedGOApp
from fedgo_app.strategies.fedprox import FEDPROX
from fedgo_app.strategies.fedtgp import FEDTGP
from fedgo_app.strategies.feduv import FEDUV
from fedgo_app.strategies.registry import Registry, StrategySpec
from fedgo_app.strategies.scaffold import SCAFFOLD

STRATEGIES = Registry()
for spec in (
    FEDAVG,
    FEDDF,
    FEDGO,
    FEDPROX,
    FEDGEN,
    DAFKD,
    FEDBPG,
    SCAFFOLD,
    FEDDISCO,
    FEDUV,
    FEDGKD,
    FEDTGP,
):
    STRATEGIES.register(spec)

__all__ = ["STRATEGIES", "FedAvgStrategy", "FedDFApp", "FedGOApp", "RoundGrid", "ServerSetup",
           "StrategySpec"]
