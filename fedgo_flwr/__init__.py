"""FedGO federated ensemble distillation and its baselines for Flower: strategies any Flower
app can use as it uses Flower's `FedAvg`, and the client steps they need (fedgo_flwr.client).

    from fedgo_flwr import FedGO
    strategy = FedGO(unlabeled_data=u, model_fn=Net, fraction_train=0.5)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(Net().state_dict()),
                            num_rounds=10, evaluate_fn=evaluate)
"""

from fedgo_flwr.strategies import (SCAFFOLD, DaFKD, EnsembleDistillation, FedBPG, FedDF,
                                   FedDisco, FedGen, FedGKD, FedGO, FedTGP, FedUV)

__version__ = "0.2.0"
__all__ = ["DaFKD", "EnsembleDistillation", "FedBPG", "FedDF", "FedDisco", "FedGKD", "FedGO",
           "FedGen", "FedTGP", "FedUV", "SCAFFOLD", "__version__"]
