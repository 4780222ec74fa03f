"""The library as a Flower user meets it: `FedGO(...).start(...)` with Flower's standard
arguments over the in-process grid, a model of the user's own (not one of the project's
registered models), a ClientApp of the user's own with the library's handlers registered,
and nodes that come late."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg, Result
from torch import nn

from conftest import tiny_images
from fedgo_flwr import DaFKD, FedDF, FedGO
from fedgo_flwr.client import register
from fedgo_flwr.inputs import images_of, labelled
from fedgo_lab.inprocess import InProcessGrid

pytestmark = pytest.mark.app

NODES = 4


class UserNet(nn.Module):
    """A user's model: not registered anywhere; features/head/latent_dim for DaFKD."""

    latent_dim = 16

    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Conv2d(1, 4, 5, 2, 2), nn.ReLU(), nn.Flatten(),
                                   nn.Linear(4 * 14 * 14, self.latent_dim), nn.ReLU())
        self.fc = nn.Linear(self.latent_dim, 10)

    def features(self, x):
        return self.trunk(x)

    def head(self, z):
        return self.fc(z)

    def forward(self, x):
        return self.head(self.features(x))


def to_input(x: np.ndarray) -> torch.Tensor:
    """The user's own preprocessing: floats in [-1, 1], [N, 1, 28, 28]."""
    return torch.from_numpy(x).float().div(127.5).sub(1).unsqueeze(1)


rng = np.random.default_rng(1)
_x, _y = tiny_images(NODES * 40 + 120, rng)
PARTS = [(to_input(_x[i * 40:(i + 1) * 40]), torch.from_numpy(_y[i * 40:(i + 1) * 40]).long())
         for i in range(NODES)]
U = to_input(_x[NODES * 40:NODES * 40 + 80])
TEST = (to_input(_x[-40:]), torch.from_numpy(_y[-40:]).long())


def user_client_app() -> ClientApp:
    """A ClientApp as a Flower user writes one, plus the library's one `register` call."""
    app = ClientApp()

    def data(context):
        return PARTS[int(context.node_config["partition-id"])]

    @app.train()
    def train(msg, context):
        model = UserNet()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        x, y = data(context)
        opt = torch.optim.SGD(model.parameters(), lr=float(msg.content["config"]["lr"]))
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()),
                                   "metrics": MetricRecord({"num-examples": len(y),
                                                            "train-loss": loss.item()})}),
                       reply_to=msg)

    @app.evaluate()
    def evaluate(msg, context):
        model = UserNet()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        x, y = data(context)
        acc = (model(x).argmax(1) == y).float().mean().item()
        return Message(RecordDict({"metrics": MetricRecord({"num-examples": len(y),
                                                            "eval-acc": acc})}), reply_to=msg)

    register(app, model_fn=UserNet, data_fn=data, device="cpu")
    return app


def central_evaluation(server_round, arrays):
    model = UserNet()
    model.load_state_dict(arrays.to_torch_state_dict())
    with torch.no_grad():
        acc = (model(TEST[0]).argmax(1) == TEST[1]).float().mean().item()
    return MetricRecord({"accuracy": acc})


# the user's handler reads lr; DaFKD's client step, which replaces it, all three
TRAINING = ConfigRecord({"lr": 0.05, "local-epochs": 1, "optimizer": "sgd"})
SMALL = dict(distill_epochs=1, distill_batch_size=32, fraction_evaluate=0.5, device="cpu")
SMALL_GAN = dict(generator_steps=2, generator_width=8, latent_dim=16, gan_batch_size=16,
                 discriminator_epochs=1, discriminator_width=8)


def run(strategy, grid=None, rounds=2):
    grid = grid or InProcessGrid(user_client_app(), {}, NODES)
    torch.manual_seed(0)
    initial = ArrayRecord(UserNet().state_dict())
    result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=rounds,
                            train_config=TRAINING,
                            evaluate_fn=central_evaluation)
    return initial, result


def changed(initial: ArrayRecord, result: Result) -> bool:
    a, b = initial.to_torch_state_dict(), result.arrays.to_torch_state_dict()
    return any(not torch.equal(a[k], b[k]) for k in a)


def test_fedgo_starts_as_flower_documents_it_with_a_users_model():
    strategy = FedGO(unlabeled_data=U, model_fn=UserNet, **SMALL, **SMALL_GAN)
    assert isinstance(strategy, FedAvg)
    initial, result = run(strategy)
    assert len(strategy.log_odds) == NODES  # a discriminator from every node
    assert sorted(result.train_metrics_clientapp) == [1, 2]
    for metrics in result.train_metrics_clientapp.values():
        assert metrics["distill-teachers"] == NODES and metrics["distill-loss"] >= 0
        assert "train-loss" in metrics  # the clients' own, averaged as FedAvg does
    assert sorted(result.evaluate_metrics_serverapp) == [0, 1, 2]
    assert sorted(result.evaluate_metrics_clientapp) == [1, 2]  # Flower's federated evaluation
    assert changed(initial, result)


def test_the_caller_s_train_config_reaches_the_clients():
    grid = InProcessGrid(user_client_app(), {}, NODES)
    run(FedDF(unlabeled_data=U, model_fn=UserNet, **SMALL), grid, rounds=1)
    sent = [m for m in grid.sent if m.metadata.message_type == "train"]
    assert sent and all(m.content["config"]["lr"] == 0.05 for m in sent)


def test_feddf_and_dafkd_run_in_the_same_app():
    initial, result = run(FedDF(unlabeled_data=U, model_fn=UserNet, **SMALL))
    assert changed(initial, result) and result.train_metrics_clientapp[2]["distill-teachers"]
    dafkd = DaFKD(model_fn=UserNet, image_shape=(1, 28, 28), distill_size=32, gan_rounds=1,
                  latent_dim=16, generator_width=8, **SMALL)
    initial, result = run(dafkd)
    assert changed(initial, result)
    assert result.train_metrics_clientapp[2]["distill-teachers"] == NODES
    assert sorted(result.evaluate_metrics_serverapp) == [0, 1, 2]


class SlowGrid(InProcessGrid):
    """A grid whose node `slow` answers the discriminator request only after the pre-FL
    stage's wait, and whose node `late` connects only after the pre-FL stage."""

    def __init__(self):
        super().__init__(user_client_app(), {}, NODES)
        self.slow, self.late = list(self.nodes)[:2]
        self.offline.add(self.late)
        self.hold_slow = True

    def pull_messages(self, message_ids):
        replies = super().pull_messages(message_ids)
        held = [r for r in replies if self.hold_slow and r.metadata.src_node_id == self.slow
                and "discriminator" in r.content.array_records]
        for r in held:  # back in the queue, answered later
            self.replies[r.metadata.reply_to_message_id] = r
        return [r for r in replies if r not in held]


def test_nodes_that_come_late_get_g_and_their_discriminators_join():
    grid = SlowGrid()
    strategy = FedGO(unlabeled_data=U, model_fn=UserNet, **SMALL, **SMALL_GAN)

    def evaluate(server_round, arrays):
        if server_round == 0:  # after the pre-FL stage: one D missing, one node unseen
            assert set(strategy.log_odds) == set(grid.nodes) - {grid.slow, grid.late}
            grid.hold_slow = False
            grid.back_online(grid.late)
        return central_evaluation(server_round, arrays)

    strategy.start(grid=grid, initial_arrays=ArrayRecord(UserNet().state_dict()),
                   num_rounds=2, timeout=0.5, train_config=TRAINING,
                   evaluate_fn=evaluate)
    assert set(strategy.log_odds) == set(grid.nodes)


def test_malformed_replies_are_left_out_with_a_reason(caplog):
    def tamper(reply):
        if reply.metadata.src_node_id == 1000 and "arrays" in reply.content.array_records:
            state = reply.content["arrays"].to_torch_state_dict()
            state["fc.weight"] = state["fc.weight"][:3]
            reply.content["arrays"] = ArrayRecord(state)
        return reply

    grid = InProcessGrid(user_client_app(), {}, NODES, tamper=tamper)
    _, result = run(FedDF(unlabeled_data=U, model_fn=UserNet, **SMALL), grid, rounds=1)
    assert "train reply of node 1000 left out: fc.weight has shape" in caplog.text
    assert result.train_metrics_clientapp[1]["distill-teachers"] == NODES - 1


def test_a_robust_aggregate_fn_replaces_the_mean_before_distillation():
    chosen = []

    def first_model(contents, weighted_by_key):  # a stand-in for a robust rule
        chosen.append(contents[0]["arrays"].to_torch_state_dict())
        return contents[0]["arrays"]

    strategy = FedDF(unlabeled_data=U, model_fn=UserNet, aggregate_fn=first_model,
                     **{**SMALL, "distill_epochs": 0})  # no distillation: the aggregate stays
    _, result = run(strategy, rounds=1)
    kept = result.arrays.to_torch_state_dict()
    assert len(chosen) == 1 and all(torch.equal(kept[k], v) for k, v in chosen[0].items())


def test_bad_arguments_fail_at_construction_naming_the_argument():
    with pytest.raises(ValueError, match="distill_schedule is 'linear'; allowed: cosine"):
        FedDF(unlabeled_data=U, model_fn=UserNet, distill_schedule="linear")
    with pytest.raises(ValueError, match="weighting 'votes'; allowed: odds"):
        FedGO(unlabeled_data=U, model_fn=UserNet, weighting="votes")
    with pytest.raises(TypeError, match="DaFKD works on the model's latent layer"):
        DaFKD(model_fn=lambda: nn.Sequential(nn.Flatten(), nn.Linear(784, 10)),
              image_shape=(1, 28, 28))


def test_data_comes_as_tensors_datasets_or_loaders_of_dicts():
    x, y = PARTS[0]
    loader = torch.utils.data.DataLoader([{"img": a, "label": b} for a, b in zip(x, y)],
                                         batch_size=16)
    lx, ly = labelled(loader)
    assert torch.equal(lx, x) and torch.equal(ly, y)
    dataset = torch.utils.data.TensorDataset(x, y)
    assert torch.equal(images_of(dataset), x) and torch.equal(labelled(dataset)[1], y)
    with pytest.raises(ValueError, match="no images under any of"):
        images_of(torch.utils.data.DataLoader([{"pixels": a} for a in x], batch_size=8))


def test_the_lasting_options_reach_the_librarys_distillation():
    """teacher_floor, confidence_threshold, distill_budget and past_teachers (not in the
    papers) compose with every ensemble strategy of the library; the threshold leaves out the
    unsure pseudo-labels, the budget takes the share of the steps that is the average's
    disagreement, the past global models join from round 2 on."""
    plain = FedDF(unlabeled_data=U, model_fn=UserNet, **SMALL)
    _, result = run(plain, rounds=1)
    assert result.train_metrics_clientapp[1]["distill-kept"] == 1.0
    sure = FedDF(unlabeled_data=U, model_fn=UserNet, confidence_threshold=0.99, **SMALL)
    _, result = run(sure, rounds=1)
    assert 0 <= result.train_metrics_clientapp[1]["distill-kept"] < 1.0
    floor = FedGO(unlabeled_data=U, model_fn=UserNet, teacher_floor=True, **SMALL, **SMALL_GAN)
    initial, result = run(floor, rounds=1)
    assert changed(initial, result)
    budget = FedDF(unlabeled_data=U, model_fn=UserNet, distill_budget="disagreement", **SMALL)
    _, result = run(budget, rounds=1)
    metrics = result.train_metrics_clientapp[1]
    assert 0 <= metrics["disagreement"] <= 1
    # ceil(share x steps) steps: at most one batch more than the share of the images
    batch = SMALL["distill_batch_size"]
    assert metrics["distill-kept"] <= metrics["disagreement"] + batch / len(U)
    probe = FedDF(unlabeled_data=U, model_fn=UserNet, distill_budget="disagreement",
                  budget_probe=SMALL["distill_batch_size"], **SMALL)  # the first step's images
    _, result = run(probe, rounds=1)
    assert 0 <= result.train_metrics_clientapp[1]["disagreement"] <= 1
    with pytest.raises(ValueError, match="budget_probe is 64; allowed: >= 0, and 0 unless"):
        FedDF(unlabeled_data=U, model_fn=UserNet, budget_probe=64)
    past = FedDF(unlabeled_data=U, model_fn=UserNet, past_teachers=2, **SMALL)
    _, result = run(past, rounds=3)
    assert [result.train_metrics_clientapp[t]["past-teachers"] for t in (1, 2, 3)] == [0, 1, 2]
    with pytest.raises(ValueError, match="past_teachers is -1; allowed: an integer >= 0"):
        FedDF(unlabeled_data=U, model_fn=UserNet, past_teachers=-1)
    with pytest.raises(ValueError, match="distill_budget is 'half'; allowed: full, disagreement"):
        FedDF(unlabeled_data=U, model_fn=UserNet, distill_budget="half")
    with pytest.raises(ValueError, match=r"confidence_threshold is 1.5; allowed: \[0, 1\)"):
        FedDF(unlabeled_data=U, model_fn=UserNet, confidence_threshold=1.5)


def test_teachers_per_image_labels_each_image_by_its_top_odds_teachers():
    """teachers_per_image = 1: each image's pseudo-label is the prediction of the one teacher
    of largest n_k Phi_k(u), as eq. (9) ranks them from the odds, and the weight the others
    held is reported; at K or more it is the paper's ensemble, unchanged."""
    reports = []
    top = FedGO(unlabeled_data=U, model_fn=UserNet, teachers_per_image=1,
                ensemble_space="probabilities", observers=[reports.append], **SMALL, **SMALL_GAN)
    _, result = run(top, rounds=1)
    report = reports[-1]
    teachers, nets, targets = (report.details[k] for k in ("teachers", "nets", "targets"))
    n_k = torch.tensor([float(m.num_examples) for m in teachers])
    log_w = torch.stack([top.log_odds[m.key][0] for m in teachers]) + n_k.log()[:, None]
    labelled = (~targets[0, :, 0].isnan()).nonzero().squeeze(1)
    assert len(labelled) == len(U)
    best = log_w.argmax(0)
    with torch.no_grad():
        expected = torch.cat([F.softmax(nets[k].eval()(U[i:i + 1]), -1)
                              for i, k in enumerate(best.tolist())])
    torch.testing.assert_close(targets[0], expected, rtol=1e-4, atol=1e-5)
    dropped = 1 - torch.softmax(log_w, 0).max(0).values.mean().item()
    assert result.train_metrics_clientapp[1]["dropped-weight"] == pytest.approx(dropped, abs=1e-5)
    assert 0 < dropped < 1
    runs = [run(FedGO(unlabeled_data=U, model_fn=UserNet, **SMALL, **SMALL_GAN, **extra),
                rounds=1)[1].arrays.to_torch_state_dict()
            for extra in ({}, {"teachers_per_image": NODES})]
    assert all(torch.equal(runs[0][k], runs[1][k]) for k in runs[0])
    with pytest.raises(ValueError, match="teachers_per_image is 2 with weighting 'uniform'"):
        FedGO(unlabeled_data=U, model_fn=UserNet, weighting="uniform", teachers_per_image=2)
