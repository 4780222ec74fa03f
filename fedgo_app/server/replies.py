"""The app's replies, checked by the library's checks (fedgo_flwr.replies) and tallied by
partition id: every reply is checked before any aggregation reads it (a malformed one is
rejected with its reason, never averaged), and the record counts who was missing, failed or
was rejected."""

from __future__ import annotations

from logging import WARNING
from typing import Callable, Iterable

import torch
from flwr.app import Message
from flwr.common.logger import log

from fedgo_app.server.averaging import PartitionModel
from fedgo_flwr.replies import examples_problem, state_problem


def reply_problem(reply: Message, array_key: str, template: dict[str, torch.Tensor],
                  extras: dict[str, dict[str, torch.Tensor]] | None = None) -> str | None:
    """Why a reply cannot be used, or None: it must carry `array_key` (and each of `extras`,
    name -> template) fitting its template (fedgo_flwr.replies.state_problem), and metrics
    with num-examples > 0."""
    if reply.has_error():
        return f"error reply: {reply.error.reason}"
    for key, ref in {array_key: template, **(extras or {})}.items():
        if why := state_problem(reply.content.array_records.get(key), ref):
            return f"'{key}': {why}"
    return examples_problem(reply.content.metric_records.get("metrics"), "num-examples")


def collect(replies: Iterable[Message], expected: dict[int, int],
            node_of: Callable[[Message], int], problem: Callable[[Message, int], str | None],
            array_key: str, sample_size: Callable[[int, int], int]
            ) -> tuple[list[PartitionModel], dict]:
    """The usable replies as PartitionModels in partition order (`expected`: node id ->
    partition id; `problem(reply, pid)`: why it cannot be used; `sample_size(pid, reported)`:
    its n_k), and the tally of the partitions asked: missing (no reply in time), failed (an
    error reply: the node or its ClientApp failed) and rejected (a reply that fails the
    checks), the last two with the reason; each is logged."""
    models, seen = [], set()
    tally = {"asked": len(expected), "missing": [], "failed": {}, "rejected": {}}
    for reply in replies:
        node = node_of(reply)
        pid = expected.get(node)
        why = ("not asked this round" if pid is None else "duplicate reply" if pid in seen
               else problem(reply, pid))
        if why:
            log(WARNING, "rejected reply from node %d (partition %s): %s", node, pid, why)
            if pid is not None and pid not in seen:
                seen.add(pid)
                tally["failed" if reply.has_error() else "rejected"][str(pid)] = why
            continue
        seen.add(pid)
        metrics = dict(reply.content.metric_records["metrics"])
        arrays = {k: a.to_torch_state_dict() for k, a in reply.content.array_records.items()}
        models.append(PartitionModel(pid, sample_size(pid, int(metrics["num-examples"])),
                                     arrays.pop(array_key), metrics, arrays))
    no_reply = sorted(set(expected.values()) - seen)
    if no_reply:
        log(WARNING, "no reply in time from partitions %s", no_reply)
    tally.update(missing=no_reply, usable=len(models))
    return sorted(models, key=lambda m: m.partition_id), tally
