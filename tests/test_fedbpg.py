"""FedBPG as a strategy (fedgo_app/strategies/fedbpg.py): the server's tuning of the global
model on G's pseudo-data (Algorithm 1 of the appendix), the clients' fusion kept across rounds,
the personalised accuracy, and the ablation switches, on the in-process grid (the real
ServerApp and ClientApp code; the real runtime's run is in test_flwr_run.py)."""

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import client_app.app as client_module
from fedgo_flwr.bpg import tune_global, tuning_loss
from fedgo_app.config import ConfigError
from fedgo_app.strategies.fedbpg import ALPHAS, LOCAL_MODEL
from fedgo_lab.inprocess import InProcessGrid
from fedgo_lab.report import label
from server_app.app import run

pytestmark = pytest.mark.app


def test_the_empirical_loss_joins_the_kl_where_the_consensus_does_not_beat_the_global_model():
    y = torch.tensor([0, 0, 0])
    # sample 0: the consensus (two sure, right clients) beats the global model -> KL only,
    # retained; 1: the global model is better and the consensus good enough -> KL + CE;
    # 2: the global model is better but the consensus is poor (xi >= zeta) -> KL only
    clients = torch.tensor([[[4.0, 0.0], [1.0, 0.0], [0.0, 1.0]],
                            [[4.0, 0.0], [1.0, 0.0], [0.0, 1.0]]])
    global_logits = torch.tensor([[0.0, 1.0], [5.0, 0.0], [3.0, 0.0]], requires_grad=True)
    loss, keep, parts = tuning_loss(global_logits, clients, y, zeta=0.5)
    assert keep.tolist() == [True, False, False]
    assert parts["empirical_share"] == pytest.approx(1 / 3)
    kl = F.kl_div(global_logits.log_softmax(-1), clients[0].log_softmax(-1), log_target=True,
                  reduction="batchmean")
    ce = F.cross_entropy(global_logits[1:2], y[1:2])
    torch.testing.assert_close(loss, kl + ce / 3)
    # zeta = 0: no pseudo-sample passes, so nothing is retained and no CE is added
    loss0, keep0, _ = tuning_loss(global_logits, clients, y, zeta=0.0)
    assert not keep0.any()
    torch.testing.assert_close(loss0, kl)


class Fixed(nn.Module):
    """A 'client' that reads the label off pixel 0: logits 4 * onehot(round(x[0]))."""
    def forward(self, x):
        return 4 * F.one_hot(x.flatten(1)[:, 0].round().clamp(0, 1).long(), 2).float()


class Label(nn.Module):
    """G(z, y) = y in pixel 0 (a perfect generator)."""
    noise_dim = 2

    def forward(self, z, y):
        return y.float().view(-1, 1, 1, 1).expand(-1, 1, 2, 2).clone()


def test_tuning_uses_the_retained_pool_first_and_keeps_at_most_retain_max():
    torch.manual_seed(0)
    student = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))
    pool = (torch.zeros(6, 1, 2, 2), torch.zeros(6, dtype=torch.long))
    rng = torch.Generator().manual_seed(0)
    before = F.cross_entropy(student(Label()(None, torch.tensor([0, 1] * 8))),
                             torch.tensor([0, 1] * 8)).item()
    kept, info = tune_global(student, [Fixed(), Fixed()], Label(), torch.tensor([0.5, 0.5]),
                             pool, steps=40, batch_size=4, lr=0.05, zeta=1.0, retain_max=5,
                             rng=rng)
    assert info["from_pool"] == pytest.approx(2 / 40)  # 6 pooled samples: two batches of 4
    assert 0 < len(kept[1]) <= 5 and kept[0].shape[1:] == (1, 2, 2)
    # the consensus is right on every pseudo-sample: the student learns it
    after = F.cross_entropy(student(Label()(None, torch.tensor([0, 1] * 8))),
                            torch.tensor([0, 1] * 8)).item()
    assert after < 0.5 * before
    assert info["consensus_acc"] == 1.0


def _run(cfg, partitions=4):
    grid = InProcessGrid(client_module.app, cfg.to_run_config(), partitions)
    return json.loads(run(grid, cfg).read_text()), grid


@pytest.fixture
def bpg(tiny_config):
    return tiny_config.replace(strategy="fedbpg", personal_test_fraction=0.25, fraction_train=1.0,
                               fedbpg_generator_steps=2, fedbpg_tune_steps=3,
                               fedbpg_fusion_steps=3, fedbpg_batch_size=8)


def test_fedbpg_tunes_the_global_model_and_its_clients_keep_and_fuse_their_own(bpg):
    record, grid = _run(bpg)
    rounds = record["rounds"]
    for r in rounds[1:]:
        assert set(r["generator"]) == {"authenticity", "diversity", "effectiveness"}
        assert r["tuning"]["retained"] >= 0 and 0 <= r["tuning"]["consensus_acc"] <= 1
        assert 0 <= r["tuning"]["averaged_test_acc"] <= 1
        assert 0 <= r["personalised_test_acc"] <= 1 and r["personalised"]["clients"] == 4
    assert "fusion_alpha" not in rounds[1]  # round 1: no local model yet, nothing to fuse
    assert 0 <= rounds[2]["fusion_alpha"] <= 1  # round 2: every client fused its own
    for context in grid.nodes.values():  # each node kept its omega_k and alphas
        assert LOCAL_MODEL in context.state.array_records and ALPHAS in context.state
    assert label(record) == "fedbpg"


def test_without_ed_and_af_fedbpg_global_model_is_fedavgs(bpg):
    """The ablations compose: without ED the server averages; without AF the clients start
    from the global model; so the global model is FedAvg's, round by round."""
    ablated, _ = _run(bpg.replace(run_name="ablated", fedbpg_ensemble_distillation=False,
                                  fedbpg_adaptive_fusion=False))
    fedavg, _ = _run(bpg.replace(run_name="fedavg", strategy="fedavg"))
    assert [r["server_test_acc"] for r in ablated["rounds"]] == \
        [r["server_test_acc"] for r in fedavg["rounds"]]
    assert "generator" not in ablated["rounds"][1] and "tuning" not in ablated["rounds"][1]
    # DP changes only the personal model: FedBPG w/o ED, AF is FedAvg plus a last-layer tune
    assert ablated["rounds"][2]["personalised_test_acc"] != \
        fedavg["rounds"][2]["personalised_test_acc"]
    assert label(ablated) == "fedbpg[w/o ED, w/o AF]"


def test_fedbpg_needs_a_personal_test_split(tiny_config):
    with pytest.raises(ConfigError, match="personal-test-fraction.*fedbpg"):
        tiny_config.replace(strategy="fedbpg").validate()


def test_rows_name_the_ablations_and_a_partitioner_other_than_dirichlet():
    from fedgo_app.strategies import STRATEGIES
    spec = STRATEGIES["fedbpg"]
    assert spec.label({"fedbpg-deep-personalisation": False}) == "fedbpg[w/o DP]"
    assert spec.label({"partitioner": "pathological"}) == "fedbpg[pathological]"
    assert STRATEGIES["fedavg"].label({"partitioner": "dirichlet"}) == "fedavg"
