"""The distillation guard (not in the papers): after distillation the server keeps the distilled
model only if it scores higher than the average it started from, so a round whose teacher is
worse than the average cannot pull the global model down. Two judges:

- `ClientsGuard`: as many clients as trained (or `judges` of them), drawn by the seed and the
  round from those that did not train this round (none of the round's models saw their data),
  score both models on their own data (message type `evaluate.candidates`, answered by
  `fedgo_flwr.client.register` or `evaluate_candidates` in a handler of your own);
- `LabelledGuard(x, y)`: the server's own labelled images score them (a row that uses it
  reads labels the others do not, and should say so).

With no usable score the distilled model is kept, as the papers keep it. A guard is any
object with `scores(strategy, server_round, candidates) -> {name: accuracy}`."""

from __future__ import annotations

import math
from logging import INFO, WARNING
from typing import Protocol

import torch
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log

from fedgo_flwr.inputs import labelled
from fedgo_flwr.seeds import round_seed
from fedgo_flwr.replies import examples_problem, payload_bytes
from fedgo_flwr.train import evaluate

EVALUATE_CANDIDATES = "evaluate.candidates"
AVERAGED, DISTILLED = "averaged", "distilled"


class Guard(Protocol):
    def scores(self, strategy, server_round: int, candidates: dict[str, ArrayRecord]
               ) -> tuple[dict[str, float], dict]:
        """Each candidate's accuracy (NaN: no usable score) and what to record of how."""


def kept(accuracy: dict[str, float]) -> str:
    """The candidate the server keeps: the average where it scores at least as high as the
    distilled model; the distilled one otherwise or without a usable score."""
    usable = not any(math.isnan(a) for a in accuracy.values())
    return AVERAGED if usable and accuracy[AVERAGED] >= accuracy[DISTILLED] else DISTILLED


def weighted_accuracy(scores: list[dict], names) -> dict[str, float]:
    """The n_k-weighted accuracy of each candidate over the clients' scores (NaN: none)."""
    n = sum(s["num-examples"] for s in scores)
    return {name: sum(s["num-examples"] * s[f"{name}-acc"] for s in scores) / n if n
            else float("nan") for name in names}


def scores_problem(reply: Message, names) -> str | None:
    """Why a reply to `evaluate.candidates` cannot be used, or None: metrics with
    num-examples > 0 and, for each candidate name, "<name>-acc" in [0, 1]."""
    if reply.has_error():
        return f"error reply: {reply.error.reason}"
    metrics = reply.content.metric_records.get("metrics")
    if not isinstance(metrics, MetricRecord):
        return "no MetricRecord 'metrics'"
    if why := examples_problem(metrics, "num-examples"):
        return why
    for name in names:
        acc = metrics.get(f"{name}-acc")
        if not isinstance(acc, (int, float)) or not 0 <= acc <= 1:
            return f"'{name}-acc' missing or not in [0, 1] ({acc!r})"
    return None


class ClientsGuard:
    """Clients that did not train this round judge (`timeout`: seconds to wait for them;
    `judges`: how many are asked, None = as many as trained; fewer make the exchange cheaper
    at many clients, and the score noisier)."""

    def __init__(self, timeout: float = 600.0, judges: int | None = None):
        if judges is not None and (isinstance(judges, bool) or not isinstance(judges, int)
                                   or judges < 1):
            raise ValueError(f"judges is {judges!r}; allowed: None (as many as trained) or an "
                             "int >= 1")
        self.timeout, self.num_judges = timeout, judges

    def __repr__(self) -> str:
        return f"ClientsGuard(timeout={self.timeout!r}, judges={self.num_judges!r})"

    def judges(self, strategy, server_round: int) -> dict[int, object]:
        """{node id: key} of as many clients as trained (or `judges`), drawn by the seed and
        the round from those that did not (from those that did where every client trained)."""
        keys = strategy.client_keys.keys(strategy.grid, strategy.grid.get_node_ids())
        trained = set(strategy.sampled)
        pool = {k: n for n, k in keys.items() if n not in trained}
        if not pool:
            log(WARNING, "round %d: every client trained; the guard asks them instead",
                server_round)
            pool = {k: n for n, k in keys.items()}
        # a permutation of the pool (in key order) by the round's seed: the benchmarks' draw
        keys = sorted(pool)
        order = torch.randperm(len(keys), generator=torch.Generator().manual_seed(
            round_seed(strategy.seed, server_round)))
        asked = len(trained) if self.num_judges is None else self.num_judges
        return {pool[k]: k for k in sorted(keys[i] for i in order[:asked].tolist())}

    def scores(self, strategy, server_round, candidates):
        judges = self.judges(strategy, server_round)
        content = RecordDict(dict(candidates))
        replies = strategy.grid.send_and_receive(
            [Message(content, dst_node_id=n, message_type=EVALUATE_CANDIDATES) for n in judges],
            timeout=self.timeout)
        scored, rejected = {}, {}
        for reply in replies:
            node = reply.metadata.src_node_id
            why = ("not asked" if node not in judges else "duplicate reply" if node in scored
                   else scores_problem(reply, candidates))
            if why:
                log(WARNING, "round %d: guard reply of node %d rejected: %s", server_round,
                    node, why)
                rejected[str(judges.get(node, node))] = why
                continue
            scored[node] = dict(reply.content.metric_records["metrics"])
        keys = sorted(judges[n] for n in scored)
        return weighted_accuracy(list(scored.values()), candidates), {
            "judges": f"clients {keys}", "clients": sorted(judges.values()), "scored": keys,
            "rejected": rejected, "bytes_down": payload_bytes([content]) * len(judges)}


class LabelledGuard:
    """The server's labelled images judge: `data` as (images, labels), a Dataset or a
    DataLoader (fedgo_flwr.inputs)."""

    def __init__(self, data):
        self.x, self.y = labelled(data)

    def scores(self, strategy, server_round, candidates):
        accuracy = {}
        for name, arrays in candidates.items():
            model = strategy.load(arrays.to_torch_state_dict())
            accuracy[name] = evaluate(model, self.x, self.y, device=strategy.device)[0]
        return accuracy, {"judges": f"{len(self.y)} labelled server images",
                          "val_images": len(self.y)}


def judge(guard: Guard, strategy, server_round: int, averaged: ArrayRecord,
          distilled: ArrayRecord) -> tuple[ArrayRecord, dict]:
    """The model the server keeps, and what the round records of the choice."""
    candidates = {AVERAGED: averaged, DISTILLED: distilled}
    accuracy, how = guard.scores(strategy, server_round, candidates)
    choice = kept(accuracy)
    if any(math.isnan(a) for a in accuracy.values()):
        log(WARNING, "round %d: no usable guard score; the distilled model is kept",
            server_round)
    log(INFO, "round %d: guard on %s: averaged %.4f, distilled %.4f -> keeps the %s model",
        server_round, how["judges"], accuracy[AVERAGED], accuracy[DISTILLED], choice)
    return candidates[choice], {**how, "averaged_acc": accuracy[AVERAGED],
                                "distilled_acc": accuracy[DISTILLED], "kept": choice}


# ---------------------------------------------------------------------------- client side
@torch.no_grad()
def evaluate_candidates(message: Message, model_fn, data, *,
                        device: str | torch.device = "cpu") -> Message:
    """A client's answer to `evaluate.candidates`: each model the server sent (one
    ArrayRecord each) scored on this node's labelled `data`: "<name>-acc", "<name>-loss" and
    "num-examples" in MetricRecord "metrics"."""
    x, y = labelled(data)
    metrics = {"num-examples": len(y)}
    for name, arrays in message.content.array_records.items():
        model = model_fn()
        model.load_state_dict(arrays.to_torch_state_dict())
        acc, loss = evaluate(model, x, y, device=torch.device(device))
        metrics.update({f"{name}-acc": acc, f"{name}-loss": loss})
    return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=message)
