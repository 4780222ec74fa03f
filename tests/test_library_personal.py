"""FedGen and FedBPG as a Flower user meets them: `start(...)` with Flower's standard arguments
over the in-process grid, the user's own model and ClientApp (tests/test_library.py), the
library's handlers registered; FedBPG's clients keeping their personal models in Flower's
`context.state`; and train replies whose label counts are malformed, left out with a reason."""

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg
from torch import nn

from fedgo_flwr import FedBPG, FedGen
from fedgo_flwr.client import register
from fedgo_flwr.strategies.fedbpg import ALPHAS, EVALUATE_FEDBPG, LOCAL_MODEL, TRAIN_FEDBPG
from fedgo_flwr.strategies.fedgen import GENERATOR, TRAIN_FEDGEN
from fedgo_flwr.strategies.label_counts import label_counts_problem
from fedgo_lab.inprocess import InProcessGrid
from test_library import NODES, PARTS, TEST, UserNet, changed, run, user_client_app

pytestmark = pytest.mark.app

TINY_GEN = dict(generator_steps=3, generator_batch_size=8, noise_dim=4, hidden_dim=16,
                fraction_evaluate=0.5, device="cpu")
TINY_BPG = dict(image_shape=(1, 28, 28), generator_steps=2, generator_width=4, noise_dim=4,
                batch_size=8, tune_steps=2, fusion_steps=2, device="cpu")


def types_sent(grid: InProcessGrid) -> set[str]:
    return {m.metadata.message_type for m in grid.sent}


def test_fedgen_starts_as_flower_documents_it_with_a_users_model():
    grid = InProcessGrid(user_client_app(), {}, NODES)
    strategy = FedGen(model_fn=UserNet, **TINY_GEN)
    assert isinstance(strategy, FedAvg) and strategy.num_classes == 10
    initial, result = run(strategy, grid)
    assert sorted(result.train_metrics_clientapp) == [1, 2]
    for metrics in result.train_metrics_clientapp.values():
        assert metrics["generator-loss"] > 0 and 0 < metrics["diversity-loss"] <= 1
        assert "train-loss" in metrics and "label-counts" not in metrics  # not averaged
    lrs = [result.train_metrics_clientapp[t]["generator-lr"] for t in (1, 2)]
    assert lrs[1] == pytest.approx(0.98 * lrs[0])  # G_w's learning rate decays a round
    assert sorted(result.evaluate_metrics_serverapp) == [0, 1, 2]
    assert sorted(result.evaluate_metrics_clientapp) == [1, 2]  # the user's evaluate handler
    assert changed(initial, result)
    # train.fedgen, never the user's plain train; G_w and p^(y) from round 2 on
    assert types_sent(grid) == {TRAIN_FEDGEN, "evaluate"}
    train = [m for m in grid.sent if m.metadata.message_type == TRAIN_FEDGEN]
    with_g = {int(m.content["config"]["server-round"]): GENERATOR in m.content.array_records
              for m in train}
    assert with_g == {1: False, 2: True}
    second = next(m for m in train if GENERATOR in m.content.array_records)
    prior = second.content["config"]["label-prior"]
    assert len(prior) == 10 and sum(prior) == pytest.approx(1.0)
    assert second.content["config"]["fedgen-alpha"] == pytest.approx(10 * 0.98 ** 2)
    assert second.content["config"]["lr"] == 0.05  # the caller's train config reaches them


def test_a_fedgen_client_learns_from_the_generated_features():
    """With G_w the client's head fits G_w's features (eq. 5); without, it does not; both
    replies carry the label counts c_k. The messages go through the registered handler."""
    grid = InProcessGrid(user_client_app(), {}, NODES)  # node 1000 holds PARTS[0]
    strategy = FedGen(model_fn=UserNet, **TINY_GEN)
    strategy.prior = torch.full((10,), 0.1)
    generator = strategy.generator.eval()
    with torch.no_grad():  # features that depend on the label more than on the noise
        generator.hidden.weight[:, 4:] *= 10
    y, eps = torch.arange(10).repeat(10), torch.randn(100, 4)
    torch.manual_seed(0)
    start, losses = UserNet().state_dict(), []
    for with_generator in (False, True):
        arrays, settings = strategy.train_payload(3, None) if with_generator else ({}, {})
        conf = ConfigRecord({"lr": 1e-2, "local-epochs": 40, "batch-size": 20,
                             "num-classes": 10, **settings})
        message = Message(RecordDict({"arrays": ArrayRecord(start), **arrays, "config": conf}),
                          dst_node_id=1000, message_type=TRAIN_FEDGEN)
        (reply,) = grid.send_and_receive([message])
        metrics = reply.content["metrics"]
        assert metrics["label-counts"] == torch.bincount(PARTS[0][1], minlength=10).tolist()
        assert label_counts_problem(metrics, 10) is None
        model = UserNet()
        model.load_state_dict(reply.content["arrays"].to_torch_state_dict())
        with torch.no_grad():
            losses.append(nn.functional.cross_entropy(model.head(generator(y, eps)), y).item())
    assert losses[1] < 0.5 * losses[0], losses


def test_malformed_label_counts_are_left_out_with_a_reason(caplog):
    def tamper(reply):
        metrics = reply.content.metric_records.get("metrics")
        if reply.metadata.src_node_id == 1000 and metrics and "label-counts" in metrics:
            metrics["label-counts"] = [1] * 10  # does not sum to n_k
        if reply.metadata.src_node_id == 1017 and metrics and "label-counts" in metrics:
            del metrics["label-counts"]
        return reply

    grid = InProcessGrid(user_client_app(), {}, NODES, tamper=tamper)
    with caplog.at_level("INFO"):
        _, result = run(FedGen(model_fn=UserNet, **TINY_GEN), grid, rounds=1)
    assert ("train reply of node 1000 left out: label-counts [1, 1, 1, 1, 1, 1, 1, 1, 1, 1] "
            "are not 10 non-negative integers summing to n_k = 40") in caplog.text
    assert "train reply of node 1017 left out: label-counts None are not 10" in caplog.text
    assert f"aggregate_train: {NODES - 2} usable client model(s)" in caplog.text
    assert result.train_metrics_clientapp[1]["generator-loss"] > 0  # the others still count
    assert label_counts_problem({"label-counts": [20, 20] + [0] * 8, "num-examples": 40},
                                10) is None
    assert label_counts_problem({"label-counts": [-1, 41] + [0] * 8, "num-examples": 40}, 10)


def test_fedbpg_starts_and_its_clients_keep_their_personal_models_in_context_state():
    replies = {}

    def record(reply):  # each node's last train reply
        if reply.metadata.message_type == TRAIN_FEDBPG and not reply.has_error():
            replies[reply.metadata.src_node_id] = reply.content["arrays"]
        return reply

    grid = InProcessGrid(user_client_app(), {}, NODES, tamper=record)
    strategy = FedBPG(model_fn=UserNet, **TINY_BPG)
    assert isinstance(strategy, FedAvg)
    initial, result = run(strategy, grid)
    assert changed(initial, result)
    train = result.train_metrics_clientapp
    assert sorted(train) == [1, 2]
    for metrics in train.values():
        assert {"generator-authenticity", "generator-diversity", "generator-effectiveness",
                "tuning-kl", "tuning-consensus-acc", "tuning-retained", "train-loss"
                } <= set(metrics)
        assert metrics["tuning-retained"] >= 0 and 0 <= metrics["tuning-consensus-acc"] <= 1
    assert "fusion-alpha" not in train[1]  # round 1: no local model yet, nothing to fuse
    assert 0 <= train[2]["fusion-alpha"] <= 1  # round 2: each client fused its kept omega_k
    # the federated evaluation scores the personal models (evaluate.fedbpg), not the global
    assert types_sent(grid) == {TRAIN_FEDBPG, EVALUATE_FEDBPG}
    assert sorted(result.evaluate_metrics_clientapp) == [1, 2]
    assert 0 <= result.evaluate_metrics_clientapp[2]["eval-acc"] <= 1
    assert sorted(result.evaluate_metrics_serverapp) == [0, 1, 2]
    kept = []
    for node, context in grid.nodes.items():  # omega_k is the node's last uploaded model
        assert LOCAL_MODEL in context.state.array_records and ALPHAS in context.state
        state = context.state[LOCAL_MODEL].to_torch_state_dict()
        sent = replies[node].to_torch_state_dict()
        assert all(torch.equal(state[k], sent[k]) for k in state)
        kept.append(state["fc.weight"])
    assert not torch.equal(kept[0], kept[1])  # each its own


def test_fedbpg_without_ed_af_and_dp_averages_and_scores_on_the_test_data_given():
    """The ablations' switches; and a ClientApp with nothing but `register` (FedBPG uses no
    plain train or evaluate handler), whose clients score on the test data it is given."""
    scored = []

    def count(reply):
        if reply.metadata.message_type == EVALUATE_FEDBPG:
            scored.append(reply.content["metrics"]["num-examples"])
        return reply

    app = ClientApp()
    register(app, model_fn=UserNet, data_fn=lambda c: PARTS[int(c.node_config["partition-id"])],
             device="cpu", test_data_fn=lambda c: (TEST[0][:10], TEST[1][:10]))
    strategy = FedBPG(model_fn=UserNet, ensemble_distillation=False, adaptive_fusion=False,
                      deep_personalisation=False, **TINY_BPG)
    assert strategy.generator is None
    grid = InProcessGrid(app, {}, NODES, tamper=count)
    initial, result = run(strategy, grid)
    assert changed(initial, result)
    for metrics in result.train_metrics_clientapp.values():
        assert not any(k.startswith(("generator-", "tuning-")) for k in metrics)
        assert "fusion-alpha" not in metrics
    evaluate = [m for m in grid.sent if m.metadata.message_type == EVALUATE_FEDBPG]
    assert evaluate and not evaluate[0].content["config"]["deep-personalisation"]
    assert scored == [10] * (2 * NODES)  # every node, both rounds, on its 10 test images
    assert all(ALPHAS not in c.state for c in grid.nodes.values())  # nothing was fused


def test_bad_arguments_fail_at_construction_naming_the_argument():
    flat = lambda: nn.Sequential(nn.Flatten(), nn.Linear(784, 10))  # noqa: E731
    with pytest.raises(TypeError, match="FedGen works on the model's latent layer"):
        FedGen(model_fn=flat)
    with pytest.raises(ValueError, match="decay"):
        FedGen(model_fn=UserNet, decay=1.5)
    with pytest.raises(ValueError, match=r"model_fn's model cannot take images of "
                                         r"image_shape \(1, 30, 30\), of shape"):
        FedBPG(model_fn=UserNet, image_shape=(1, 30, 30))
    with pytest.raises(ValueError, match="initial_arrays do not fit"):
        FedGen(model_fn=UserNet, device="cpu").start(
            grid=InProcessGrid(user_client_app(), {}, NODES),
            initial_arrays=ArrayRecord(flat().state_dict()), num_rounds=1)
