"""The library's imports: no circle among its modules (a registry never imports the config
that validates against it), and the library never imports the harness nor its plotting and
plan-file packages."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("fedgo_flwr", "fedgo_app", "server_app", "client_app")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, known: set[str]) -> set[str]:
    """The package modules `path` imports, at any depth of its code (a lazy import inside a
    function is an import too, and so is one under `if TYPE_CHECKING:`, for annotations)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return {m for m in found if m in known}


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}
    edges = {}
    for name, path in files.items():
        targets = imports(path, set(files))
        # Importing a module runs its parent packages' __init__ first, unless the importer
        # lives inside that package (then the package is already being imported).
        for t in list(targets):
            parts = t.split(".")
            for i in range(1, len(parts)):
                parent = ".".join(parts[:i])
                if parent in files and not name.startswith(parent + ".") and name != parent:
                    targets.add(parent)
        edges[name] = targets - {name}
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_library_has_no_import_circle():
    edges = graph()
    assert edges["fedgo_app.config"] >= {"fedgo_app.strategies", "fedgo_app.config_keys"}
    assert edges["fedgo_app.config_keys"] >= {"fedgo_app.strategies", "fedgo_app.data"}
    cycle = find_cycle(edges)
    assert cycle is None, " -> ".join(cycle)


def test_the_circle_check_finds_a_circle(tmp_path):
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    lazy = tmp_path / "m.py"  # an import inside a function counts, and so does TYPE_CHECKING
    lazy.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x.a\n"
                    "def f():\n    import x.b\n")
    assert imports(lazy, {"x.a", "x.b", "x.c"}) == {"x.a", "x.b"}


def test_the_library_imports_neither_the_app_layer_nor_the_apps_nor_the_harness():
    for path in (REPO / "fedgo_flwr").rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                 for a in n.names} | {n.module.split(".")[0] for n in ast.walk(tree)
                                      if isinstance(n, ast.ImportFrom) and n.module}
        assert not names & {"fedgo_app", "fedgo_lab", "server_app", "client_app"}, path


def test_the_registries_never_import_the_config():
    edges = graph()
    for registry in ("fedgo_app.strategies", "fedgo_app.data", "fedgo_flwr.models",
                     "fedgo_flwr.weighting", "fedgo_flwr.keys"):
        reach, todo = set(), [registry]
        while todo:
            for nxt in edges[todo.pop()] - reach:
                reach.add(nxt)
                todo.append(nxt)
        assert not reach & {"fedgo_app.config", "fedgo_app.config_keys"}, registry


# Every library module and the apps import with these refused to them (not to the packages they
# use: flwr needs pyyaml and flwr-datasets imports matplotlib, so both stay installed).
HARNESS_IMPORTS = ("matplotlib", "yaml", "fedgo_lab")
REFUSE = f"""
import builtins, importlib
real = builtins.__import__
def refuse(name, globals=None, locals=None, fromlist=(), level=0):
    importer = (globals or {{}}).get("__name__", "")
    if (level == 0 and name.split(".")[0] in {HARNESS_IMPORTS!r}
            and importer.split(".")[0] in {PACKAGES!r}):
        raise ImportError(f"{{importer}} imports {{name}}")
    return real(name, globals, locals, fromlist, level)
builtins.__import__ = refuse
"""


def test_the_library_imports_without_the_harness_dependencies():
    """Every library module (and both apps) imports while the library may not import
    matplotlib, yaml or the harness."""
    names = sorted(graph())
    # then, in the same process (one start-up of torch and flwr), a planted import the check
    # must refuse
    code = REFUSE + "".join(f"importlib.import_module({n!r})\n" for n in names) + (
        "import fedgo_flwr\n"
        "try:\n    exec('import yaml', vars(fedgo_flwr))\n"
        "except ImportError as err:\n    print('refused:', err)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused: fedgo_flwr imports yaml" in done.stdout  # the check does refuse
