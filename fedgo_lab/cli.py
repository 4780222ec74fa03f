"""The flags every harness command parses the same way: `--config KEY=VALUE ...` (run-config
keys with TOML values) and `--repo DIR` (the repository: the folder whose pyproject.toml
declares the Flower app, by default the current directory)."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path
from typing import Any

from fedgo_app.config import Config, ConfigError


def add_config_flag(parser: argparse.ArgumentParser, default_text: str = "") -> None:
    """`--config KEY=VALUE ...`: other run-config keys, over the app's defaults."""
    parser.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE",
                        help="other run-config keys, TOML values, e.g. generator-steps=0 "
                             'model="resnet18"' + (f" ({default_text})" if default_text else ""))


def config_values(parser: argparse.ArgumentParser, items: list[str]) -> dict[str, Any]:
    """The `--config` items as a dict of TOML-parsed values; a malformed item or a key given
    twice ends the command with the parser's usage error."""
    values: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            parser.error(f"--config: {item!r} is not KEY=VALUE")
        try:
            parsed = tomllib.loads(item)
        except tomllib.TOMLDecodeError as err:
            parser.error(f"--config: {item!r}: {err} (a string value needs quotes: "
                         f'key="text")')
        for key in parsed:
            if key in values:
                parser.error(f"--config: {key!r} given twice")
        values.update(parsed)
    return values


def config_from(parser: argparse.ArgumentParser, items: list[str], *,
                under: dict[str, Any] | None = None, over: dict[str, Any] | None = None) -> Config:
    """The validated Config of the app's defaults, then `under` (the command's own defaults),
    then the `--config` items, then `over` (what the command's own flags set); an unknown key
    or a bad value ends the command with the parser's usage error."""
    try:
        return Config.from_run_config({**Config().to_run_config(), **(under or {}),
                                       **config_values(parser, items), **(over or {})})
    except ConfigError as err:
        parser.error(f"--config: {err}")


def add_tracking_flags(parser: argparse.ArgumentParser) -> None:
    """`--tensorboard-dir DIR`, `--mlflow-uri URI`: watch every run of the plan live, the
    plan's runs as one experiment (fedgo_flwr.observers)."""
    parser.add_argument("--tensorboard-dir", metavar="DIR", default="",
                        help="each run's TensorBoard event files in DIR/<run name>")
    parser.add_argument("--mlflow-uri", metavar="URI", default="",
                        help="each run an MLflow run of the experiment named as the plan "
                             "(e.g. sqlite:///mlflow.db, or a server's http://...)")


def tracking(args: argparse.Namespace, plan_name: str) -> dict[str, Any]:
    """The run-config keys the tracking flags set."""
    keys: dict[str, Any] = {}
    if args.tensorboard_dir:
        keys["tensorboard-dir"] = str(Path(args.tensorboard_dir).expanduser().resolve())
    if args.mlflow_uri:
        keys.update({"mlflow-uri": args.mlflow_uri, "mlflow-experiment": plan_name})
    return keys


def add_out_flag(parser: argparse.ArgumentParser, what: str, default: str) -> None:
    """`--out DIR`: where the command writes `what`; by default `default` (a path relative to
    the repository), which the command joins to `repo_of`'s folder."""
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help=f"where {what}; default: {default} in the repository")


def add_repo_flag(parser: argparse.ArgumentParser) -> None:
    """`--repo DIR`: the repository, where pyproject.toml declares the Flower app."""
    parser.add_argument("--repo", type=Path, default=None, metavar="DIR",
                        help="the repository (its pyproject.toml declares the Flower app); "
                             "default: the current directory")


def is_repository(folder: Path) -> bool:
    """Whether `folder` holds a pyproject.toml with a [tool.flwr.app] table."""
    try:
        pyproject = tomllib.loads((folder / "pyproject.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return False
    return isinstance(pyproject.get("tool", {}).get("flwr", {}).get("app"), dict)


def repo_of(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Path:
    """The repository `--repo` names (default: the current directory), resolved; a folder
    without the app's pyproject.toml ends the command with the parser's usage error."""
    folder = (args.repo or Path.cwd()).resolve()
    if not is_repository(folder):
        parser.error(f"--repo: {folder} has no pyproject.toml with [tool.flwr.app]; run from "
                     "the repository root or pass --repo DIR")
    return folder
