"""The whole ServerApp logic on the in-process grid: record, reproducibility, bad replies."""

import json
import logging

import numpy as np
import pytest
import torch

from client_app.app import app as client_app
from fedgo_app.config import ConfigError
from fedgo_lab.inprocess import InProcessGrid
from server_app.app import run


def _run(cfg, tamper=None, num_partitions=4):
    grid = InProcessGrid(client_app, cfg.to_run_config(), num_partitions, tamper=tamper)
    return json.loads(run(grid, cfg).read_text()), grid


def test_fedgo_record_holds_config_rounds_timings_and_bytes(tiny_config):
    record, grid = _run(tiny_config)
    assert record["config"] == tiny_config.to_run_config()
    assert [r["round"] for r in record["rounds"]] == [0, 1, 2]
    assert record["device"] == "CPU"  # which device made it (a table keeps to one)
    for r in record["rounds"][1:]:
        for key in ("server_test_acc", "server_test_loss", "ensemble_test_acc",
                    "ensemble_test_loss", "distill_loss"):
            assert np.isfinite(r[key]), key
        assert len(r["clients"]) == 2  # floor(0.5 * 4)
        assert set(r["seconds"]) >= {"client_training", "aggregation", "pseudo_labelling",
                                     "distillation", "evaluation"}
        assert r["bytes"]["down"] == r["bytes"]["up"] > 0
        assert 0 < r["client_seconds"] < r["seconds"]["client_training"]
    assert record["timings"]["generator_training"] > 0
    assert record["timings"]["discriminator_training"] > 0
    assert record["bytes"]["pre_fl_down"] > 0 and record["bytes"]["pre_fl_up"] > 0
    types = [m.metadata.message_type for m in grid.sent]
    assert types.count("train.discriminator") == 4  # G goes to every client, once
    assert types.count("train") == 4


def test_one_seed_reproduces_the_run_and_another_changes_it(tiny_config):
    a, _ = _run(tiny_config)
    b, _ = _run(tiny_config.replace(run_name="again"))
    c, _ = _run(tiny_config.replace(run_name="other", seed=1))
    pick = lambda rec: [(r.get("clients"), r["server_test_acc"], r.get("distill_loss"))
                        for r in rec["rounds"]]
    assert pick(a) == pick(b)
    assert pick(a) != pick(c)


def test_fedavg_has_no_pre_fl_and_no_ensemble(tiny_config):
    record, grid = _run(tiny_config.replace(strategy="fedavg"))
    assert "train.discriminator" not in {m.metadata.message_type for m in grid.sent}
    assert all("ensemble_test_acc" not in r for r in record["rounds"])
    assert "pre_fl_down" not in record["bytes"]


def test_malformed_replies_are_rejected_with_a_logged_reason(tiny_config, caplog):
    def tamper(reply):
        arrays = reply.content.array_records.get("arrays")
        if arrays is not None and reply.metadata.src_node_id == 1000:  # partition 0
            state = arrays.to_torch_state_dict()
            state["fc2.weight"] = torch.full_like(state["fc2.weight"], float("nan"))
            reply.content.array_records["arrays"] = type(arrays)(state)
        if arrays is not None and reply.metadata.src_node_id == 1017:  # partition 1
            state = arrays.to_torch_state_dict()
            state["fc2.bias"] = torch.zeros(3)
            reply.content.array_records["arrays"] = type(arrays)(state)
        return reply

    cfg = tiny_config.replace(fraction_train=1.0, num_server_rounds=1)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        record, _ = _run(cfg, tamper=tamper)
    text = caplog.text
    assert "train reply of node 1000 (client 0) left out: fc2.weight holds NaN" in text
    assert "train reply of node 1017 (client 1) left out: fc2.bias has shape" in text
    last = record["rounds"][-1]
    assert np.isfinite(last["server_test_acc"]) and np.isfinite(last["ensemble_test_acc"])


def test_a_discriminator_with_a_bad_calibration_is_left_out_of_the_odds(tiny_config, caplog):
    """With calibrated discriminators, a reply whose (odds-scale, odds-shift) is missing,
    non-positive or not finite is rejected with its reason; the run goes on without it."""
    def tamper(reply):
        if "discriminator" in reply.content.array_records:
            metrics = reply.content.metric_records["metrics"]
            if reply.metadata.src_node_id == 1000:  # partition 0
                metrics["odds-scale"] = -1.0
            if reply.metadata.src_node_id == 1017:  # partition 1
                metrics["odds-shift"] = float("inf")
        return reply

    cfg = tiny_config.replace(discriminator_calibration="platt", calibration_fraction=0.2,
                              fraction_train=1.0, num_server_rounds=1)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        record, _ = _run(cfg, tamper=tamper)
    assert "client 0 (node 1000) left out: calibration (odds-scale, odds-shift) is (-1.0," \
        in caplog.text
    assert "client 1 (node 1017) left out: calibration (odds-scale, odds-shift) is (" \
        in caplog.text
    assert set(record["pre_fl"]["replies"]["rejected"]) == {"0", "1"}
    assert set(record["pre_fl"]["calibration"]) == {"2", "3"}
    assert all(a > 0 for a, _ in record["pre_fl"]["calibration"].values())
    assert np.isfinite(record["rounds"][-1]["ensemble_test_acc"])


def test_two_nodes_claiming_one_partition_fail_fast_or_the_second_is_left_out(tiny_config):
    cfg = tiny_config.replace(require_all_clients=True)
    grid = InProcessGrid(client_app, cfg.to_run_config(), 3)
    second = list(grid.nodes)[1]
    grid.nodes[second].node_config["partition-id"] = 0
    with pytest.raises(RuntimeError, match="partition-id 0 is claimed by nodes .*fix --node"):
        run(grid, cfg)
    # without require-all-clients a node lying about its partition cannot stop the run
    cfg = tiny_config.replace(num_server_rounds=1, join_timeout=3.0)
    grid = InProcessGrid(client_app, cfg.to_run_config(), 3)
    grid.nodes[second].node_config["partition-id"] = 0
    record = json.loads(run(grid, cfg).read_text())["clients"]
    assert sorted(record["num_examples"]) == ["0", "2"]
    assert record["refused"] == {
        f"node {second}": f"partition-id 0 is claimed by nodes {list(grid.nodes)[0]} and {second}"}


def test_nodes_that_cannot_load_their_partition_fail_the_run_fast(tiny_config):
    """500 pool images cannot give 60 clients their minimum share (10): the run stops at discovery
    with the clients' reason instead of waiting for round-timeout (which would end it with a
    TimeoutError naming no cause)."""
    cfg = tiny_config.replace(round_timeout=1.0)
    with pytest.raises(RuntimeError, match=r"60 node\(s\) could not load their partition.*'alpha'"):
        run(InProcessGrid(client_app, cfg.to_run_config(), 60), cfg)


def _without_reuse(pre_fl: dict) -> dict:
    """The pre-FL record without what differs between runs of the same G and D_k: whether G
    came from the cache, and the clients' seconds."""
    return {**{k: v for k, v in pre_fl.items() if k != "client_seconds"},
            "generator": {k: v for k, v in pre_fl["generator"].items() if k != "reused"}}


def test_each_rule_alone_gives_what_the_all_rules_diagnostic_reports(tiny_config):
    """One run with diagnostics scores every rule on its round's client models; a run that
    swaps in any one rule (and nothing else) gets exactly that rule's ensemble."""
    from fedgo_flwr.weighting import WEIGHTINGS
    base = tiny_config.replace(num_server_rounds=1, diagnostics=True)
    records = {name: _run(base.replace(weighting=name, run_name=name))[0] for name in WEIGHTINGS}
    records["odds-beta4"] = _run(base.replace(odds_beta=4.0, run_name="b4"))[0]
    records["probabilities"] = _run(base.replace(ensemble_space="probabilities", run_name="p"))[0]
    odds = records["odds"]
    diag = odds["rounds"][1]["diagnostics"]
    for name, rec in records.items():
        assert _without_reuse(rec["pre_fl"]) == _without_reuse(odds["pre_fl"]), name  # same G, D_k
        assert rec["rounds"][1]["clients"] == odds["rounds"][1]["clients"], name
        assert rec["rounds"][1]["train_loss"] == odds["rounds"][1]["train_loss"], name
    for name in (*WEIGHTINGS, "odds-beta4"):
        r = records[name]["rounds"][1]
        assert diag["logits"][name]["acc"] == r["ensemble_test_acc"], name
        assert diag["logits"][name]["loss"] == pytest.approx(r["ensemble_test_loss"], abs=1e-6)
    r = records["probabilities"]["rounds"][1]
    assert diag["probabilities"]["odds"]["acc"] == r["ensemble_test_acc"]
    assert diag["probabilities"]["odds"]["loss"] == pytest.approx(r["ensemble_test_loss"], abs=1e-6)
    # every rule its own ensemble; but odds-beta4 caps the odds at e^4 and equals the uncapped
    # odds-unsquashed wherever no client's odds reach that cap (as in this tiny run, on some
    # machines), so it is checked above against its diagnostic only
    distinct = [rec for name, rec in records.items() if name != "odds-beta4"]
    assert len({rec["rounds"][1]["ensemble_test_loss"] for rec in distinct}) == len(distinct)
    assert diag["weight_on_oracle_client"]["active"] == diag["weight_on_oracle_client"]["odds"]
    assert {"label-oracle", "odds-unsquashed"} <= set(diag["logits"])
    assert 1 < diag["phi"]["min"] <= diag["phi"]["mean"] <= diag["phi"]["max"] < np.e
    assert set(odds["clients"]["label_histograms"]) == {"0", "1", "2", "3"}
    # the averaged model before distillation is the model FedAvg has after the same round
    fedavg = _run(base.replace(strategy="fedavg", run_name="avg"))[0]
    assert fedavg["rounds"][1]["clients"] == odds["rounds"][1]["clients"]
    assert diag["averaged"]["acc"] == fedavg["rounds"][1]["server_test_acc"]
    assert diag["averaged"]["loss"] == fedavg["rounds"][1]["server_test_loss"]
    assert diag["averaged"]["acc"] != odds["rounds"][1]["server_test_acc"]  # distillation moved it


def test_the_averaged_model_as_a_teacher_is_what_the_diagnostics_score(tiny_config):
    """averaged-share = 0.5 gets the ensemble the diagnostics score as the run's own rule with
    the averaged model as a member holding half the weight, on the same client models."""
    base = tiny_config.replace(num_server_rounds=1, diagnostics=True)
    paper = _run(base)[0]["rounds"][1]
    member = _run(base.replace(averaged_share=0.5, run_name="member"))[0]["rounds"][1]
    assert member["clients"] == paper["clients"]
    scored = paper["diagnostics"]["logits"]["active+averaged"]
    assert member["ensemble_test_acc"] == scored["acc"]
    assert member["ensemble_test_loss"] == pytest.approx(scored["loss"], abs=1e-6)
    assert member["diagnostics"]["logits"]["odds"] == paper["diagnostics"]["logits"]["odds"]
    assert member["distill_loss"] != paper["distill_loss"]  # it distils toward another target


def test_the_lasting_options_do_what_the_diagnostics_score(tiny_config):
    """teacher-floor gets the teacher the diagnostics score as the floored ensemble, and
    confidence-threshold distils only on the sure pseudo-labels, on the same client models
    (issue 46, item 3)."""
    base = tiny_config.replace(num_server_rounds=1, diagnostics=True)
    paper = _run(base)[0]["rounds"][1]
    lasting = paper["diagnostics"]["lasting"]
    assert 0 <= lasting["floor"]["own_share"] <= 1
    assert set(lasting["confident"]) == {"0.5", "0.8", "0.9", "0.95"}
    per_class = paper["diagnostics"]["per_class"]  # one value per class, from the same teacher
    assert all(len(v) == 10 for v in per_class.values())
    from torchvision.datasets import FashionMNIST  # the run scores the whole test split
    labels = FashionMNIST(base.data_dir, train=False).targets
    n = torch.bincount(labels, minlength=10).float()
    seen = n > 0
    assert (torch.tensor(per_class["teacher_acc"])[seen] * n[seen]).sum() / n.sum() == \
        pytest.approx(paper["ensemble_test_acc"], abs=1e-6)
    floor = _run(base.replace(teacher_floor=True, diagnostics=False, run_name="floor"))[0]
    floor = floor["rounds"][1]
    assert floor["clients"] == paper["clients"]
    assert floor["ensemble_test_acc"] == lasting["floor"]["acc"]
    assert floor["ensemble_test_loss"] == pytest.approx(lasting["floor"]["loss"], abs=1e-6)
    if 0 < lasting["floor"]["own_share"]:  # the floor changed some pseudo-labels
        assert floor["distill_loss"] != paper["distill_loss"]
    sure = _run(base.replace(confidence_threshold=0.5, run_name="sure"))[0]["rounds"][1]
    assert sure["clients"] == paper["clients"]
    assert sure["ensemble_test_acc"] == paper["ensemble_test_acc"]  # the same teacher
    assert 0 <= sure["distill_kept"] <= 1 and "distill_kept" not in paper
    assert sure["distill_steps"] <= paper["distill_steps"]


def test_the_disagreement_budget_takes_the_share_of_steps_the_diagnostics_measure(tiny_config):
    """distill-budget = disagreement distils for the share of the round's steps that is the
    averaged model's disagreement with the pseudo-labels, as the diagnostics measure it on the
    same client models (issue 46, item 3: distillation fading as they agree)."""
    import math
    base = tiny_config.replace(num_server_rounds=1, diagnostics=True, server_epochs=2)
    paper = _run(base)[0]["rounds"][1]
    assert 0 < paper["disagreement"] < 1
    budget = _run(base.replace(distill_budget="disagreement", diagnostics=False,
                               run_name="budget"))[0]["rounds"][1]
    assert budget["clients"] == paper["clients"]
    assert budget["disagreement"] == paper["disagreement"]
    assert budget["distill_steps"] == math.ceil(paper["disagreement"] * paper["distill_steps"])
    assert budget["distill_steps"] < paper["distill_steps"]
    assert budget["ensemble_test_acc"] == paper["ensemble_test_acc"]  # the same teacher
    # a probe of every image is the budget without one; a probe of one minibatch measures
    # the share there and labels only the steps it keeps
    whole = _run(base.replace(distill_budget="disagreement", budget_probe=10**6,
                              run_name="whole"))[0]["rounds"][1]
    assert [whole[k] for k in ("disagreement", "distill_steps", "distill_loss",
                               "server_test_acc")] == [
        budget[k] for k in ("disagreement", "distill_steps", "distill_loss", "server_test_acc")]
    probe = _run(base.replace(distill_budget="disagreement", budget_probe=1,
                              run_name="probe"))[0]["rounds"][1]
    assert probe["clients"] == paper["clients"]
    assert probe["distill_steps"] == math.ceil(probe["disagreement"] * paper["distill_steps"])
    assert probe["ensemble_test_acc"] == paper["ensemble_test_acc"]
    with pytest.raises(ConfigError, match="'budget-probe' is 64 and 'distill-budget' is 'full'"):
        base.replace(budget_probe=64).validate()


def test_past_global_models_as_teachers_are_what_the_diagnostics_score(tiny_config):
    """past-teachers = 3 gets the ensemble the diagnostics score as the run's own rule with
    the past global models as members, each holding 1/(K + P) of the weight, on the same
    client models: round 1 has none (the two runs agree), round 2 has round 1's global model
    (issue 46, item 3)."""
    base = tiny_config.replace(diagnostics=True)
    paper = _run(base)[0]["rounds"]
    past = _run(base.replace(past_teachers=3, diagnostics=False, run_name="past"))[0]["rounds"]
    assert "past" not in paper[1]["diagnostics"]["lasting"]
    assert past[1]["server_test_acc"] == paper[1]["server_test_acc"]
    assert past[2]["clients"] == paper[2]["clients"]
    scored = paper[2]["diagnostics"]["lasting"]["past"]
    assert past[2]["ensemble_test_acc"] == scored["acc"]
    assert past[2]["ensemble_test_loss"] == pytest.approx(scored["loss"], abs=1e-6)
    assert past[2]["ensemble_test_loss"] != paper[2]["ensemble_test_loss"]  # another teacher


def test_past_teachers_label_u_once_per_model_and_view_as_recomputing_would(tiny_config,
                                                                             monkeypatch):
    """A past global model does not change while it stays a teacher: its logits on an image
    of U (each view) or of the test split are computed once, when first needed, and the run
    is the one that computes them every round."""
    from fedgo_flwr import teachers
    cfg = tiny_config.replace(past_teachers=2, num_server_rounds=4)
    forward, weights = teachers.teacher_logits, torch.rand(4096, dtype=torch.float64)
    seen, repeats = set(), []

    def counted(nets, x, **kwargs):  # PastTeachers' forwards, by model, view and image
        assert len(nets) == 1
        model = sum(p.double().sum().item() for p in nets[0].parameters())
        for image in (x.flatten(1).double() @ weights[:x[0].numel()]).tolist():
            key = (model, kwargs.get("flip", False), image)
            repeats.append(key) if key in seen else seen.add(key)
        return forward(nets, x, **kwargs)

    monkeypatch.setattr(teachers, "teacher_logits", counted)
    cached = _run(cfg)[0]["rounds"]
    # theta_s of rounds 1, 2 and 3 (round 2 has one past teacher, rounds 3 and 4 two)
    assert len({model for model, _, _ in seen}) == 3 and repeats == []
    logits = teachers.PastTeachers.logits

    def recomputed(self, *args, **kwargs):
        self._logits.clear()
        return logits(self, *args, **kwargs)

    monkeypatch.setattr(teachers.PastTeachers, "logits", recomputed)
    seen.clear()
    again = _run(cfg.replace(run_name="recomputed"))[0]["rounds"]
    assert len(repeats) > 0  # rounds 3 and 4 forward round 2's model again
    for a, b in zip(cached[1:], again[1:], strict=True):
        assert a["server_test_acc"] == pytest.approx(b["server_test_acc"], abs=1e-6)
        assert a["ensemble_test_loss"] == pytest.approx(b["ensemble_test_loss"], abs=1e-5)


def _info_replies(cfg):
    infos = []

    def tamper(reply):
        info = reply.content.metric_records.get("info")
        if info is not None:
            infos.append(dict(info))
        return reply

    record, _ = _run(cfg, tamper=tamper)
    return record, infos


def test_clients_send_their_label_histogram_only_when_the_diagnostics_ask(tiny_config):
    from fedgo_app.data import client_data
    cfg = tiny_config.replace(num_server_rounds=1)
    record, infos = _info_replies(cfg)
    assert len(infos) == 4 and all("label-histogram" not in i for i in infos)
    assert "label_histograms" not in record["clients"]
    assert all("diagnostics" not in r for r in record["rounds"])
    record, infos = _info_replies(cfg.replace(diagnostics=True, run_name="diag"))
    for info in infos:
        _, y = client_data(cfg, int(info["partition-id"]), 4)
        assert info["label-histogram"] == torch.bincount(y, minlength=10).tolist()
    assert "diagnostics" in record["rounds"][1]


def test_feddf_diagnostics_score_the_rules_that_need_no_discriminator(tiny_config):
    cfg = tiny_config.replace(strategy="feddf", num_server_rounds=1, diagnostics=True)
    diag = _run(cfg)[0]["rounds"][1]["diagnostics"]
    assert set(diag["logits"]) == {"uniform", "variance", "entropy", "size", "label-oracle",
                                   "class-count", "class-count-from-averaged",
                                   "class-count-from-own", "active+averaged"}
    assert "phi" not in diag


def test_a_round_trains_two_clients_even_when_c_times_k_is_one(tiny_config, caplog):
    """Flower's default federation has 2 SuperNodes: C = 0.4 must still make an ensemble."""
    from fedgo_flwr.sampling import sample_clients
    assert len(sample_clients([0, 1], 0.4, seed=0, server_round=1)) == 2
    assert sample_clients([0, 1, 2], 0.1, 0, 1, absent=frozenset({1})) == [0, 2]
    assert len(sample_clients(list(range(20)), 0.4, 0, 1)) == 8  # floor(C K) above two
    with caplog.at_level(logging.INFO):
        record, _ = _run(tiny_config.replace(fraction_train=0.1), num_partitions=2)
    assert all(len(r["clients"]) == 2 for r in record["rounds"][1:])
    log = caplog.text  # every phase says what it does, by partition id
    assert "2 clients, n_k by partition id: 0: " in log
    for line in ("pre-FL: sending the generator to 2 clients", "discriminator of client 0 in",
                 "discriminator of client 1 in", "round 1: client training: partition 1 done",
                 "round 2: distilled"):
        assert line in log, line


def test_keys_the_strategy_never_reads_are_logged_and_recorded(tiny_config, caplog):
    with caplog.at_level(logging.WARNING):
        record, _ = _run(tiny_config.replace(strategy="fedavg", odds_beta=4.0, fedprox_mu=0.1))
    unread = record["unread_keys"]  # tiny_config's pre-FL sizes too: FedAvg has no pre-FL
    assert {"odds-beta", "fedprox-mu", "generator-steps", "distill-size"} <= set(unread)
    assert not {"alpha", "num-server-rounds", "fraction-train"} & set(unread)
    assert f"{', '.join(unread)} are set but strategy 'fedavg' never reads them" in caplog.text


def _guard_config(tiny_config):
    return tiny_config.replace(num_server_rounds=1, diagnostics=True,
                               distillation_guard="clients", run_name="guard")


def test_the_guard_asks_clients_that_did_not_train_and_scores_as_they_do(tiny_config):
    """distillation-guard = clients: the round's untrained clients receive the averaged and
    the distilled model; the record's scores are the n_k-weighted accuracies of those two
    models on their partitions, and the server keeps the one scored higher."""
    from fedgo_app.data import client_data
    from fedgo_flwr.models import create_classifier
    from fedgo_flwr.train import evaluate
    cfg = _guard_config(tiny_config)
    record, grid = _run(cfg)
    entry = record["rounds"][1]
    guard = entry["guard"]
    assert len(guard["clients"]) == len(entry["clients"]) == 2
    assert not set(guard["clients"]) & set(entry["clients"])
    assert guard["scored"] == guard["clients"] and guard["rejected"] == {}
    sent = [m for m in grid.sent if m.metadata.message_type == "evaluate.candidates"]
    assert len(sent) == 2
    candidates = sent[0].content.array_records
    assert set(candidates) == {"averaged", "distilled"}
    for name in candidates:
        model = create_classifier(cfg.model, 1, 10, 28)
        model.load_state_dict(candidates[name].to_torch_state_dict())
        parts = [client_data(cfg, p, 4) for p in guard["clients"]]
        acc = sum(len(y) * evaluate(model, x, y, device=torch.device("cpu"))[0]
                  for x, y in parts) / sum(len(y) for _, y in parts)
        assert guard[f"{name}_acc"] == pytest.approx(acc, abs=1e-9)
    better = "distilled" if guard["distilled_acc"] > guard["averaged_acc"] else "averaged"
    assert guard["kept"] == better
    assert record["bytes"]["guard_down"] == 2 * sum(a.count_bytes() for a in candidates.values())
    # with the diagnostics on, the test split scores both: the kept one is the server's model
    assert guard["test_acc"][guard["kept"]] == entry["server_test_acc"]
    assert guard["test_acc"]["averaged"] == entry["diagnostics"]["averaged"]["acc"]


def test_the_guard_judges_what_the_budget_and_past_teachers_distilled(tiny_config):
    """The guard on top of the disagreement budget and past teachers (the plan's
    fedgo-cal-guard-budget-past-probe, without its probe; one judge): every round that distilled asks the clients, the kept
    candidate is the server's model, and round 1's teacher and share are those of the run
    without the guard (the guard acts after them)."""
    base = tiny_config.replace(num_server_rounds=3, server_epochs=2, diagnostics=True,
                               distill_budget="disagreement", past_teachers=2)
    guarded = _run(base.replace(distillation_guard="clients", guard_judges=1,
                                run_name="guard"))[0]["rounds"]
    plain = _run(base.replace(run_name="plain"))[0]["rounds"]
    assert guarded[1]["disagreement"] == plain[1]["disagreement"]
    assert guarded[1]["ensemble_test_acc"] == plain[1]["ensemble_test_acc"]
    for entry in guarded[1:]:
        assert 0 <= entry["disagreement"] <= 1
        guard = entry["guard"]  # every round distilled (a share above 0)
        assert entry["distill_steps"] > 0 and guard["scored"] == guard["clients"]
        assert len(guard["clients"]) == 1  # guard-judges = 1 of the clients that did not train
        assert guard["test_acc"][guard["kept"]] == entry["server_test_acc"]


@pytest.mark.parametrize("lie", ["averaged", "distilled"])
def test_the_guard_keeps_what_the_clients_score_higher(tiny_config, lie):
    """Clients that score one candidate 1.0 and the other 0.0 make the server keep it: the
    averaged model (what FedAvg has after the same round) or the distilled one (what the run
    without the guard has)."""
    def tamper(reply):
        metrics = reply.content.metric_records.get("metrics")
        if metrics is not None and "averaged-acc" in metrics:
            metrics["averaged-acc"], metrics["distilled-acc"] = float(lie == "averaged"), \
                float(lie == "distilled")
        return reply

    cfg = _guard_config(tiny_config)
    entry = _run(cfg, tamper=tamper)[0]["rounds"][1]
    assert entry["guard"]["kept"] == lie
    if lie == "averaged":
        assert entry["server_test_acc"] == entry["diagnostics"]["averaged"]["acc"]
    else:
        unguarded = _run(cfg.replace(distillation_guard="none", run_name="plain"))[0]
        assert entry["server_test_acc"] == unguarded["rounds"][1]["server_test_acc"]
        assert entry["server_test_acc"] != entry["diagnostics"]["averaged"]["acc"]


def test_the_labelled_val_guard_scores_the_candidates_on_the_servers_labelled_images(
        tiny_config):
    """distillation-guard = labelled-val: no client is asked; the server scores the same two
    candidates the clients' guard sends (the round's models do not depend on who judges) on
    its val-size labelled images, and keeps the one scored higher."""
    from fedgo_app.data import validation_data
    from fedgo_flwr.models import create_classifier
    from fedgo_flwr.train import evaluate
    cfg = _guard_config(tiny_config).replace(distill_size=300)  # U leaves images to label
    labelled = cfg.replace(distillation_guard="labelled-val", val_size=60)
    record, grid = _run(labelled)
    entry = record["rounds"][1]
    guard = entry["guard"]
    assert guard["val_images"] == 60 and "clients" not in guard
    assert "evaluate.candidates" not in {m.metadata.message_type for m in grid.sent}
    assert "guard_down" not in record["bytes"]
    asked = _run(cfg)[1]  # the clients' guard: its message carries the candidates
    (sent, *_) = [m for m in asked.sent if m.metadata.message_type == "evaluate.candidates"]
    val_x, val_y = validation_data(labelled)
    for name, arrays in sent.content.array_records.items():
        model = create_classifier(cfg.model, 1, 10, 28)
        model.load_state_dict(arrays.to_torch_state_dict())
        acc = evaluate(model, val_x, val_y, device=torch.device("cpu"))[0]
        assert guard[f"{name}_acc"] == pytest.approx(acc, abs=1e-9)
    better = "distilled" if guard["distilled_acc"] > guard["averaged_acc"] else "averaged"
    assert guard["kept"] == better
    assert guard["test_acc"][guard["kept"]] == entry["server_test_acc"]
    assert guard["test_acc"]["averaged"] == entry["diagnostics"]["averaged"]["acc"]


def test_a_malformed_guard_score_is_rejected_with_its_reason(tiny_config, caplog):
    """A score out of [0, 1] is left out, logged with its reason; with no usable score the
    server keeps the distilled model, as the papers do."""
    def tamper(reply):
        metrics = reply.content.metric_records.get("metrics")
        if metrics is not None and "averaged-acc" in metrics:
            metrics["averaged-acc"] = 1.5
        return reply

    with caplog.at_level(logging.WARNING, logger="flwr"):
        entry = _run(_guard_config(tiny_config), tamper=tamper)[0]["rounds"][1]
    guard = entry["guard"]
    assert guard["scored"] == [] and set(guard["rejected"]) == set(map(str, guard["clients"]))
    assert "'averaged-acc' missing or not in [0, 1] (1.5)" in caplog.text
    assert "no usable guard score; the distilled model is kept" in caplog.text
    assert guard["kept"] == "distilled"


def test_when_every_client_trained_the_guard_asks_them(tiny_config, caplog):
    with caplog.at_level(logging.WARNING, logger="flwr"):
        entry = _run(_guard_config(tiny_config).replace(fraction_train=1.0))[0]["rounds"][1]
    assert entry["guard"]["clients"] == entry["clients"] == [0, 1, 2, 3]
    assert "every client trained; the guard asks them instead" in caplog.text


@pytest.mark.parametrize("strategy", ["fedgo", "feddf"])
def test_a_users_model_by_import_path_runs_fedgo_and_feddf(tiny_config, tmp_path, monkeypatch,
                                                           strategy):
    (tmp_path / "my_model.py").write_text(
        "from torch import nn\n\n"
        "def Net(channels, num_classes, image_size):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(channels * image_size ** 2, 32),\n"
        "                         nn.ReLU(), nn.Linear(32, num_classes))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = tiny_config.replace(model="my_model:Net", strategy=strategy, num_server_rounds=1)
    record, _ = _run(cfg)
    assert record["config"]["model"] == "my_model:Net"
    assert np.isfinite(record["rounds"][1]["ensemble_test_acc"])
    final = torch.load(cfg.results_path / "tiny" / "model.pt")
    assert set(final) == {"1.weight", "1.bias", "3.weight", "3.bias"}  # the user's layers


def test_a_bad_dataset_fails_before_anything_is_written(tiny_config, tmp_path):
    (tmp_path / "images" / "train" / "cat").mkdir(parents=True)  # a class folder, no image
    cfg = tiny_config.replace(dataset="folder", data_dir=str(tmp_path / "images"))
    with pytest.raises(RuntimeError, match="every class needs a folder with at least one image"):
        _run(cfg)
    assert not cfg.results_path.exists() or not any(cfg.results_path.iterdir())
