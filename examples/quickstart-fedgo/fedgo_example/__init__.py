"""quickstart-fedgo: FedGO on Fashion-MNIST with Flower and PyTorch."""
