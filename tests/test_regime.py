"""The regime map: each row's accuracy over the last rounds, its lead over FedAvg at the same
value of the varied key, and FedGO's mechanism columns from its diagnostics."""

import pytest

from fedgo_app.config import Config
from fedgo_lab.regime import lead_figure, main, regime_table, rules_table

pytestmark = pytest.mark.unit


def record(strategy, alpha, epochs, accs, seed=0, averaged=None, weights=None):
    config = {**Config().to_run_config(), "strategy": strategy, "alpha": alpha,
              "local-epochs": epochs, "seed": seed}
    rounds = [{"round": 0, "server_test_acc": 0.1}]
    for t, acc in enumerate(accs, 1):
        entry = {"round": t, "server_test_acc": acc, "ensemble_test_acc": acc + 0.01}
        if averaged is not None:
            entry["diagnostics"] = {
                "averaged": {"acc": averaged[t - 1]},
                "weight_on_oracle_client": {"active": weights[0], "label-oracle": weights[1]},
                "logits": {"label-oracle": {"acc": 0.95}, "odds": {"acc": acc + 0.01},
                           "uniform": {"acc": 0.6}},
                "probabilities": {}}
        rounds.append(entry)
    return {"config": config, "rounds": rounds, "run_name": f"{strategy}-{epochs}"}


RECORDS = [
    record("fedavg", 0.1, 2, [0.50, 0.60, 0.70, 0.80]),
    record("fedgo", 0.1, 2, [0.55, 0.60, 0.60, 0.60], averaged=[0.5, 0.7, 0.7, 0.7],
           weights=(0.2, 0.8)),
    record("fedavg", 0.1, 10, [0.40, 0.50, 0.50, 0.50]),
    record("fedgo", 0.1, 10, [0.60, 0.70, 0.70, 0.70], averaged=[0.5, 0.5, 0.5, 0.5],
           weights=(0.3, 0.7)),
    record("fedavg", 0.05, 10, [0.40, 0.40, 0.40, 0.40]),
    record("feddf", 0.05, 10, [0.30, 0.30, 0.30, 0.30]),
]


def test_the_table_gives_the_lead_over_fedavg_at_each_value():
    rows = regime_table(RECORDS, last=3).splitlines()
    assert rows[0].startswith("| alpha | local-epochs | seeds | fedavg (%) | feddf (%) | "
                              "fedgo (%) | feddf − fedavg | fedgo − fedavg | fedgo: ensemble")
    # alpha 0.1, 2 epochs: fedavg (0.6+0.7+0.8)/3 = 70.0, fedgo 60.0: -10.0; its ensemble
    # (0.61) beat the averaged model (0.5 / 0.7) in 1 of 4 rounds
    assert rows[2] == ("| 0.1 | 2 | 0 | 70.0 | - | 60.0 | - | -10.0 | 1/4 | 0.20 / 0.80 "
                       "| 95.0 |")
    assert rows[3] == "| 0.1 | 10 | 0 | 50.0 | - | 70.0 | - | +20.0 | 4/4 | 0.30 / 0.70 | 95.0 |"
    assert rows[4] == "| 0.05 | 10 | 0 | 40.0 | 30.0 | - | -10.0 | - | - | - | - |"


def test_the_plot_has_a_panel_per_alpha(tmp_path):
    fig = lead_figure(RECORDS)
    assert [ax.get_title() for ax in fig.axes] == ["alpha = 0.1", "alpha = 0.05"]
    (fedgo,) = [line for line in fig.axes[0].get_lines() if line.get_label() == "fedgo"]
    assert list(fedgo.get_xdata()) == [2, 10]
    assert [round(y, 6) for y in fedgo.get_ydata()] == [-10.0, 20.0]


def test_an_unknown_key_is_refused(tmp_path, capsys):
    (tmp_path / "r").mkdir()
    import json
    (tmp_path / "r" / "record.json").write_text(json.dumps(RECORDS[0]))
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--key", "local-epoch"])
    assert "--key 'local-epoch'" in capsys.readouterr().err


def test_the_rules_table_scores_every_rule_against_the_averaged_model_round_by_round():
    rows = rules_table(RECORDS).splitlines()
    assert rows[0] == ("| alpha | local-epochs | rounds | averaged (%) | uniform | **odds** | "
                       "label oracle |")
    # 2 epochs: averaged 0.5, 0.7, 0.7, 0.7 (mean 65.0); odds 0.56, 0.61, 0.61, 0.61 beats it
    # once; uniform 0.6 beats it once; the oracle (0.95) always
    assert rows[2] == "| 0.1 | 2 | 4 | 65.0 | 60.0 (1/4) | 59.8 (1/4) | 95.0 (4/4) |"
    assert rows[3] == "| 0.1 | 10 | 4 | 50.0 | 60.0 (4/4) | 68.5 (4/4) | 95.0 (4/4) |"
    assert len(rows) == 4  # alpha 0.05 has no FedGO record


def test_update_writes_both_tables_between_the_markers(tmp_path):
    import json
    for i, rec in enumerate(RECORDS):
        (tmp_path / f"r{i}").mkdir()
        (tmp_path / f"r{i}" / "record.json").write_text(json.dumps(rec))
    doc = tmp_path / "results.md"
    doc.write_text("before\n<!-- regime -->\nold\n<!-- /regime -->\nafter\n")
    assert main([str(tmp_path), "--update", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("before\n<!-- regime -->\n| alpha | local-epochs | seeds |")
    assert "old" not in text and text.endswith("<!-- /regime -->\nafter\n")
    assert rules_table(RECORDS) in text
    doc.write_text("no markers")
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--update", str(doc)])
