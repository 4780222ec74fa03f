"""The client-side extension point and FedProx: strategies bring their own client handlers and
keys; the ClientApp only dispatches."""

import importlib
import json
from dataclasses import dataclass

import pytest
import torch
from fedgo_flwr.strategies.fedgen import TRAIN_FEDGEN
from fedgo_flwr.strategies.rounds import ClientModel
from flwr.app import ArrayRecord, Message, RecordDict

import client_app.app as client_module
from conftest import REPO
from fedgo_app.client_context import Local, config_of, reply
from fedgo_app.config import Config, ConfigError, check
from fedgo_flwr.models import CNN, create_classifier
from fedgo_app.server.clients import config_record
from fedgo_app.strategies import STRATEGIES, FedAvgStrategy, StrategySpec
from fedgo_app.strategies.base import CLIENT
from fedgo_flwr.client import proximal_term
from fedgo_lab.inprocess import InProcessGrid
from server_app.app import run


def _run(cfg, app=None, num_partitions=4):
    grid = InProcessGrid(app or client_module.app, cfg.to_run_config(), num_partitions)
    return json.loads(run(grid, cfg).read_text()), grid


# ------------------------------------------------------------------ the extension point
@dataclass(frozen=True)
class ThrowawayKeys:
    factor: int = 3

    def validate(self, cfg, strategies) -> None:
        check("throwaway-factor", self.factor >= 1, "must be >= 1")


class Throwaway(FedAvgStrategy):
    """Asks every client, before the rounds, for factor * (sum of its labels)."""

    def pre_fl(self, grid, timeout):
        super().pre_fl(grid, timeout)
        factor = self.cfg.keys("throwaway").factor
        msgs = [Message(RecordDict({"config": config_record(factor=factor)}), dst_node_id=c.node_id,
                        message_type="query.label_sum")
                for c in self.clients.by_partition.values()]
        replies = grid.send_and_receive(msgs, timeout=60)
        self.record.data["pre_fl"]["label_sums"] = sorted(
            int(r.content.metric_records["metrics"]["label-sum"]) for r in replies)


def label_sum(message, local: Local):
    return reply(message, {"label-sum": int(config_of(message)["factor"]) * int(local.y.sum())})


@pytest.fixture
def throwaway():
    spec = STRATEGIES.register(StrategySpec("throwaway", Throwaway,
                                            {**CLIENT, "query.label_sum": label_sum},
                                            keys=ThrowawayKeys))
    yield importlib.reload(client_module).app  # the ClientApp file as it is, imported anew
    del STRATEGIES[spec.name]
    importlib.reload(client_module)


def test_a_new_strategy_with_its_own_message_type_needs_no_clientapp_change(tiny_config,
                                                                           throwaway):
    source = (REPO / "client_app" / "app.py").read_bytes()
    cfg = Config.from_run_config({**tiny_config.to_run_config(), "strategy": "throwaway",
                                  "throwaway-factor": 2})
    record, grid = _run(cfg, throwaway)
    sums = []
    for pid in range(4):  # what each partition holds, computed here independently
        local = Local.of(grid.nodes[1000 + 17 * pid], cfg)
        sums.append(2 * int(local.y.sum()))
    assert record["pre_fl"]["label_sums"] == sorted(sums)
    assert [r["round"] for r in record["rounds"]] == [0, 1, 2]
    assert (REPO / "client_app" / "app.py").read_bytes() == source
    with pytest.raises(ConfigError, match="throwaway-factor"):
        Config.from_run_config({"strategy": "throwaway", "throwaway-factor": 0})


def test_registry_rejects_duplicates_and_bad_message_types():
    with pytest.raises(ValueError, match="already registered"):
        STRATEGIES.register(StrategySpec("fedavg", FedAvgStrategy, CLIENT))
    with pytest.raises(ValueError, match="message type"):
        STRATEGIES.register(StrategySpec("bad", FedAvgStrategy, {"train.a.b": label_sum}))
    with pytest.raises(ValueError, match="message type"):
        STRATEGIES.register(StrategySpec("bad", FedAvgStrategy, {"query.label-sum": label_sum}))
    assert "bad" not in STRATEGIES


def test_a_message_type_the_running_strategy_does_not_answer_is_an_error_reply(tiny_config):
    grid = InProcessGrid(client_module.app, tiny_config.replace(strategy="fedavg").to_run_config(), 2)
    msg = Message(RecordDict(), dst_node_id=1000, message_type="train.discriminator")
    out, = grid.send_and_receive([msg])
    assert out.has_error() and "no client handler" in out.error.reason


def test_every_declared_key_is_in_pyproject_with_its_default():
    import tomllib
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    from fedgo_app.config import strategy_declared
    keys = strategy_declared()
    assert {d.name for d in keys} >= {"fedprox-mu", "feddf-published", "dafkd-gan-rounds"}
    for d in keys:
        assert d.groups[0] in STRATEGIES and d.name.startswith(d.groups[0] + "-")
        assert declared[d.name] == d.default, d.name


# ------------------------------------------------------------------ FedProx
def test_proximal_term_gradient_is_mu_times_the_distance_to_the_global_model():
    torch.manual_seed(0)
    model = CNN()
    anchor = [w.detach().clone() for w in model.parameters()]
    with torch.no_grad():
        for w in model.parameters():
            w.add_(torch.randn_like(w))
    mu = 0.01
    proximal_term(model, anchor, mu).backward()
    for w, a in zip(model.parameters(), anchor):
        assert torch.allclose(w.grad, mu * (w.detach() - a), atol=1e-7)


def test_fedprox_sends_mu_and_its_clients_stay_closer_to_the_global_model(tiny_config):
    base = tiny_config.replace(strategy="fedavg", local_epochs=3, run_name="fedavg")
    prox = base.replace(strategy="fedprox", fedprox_mu=1.0, run_name="fedprox")
    avg_record, avg_grid = _run(base)
    prox_record, prox_grid = _run(prox)
    sent = [m for m in prox_grid.sent if m.metadata.message_type == "train"]
    assert sent and all(m.content.config_records["config"]["proximal-mu"] == 1.0 for m in sent)
    assert all("proximal-mu" not in m.content.config_records["config"]
               for m in avg_grid.sent if m.metadata.message_type == "train")
    # Same seed, same partitions and sampling: only the local objective differs.
    assert [r.get("clients") for r in avg_record["rounds"]] == \
        [r.get("clients") for r in prox_record["rounds"]]
    moved = []
    for cfg in (base, prox):
        model = create_classifier(cfg.model, 1, 10, 28)
        model.load_state_dict(torch.load(cfg.results_path / cfg.run_name / "model.pt"))
        torch.manual_seed(cfg.seed)
        start = create_classifier(cfg.model, 1, 10, 28)  # theta^0, as the ServerApp draws it
        moved.append(sum(((w - w0) ** 2).sum().item()
                         for w, w0 in zip(model.parameters(), start.parameters())))
    assert moved[1] < moved[0]  # the proximal term holds the models near w^t


@pytest.mark.parametrize("options", [{}, {"distill_budget": "disagreement", "past_teachers": 3,
                                           "budget_probe": 64}])
def test_fedprox_over_fedgo_keeps_fedgos_pre_fl_stage_and_options(tiny_config, options):
    cfg = tiny_config.replace(strategy="fedprox", fedprox_base="fedgo", **options)
    record, grid = _run(cfg)
    types = [m.metadata.message_type for m in grid.sent]
    assert types.count("train.discriminator") == 4
    assert all(m.content.config_records["config"]["proximal-mu"] == 0.001
               for m in grid.sent if m.metadata.message_type == "train")
    assert all("ensemble_test_acc" in r for r in record["rounds"][1:])
    # FedGO's server options act under FedProx's clients as under FedGO's own
    budgeted = [0 <= r["disagreement"] <= 1 for r in record["rounds"][1:] if "disagreement" in r]
    assert budgeted == ([True] * cfg.num_server_rounds if options else [])


@pytest.mark.parametrize("key, value, message", [
    ("fedprox-mu", 0.0, "is 0.0; allowed: > 0"),
    ("fedprox-base", "fedprox", "allowed: dafkd, fedavg"),
    ("fedprox-base", "nope", "allowed: dafkd, fedavg, feddf, feddisco, fedgo"),
])
def test_fedprox_keys_are_validated(key, value, message):
    with pytest.raises(ConfigError, match=message):
        Config.from_run_config({"strategy": "fedprox", key: value})


# ------------------------------------------------------------------ FedGen
from fedgo_flwr.models import FeatureGenerator  # noqa: E402
from fedgo_flwr.strategies.fedgen import train_feature_generator  # noqa: E402


def _teacher_loss(generator, nets, weights, y, eps):
    generator.eval()
    with torch.no_grad():
        z = generator(y, eps)
        ce = torch.stack([torch.nn.functional.cross_entropy(n.head(z), y, reduction="none")
                          for n in nets])
    return (weights[:, y] * ce).sum(0).mean().item()


def test_feature_generator_loss_decreases_on_fixed_heads():
    torch.manual_seed(0)
    nets = [CNN() for _ in range(3)]
    counts = torch.tensor([[50, 0, 10] + [5] * 7, [0, 40, 10] + [5] * 7, [10, 10, 0] + [5] * 7],
                          dtype=torch.float64)
    weights = (counts / counts.sum(0)).float()
    prior = (counts.sum(0) / counts.sum()).float()
    generator = FeatureGenerator(10, CNN.latent_dim)
    heads_before = [n.fc2.weight.clone() for n in nets]
    y, eps = torch.arange(10).repeat(20), torch.randn(200, 32)
    before = _teacher_loss(generator, nets, weights, y, eps)
    info = train_feature_generator(
        generator, nets, weights, prior, steps=60, batch_size=32,
        optimizer=torch.optim.Adam(generator.parameters(), lr=3e-3), diversity_weight=1.0,
        gen=torch.Generator().manual_seed(0), device=torch.device("cpu"))
    after = _teacher_loss(generator, nets, weights, y, eps)
    assert after < 0.5 * before, (before, after)
    assert 0 < info["diversity_loss"] <= 1
    assert all(torch.equal(n.fc2.weight, w) for n, w in zip(nets, heads_before))  # heads fixed


def test_fedgen_clients_learn_from_the_generated_features(tiny_config):
    """A client that receives G_w fits its head to G_w's features (eq. 5); one that does not,
    does not; both report their label counts."""
    torch.manual_seed(0)
    model = CNN()  # its 512 features fit the generated ones within 5 epochs; the 2NN's lag
    generator = FeatureGenerator(10, model.latent_dim).eval()
    with torch.no_grad():  # features that depend on the label more than on the noise
        generator.hidden.weight[:, 32:] *= 10
    prior = [0.1] * 10
    conf = config_record(local_epochs=5, batch_size=32, lr=1e-3, flip=False, random_crop=0,
                         optimizer="adam", momentum=0.9, seed=1, fedgen_alpha=10.0,
                         label_prior=prior, noise_dim=32, hidden_dim=256, num_classes=10)
    from fedgo_app.strategies.fedgen import FEDGEN
    generated_feature_update = FEDGEN.handlers[TRAIN_FEDGEN]  # the library's step, in the app
    cfg = tiny_config.replace(strategy="fedgen", model="cnn")
    grid = InProcessGrid(client_module.app, cfg.to_run_config(), 4)
    local = Local.of(grid.nodes[1000], cfg)
    y, eps = torch.arange(10).repeat(20), torch.randn(200, 32)
    losses = []
    for with_generator in (False, True):
        arrays = {"arrays": ArrayRecord(model.state_dict()), "config": conf}
        if with_generator:
            arrays["generator"] = ArrayRecord(generator.state_dict())
        out = generated_feature_update(Message(RecordDict(arrays), dst_node_id=1000,
                                               message_type=TRAIN_FEDGEN), local)
        metrics = out.content.metric_records["metrics"]
        assert metrics["label-counts"] == torch.bincount(local.y, minlength=10).tolist()
        trained = create_classifier(cfg.model, 1, 10, 28)
        trained.load_state_dict(out.content.array_records["arrays"].to_torch_state_dict())
        with torch.no_grad():
            losses.append(torch.nn.functional.cross_entropy(trained.head(generator(y, eps)), y).item())
    assert losses[1] < 0.5 * losses[0], losses


def test_fedgen_sends_the_generator_from_round_two_and_rejects_bad_label_counts(tiny_config,
                                                                               caplog):
    cfg = tiny_config.replace(strategy="fedgen", num_server_rounds=3, fedgen_generator_steps=5)

    def tamper(reply):
        metrics = reply.content.metric_records.get("metrics")
        if reply.metadata.src_node_id == 1000 and metrics and "label-counts" in metrics:
            metrics["label-counts"] = [1] * 10  # does not sum to n_k
        return reply

    grid = InProcessGrid(client_module.app, cfg.to_run_config(), 4, tamper=tamper)
    with caplog.at_level("WARNING"):
        record = json.loads(run(grid, cfg).read_text())
    train = [m for m in grid.sent if m.metadata.message_type == TRAIN_FEDGEN]
    rounds = [r for r in record["rounds"] if r["round"] > 0]
    with_g = ["generator" in m.content.array_records for m in train]
    assert with_g == [False, False, True, True, True, True]  # 2 clients a round
    assert rounds[1]["bytes"]["down"] > rounds[0]["bytes"]["down"]  # G_w travels too
    assert all(r["generator_loss"] > 0 and 0 < r["diversity_loss"] <= 1 for r in rounds)
    assert all("ensemble_test_acc" not in r for r in rounds)  # no server distillation
    assert rounds[1]["clients"] == [0, 1]  # seed 0 samples partition 0 in round 2 ...
    assert "(client 0) left out: label-counts [1, 1," in caplog.text  # ... and rejects it
    assert "label-counts" in rounds[1]["replies"]["rejected"]["0"]
    assert rounds[1]["replies"]["usable"] == 1 and rounds[1]["replies"]["missing"] == []


# ------------------------------------------------------------------ DaFKD
def test_dafkd_averages_g_and_heads_by_n_k_and_weights_by_this_rounds_discriminators(
        tiny_config, monkeypatch):
    import dataclasses
    from fedgo_app.strategies.dafkd import DaFKDApp
    from fedgo_flwr.strategies.dafkd import discriminator_head
    from fedgo_flwr.weighting import domain_aware_weights

    made = []
    monkeypatch.setitem(STRATEGIES, "dafkd", dataclasses.replace(
        STRATEGIES["dafkd"], server=lambda s, r: made.append(DaFKDApp(s, r)) or made[-1]))
    replies = []
    cfg = tiny_config.replace(strategy="dafkd", num_server_rounds=2, dafkd_gan_rounds=1,
                              diagnostics=True)
    grid = InProcessGrid(client_module.app, cfg.to_run_config(), 4,
                         tamper=lambda r: replies.append(r) or r)
    record = json.loads(run(grid, cfg).read_text())
    strategy = made[0]
    train = [m for m in grid.sent if m.metadata.message_type == "train.dafkd"]
    assert all({"generator", "discriminator-head"} <= set(m.content.array_records) for m in train)
    assert [m.content.config_records["config"]["train-generator"] for m in train] == \
        [True, True, False, False]
    answers = [r for r in replies if "discriminator-head" in r.content.array_records]
    assert ["generator" in r.content.array_records for r in answers] == [True, True, False, False]

    # Round 1: the global G is the n_k-weighted mean of the clients' generators.
    n = torch.tensor([float(r.content.metric_records["metrics"]["num-examples"])
                      for r in answers[:2]])
    g_k = [r.content.array_records["generator"].to_torch_state_dict() for r in answers[:2]]
    for name, value in strategy.generator.state_dict().items():
        if value.is_floating_point():
            expected = sum(w * g[name].double() for w, g in zip(n / n.sum(), g_k))
            assert torch.allclose(value.double(), expected, atol=1e-6), name

    # Round 2: the weights use each client's own trunk and head of this round.
    pids = {1000 + 17 * i: i for i in range(4)}
    keys, nets, logits, d_logits = [], [], [], []
    for r in answers[2:]:
        arrays = r.content.array_records
        keys.append(pids[r.metadata.src_node_id])
        net = create_classifier(cfg.model, 1, 10, 28)
        net.load_state_dict(arrays["arrays"].to_torch_state_dict())
        head = discriminator_head(net.latent_dim)
        head.load_state_dict(arrays["discriminator-head"].to_torch_state_dict())
        x = strategy.setup.test_x[:20].float() / 127.5 - 1
        nets.append(net)
        with torch.no_grad():
            d_logits.append(head(net.features(x)).squeeze(1))
            logits.append(net(x))
    # One pass of each trunk gives the class logits and D_k's.
    teachers = [ClientModel(0, 1, RecordDict(), extras={
        "discriminator-head": r.content.array_records["discriminator-head"]}, key=k)
        for r, k in zip(answers[2:], keys)]
    test_logits, log_odds = strategy.test_scores(teachers, nets,
                                                 torch.ones(len(nets)))
    # bf16 on a GPU (server-amp): a step of 2^-8 relative, against the fp32 reference here.
    tol = dict(atol=0.05, rtol=0.01) if strategy.setup.amp else dict(atol=1e-5)
    assert torch.allclose(log_odds[:, :20].cpu(), torch.stack(d_logits), **tol)
    assert torch.allclose(test_logits[:, :20].cpu(), torch.stack(logits), **tol)
    assert strategy.weighting is domain_aware_weights  # w_k = D_k / sum_i D_i
    last = record["rounds"][-1]
    assert last["ensemble_test_acc"] == last["diagnostics"]["logits"]["domain-aware"]["acc"]
    assert len(strategy.u) == len(strategy.setup.u) and strategy.u.dtype == torch.uint8


def test_communication_table_counts_every_array_each_way(tiny_config):
    """FedGO pays once before the rounds; DaFKD sends G and D heads every round; FedGen G_w
    down from round 2; all from the records' byte counts."""
    from fedgo_lab.report import communication_table
    records = {}
    for strategy in ("fedavg", "fedgo", "fedgen", "dafkd"):
        cfg = tiny_config.replace(strategy=strategy, run_name=strategy, dafkd_gan_rounds=1,
                                  fedgen_generator_steps=2)
        records[strategy], _ = _run(cfg)
    per_round = lambda s, d: [r["bytes"][d] for r in records[s]["rounds"] if r["round"] > 0]
    assert per_round("fedgo", "down") == per_round("fedavg", "down")  # no per-round overhead
    assert records["fedgo"]["bytes"]["pre_fl_down"] > 0 == records["fedavg"]["bytes"].get(
        "pre_fl_down", 0)
    assert all(d > a for d, a in zip(per_round("dafkd", "down"), per_round("fedavg", "down")))
    up = per_round("dafkd", "up")
    assert up[0] > up[1] > per_round("fedavg", "up")[1]  # G up in the GAN round only
    down = per_round("fedgen", "down")
    assert down[0] == per_round("fedavg", "down")[0] < down[1]
    # the clients' discriminator seconds are FedGO's pre-FL compute, apart from its rounds'
    assert records["fedgo"]["pre_fl"]["client_seconds"]["discriminators"] > 0
    assert "client_seconds" not in records["fedavg"]["pre_fl"]
    table = communication_table(list(records.values()))
    assert table.count("\n") == 5 and "| dafkd | 2 |" in table
    rows = {line.split(" | ")[0][2:]: line.strip("| ").split(" | ") for line in
            table.splitlines()[2:]}
    assert rows["fedavg"][7] == "0.0 %" and rows["fedavg"][9] == "0.0"
    fedgo_pre = records["fedgo"]["pre_fl"]["client_seconds"]["discriminators"]
    fedgo_main = sum(r["client_seconds"] for r in records["fedgo"]["rounds"] if r["round"] > 0)
    assert rows["fedgo"][9] == f"{fedgo_pre:.1f}"
    assert rows["fedgo"][10] == f"{100 * fedgo_pre / (fedgo_pre + fedgo_main):.1f} %"


def test_dafkd_client_trains_a_partition_whose_last_minibatch_holds_one_image():
    """n_k = 1 mod batch-size: G's BatchNorm still gets two fakes (a real run's partition 14,
    seed 1, alpha 0.1, failed every round before)."""
    from fedgo_flwr.models import Generator, create_classifier
    from fedgo_flwr.strategies.dafkd import discriminator_head, train_domain_aware
    torch.manual_seed(0)
    model = create_classifier("cnn", 1, 10, 28)
    generator = Generator(16, 1, 28, dim=8)
    x = torch.randint(0, 256, (5, 1, 28, 28), dtype=torch.uint8)
    out = train_domain_aware(model, discriminator_head(model.latent_dim), generator, x,
                             torch.arange(5) % 10, epochs=1, batch_size=4, lr=1e-3,
                             gan_lr=1e-3, train_generator=True, flip=False, seed=0,
                             device=torch.device("cpu"))
    assert torch.isfinite(torch.tensor([out["train-loss"], out["generator-loss"]])).all()


def test_a_results_row_names_the_options_that_change_what_fedgo_distils():
    # the budget probe changes which images are labelled and so the run: its rows stay apart
    config = {"strategy": "fedgo", "distill-budget": "disagreement", "past-teachers": 3}
    assert STRATEGIES.label(config) == "fedgo[disagreement budget, past 3]"
    assert (STRATEGIES.label({**config, "budget-probe": 1024})
            == "fedgo[disagreement budget, probe 1024, past 3]")
