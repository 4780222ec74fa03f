"""Strategy registry: run-config `strategy` -> class. A new baseline is one module and one line."""

from fedgo_flwr.strategies.base import FedAvgStrategy, ServerSetup
from fedgo_flwr.strategies.fedgo import FedGO

STRATEGIES = {
    "fedavg": FedAvgStrategy,
    "fedgo": FedGO,
}

__all__ = ["STRATEGIES", "FedAvgStrategy", "FedGO", "ServerSetup"]
