"""The app's dependency set resolves for every Python it claims: a SuperLink with runtime
dependency installation on (Flower's default) resolves it with uv for each of them, and an app
claiming a Python that one of its dependencies does not support fails there (exit code 608).
Checked offline against the installed distributions' metadata."""

import importlib.metadata as metadata
import tomllib

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from conftest import REPO

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
# The Pythons a resolver tries for `requires-python`: each minor from its floor on.
CLAIMED = [Version(f"3.{minor}") for minor in range(8, 16)
           if Version(f"3.{minor}") in SpecifierSet(PROJECT["requires-python"])]


def test_requires_python_is_flowers_floor_or_above():
    flwr = SpecifierSet(metadata.metadata("flwr")["Requires-Python"])
    assert CLAIMED and all(v in flwr for v in CLAIMED), (PROJECT["requires-python"], flwr)


def test_every_dependency_supports_every_claimed_python_and_its_bounds_hold():
    for line in PROJECT["dependencies"]:
        req = Requirement(line)
        installed = metadata.version(req.name)
        assert req.specifier.contains(installed, prereleases=True), (req, installed)
        supported = SpecifierSet(metadata.metadata(req.name).get("Requires-Python") or "")
        unsupported = [str(v) for v in CLAIMED if v not in supported]
        assert not unsupported, f"{req.name} {installed} does not support Python {unsupported}"
