"""The library's strategies: Flower `FedAvg` subclasses whose `start()` works as Flower
documents it (a pre-FL stage first where the method has one). One module per method, server
and client side, on the shared base (base.py): FedAvg, checked replies, a server update."""

from fedgo_flwr.strategies.base import ServerUpdateFedAvg
from fedgo_flwr.strategies.dafkd import DaFKD
from fedgo_flwr.strategies.ensemble import EnsembleDistillation
from fedgo_flwr.strategies.fedbpg import FedBPG
from fedgo_flwr.strategies.feddf import FedDF
from fedgo_flwr.strategies.feddisco import FedDisco
from fedgo_flwr.strategies.fedgkd import FedGKD
from fedgo_flwr.strategies.fedtgp import FedTGP
from fedgo_flwr.strategies.feduv import FedUV
from fedgo_flwr.strategies.fedgen import FedGen
from fedgo_flwr.strategies.fedgo import FedGO
from fedgo_flwr.strategies.label_counts import LabelCountFedAvg
from fedgo_flwr.strategies.scaffold import SCAFFOLD

__all__ = ["DaFKD", "EnsembleDistillation", "FedBPG", "FedDF", "FedDisco", "FedGKD", "FedGO",
           "FedGen", "FedTGP", "FedUV", "LabelCountFedAvg", "SCAFFOLD", "ServerUpdateFedAvg"]
