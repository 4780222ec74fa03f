"""Defences beyond the papers against clients that lie about their discriminators (FedGO's
App. F.8 attack: a D_k that says "real" with the highest odds everywhere, which the odds
weights n_k Phi_k then trust on every image).

`discriminator-screen = "odds"` screens each D_k once, by its log-odds on the distillation set
U, before the odds are used; a flagged D_k is left out of the odds (its client still trains
and is averaged, as a client without a discriminator is):
    saturated  (capped odds only) on more than SATURATED_SHARE of U its log Phi is within 1 %
               of the cap (log e = 1): an honest D_k says "real" with full confidence only on
               its own classes' images, a share of U near its share of the classes
    constant   the standard deviation of its log Phi over U is below CONSTANT_STD: it does not
               tell one image from another
    outlier    its mean log Phi over U is more than `discriminator-screen-z` robust standard
               deviations (1.4826 x the median absolute deviation) from the clients' median
               (robust while fewer than half the discriminators lie; the saturation rule is
               not limited so)
"""

from __future__ import annotations

from logging import WARNING

import torch
from flwr.common.logger import log

SCREENS = ("none", "odds")
SATURATED_SHARE = 0.9
CONSTANT_STD = 1e-3


def screen_odds(u_log_odds: torch.Tensor, capped: bool, z: float) -> dict[int, str]:
    """Rows of u_log_odds [K, |U|] (log Phi_k on U) to leave out, with the rule that flags
    each."""
    flagged: dict[int, str] = {}
    if capped:
        share = (u_log_odds >= 0.99).float().mean(dim=1)
        flagged.update({k: f"saturated on {100 * s:.0f} % of U"
                        for k, s in enumerate(share.tolist()) if s > SATURATED_SHARE})
    std = u_log_odds.std(dim=1)
    for k, s in enumerate(std.tolist()):
        if k not in flagged and s < CONSTANT_STD:
            flagged[k] = f"constant (std {s:.2g} over U)"
    means = u_log_odds.mean(dim=1)
    median = means.median()
    spread = 1.4826 * (means - median).abs().median()
    if spread > 0:
        for k, m in enumerate(means.tolist()):
            score = abs(m - median.item()) / spread.item()
            if k not in flagged and score > z:
                flagged[k] = f"outlier (mean log Phi {m:.3g}, {score:.1f} robust sd from the median)"
    return flagged


class OddsScreen:
    """FedGO's `odds_screen` (z): after the pre-FL stage, each D_k that `screen_odds` flags
    leaves the odds; its client still trains and is averaged."""

    def __init__(self, z: float):
        if not isinstance(z, (int, float)) or z < 0:
            raise ValueError(f"odds_screen is {z!r}; allowed: a number >= 0, or None")
        self.z = float(z)

    def apply(self, log_odds: dict, discriminators: dict, capped: bool) -> dict:
        """Screen the clients' log Phi_k on U ({key: [V, |U|]}, view 0 screened): the flagged
        leave `log_odds` and `discriminators`; returns {key: why}. Raises if none is left."""
        keys = sorted(log_odds)
        flagged = screen_odds(torch.stack([log_odds[k][0] for k in keys]), capped, self.z)
        screened = {keys[row]: why for row, why in flagged.items()}
        for key, why in screened.items():
            log(WARNING, "pre-FL: the discriminator of client %s leaves the odds: %s", key, why)
            del log_odds[key], discriminators[key]
        if not log_odds:
            raise RuntimeError(f"pre-FL: the screen left no discriminator: {screened}")
        return screened
