"""Progress of long work, through Flower's logger: steps done of all, their rate and the time
left, at most every `every` seconds (and at the end); after the first seconds an estimate of
the whole, a warning when it is long."""

from __future__ import annotations

import time
from logging import INFO, WARNING

from flwr.common.logger import log

LONG_SECONDS = 3600.0  # an estimate above this is logged as a warning


def duration(seconds: float) -> str:
    """A duration as a person reads it: 42s, 7m05s, 3h12m, 2d04h."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


class Progress:
    """Call `step(done, note)` after each unit of `total`; it logs "what: done/total | rate
    | time left" now and then. `hint` says, with the warning, how to make the work shorter.
    """

    def __init__(self, what: str, total: int, *, unit: str = "steps", every: float = 30.0,
                 estimate_after: float = 10.0, hint: str = "") -> None:
        self.what, self.total, self.unit, self.every = what, total, unit, every
        self.estimate_after, self.hint = estimate_after, hint
        self.start = self.last = time.perf_counter()
        self.estimated = False

    def step(self, done: int, note: str = "") -> None:
        now = time.perf_counter()
        elapsed = now - self.start
        rate = done / elapsed if elapsed > 0 else float("inf")
        left = (self.total - done) / rate if rate > 0 else float("inf")
        if not self.estimated and elapsed >= self.estimate_after and done < self.total:
            self.estimated = True
            whole = self.total / rate if rate > 0 else float("inf")
            long = whole > LONG_SECONDS
            log(WARNING if long else INFO, "%s: %d %s will take about %s (%.2f %s/s)%s",
                self.what, self.total, self.unit, duration(whole), rate, self.unit,
                f"; for less: {self.hint}" if long and self.hint else "")
        # the last step is logged where the work was long enough to log before it
        if now - self.last >= self.every and (done < self.total or self.last > self.start):
            self.last = now
            log(INFO, "%s: %d/%d %s | %.2f/s | %s left%s", self.what, done, self.total,
                self.unit, rate, duration(left), f" | {note}" if note else "")

    def over(self, items):
        """`items`, calling `step` after each has been used."""
        for done, item in enumerate(items, start=1):
            yield item
            self.step(done)
