"""The app's dependency set resolves for every Python it claims: a SuperLink with runtime
dependency installation on (Flower's default) resolves it with uv for each of them, and an app
claiming a Python that one of its dependencies does not support fails there (exit code 608).
Checked offline against the installed distributions: their metadata, and uv itself (Flower
installs it) resolving pyproject.toml against wheels made of nothing but that metadata."""

import importlib.metadata as metadata
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

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


@pytest.fixture(scope="module")
def installed_wheels(tmp_path_factory) -> Path:
    """A find-links folder with one metadata-only wheel per installed distribution (this
    project's own left out): what uv may choose from is exactly what is installed."""
    folder = tmp_path_factory.mktemp("installed-wheels")
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if not name or name.lower() == PROJECT["name"]:
            continue
        stem = f"{re.sub(r'[-_.]+', '_', name).lower()}-{dist.version}"
        with zipfile.ZipFile(folder / f"{stem}-py3-none-any.whl", "w") as whl:
            whl.writestr(f"{stem}.dist-info/METADATA", dist.read_text("METADATA"))
            whl.writestr(f"{stem}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                         "Root-Is-Purelib: true\nTag: py3-none-any\n")
            whl.writestr(f"{stem}.dist-info/RECORD", "")
    return folder


def _uv_compile(pyproject: Path, links: Path, python: str) -> subprocess.CompletedProcess:
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    return subprocess.run([uv, "pip", "compile", "--offline", "--no-index", "--find-links",
                           str(links), "--python-version", python, "--python-platform",
                           "x86_64-unknown-linux-gnu", str(pyproject), "--quiet"],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("python", [f"{v.major}.{v.minor}" for v in CLAIMED])
def test_uv_resolves_the_dependencies_offline_against_the_installed_packages(python,
                                                                            installed_wheels):
    out = _uv_compile(REPO / "pyproject.toml", installed_wheels, python)
    assert out.returncode == 0, out.stderr
    pins = dict(line.split("==") for line in out.stdout.splitlines() if "==" in line)
    assert pins["flwr"] == metadata.version("flwr")
    assert pins["torch"] == metadata.version("torch")


def test_uv_refuses_a_python_below_flowers_floor(installed_wheels):
    """What a SuperLink met with requires-python = ">=3.10": unsatisfiable, exit code 608."""
    out = _uv_compile(REPO / "pyproject.toml", installed_wheels, "3.10")
    assert out.returncode != 0 and "flwr" in out.stderr and "requires Python >=3.11" in out.stderr


def _app_files(repo: Path) -> list[str]:
    """The repository's files as a checkout has them: tracked and untracked, less what git
    ignores (results, data, virtual environments); every file when it is not a git checkout."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                            cwd=repo, capture_output=True)
    if listed.returncode == 0:
        return [name for name in listed.stdout.decode().split("\0")
                if name and (repo / name).is_file()]
    skip = {".git", ".venv", "results", "data", "__pycache__", ".pytest_cache"}
    return [str(p.relative_to(repo)) for p in repo.rglob("*")
            if p.is_file() and not skip & set(p.relative_to(repo).parts)]


def test_the_fab_holds_the_app_and_nothing_else(tmp_path):
    """`flwr build` packs the apps, the library and the presets: no harness module or plan, no
    tests, scripts or docs (nor the benchmark records under docs/)."""
    app = tmp_path / "fedgo-flwr"  # a copy: a name Flower accepts, none of this checkout's junk
    for name in _app_files(REPO):
        (app / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, app / name)
    out = tmp_path / "out"
    out.mkdir()
    flwr = shutil.which("flwr", path=str(Path(sys.executable).parent)) or "flwr"
    built = subprocess.run([flwr, "build", "--app", str(app)], cwd=out, capture_output=True,
                           text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (fab,) = out.glob("*.fab")
    names = zipfile.ZipFile(fab).namelist()
    assert {"pyproject.toml", "server_app/app.py", "client_app/app.py", "fedgo_app/config.py",
            "fedgo_app/strategies/fedgo.py", "conf/paper.toml"} <= set(names), names
    harness = [n for n in names if n.startswith(("fedgo_lab/", "tests/", "scripts/", "docs/",
                                                  "conf/bench/"))]
    assert not harness, harness
