"""Checks the run config a `flwr run` of this app would get, before anything starts: the
app's defaults under the run's `-c`/`--run-config` overrides (key=value pairs or a TOML file,
parsed as Flower parses them). Prints nothing and exits 0 when the app would accept it; else
prints one line that names the key, the value and what is allowed (an unknown key: the keys
close to it) and exits 2. `scripts/run.sh` runs it first, so that this line, not Flower's
`Invalid run configuration` or its exit report, is the last thing a user reads.

    python -m fedgo_lab.runconfig [flwr run arguments ...]
"""

from __future__ import annotations

import argparse
import sys

from flwr.common.config import parse_config_args

from fedgo_app.config import Config, ConfigError


def problem(flwr_run_args: list[str]) -> str | None:
    """What is wrong with the run config these `flwr run` arguments give, or None."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("-c", "--run-config", action="append")
    given, _ = parser.parse_known_args(flwr_run_args)
    try:
        overrides = parse_config_args(given.run_config)
    except Exception as err:  # Flower's own parse error, or a TOML file that is not there
        return f"the run config does not parse: {err}"
    try:
        Config.from_run_config({**Config().to_run_config(), **overrides})
    except ConfigError as err:
        return str(err)
    return None


def main(argv: list[str] | None = None) -> None:
    found = problem(sys.argv[1:] if argv is None else argv)
    if found:
        print(f"[run] bad run config: {found}", file=sys.stderr)
        raise SystemExit(2)


if __name__ == "__main__":
    main()
