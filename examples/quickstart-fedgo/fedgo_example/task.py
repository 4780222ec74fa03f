"""The model, the data and the training, as in Flower's PyTorch quickstart."""

from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F
from datasets import Dataset
from flwr_datasets.partitioner import DirichletPartitioner
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchvision.datasets import FashionMNIST
from torchvision.datasets.utils import extract_archive

from fedgo_flwr.client import proximal_term

DEBIAN = Path("/usr/share/datasets/fashion-mnist")  # `apt-get install dataset-fashion-mnist`


class Net(nn.Module):
    """A small CNN; `features`, `head` and `latent_dim` let DaFKD work on its latent layer."""

    latent_dim = 128

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5, padding=2)
        self.conv2 = nn.Conv2d(16, 32, 5, padding=2)
        self.fc1 = nn.Linear(32 * 7 * 7, self.latent_dim)
        self.fc2 = nn.Linear(self.latent_dim, 10)

    def features(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return F.relu(self.fc1(x.flatten(1)))

    def head(self, z):
        return self.fc2(z)

    def forward(self, x):
        return self.head(self.features(x))


@lru_cache(maxsize=2)  # a simulation's ClientApp runs many times in one process
def fashion_mnist(data_dir: str, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Images in [-1, 1] as [N, 1, 28, 28] and labels: torchvision's files under data_dir,
    else Debian's offline copy, else downloaded."""
    root = Path(data_dir or Path.home() / ".cache" / "fedgo-example")
    raw = root / "FashionMNIST" / "raw"
    if not raw.is_dir() and DEBIAN.is_dir():
        for archive in DEBIAN.glob("*.gz"):
            extract_archive(str(archive), str(raw))
    data = FashionMNIST(str(root), train=train, download=True)
    return data.data.unsqueeze(1).float().div(127.5).sub(1), data.targets


def load_data(partition_id: int, num_partitions: int, run_config) -> DataLoader:
    """This node's Dirichlet partition of the clients' share of the training images."""
    x, y = fashion_mnist(run_config["data-dir"], train=True)
    x, y = x[:-run_config["server-size"]], y[:-run_config["server-size"]]
    partitioner = DirichletPartitioner(num_partitions, partition_by="label",
                                       alpha=run_config["alpha"], seed=42)
    partitioner.dataset = Dataset.from_dict({"label": y.tolist(), "index": range(len(y))})
    idx = torch.tensor(partitioner.load_partition(partition_id)["index"])
    return DataLoader(TensorDataset(x[idx], y[idx]), batch_size=32, shuffle=True)


def server_data(run_config) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """The server's unlabeled set U (training images no client holds) and the test split."""
    x, _ = fashion_mnist(run_config["data-dir"], train=True)
    return x[-run_config["server-size"]:], fashion_mnist(run_config["data-dir"], train=False)


def train(net, loader, epochs, lr, device, proximal_mu=0.0):
    """SGD on the node's data; with proximal_mu > 0 (sent by Flower's FedProx, or by a
    strategy given `proximal_mu`), FedProx's term around the received weights is added."""
    net.to(device).train()
    anchor = [w.detach().clone() for w in net.parameters()]
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    total = 0.0
    for _ in range(epochs):
        for x, y in loader:
            loss = F.cross_entropy(net(x.to(device)), y.to(device))
            if proximal_mu:
                loss = loss + proximal_term(net, anchor, proximal_mu)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item()
    return total / (epochs * len(loader))


@torch.no_grad()
def test(net, x, y, device):
    net.to(device).eval()
    logits = torch.cat([net(b.to(device)).cpu() for b in x.split(512)])
    return (logits.argmax(1) == y).float().mean().item(), F.cross_entropy(logits, y).item()
