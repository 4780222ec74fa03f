"""The README's scripts' own checks: a run config is checked before anything starts, and the
SuperLink of one FLWR_HOME is stopped by PID without touching anyone else's."""

import subprocess
from pathlib import Path

import pytest

from conftest import REPO
from fedgo_lab.deploy import _wait_for
from fedgo_lab.runconfig import main, problem

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("args, says", [
    (["-c", "alpah=0.1"], "unknown run-config key 'alpah' (close: alpha)"),
    (["--stream", "--run-config", 'strategy="fedgo" alpha=-1'], "'alpha' is -1.0; allowed: > 0"),
    (["-c", 'strategy="fedgoo"'], "'strategy' is 'fedgoo'"),
    (["-c", "nowhere.toml"], "does not parse"),
])
def test_a_bad_run_config_is_named_before_anything_starts(args, says):
    assert says in problem(args)


def test_a_good_run_config_and_a_preset_pass():
    assert problem(["--stream", "-c", 'strategy="fedavg" num-server-rounds=3']) is None
    assert problem(["-c", str(REPO / "conf" / "fedgo-calibrated.toml")]) is None
    assert problem([]) is None


def test_the_command_prints_one_line_and_exits_2(capsys):
    with pytest.raises(SystemExit) as ended:
        main(["--stream", "-c", "alpah=0.1"])
    assert ended.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "[run] bad run config: unknown run-config key 'alpah' (close: alpha); every key is in "
        "docs/configuration.md"]
    main(["-c", "alpha=0.5"])  # a good one: nothing printed, no exit
    assert capsys.readouterr().err == ""


def test_stop_superlink_stops_only_the_superlink_of_its_flwr_home(tmp_path):
    def fake_superlink(home):  # a process whose command line reads like a SuperLink's
        return subprocess.Popen(["bash", "-c", f'exec -a "flower-superlink --flwr-home {home}" '
                                 "sleep 300"])
    def named(*procs):  # bash has exec'd under the SuperLink's name (slow on a busy machine)
        return all(b"flower-superlink" in Path(f"/proc/{p.pid}/cmdline").read_bytes()
                   for p in procs)

    ours, theirs = fake_superlink(tmp_path / "ours"), fake_superlink(tmp_path / "theirs")
    try:
        _wait_for(lambda: named(ours, theirs), 60, "the fake SuperLinks took their names")
        done = subprocess.run(["bash", str(REPO / "scripts" / "stop-superlink.sh")],
                              env={"FLWR_HOME": str(tmp_path / "ours"), "PATH": "/usr/bin:/bin"},
                              capture_output=True, text=True, timeout=60)
        assert "stopped 1 SuperLink(s)" in done.stdout, done.stdout + done.stderr
        assert ours.wait(timeout=10) is not None
        assert theirs.poll() is None  # someone else's SuperLink runs on
    finally:
        for p in (ours, theirs):
            p.kill()
            p.wait()
