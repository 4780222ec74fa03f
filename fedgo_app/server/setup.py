"""What the server holds: its unlabeled set U, the test split (and a labelled validation
split, if any), the class names and where it computes; it builds the run's classifiers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fedgo_flwr.models import create_classifier, require_feature_space

# The run's fedgo_app.config.Config, not imported: the config imports the strategies.
Config = Any


@dataclass
class ServerSetup:
    """What the server holds: its unlabeled set U, the test split, and where it computes."""
    cfg: Config
    u: torch.Tensor  # uint8 [N, C, H, W], no labels
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    device: torch.device
    val_x: torch.Tensor = torch.empty(0, dtype=torch.uint8)  # labelled validation split, if any
    val_y: torch.Tensor = torch.empty(0, dtype=torch.long)
    classes: tuple[str, ...] = ()  # class names; a node reporting others is refused
    # the library keywords of the clients' method (run-config key client-method), set by the
    # registry (fedgo_app.strategies.registry.Registry.server)
    client_keywords: dict = field(default_factory=dict)

    @property
    def amp(self) -> bool:
        return self.cfg.server_amp and self.device.type == "cuda"

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.u.shape[1:])  # type: ignore[return-value]

    def new_classifier(self, architecture: str = "",
                       state: dict[str, torch.Tensor] | None = None) -> nn.Module:
        """A classifier of `architecture` (default: the run's `model`), with these weights
        when given."""
        c, h, _ = self.image_shape
        model = create_classifier(architecture or self.cfg.model, c, self.num_classes, h)
        if state is not None:
            model.load_state_dict(state)
        return model

    def latent_dim(self, strategy: str) -> int:
        """The width of the classifier's latent layer, for a strategy that works on it (a
        model without `features`, `head` and `latent_dim` is refused, saying what to add)."""
        net = self.new_classifier()
        require_feature_space(net, strategy, self.cfg.model)
        return net.latent_dim
