"""Fuzzed replies (hypothesis): random malformed and hostile replies thrown at the reply checks
and at a short in-process FedGO run. The ServerApp never crashes, no hostile value reaches the
model or the odds, and the record counts each rejected reply."""

import json
import math

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from client_app.app import app as client_app
from fedgo_flwr.strategies.base import ServerUpdateFedAvg
from fedgo_flwr.guard import scores_problem
from fedgo_lab.inprocess import InProcessGrid
from server_app.app import run

pytestmark = pytest.mark.app

# What a hostile client can do to a well-formed reply, and whether the server must refuse it
# (False: the reply stays usable, and harmless: an extra record, another float dtype, a float
# count; a count above what discovery said is used at discovery's value).
MUTATIONS = {
    "drop-arrays": True, "rename-tensor": True, "shape": True, "nan": True, "inf": True,
    "zero-n": True, "negative-n": True, "nan-n": True, "inf-n": True, "drop-metrics": True,
    "list-n": True,
    "huge-n": False, "float-n": False, "float64": False, "extra-array": False,
    "extra-metric": False,
}


def mutate(content: RecordDict, how: str, array_key: str) -> None:
    """Change a reply's content in place, as `how` says."""
    arrays = content.array_records[array_key].to_torch_state_dict()
    name = next(n for n, v in arrays.items() if v.is_floating_point() and v.numel() > 1)
    metrics = content.metric_records["metrics"]
    if how == "drop-arrays":
        del content[array_key]
    elif how == "drop-metrics":
        del content["metrics"]
    elif how in ("rename-tensor", "shape", "nan", "inf", "float64"):
        value = arrays.pop(name)
        if how == "rename-tensor":
            arrays[name + "_evil"] = value
        else:
            arrays[name] = (value[..., :1].clone() if how == "shape" else
                            value.double() if how == "float64" else
                            value.index_fill(0, torch.tensor([0]),
                                             math.nan if how == "nan" else math.inf))
        content[array_key] = ArrayRecord(arrays)
    elif how == "extra-array":
        content["evil"] = ArrayRecord({"x": torch.full((3,), 1e30)})
    elif how == "extra-metric":
        metrics["evil"] = 1e30
    else:
        metrics["num-examples"] = {"zero-n": 0, "negative-n": -50, "nan-n": math.nan,
                                   "inf-n": math.inf, "huge-n": 10 ** 12, "float-n": 40.0,
                                   "list-n": [1, 2]}[how]


class Tiny(torch.nn.Module):
    """A model with a float matrix, a bias and an integer buffer."""

    def __init__(self):
        super().__init__()
        self.w, self.b = torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(3))
        self.register_buffer("count", torch.tensor(5, dtype=torch.int64))


def _honest_reply(template):
    from flwr.supercore.task_identity import TaskIdentity
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    return Message(RecordDict({"arrays": ArrayRecord(template),
                               "metrics": MetricRecord({"num-examples": 100})}),
                   dst_node_id=0, message_type="train")


@settings(max_examples=150, deadline=None)
@given(how=st.sampled_from(sorted(MUTATIONS)), seed=st.integers(0, 2 ** 16))
def test_the_reply_check_refuses_every_hostile_reply_and_keeps_the_harmless(how, seed):
    torch.manual_seed(seed)
    strategy = ServerUpdateFedAvg(model_fn=Tiny)
    reply = _honest_reply({k: v.clone() for k, v in Tiny().state_dict().items()})
    assert strategy.reply_problem(reply) is None
    mutate(reply.content, how, "arrays")
    why = strategy.reply_problem(reply)
    assert (why is not None) == MUTATIONS[how], (how, why)


@settings(max_examples=100, deadline=None)
@given(acc=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 5)),
       n=st.one_of(st.floats(allow_nan=True), st.integers(-10, 10)))
def test_the_guards_score_check_takes_only_accuracies_in_0_1(acc, n):
    reply = _honest_reply({"w": torch.zeros(1)})
    reply.content["metrics"] = MetricRecord({"num-examples": n, "averaged-acc": acc,
                                             "distilled-acc": 0.5})
    why = scores_problem(reply, ["averaged", "distilled"])
    ok = math.isfinite(n) and n > 0 and 0 <= acc <= 1
    assert (why is None) == ok


@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(plan=st.dictionaries(st.integers(0, 3), st.sampled_from(sorted(MUTATIONS)),
                            min_size=1, max_size=4),
       stage=st.sampled_from(["train", "train.discriminator"]))
def test_a_run_survives_hostile_replies_and_counts_each(tiny_config, plan, stage):
    """`plan`: partition -> what it does to its replies of `stage` (pre-FL discriminators or
    the round's models)."""
    array_key = "discriminator" if stage == "train.discriminator" else "arrays"

    def tamper(reply):
        pid = (reply.metadata.src_node_id - 1000) // 17
        if reply.metadata.message_type == stage and pid in plan and not reply.has_error():
            mutate(reply.content, plan[pid], array_key)
        return reply

    cfg = tiny_config.replace(fraction_train=1.0, num_server_rounds=1, run_name="fuzz")
    grid = InProcessGrid(client_app, cfg.to_run_config(), 4, tamper=tamper)
    refused = sorted(p for p, how in plan.items() if MUTATIONS[how])
    if stage == "train.discriminator" and len(refused) == 4:
        with pytest.raises(RuntimeError, match="no client returned a usable discriminator"):
            run(grid, cfg)
        return
    path = run(grid, cfg)
    record = json.loads(path.read_text())
    tally = (record["pre_fl"]["replies"] if stage == "train.discriminator"
             else record["rounds"][1]["replies"])
    assert sorted(map(int, tally["rejected"])) == refused
    assert tally["usable"] == 4 - len(refused)
    model = torch.load(path.parent / "model.pt")
    assert all(torch.isfinite(v).all() for v in model.values() if v.is_floating_point())
    if stage == "train.discriminator":  # the odds only of discriminators that passed
        assert np.isfinite(record["pre_fl"]["phi_on_u"]["max"])


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(key=st.sampled_from(["num-examples", "partition-id", "num-partitions"]),
       value=st.one_of(st.sampled_from([math.inf, -math.inf, math.nan, -3, 0, 10 ** 12, 99]),
                       st.floats(allow_nan=True, allow_infinity=True)))
def test_a_hostile_answer_at_discovery_leaves_its_node_out_or_bounded(tiny_config, key, value):
    """Partition 2 lies in its discovery answer: a malformed answer leaves the node out (the
    run goes on with the others); a huge but well-formed n_k is taken, and a round's reply
    cannot raise it further."""
    def tamper(reply):
        info = reply.content.metric_records.get("info")
        if info is not None and info["partition-id"] == 2:
            info[key] = value
        return reply

    cfg = tiny_config.replace(strategy="fedavg", num_server_rounds=1, run_name="discovery",
                              join_timeout=5.0)
    grid = InProcessGrid(client_app, cfg.to_run_config(), 4, tamper=tamper)
    record = json.loads(run(grid, cfg).read_text())["clients"]
    whole = math.isfinite(value) and float(value).is_integer()
    if key == "num-examples" and whole and value > 0:
        assert record["num_examples"]["2"] == int(value)  # taken; sample-size-cap bounds it
    elif whole and value == {"partition-id": 2, "num-partitions": 4}.get(key):
        assert "2" in record["num_examples"]  # the lie is the truth
    else:
        assert "2" not in record["num_examples"] and "node 1034" in record["refused"]
        assert sorted(record["num_examples"]) == ["0", "1", "3"]
