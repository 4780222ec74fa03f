"""Strategy registry: run-config `strategy` -> class. A new baseline is one module and one line."""

from fedgo_flwr.strategies.base import FedAvgStrategy, ServerSetup
from fedgo_flwr.strategies.feddf import FedDF
from fedgo_flwr.strategies.fedgo import FedGO

STRATEGIES = {
    "fedavg": FedAvgStrategy,
    "feddf": FedDF,
    "fedgo": FedGO,
}

__all__ = ["STRATEGIES", "FedAvgStrategy", "FedDF", "FedGO", "ServerSetup"]
