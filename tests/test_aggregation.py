"""The aggregation seam: each robust rule is Flower's (the strategy's own aggregate_train on the
same models gives the same model), Krum's rules drop what lies far from the rest, and a run
with a robust aggregator starts every strategy's server update from its aggregate."""

import json

import pytest
import torch
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import Bulyan, FedMedian, FedTrimmedAvg, Krum, MultiKrum
from flwr.supercore.task_identity import TaskIdentity

from client_app.app import app as client_app
from fedgo_flwr.aggregation import Aggregation, Aggregator, aggregate
from fedgo_flwr.keys import ConfigError
from fedgo_lab.inprocess import InProcessGrid
from server_app.app import run


def _models(n=9, seed=0):
    torch.manual_seed(seed)
    states = [{"w": torch.randn(4, 3), "b": torch.randn(3),
               "count": torch.tensor(10 * i + 3, dtype=torch.int64)} for i in range(n)]
    return states, [50 + 7 * i for i in range(n)]


def _flower(strategy, states, num_examples):
    """Flower's strategy, run as a ServerApp would run it on reply messages."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    replies = [Message(RecordDict({"arrays": ArrayRecord({k: v.clone() for k, v in s.items()}),
                                   "metrics": MetricRecord({"num-examples": k})}),
                       dst_node_id=0, message_type="train")
               for s, k in zip(states, num_examples)]
    arrays, _ = strategy.aggregate_train(1, replies)
    return arrays.to_torch_state_dict()


@pytest.mark.unit
@pytest.mark.parametrize("how,flower", [
    (Aggregation("median"), FedMedian()),
    (Aggregation("trimmed-mean", trim=0.2), FedTrimmedAvg(beta=0.2)),
    (Aggregation("krum", byzantine=2), Krum(num_malicious_nodes=2)),
    (Aggregation("multi-krum", byzantine=2, select=4),
     MultiKrum(num_malicious_nodes=2, num_nodes_to_select=4)),
    (Aggregation("multi-krum", byzantine=2), MultiKrum(num_malicious_nodes=2,
                                                       num_nodes_to_select=7)),
    (Aggregation("bulyan", byzantine=1), Bulyan(num_malicious_nodes=1)),
])
def test_each_robust_rule_equals_flowers_strategy_on_the_same_models(how, flower):
    states, n = _models()
    ours = aggregate(states, n, states[0], how).state
    theirs = _flower(flower, states, n)
    for name in ("w", "b"):
        torch.testing.assert_close(ours[name], theirs[name].float(), rtol=1e-6, atol=1e-6)
        assert ours[name].dtype == torch.float32
    # an integer buffer (BatchNorm's counter) is Flower's value rounded, and stays an integer
    assert ours["count"].dtype == torch.int64
    assert ours["count"].item() == round(float(theirs["count"]))


@pytest.mark.unit
def test_mean_is_the_n_k_weighted_average():
    states, n = _models(3)
    out = aggregate(states, n, states[0]).state
    expected = sum(s["w"].double() * k for s, k in zip(states, n)) / sum(n)
    torch.testing.assert_close(out["w"], expected.float())
    assert out["count"].item() == round(sum(s["count"].item() * k for s, k in zip(states, n))
                                        / sum(n))


@pytest.mark.unit
def test_krum_and_the_median_ignore_a_scaled_model_the_mean_follows():
    states, n = _models(7)
    states[2] = {k: (v * 1000 if v.is_floating_point() else v) for k, v in states[2].items()}
    krum = aggregate(states, n, states[0], Aggregation("krum", byzantine=1))
    assert krum.selected != [2] and len(krum.selected) == 1
    multi = aggregate(states, n, states[0], Aggregation("multi-krum", byzantine=1))
    assert 2 not in multi.selected and len(multi.selected) == 6
    honest = torch.stack([s["w"] for i, s in enumerate(states) if i != 2])
    median = aggregate(states, n, states[0], Aggregation("median")).state["w"]
    assert median.abs().max() <= honest.abs().max()
    assert aggregate(states, n, states[0]).state["w"].abs().max() > 10 * honest.abs().max()


@pytest.mark.unit
def test_bulyan_with_too_few_models_keeps_nothing():
    states, n = _models(6)
    assert aggregate(states, n, states[0], Aggregation("bulyan", byzantine=1)) is None  # < 7


@pytest.mark.unit
def test_the_aggregator_is_a_library_strategys_aggregate_fn_on_its_replies():
    """Aggregator(how) as `aggregate_fn`: the round's model is `aggregate`'s on the replies'
    models, `selected` names Krum's choice, and a rule that cannot combine this many keeps
    the global model (aggregate_train returns None)."""
    from fedgo_flwr.strategies.base import ServerUpdateFedAvg

    states, n = _models(7)
    states[2] = {k: (v * 1000 if v.is_floating_point() else v) for k, v in states[2].items()}
    how = Aggregation("multi-krum", byzantine=1)
    strategy = ServerUpdateFedAvg(model_fn=lambda: torch.nn.Linear(1, 1),
                                  aggregate_fn=Aggregator(how))
    contents = [RecordDict({"arrays": ArrayRecord(s), "metrics": MetricRecord(
        {"num-examples": k})}) for s, k in zip(states, n)]
    out = strategy.aggregate_fn(contents, "num-examples").to_torch_state_dict()
    expected = aggregate(states, n, states[0], how)
    torch.testing.assert_close(out["w"], expected.state["w"])
    assert strategy.aggregate_fn.selected == expected.selected and 2 not in expected.selected
    bulyan = Aggregator(Aggregation("bulyan", byzantine=2))
    assert bulyan(contents, "num-examples") is None and bulyan.selected is None
    with pytest.raises(ValueError, match="aggregator is 'geomed'; allowed: mean, median"):
        Aggregator(Aggregation("geomed"))


@pytest.mark.unit
def test_bad_aggregator_keys_fail_naming_the_key(tiny_config):
    with pytest.raises(ConfigError, match="'aggregator'.*allowed: .*bulyan"):
        tiny_config.replace(aggregator="geomed").validate()
    with pytest.raises(ConfigError, match="'aggregator-trim'"):
        tiny_config.replace(aggregator_trim=0.5).validate()


@pytest.mark.app
@pytest.mark.parametrize("strategy", ["fedavg", "fedgo"])
def test_a_run_with_krum_leaves_out_a_scaled_client_model(tiny_config, strategy):
    """Partition 1's reply scaled by 1000: Krum (f = 1) never selects it, and the server model
    stays where honest models are (a mean would carry the scale into it)."""
    def tamper(reply):
        arrays = reply.content.array_records.get("arrays")
        if arrays is not None and (reply.metadata.src_node_id - 1000) // 17 == 1:
            state = {k: (v * 1000 if v.is_floating_point() else v)
                     for k, v in arrays.to_torch_state_dict().items()}
            reply.content.array_records["arrays"] = ArrayRecord(state)
        return reply

    records = {}
    for rule in ("mean", "krum"):
        cfg = tiny_config.replace(strategy=strategy, aggregator=rule, aggregator_byzantine=1,
                                  fraction_train=1.0, num_server_rounds=1, run_name=rule)
        grid = InProcessGrid(client_app, cfg.to_run_config(), 4, tamper=tamper)
        records[rule] = json.loads(run(grid, cfg).read_text())
    selected = records["krum"]["rounds"][1]["aggregation"]["selected"]
    assert len(selected) == 1 and selected != [1]
    assert "aggregation" not in records["mean"]["rounds"][1]
    # FedAvg's mean of a 1000x model is useless; Krum's choice is an honest client's model
    assert records["krum"]["rounds"][1]["server_test_loss"] < records["mean"]["rounds"][1][
        "server_test_loss"]


@pytest.mark.app
def test_a_round_with_too_few_models_for_bulyan_keeps_the_previous_model(tiny_config):
    cfg = tiny_config.replace(strategy="fedavg", aggregator="bulyan", aggregator_byzantine=1,
                              fraction_train=1.0, num_server_rounds=1)
    grid = InProcessGrid(client_app, cfg.to_run_config(), 4)  # 4 < 4f + 3
    rounds = json.loads(run(grid, cfg).read_text())["rounds"]
    assert rounds[1]["aggregation"] == {"kept_previous": [cfg.model]}
    assert rounds[1]["server_test_acc"] == rounds[0]["server_test_acc"]
