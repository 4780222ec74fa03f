"""FedGO federated ensemble distillation and its baselines, as a Flower app."""

__version__ = "0.1.0"
