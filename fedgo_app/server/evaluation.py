"""Central evaluation after each round (and for round 0): the global model on the server's
test split and, with personal-test-fraction, on the clients' own test splits."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from logging import INFO, WARNING

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log

from fedgo_app.server.architectures import Architectures
from fedgo_app.server.membership import Membership
from fedgo_app.server.record import RunRecord, round_line
from fedgo_app.server.setup import ServerSetup
from fedgo_flwr.guard import scores_problem
from fedgo_flwr.replies import payload_bytes
from fedgo_flwr.teachers import server_autocast
from fedgo_flwr.train import evaluate


class Evaluation:
    """Scores the global model of each architecture; the record keeps the round's scores."""

    def __init__(self, setup: ServerSetup, record: RunRecord, architectures: Architectures,
                 membership: Membership,
                 personal_config: Callable[[int], ConfigRecord | None] = lambda _: None):
        self.setup, self.record = setup, record
        self.architectures, self.membership = architectures, membership
        self.personal_config = personal_config  # round -> the personal test's config

    def test_metrics(self, state: dict[str, torch.Tensor], architecture: str = "",
                     on: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[float, float]:
        """Accuracy and loss of the classifier with these weights on the test split, or on
        the labelled images `on` (x, y)."""
        model = self.setup.new_classifier(architecture, state)
        x, y = on if on is not None else (self.setup.test_x, self.setup.test_y)
        with server_autocast(self.setup.device, self.setup.amp):
            return evaluate(model, x, y, device=self.setup.device)

    def global_model(self, server_round: int, arrays: ArrayRecord) -> MetricRecord:
        """The global model on the test split; a mixed federation's row is the mean of its
        architectures' scores, each kept in the record."""
        start = time.perf_counter()
        entry = self.record.round(server_round)
        if self.architectures.heterogeneous:
            scores = {a: self.test_metrics(g, a) for a, g in
                      self.architectures.globals_of(arrays.to_torch_state_dict()).items()}
            entry["architectures"] = {a: {"server_test_acc": acc, "server_test_loss": loss}
                                      for a, (acc, loss) in scores.items()}
            acc = sum(acc for acc, _ in scores.values()) / len(scores)
            loss = sum(loss for _, loss in scores.values()) / len(scores)
        else:
            acc, loss = self.test_metrics(arrays.to_torch_state_dict())
        entry.update(server_test_acc=acc, server_test_loss=loss)
        self.record.time("evaluation", time.perf_counter() - start, server_round or None)
        log(INFO, "%s", round_line(entry))
        return MetricRecord({"server-test-acc": acc, "server-test-loss": loss})

    def personal(self, server_round: int, arrays: ArrayRecord) -> None:
        """personal-test-fraction > 0: every present client scores the global model (of its
        architecture) on its personal test split; the n_k-weighted accuracy and loss are the
        round's personalised_test_acc and _loss. Malformed scores are rejected with their
        reason."""
        if self.setup.cfg.personal_test_fraction <= 0:
            return
        start = time.perf_counter()
        expected, arch = self.membership.present(), self.architectures
        config = self.personal_config(server_round)
        contents = {a: RecordDict({"arrays": ArrayRecord(g) if arch.heterogeneous else arrays,
                                   **({"config": config} if config is not None else {})})
                    for a, g in arch.globals_of(arrays.to_torch_state_dict()).items()}
        self.record.sent("personal", "down", sum(payload_bytes([contents[arch.of(p)]])
                                                 for p in expected.values()), server_round)
        replies = self.membership.exchange(
            [Message(contents[arch.of(p)], dst_node_id=n, message_type="evaluate")
             for n, p in expected.items()], expected, f"round {server_round}: personal test",
            server_round)
        self.record_personal(server_round, self.scores(replies, expected))
        self.record.time("personal_evaluation", time.perf_counter() - start, server_round)

    def scores(self, replies: list[Message], expected: dict[int, int]) -> dict[int, tuple]:
        """partition id -> (n, accuracy, loss) of each well-formed score."""
        scores, node_of = {}, self.membership.mailbox.node_of
        for r in replies:
            pid = expected.get(node_of(r))
            why = "not asked" if pid is None else scores_problem(r, ["eval"])
            metrics = None if why else r.content.metric_records["metrics"]
            if metrics is not None and not math.isfinite(metrics.get("eval-loss", math.nan)):
                why = f"eval-loss {metrics.get('eval-loss')!r} is not a finite number"
            if why:
                log(WARNING, "personal test score of node %d (partition %s) rejected: %s",
                    node_of(r), pid, why)
                continue
            scores[pid] = (metrics["num-examples"], metrics["eval-acc"], metrics["eval-loss"])
        return scores

    def record_personal(self, server_round: int, scores: dict[int, tuple]) -> None:
        if not scores:
            return
        entry, total = self.record.round(server_round), sum(n for n, _, _ in scores.values())
        entry["personalised_test_acc"] = sum(n * a for n, a, _ in scores.values()) / total
        entry["personalised_test_loss"] = sum(n * l for n, _, l in scores.values()) / total
        entry["personalised"] = {"clients": len(scores),
                                 "min_acc": min(a for _, a, _ in scores.values()),
                                 "max_acc": max(a for _, a, _ in scores.values())}
        log(INFO, "round %d: personalised test accuracy %.4f (%d clients)", server_round,
            entry["personalised_test_acc"], len(scores))
