"""The app is a thin user of the library (issue 90): every strategy it registers is a subclass of
the library's strategy for that method, and fedgo_app/strategies/ holds no algorithm loop of
its own (no pseudo-labelling, distillation, pre-FL exchange, reply check or training step),
read from the source. Modules and round functions stay small."""

import ast
import inspect
from pathlib import Path

import pytest

import fedgo_flwr
from fedgo_app.strategies import STRATEGIES
from fedgo_app.strategies.ensemble import EnsembleApp
from fedgo_flwr.strategies.base import ServerUpdateFedAvg

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
APP_STRATEGIES = sorted((ROOT / "fedgo_app" / "strategies").glob("*.py"))

# The library's strategy each registered method must subclass (FedAvg and FedProx: its base).
LIBRARY = {"fedgo": fedgo_flwr.FedGO, "feddf": fedgo_flwr.FedDF, "dafkd": fedgo_flwr.DaFKD,
           "fedgen": fedgo_flwr.FedGen, "fedbpg": fedgo_flwr.FedBPG,
           "scaffold": fedgo_flwr.SCAFFOLD, "feddisco": fedgo_flwr.FedDisco,
           "feduv": fedgo_flwr.FedUV, "fedgkd": fedgo_flwr.FedGKD, "fedtgp": fedgo_flwr.FedTGP,
           "fedavg": ServerUpdateFedAvg}

# What an algorithm of its own would call: a training step, the library's labelling and
# distillation pieces called directly, an exchange with the clients, a reply check.
FORBIDDEN_CALLS = {
    "backward", "step", "zero_grad",  # a training loop
    "view_pseudo_labels", "budgeted_pseudo_labels", "ensemble_log_probs", "pseudo_labels_of",
    "distill", "distill_early_stopping", "teacher_logits",  # labelling and distillation
    "send_and_receive", "push_messages", "pull_messages", "exchange",  # pre-FL stages
    "state_problem", "examples_problem",  # reply checks
}
# What a module may call all the same, and why.
ALLOWED = {
    "base.py": {"exchange"},  # the mailbox's, offered to the app's FedGAN generator source
    "ensemble.py": {"teacher_logits"},  # the test split's scores, for the record
    "ensemble_record.py": {"ensemble_log_probs"},  # the record's ensemble test accuracy
}


def calls(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            names.add(f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", ""))
    return names


@pytest.mark.parametrize("path", APP_STRATEGIES, ids=lambda p: p.name)
def test_the_app_strategies_run_no_algorithm_loop_of_their_own(path):
    tree = ast.parse(path.read_text())
    used = calls(tree) & FORBIDDEN_CALLS
    assert used <= ALLOWED.get(path.name, set()), (path.name, used)
    for node in ast.walk(tree):  # no loop over replies
        if isinstance(node, (ast.For, ast.comprehension)):
            target = ast.unparse(node.iter)
            assert "replies" not in target, (path.name, target)


def test_every_registered_strategy_is_the_library_strategy_for_its_method():
    for name, spec in STRATEGIES.items():
        if spec.wraps:  # FedProx: the server of its base, with the library's proximal_mu
            continue
        library = LIBRARY[name]
        assert issubclass(spec.server, library), (name, spec.server.__mro__)
        # the server update is the library's: no app class overrides it, but for a mixed
        # federation's (several students, EnsembleApp: the library's pieces around them)
        for cls in spec.server.__mro__:
            if cls.__module__.startswith("fedgo_app") and cls is not EnsembleApp:
                assert "server_update" not in vars(cls), (name, cls)
    assert set(LIBRARY) <= set(STRATEGIES)


def test_no_app_class_shares_a_library_name():
    library = {name for name, obj in vars(fedgo_flwr).items() if inspect.isclass(obj)}
    library |= {"ClientModel", "RoundReport", "ServerUpdateFedAvg", "EnsembleDistillation"}
    for path in [*APP_STRATEGIES, *(ROOT / "fedgo_app" / "server").glob("*.py")]:
        classes = {n.name for n in ast.walk(ast.parse(path.read_text()))
                   if isinstance(n, ast.ClassDef)}
        assert not classes & library, (path.name, classes & library)


def test_modules_and_round_functions_stay_small():
    """No module of the app or the library longer than about 350 lines, no function longer
    than about 40 (its docstring aside; the run config's validation and constructors that
    only store their keywords excepted). The run config (fedgo_app/config.py), a table of
    one declaration per key, is the one longer module."""
    for path in [*(ROOT / "fedgo_app").rglob("*.py"), *(ROOT / "fedgo_flwr").rglob("*.py")]:
        text = path.read_text()
        assert path.name == "config.py" or text.count("\n") <= 360, (path, text.count("\n"))
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.FunctionDef) or node.name in ("__init__", "validate"):
                continue
            body = node.body[1:] if ast.get_docstring(node) else node.body
            if body:
                length = body[-1].end_lineno - body[0].lineno + 1
                assert length <= 45, (path.name, node.name, length)
