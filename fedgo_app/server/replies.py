"""What a well-formed client reply is, and what it weighs: every reply is checked before
any aggregation reads it (a malformed one is rejected with its reason, never averaged)."""

from __future__ import annotations

import math

import torch
from flwr.app import ArrayRecord, Message, MetricRecord


def reply_problem(reply: Message, array_key: str, template: dict[str, torch.Tensor],
                  extras: dict[str, dict[str, torch.Tensor]] | None = None) -> str | None:
    """Why a train reply cannot be used, or None: it must carry `array_key` (and each of
    `extras`, name -> template) with exactly the template's tensor names and shapes, all
    finite, and metrics with num-examples > 0."""
    if reply.has_error():
        return f"error reply: {reply.error.reason}"
    for key, ref in {array_key: template, **(extras or {})}.items():
        if why := arrays_problem(reply, key, ref):
            return why
    metrics = reply.content.metric_records.get("metrics")
    n = metrics.get("num-examples") if isinstance(metrics, MetricRecord) else None
    return count_problem(n)


def count_problem(n) -> str | None:
    """Why num-examples `n` is not a usable count (a finite number > 0), or None."""
    if not isinstance(n, (int, float)) or isinstance(n, bool) or not math.isfinite(n) or n <= 0:
        return f"num-examples missing, not finite or not positive ({n!r})"
    return None


def arrays_problem(reply: Message, array_key: str,
                   template: dict[str, torch.Tensor]) -> str | None:
    """Why the reply's ArrayRecord `array_key` does not fit `template` (names, shapes, finite
    values), or None."""
    arrays = reply.content.array_records.get(array_key)
    if not isinstance(arrays, ArrayRecord):
        return f"no ArrayRecord '{array_key}'"
    if set(arrays) != set(template):
        return (f"'{array_key}': tensor names differ from the model's "
                f"({sorted(set(arrays) ^ set(template))[:3]}...)")
    for name, ref in template.items():
        if tuple(arrays[name].shape) != tuple(ref.shape):
            return f"tensor '{name}' has shape {arrays[name].shape}, expected {tuple(ref.shape)}"
        if ref.is_floating_point() and not torch.isfinite(torch.from_numpy(arrays[name].numpy())).all():
            return f"tensor '{name}' has non-finite values"
    return None
