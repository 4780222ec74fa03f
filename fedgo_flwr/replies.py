"""What a well-formed client reply is: checks a strategy runs on every reply before anything
reads it (a malformed one is left out of its round with the reason logged, never averaged),
and what replies weigh in bytes."""

from __future__ import annotations

import math

import torch
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

FAILED = "failed: "  # how the reason of an error reply (the node or its ClientApp failed) starts


def state_problem(arrays: ArrayRecord | None, template: dict[str, torch.Tensor]) -> str | None:
    """Why `arrays` cannot be loaded as a model shaped like `template`, or None."""
    if arrays is None:
        return "no ArrayRecord"
    state = arrays.to_torch_state_dict()
    if set(state) != set(template):
        missing, unexpected = sorted(set(template) - set(state)), sorted(set(state) - set(template))
        return (f"array names differ from the model's (missing {missing[:3]}, unexpected "
                f"{unexpected[:3]})")
    for name, t in template.items():
        if state[name].shape != t.shape:
            return f"{name} has shape {tuple(state[name].shape)}, expected {tuple(t.shape)}"
        if state[name].is_floating_point() and not torch.isfinite(state[name]).all():
            return f"{name} holds NaN or infinite values"
    return None


def arrays_problem(records, templates: dict[str, dict[str, torch.Tensor] | None]) -> str | None:
    """Why one of the reply's ArrayRecords `records` named in `templates` does not fit its
    template (None: any content), or None."""
    return next((f"{name}: {why}" for name, t in templates.items() if t is not None
                 and (why := state_problem(records.get(name), t))), None)


def examples_problem(metrics: MetricRecord | None, key: str) -> str | None:
    value = None if metrics is None else metrics.get(key)
    if (not isinstance(value, (int, float)) or isinstance(value, bool)
            or not math.isfinite(value) or value <= 0):
        return f"metric {key!r} is {value!r}, not a positive number"
    return None


def train_reply_problem(content: RecordDict, model_key: str, template: dict[str, torch.Tensor],
                        extras: dict[str, dict[str, torch.Tensor] | None],
                        examples_key: str) -> str | None:
    """Why a train reply's content cannot be used, or None: one MetricRecord with a positive
    n_k (`examples_key`), the model (`model_key`) fitting `template`, each of `extras` there
    and fitting its template."""
    if len(content.metric_records) != 1:
        return f"{len(content.metric_records)} MetricRecords, expected one"
    (metrics,) = content.metric_records.values()
    missing = [k for k in (model_key, *extras) if k not in content.array_records]
    if missing:
        return f"no ArrayRecord {missing}"
    return (examples_problem(metrics, examples_key)
            or state_problem(content.array_records[model_key], template)
            or arrays_problem(content.array_records, extras))


def payload_bytes(contents: list[Message | RecordDict]) -> int:
    """Bytes of every ArrayRecord in these messages (error replies carry none) or contents;
    replies are counted as they arrived, before any is checked."""
    total = 0
    for item in contents:
        if isinstance(item, Message):
            if item.has_error():
                continue
            item = item.content
        total += sum(a.count_bytes() for a in item.array_records.values())
    return total
