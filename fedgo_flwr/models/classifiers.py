"""Classifiers f(.; theta) = head(features(x)). Each returns logits; `features` gives the latent
layer (`latent_dim` wide) and `head` the last layer from it, for methods that work in feature
space (FedGen's generator feeds `head` directly, DaFKD puts a discriminator on `features`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class CNN(nn.Module):
    """The FedAvg CNN (McMahan et al.): conv5-32, pool, conv5-64, pool, fc512, fc."""

    latent_dim = 512

    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 28):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 32, 5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2)
        self.fc1 = nn.Linear(64 * (image_size // 4) ** 2, 512)
        self.fc2 = nn.Linear(512, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return F.relu(self.fc1(x.flatten(1)))

    def head(self, z: torch.Tensor) -> torch.Tensor:
        return self.fc2(z)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class MLP(nn.Module):
    """The 2NN of McMahan et al. (two hidden layers of 200, ReLU): a second, cheap architecture
    for mixed federations (client-models) on small images."""

    latent_dim = 200

    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 28):
        super().__init__()
        self.fc1 = nn.Linear(in_channels * image_size ** 2, 200)
        self.fc2 = nn.Linear(200, 200)
        self.fc3 = nn.Linear(200, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.fc2(F.relu(self.fc1(x.flatten(1)))))

    def head(self, z: torch.Tensor) -> torch.Tensor:
        return self.fc3(z)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(in_planes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, out, 1, stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        return F.relu(self.bn3(self.conv3(out)) + self.shortcut(x))


class ResNet(nn.Module):
    """ResNet, CIFAR variant (3x3 stem, no max-pool), as used in the paper (App. E.2)."""

    def __init__(self, block: type[nn.Module], blocks: tuple[int, int, int, int],
                 in_channels: int, num_classes: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        layers, in_planes = [], 64
        for planes, stride, n in zip((64, 128, 256, 512), (1, 2, 2, 2), blocks):
            for s in (stride,) + (1,) * (n - 1):
                layers.append(block(in_planes, planes, s))
                in_planes = planes * block.expansion
        self.layers = nn.Sequential(*layers)
        self.latent_dim = in_planes
        self.linear = nn.Linear(in_planes, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layers(F.relu(self.bn1(self.conv1(x))))
        return F.adaptive_avg_pool2d(out, 1).flatten(1)

    def head(self, z: torch.Tensor) -> torch.Tensor:
        return self.linear(z)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class ResNet18(ResNet):
    def __init__(self, in_channels: int = 3, num_classes: int = 10, image_size: int = 32):
        super().__init__(BasicBlock, (2, 2, 2, 2), in_channels, num_classes)


class ResNet50(ResNet):
    def __init__(self, in_channels: int = 3, num_classes: int = 10, image_size: int = 32):
        super().__init__(Bottleneck, (3, 4, 6, 3), in_channels, num_classes)


class VGG11BN(nn.Module):
    """VGG-11 with batch norm, CIFAR variant (one linear layer on the 512 channels left after
    the convolutions). The last max-pool takes the whole remaining map, so 28x28 inputs work
    as 32x32 ones do."""

    PLAN = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512)
    latent_dim = 512

    def __init__(self, in_channels: int = 3, num_classes: int = 10, image_size: int = 32):
        super().__init__()
        layers, c = [], in_channels
        for v in self.PLAN:
            if v == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                layers += [nn.Conv2d(c, v, 3, padding=1), nn.BatchNorm2d(v), nn.ReLU()]
                c = v
        self.convs = nn.Sequential(*layers)
        self.linear = nn.Linear(512, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return F.adaptive_max_pool2d(self.convs(x), 1).flatten(1)

    def head(self, z: torch.Tensor) -> torch.Tensor:
        return self.linear(z)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))
