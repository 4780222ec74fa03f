"""The client-training throughput benchmark prints one row per thread count and setting."""

import pytest

from fedgo_lab.throughput import main

pytestmark = pytest.mark.unit


def test_each_setting_is_measured_against_the_first(capsys):
    assert main(["--images", "128", "--epochs", "1", "--threads", "1", "--repeats", "1",
                 "--settings", "plain", "channels-last"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 1 |")]
    assert [r.split(" | ")[1] for r in rows] == ["plain", "channels-last"]
    assert rows[0].split(" | ")[3] == "1.00x" and rows[0].endswith("| 0.0e+00 |")
    # the same training in another memory layout: float noise at most
    assert float(rows[1].split(" | ")[5].rstrip(" |")) < 1e-3
