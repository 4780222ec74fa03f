"""fedgo_lab.perf_plot reads perf's saved round table and draws the server's cost against K."""

import pytest

from fedgo_lab import perf_plot

pytestmark = pytest.mark.unit

OUTPUT = """# fedgo-flwr performance benchmark
## One FedGO round (pre-FL included), in-process grid, clients one after another
| K | clients/round | G training s | D training s (all) | odds s | client training s | aggregation s | pseudo labelling s | distillation s | evaluation s | round s | round CPU s | peak RSS MB | peak CUDA MB |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
| 20 | 8 | 0.0 | 1.0 | 1.0 | 5.00 | 0.25 | 6.00 | 3.50 | 9.25 | 24.0 | 20.0 | 1392 | 0 |
| 100 | 40 | 0.0 | 2.0 | 2.0 | 9.00 | 1.00 | 25.00 | 3.00 | 21.00 | 59.0 | 50.0 | 2358 | 0 |
K = 20: a client's discriminator training costs ...
"""


def test_the_server_seconds_are_the_server_stages_summed(tmp_path, capsys):
    rows = perf_plot.rounds_table(OUTPUT)
    assert [r["K"] for r in rows] == [20, 100] and rows[1]["round CPU s"] == 50.0
    (tmp_path / "a.txt").write_text(OUTPUT)
    perf_plot.main([str(tmp_path / "a.txt"), "--labels", "a", "--out", str(tmp_path / "f.png")])
    assert "a: server s a round K=20 19.0, K=100 50.0" in capsys.readouterr().out
    assert (tmp_path / "f.png").stat().st_size > 0
