"""What the app records of an ensemble strategy's round: an observer of the library's
`RoundReport` (fedgo_flwr.strategies.base). It writes the round's distillation, budget and
guard into the run record with their seconds and bytes, and scores the weighted ensemble on
the test split (`ensemble-test`) and, with `diagnostics`, every weighting rule and option on
the same teachers; and FedGO's pre-FL stage (round 0). Nothing here changes the global
model."""

from __future__ import annotations

import time

import torch

from fedgo_flwr.diagnostics import (ensemble_diagnostics, lasting_diagnostics,
                                     per_class_diagnostics, phi_stats)
from fedgo_flwr.budget import disagreement
from fedgo_flwr.distill import ensemble_log_probs, floored
from fedgo_flwr.observers import numbers
from fedgo_flwr.strategies.base import RoundReport
from fedgo_flwr.train import accuracy_and_loss
from fedgo_flwr.weighting import past_member_shares, with_members

SECONDS = ("pseudo_labelling", "odds", "distillation", "guard")  # stages of report.seconds


def without_seconds(info: dict) -> dict:
    return {k: v for k, v in info.items() if k != "seconds"}


class EnsembleRecord:
    """The record and diagnostics of one ensemble strategy's rounds."""

    def __init__(self, strategy):
        self.strategy = strategy

    def __call__(self, report: RoundReport) -> None:
        if report.server_round == 0:
            return self.stage(report)
        s, t = self.strategy, report.server_round
        cfg, entry, details = s.cfg, s.record.round(t), report.details
        for stage in SECONDS:
            if stage in report.seconds:
                s.record.time(stage, report.seconds[stage], t)
        if "distillation" in details:
            entry.update(without_seconds(details["distillation"]))
        for arch, info in details.get("distill_by_architecture", {}).items():
            s.record.time("distillation", info["seconds"], t)
            entry.setdefault("distill_by_architecture", {})[arch] = without_seconds(info)
        if "disagreement" in report.metrics:
            entry["disagreement"] = report.metrics["disagreement"]
        elif cfg.diagnostics and "targets" in details:  # the share the budget would take
            entry["disagreement"] = disagreement(
                s.load(report.averaged.to_torch_state_dict()), details["distillation_set"],
                details["targets"], device=s.setup.device, amp=s.setup.amp)
        if "dropped-weight" in report.metrics:  # FedGO's teachers-per-image
            entry["dropped_weight"] = report.metrics["dropped-weight"]
        if cfg.confidence_threshold > 0 and "distill-kept" in report.metrics:
            entry["distill_kept"] = report.metrics["distill-kept"]
        if "guard" in details:
            self.guard(report, entry)
        if "teachers" in details and (cfg.ensemble_test or cfg.diagnostics):
            self.score_ensemble(report, entry)
        # for the trackers that come after (fedgo_flwr.observers): the scores, diagnostics
        report.metrics.update(numbers("", {k: entry[k] for k in (
            "ensemble_test_acc", "ensemble_test_loss", "diagnostics") if k in entry}))

    def stage(self, report: RoundReport) -> None:
        """FedGO's pre-FL stage (or discriminators that join after it), by partition id: the
        replies' tally, each D_k's loss and calibration, its clients' compute, the odds on U,
        the screen, seconds and bytes."""
        s, details = self.strategy, report.details
        pre_fl, received = s.record.data["pre_fl"], details.get("discriminators", {})
        for stage, seconds in report.seconds.items():
            s.record.time(stage, seconds)
        for direction, nbytes in report.bytes.items():
            s.record.sent("pre_fl", direction, nbytes)
        s.record.client_seconds("discriminators", sum(
            float(m.get("discriminator-seconds", 0.0)) for m in received.values()))
        if "joined_late" in details:
            pre_fl.setdefault("joined_late", []).extend(details["joined_late"])
        else:
            pre_fl["replies"] = {
                "asked": len(report.sampled), "missing": details["missing"],
                **{kind: {str(k): why for k, why in details.get(kind, {}).items()}
                   for kind in ("failed", "rejected")}, "usable": len(received)}
            if s.negatives == "server-sample":
                pre_fl["server_sample"] = min(s.server_sample_size, len(s.u))
        for name in ("discriminator-loss", "discriminator-train-acc"):
            pre_fl.setdefault(name.replace("-", "_"), {}).update(
                {str(k): m.get(name) for k, m in received.items()})
        if s.calibrated:
            pre_fl.setdefault("calibration", {}).update(
                {str(k): [m["odds-scale"], m["odds-shift"]] for k, m in received.items()})
        if "screened" in details:
            pre_fl["screened"] = {str(k): why for k, why in details["screened"].items()}
        pre_fl["phi_on_u"] = phi_stats(torch.stack([s.log_odds[k] for k in sorted(s.log_odds)]))

    def guard(self, report: RoundReport, entry: dict) -> None:
        """The guard's choice, who judged, and (diagnostics) what the test split says of it."""
        s = self.strategy
        guard = {k: v for k, v in report.details["guard"].items()
                 if k not in ("judges", "bytes_down")}
        if "bytes_down" in report.details["guard"]:
            s.record.sent("guard", "down", report.details["guard"]["bytes_down"],
                          report.server_round)
        if s.cfg.diagnostics:
            guard["test_acc"] = {name: s.test_metrics(arrays.to_torch_state_dict())[0]
                                 for name, arrays in report.details["candidates"].items()}
        entry["guard"] = guard

    def score_ensemble(self, report: RoundReport, entry: dict) -> None:
        """The weighted ensemble's test accuracy and loss (`ensemble-test`), and with
        `diagnostics` every rule on the same teachers (None of the averaged model's in a
        mixed federation)."""
        s, details = self.strategy, report.details
        cfg, test_x, test_y = s.cfg, s.setup.test_x, s.setup.test_y
        start = time.perf_counter()
        nets = details["nets"]
        n_k = torch.tensor([m.num_examples for m in details["teachers"]], dtype=torch.float32)
        past, member = details["past"], cfg.averaged_share > 0
        test_logits, log_odds = s.test_scores(details["teachers"], nets, n_k)
        average_logits = (s.logits_of([s.load(report.averaged.to_torch_state_dict())], test_x)
                          if member or cfg.teacher_floor or cfg.diagnostics else None)
        past_logits = s.past_logits(past, test_x) if past else None
        teachers = torch.cat([test_logits] + [past_logits] * bool(past)
                             + [average_logits] * member)
        weights = details["weighting"](teachers, log_odds, n_k)
        log_probs = ensemble_log_probs(teachers, weights, cfg.ensemble_space)
        if cfg.teacher_floor:
            log_probs = floored(log_probs, average_logits[0])
        acc, loss = accuracy_and_loss(log_probs, test_y)
        entry.update(ensemble_test_acc=acc, ensemble_test_loss=loss)
        if cfg.diagnostics:
            active = (details["client_rule"](test_logits, log_odds, n_k)
                      if len(teachers) > len(nets) else weights)
            self.diagnose(report, entry, test_logits, log_odds, n_k, active, average_logits,
                          past_logits)
        s.record.time("evaluation", time.perf_counter() - start, report.server_round)

    def diagnose(self, report, entry, test_logits, log_odds, n_k, active, average_logits,
                 past_logits) -> None:
        """Every rule on the round's teachers, and the options that keep a lead, each as it
        would act alone on these models."""
        s, cfg, test_y = self.strategy, self.strategy.cfg, self.strategy.setup.test_y
        histograms = s.clients.label_histograms([m.key for m in report.details["teachers"]])
        entry["diagnostics"] = ensemble_diagnostics(
            test_logits, log_odds if s.has_discriminators else None, n_k, test_y,
            entropy_tau=cfg.entropy_tau, active=active, histograms=histograms,
            averaged_logits=average_logits[0], capped=not cfg.calibrated_odds)
        held = report.details["past_states"]
        if past_logits is None and held:  # the diagnostics' own past teachers
            past_logits = s.past_logits(held, s.setup.test_x)
        with_past = None
        if past_logits is not None:
            members = torch.cat([test_logits, past_logits])
            with_past = ensemble_log_probs(members, with_members(
                lambda *_: active, past_member_shares(len(test_logits), len(past_logits)))(
                    members, log_odds, n_k), cfg.ensemble_space)
        own = ensemble_log_probs(test_logits, active, cfg.ensemble_space)
        entry["diagnostics"]["lasting"] = lasting_diagnostics(own, average_logits[0], test_y,
                                                              with_past)
        if histograms is not None:  # where the teacher falls behind, by class
            entry["diagnostics"]["per_class"] = per_class_diagnostics(
                own, average_logits[0], test_y, histograms, active)
        # what FedAvg keeps this round, where distillation started
        avg_acc, avg_loss = s.test_metrics(report.averaged.to_torch_state_dict())
        entry["diagnostics"]["averaged"] = {"acc": avg_acc, "loss": avg_loss}
