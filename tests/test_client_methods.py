"""Client methods under any server update (issue 104, item 1): FedProx's, SCAFFOLD's, FedUV's
and FedGKD's clients under FedAvg's, FedDF's, DaFKD's and FedGO's servers, by the library's
`client_method` keyword and the app's run-config key client-method; each combination end to
end in process, a resume mid-run, and what cannot be combined refused by name."""

import json

import pytest
from fedgo_app.attacks import MODEL_TRAINING
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

import client_app.app as client_module
from fedgo_app.config import ConfigError
from fedgo_app.server import checkpoint
from fedgo_flwr import DaFKD, FedDF, FedGen, FedGO, FedTGP
from fedgo_flwr.models import Generator
from fedgo_flwr.strategies.dafkd import GENERATOR, HEAD, discriminator_head, domain_aware_update
from fedgo_flwr.strategies.fedgkd import HistoricalTeacher
from fedgo_flwr.strategies.feduv import UniformVariance
from fedgo_flwr.strategies.scaffold import CLIENT_CONTROL, ControlVariates
from fedgo_lab.inprocess import InProcessGrid
from server_app.app import run
from test_any_app import (CLASSES, MLP, NODES, SMALL, TINY_GAN, TRAINING, accuracy, tiny_data,
                          user_app)

pytestmark = pytest.mark.app

SERVERS = ("fedavg", "feddf", "dafkd", "fedgo")
METHODS = {"fedprox": None, "scaffold": "control", "feduv": None, "fedgkd": "historical"}


def app_run(cfg, grid=None):
    grid = grid or InProcessGrid(client_module.app, cfg.to_run_config(), 4)
    path = run(grid, cfg)
    return json.loads(path.read_text()), torch.load(path.parent / "model.pt"), grid


def trains(grid, server_round: int) -> list:
    return [m for m in grid.sent if m.metadata.message_type in MODEL_TRAINING
            and m.content.config_records["config"]["server-round"] == server_round]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("server", SERVERS)
def test_each_server_runs_on_each_client_method_in_the_app(server, method, tiny_config):
    cfg = tiny_config.replace(strategy=server, client_method=method, run_name="combined")
    record, _, grid = app_run(cfg)
    rounds = [r for r in record["rounds"] if r["round"] > 0]
    assert len(rounds) == 2
    for r in rounds:
        assert r["replies"]["usable"] == r["replies"]["asked"] == 2, r["replies"]
    config = trains(grid, 2)[0].content.config_records["config"]
    if method == "fedprox":  # Flower's convention: the user's train handler reads mu
        assert config["proximal-mu"] == 0.001 and "client-method" not in config
    else:
        assert config["client-method"] == method
    if METHODS[method]:  # c, the buffer's average: in every train message
        assert all(METHODS[method] in m.content.array_records
                   for r in (1, 2) for m in trains(grid, r))
    if server == "fedgo":  # the server's own stage and update are still FedGO's
        assert any(m.metadata.message_type == "train.discriminator" for m in grid.sent)
    if server == "dafkd":  # and DaFKD's clients still train its head and G beside the method
        assert all({"generator", "discriminator-head"} <= set(m.content.array_records)
                   for m in trains(grid, 2))
        assert all(r["distill_steps"] > 0 for r in rounds), rounds
    if method == "scaffold":  # every client that trained keeps its c_i
        kept = [c.state.array_records.get(CLIENT_CONTROL) for c in grid.nodes.values()]
        assert sum(k is not None for k in kept) >= 2


@pytest.mark.parametrize("server, method", [("fedgo", "scaffold"), ("feddf", "fedgkd"),
                                            ("fedgo", "feduv"), ("dafkd", "scaffold"),
                                            ("fedavg", "fedprox")])
def test_a_combined_run_resumes_with_the_method_state_it_left(server, method, tiny_config,
                                                              tmp_path):
    cfg = tiny_config.replace(strategy=server, client_method=method, num_server_rounds=3,
                              checkpoint_keep=3)
    record, model, first = app_run(cfg)
    again = cfg.replace(results_dir=str(tmp_path / "elsewhere"),
                        resume_from=str(checkpoint.path_of(cfg.results_path / "tiny", 2)))
    resumed, resumed_model, grid = app_run(again)
    assert resumed["resumed"][0]["after_round"] == 2
    assert resumed["rounds"][:3] == record["rounds"][:3]
    assert not any(m.metadata.message_type == "train.discriminator" for m in grid.sent)
    # round 3's message is made from the server's state after round 2 alone
    key = METHODS[method]
    if key:
        sent = [trains(g, 3)[0].content.array_records[key].to_torch_state_dict()
                for g in (first, grid)]
        for name, tensor in sent[0].items():
            assert torch.equal(sent[1][name], tensor), name
    if method != "scaffold":  # the clients keep nothing: the resumed run ends where it did
        for name, tensor in model.items():
            assert torch.allclose(resumed_model[name].double(), tensor.double(), atol=1e-6)


def test_what_cannot_be_combined_is_refused_naming_the_key(tiny_config):
    for strategy in ("scaffold", "fedgen", "fedtgp", "fedprox"):
        with pytest.raises(ConfigError, match="'client-method' is 'feduv': strategy "
                                              f"'{strategy}' has clients of its own"):
            tiny_config.replace(strategy=strategy, client_method="feduv")
    with pytest.raises(ConfigError, match="client-method"):
        tiny_config.replace(client_method="moon")
    with pytest.raises(ConfigError, match="cannot mix architectures"):
        cfg = tiny_config.replace(strategy="fedavg", client_method="scaffold",
                                  client_models="mlp:0.5,cnn:0.5")
        app_run(cfg)


@pytest.mark.parametrize("method", [ControlVariates, UniformVariance, HistoricalTeacher])
def test_the_library_distils_on_each_client_method_in_a_users_app(method):
    """A user's own app (own model, data and train handler) running FedDF's, DaFKD's and
    FedGO's server on the client methods the library's `register` answers."""
    shape = (1, 8, 8)
    u = tiny_data(shape, 32, seed=7)[0]
    for strategy in (FedDF(unlabeled_data=u, model_fn=lambda: MLP(shape),
                           client_method=method(), fraction_train=0.67, **SMALL),
                     DaFKD(unlabeled_data=u, model_fn=lambda: MLP(shape), latent_dim=8,
                           generator_width=4, gan_rounds=1, client_method=method(),
                           fraction_train=0.67, **SMALL),
                     FedGO(unlabeled_data=u, model_fn=lambda: MLP(shape),
                           client_method=method(), fraction_train=0.67, **SMALL, **TINY_GAN)):
        grid = InProcessGrid(user_app(shape), {}, NODES)
        torch.manual_seed(0)
        result = strategy.start(grid=grid, initial_arrays=ArrayRecord(MLP(shape).state_dict()),
                                num_rounds=2, train_config=TRAINING,
                                evaluate_fn=accuracy(shape))
        types = {m.metadata.message_type for m in grid.sent}
        assert (method.message_type in types if not isinstance(strategy, DaFKD)
                else "train.dafkd" in types) and "train" not in types
        sent = [m for m in grid.sent if m.metadata.message_type.startswith("train.")
                and m.metadata.message_type != "train.discriminator"]
        assert all(m.content.config_records["config"]["client-method"] == method.name
                   for m in sent)
        assert result.evaluate_metrics_serverapp[2]["accuracy"] > 1 / CLASSES
        if method is ControlVariates:  # its server's step ran before the distillation
            assert result.train_metrics_clientapp[2]["control-norm"] > 0
    with pytest.raises(ValueError, match="clients train with a step of its own"):
        FedTGP(model_fn=lambda: MLP(shape), num_classes=CLASSES, client_method=method())


@pytest.mark.parametrize("published, combined", [
    ({"strategy": "fedprox", "fedprox_base": "fedgo"}, {"strategy": "fedgo",
                                                         "client_method": "fedprox"}),
    ({"strategy": "scaffold"}, {"strategy": "fedavg", "client_method": "scaffold"}),
    ({"strategy": "fedgkd"}, {"strategy": "feddf", "client_method": "fedgkd"})])
def test_a_published_method_is_its_server_on_its_clients(published, combined, tiny_config):
    """FedProx under FedGO (fedprox-base), SCAFFOLD and FedGKD+ are the same runs as their
    server with client-method naming their clients: one implementation of each."""
    models = [app_run(tiny_config.replace(run_name=name, **keys))[1]
              for name, keys in (("published", published), ("combined", combined))]
    for name, tensor in models[0].items():
        assert torch.equal(models[1][name], tensor), name


def test_dafkds_clients_take_fedproxs_term_and_the_others_refuse_it():
    """proximal_mu under DaFKD's server reaches DaFKD's own client step (its weights stay
    nearer the received ones); FedGen's step, which has no place for it, refuses it."""
    shape = (1, 8, 8)
    x, y = tiny_data(shape, 48, seed=3)
    torch.manual_seed(0)
    start, gen = MLP(shape), Generator(8, 1, (8, 8), 4)
    conf = {"lr": 0.05, "local-epochs": 3, "optimizer": "sgd", "train-generator": False,
            "latent-dim": 8, "generator-width": 4, "gan-lr": 2e-4}

    def moved(**extra) -> float:
        message = Message(RecordDict({
            "arrays": ArrayRecord(start.state_dict()),
            GENERATOR: ArrayRecord(gen.state_dict()),
            HEAD: ArrayRecord(discriminator_head(start.latent_dim).state_dict()),
            "config": ConfigRecord({**conf, **extra})}), dst_node_id=7,
            message_type="train.dafkd")
        reply = domain_aware_update(message, MLP(shape), (x, y), seed=0)
        trained = reply.content["arrays"].to_torch_state_dict()
        return sum(float(((trained[n] - w) ** 2).sum()) for n, w in start.state_dict().items())

    assert moved(**{"proximal-mu": 50.0}) < 0.5 * moved()
    with pytest.raises(ValueError, match="no client_method or proximal_mu"):
        FedGen(model_fn=lambda: MLP(shape), num_classes=CLASSES, proximal_mu=0.01)


def test_a_combined_row_is_named_server_plus_clients(tiny_config):
    """Results tables name a run "<server>+<clients>": FedGO on FedProx's clients by
    fedprox-base or by client-method is one row, FedGO on SCAFFOLD's another."""
    from fedgo_app.strategies import STRATEGIES
    def name(**keys):
        return STRATEGIES.label(tiny_config.replace(**keys).to_run_config())
    assert name(strategy="fedprox", fedprox_base="fedgo") == name(
        strategy="fedgo", client_method="fedprox") == "fedgo+fedprox"
    assert name(strategy="fedgo", client_method="scaffold") == "fedgo+scaffold"
    assert name(strategy="fedgo", weighting="uniform", client_method="feduv") == \
        "fedgo+feduv[uniform]"
