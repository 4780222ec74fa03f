import pytest

from fedgo_app.server.record import format_table, round_line
from fedgo_lab.report import fedavg_target, plot_rounds, rounds_to_target, summary_table


def test_table_and_progress_line_show_what_each_round_has():
    rounds = [{"round": 0, "server_test_acc": 0.1, "server_test_loss": 2.3, "seconds": {}},
              {"round": 1, "server_test_acc": 0.5, "server_test_loss": 1.2,
               "ensemble_test_acc": 0.55, "ensemble_test_loss": 1.1, "distill_loss": 0.02,
               "seconds": {"client_training": 3.0, "distillation": 1.5}}]
    lines = format_table(rounds).splitlines()
    assert lines[0].split()[:3] == ["round", "server", "acc"]
    assert lines[1].split()[-1] == "-" and "0.5500" in lines[2]
    assert round_line(rounds[1]) == ("round 1 | server acc 0.5000 | ens. acc 0.5500 | "
                                     "distill KL 0.0200 | 4.5s")


def test_summary_table_mean_and_std_over_seeds():
    recs = [{"config": {"strategy": "fedgo", "alpha": 0.1, "seed": s, "weighting": "odds"},
             "rounds": [{"round": 9, "server_test_acc": acc - 0.1},
                        {"round": 10, "server_test_acc": acc, "ensemble_test_acc": acc}]}
            for s, acc in ((0, 0.70), (1, 0.80))]
    row = summary_table(recs).splitlines()[2]
    assert row == "| fedgo | 0.1 | 0,1 | 10 | 75.00 ± 7.07 | 70.00 ± 7.07 | 75.00 ± 7.07 | - |"
    recs[1]["config"]["weighting"] = "uniform"
    names = [line.split("|")[1].strip() for line in summary_table(recs).splitlines()[2:]]
    assert names == ["fedgo", "fedgo[uniform]"]


def curve(strategy: str, seed: int, accs: list[float]) -> dict:
    return {"config": {"strategy": strategy, "alpha": 0.1, "seed": seed},
            "rounds": [{"round": t, "server_test_acc": a} for t, a in enumerate(accs)]}


def test_rows_are_named_by_the_strategys_spec_so_a_new_strategy_needs_no_report_edit(
        monkeypatch):
    from fedgo_app.strategies import STRATEGIES, StrategySpec
    monkeypatch.setitem(STRATEGIES, "fedtoy", StrategySpec(
        "fedtoy", server=None, marks=(("fedtoy-steps", 5, "{} steps"),)))
    recs = [curve("fedtoy", 0, [0.1, 0.5]), curve("fedtoy", 0, [0.1, 0.6])]
    recs[1]["config"]["fedtoy-steps"] = 9
    names = [line.split("|")[1].strip() for line in summary_table(recs).splitlines()[2:]]
    assert names == ["fedtoy", "fedtoy[9 steps]"]


def test_target_is_the_highest_multiple_of_5_fedavg_reaches_in_every_seed():
    fedavg = [curve("fedavg", 0, [0.1, 0.52, 0.68, 0.66]), curve("fedavg", 1, [0.1, 0.6, 0.651])]
    assert fedavg_target(fedavg) == 0.65
    assert fedavg_target([curve("fedgo", 0, [0.1, 0.9])]) is None
    fedgo = [curve("fedgo", 0, [0.1, 0.66, 0.7]), curve("fedgo", 1, [0.1, 0.5, 0.65]),
             curve("fedgo", 2, [0.1, 0.5, 0.6])]
    assert rounds_to_target(fedgo[:2], 0.65) == "1.5 ± 0.7"
    assert rounds_to_target(fedgo, 0.65) == "1.5 ± 0.7 (2/3 seeds)"
    assert rounds_to_target(fedgo[2:], 0.65) == "not reached"
    rows = summary_table(fedavg + fedgo).splitlines()[2:]
    assert rows[0].endswith("| 2.0 ± 0.0 (65%) |") and rows[0].startswith("| fedavg |")
    assert rows[1].endswith("| 1.5 ± 0.7 (2/3 seeds) (65%) |")


def test_plot_writes_a_png(tmp_path):
    recs = [{"config": {"strategy": "fedavg", "alpha": 0.1, "seed": s},
             "rounds": [{"round": t, "server_test_acc": 0.1 * t + 0.01 * s} for t in range(4)]}
            for s in range(3)]
    path = plot_rounds(recs, tmp_path / "p.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_of_two_alphas_has_a_panel_per_alpha_with_integer_rounds(tmp_path):
    from fedgo_lab.report import rounds_figure
    recs = [{"config": {"strategy": strategy, "alpha": alpha, "seed": s},
             "rounds": [{"round": t, "server_test_acc": 0.1 * t + alpha + 0.01 * s}
                        for t in range(3)]}
            for strategy in ("fedavg", "fedgo") for alpha in (0.1, 0.05) for s in range(2)]
    central = {"config": {"strategy": "central", "alpha": None, "seed": 0},
               "rounds": [{"round": t, "server_test_acc": 0.9} for t in range(6)]}
    fig = rounds_figure([*recs, central])
    axes = fig.get_axes()
    assert [ax.get_title() for ax in axes] == ["alpha = 0.05", "alpha = 0.1"]
    for ax, alpha in zip(axes, (0.05, 0.1)):
        assert len(ax.get_lines()) == 3  # fedavg, fedgo (one curve each) and the central level
        assert [line.get_xdata()[-1] for line in ax.get_lines()[1:]] == [2, 2]
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks
        # this panel's curve is the mean of this alpha's two seeds only, in %
        assert ax.get_lines()[1].get_ydata()[-1] == pytest.approx(100 * (0.2 + alpha + 0.005))
    (legend,) = fig.legends  # one for both panels, under them: long names squeeze no panel
    assert [t.get_text() for t in legend.get_texts()][1:] == ["fedavg (n=2)", "fedgo (n=2)"]
    fig.canvas.draw()
    below = legend.get_window_extent().y1
    assert all(below <= ax.get_tightbbox().y0 for ax in axes)
    path = plot_rounds([*recs, central], tmp_path / "two.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_diagnostics_table_has_a_row_per_round_and_a_column_per_rule():
    from fedgo_lab.report import diagnostics_table
    diag = {"logits": {"uniform": {"acc": 0.41}, "odds": {"acc": 0.474},
                       "label-oracle": {"acc": 0.948}},
            "probabilities": {"odds": {"acc": 0.655}},
            "weight_on_oracle_client": {"active": 0.3, "uniform": 0.125},
            "phi": {"share_near_cap": 0.25}}
    rec = {"rounds": [{"round": 0, "server_test_acc": 0.1},
                      {"round": 1, "server_test_acc": 0.5, "diagnostics": diag}]}
    lines = diagnostics_table(rec).splitlines()
    assert lines[0] == ("| round | server | uniform | **odds** | odds (prob.) | label oracle | "
                        "w(oracle client): own / uniform | Phi near e |")
    assert lines[2] == "| 1 | 50.0 | 41.0 | 47.4 | 65.5 | 94.8 | 0.30 / 0.12 | 25 % |"
    assert "no diagnostics" in diagnostics_table({"rounds": [{"round": 0}]})
    diag["averaged"] = {"acc": 0.52}
    lines = diagnostics_table(rec).splitlines()
    assert lines[0].startswith("| round | server | averaged (before distillation) | uniform |")
    assert lines[2].startswith("| 1 | 50.0 | 52.0 | 41.0 |")


def test_seed_differences_compare_fedgo_with_each_row_seed_by_seed():
    from fedgo_lab.report import seed_differences
    recs = [curve("fedgo", 0, [0.1, 0.70]), curve("fedavg", 0, [0.1, 0.65]),
            curve("fedgo", 1, [0.1, 0.60]), curve("fedavg", 1, [0.1, 0.62]),
            curve("feddf", 1, [0.1, 0.58])]
    lines = seed_differences(recs).splitlines()
    assert lines[0] == "| alpha | seed | fedgo (%) | fedgo − fedavg | fedgo − feddf |"
    assert lines[2] == "| 0.1 | 0 | 70.0 | +5.0 | - |"
    assert lines[3] == "| 0.1 | 1 | 60.0 | -2.0 | +2.0 |"
    lines = seed_differences(recs, last=2).splitlines()  # means of the last two rounds
    assert lines[0] == "| alpha | seed | fedgo, mean of last 2 (%) | fedgo − fedavg | fedgo − feddf |"
    assert lines[3] == "| 0.1 | 1 | 60.0 | -2.0 | +2.0 |"  # round 0 never counts: round 1 alone
    recs[2]["rounds"].append({"round": 2, "server_test_acc": 0.70})
    lines = seed_differences(recs, last=2).splitlines()
    assert lines[3] == "| 0.1 | 1 | 65.0 | +3.0 | +7.0 |"
    lines = seed_differences(recs, last=None).splitlines()
    assert lines[0].startswith("| alpha | seed | fedgo, mean over all rounds (%) |")
    assert lines[3] == "| 0.1 | 1 | 65.0 | +3.0 | +7.0 |"


def test_gap_table_gives_the_share_of_the_odds_to_oracle_gap_each_option_closes():
    from fedgo_lab.report import gap_table

    def diag(odds, beta4, prob, prob4, unsquashed, oracle):
        return {"logits": {"odds": {"acc": odds}, "odds-beta4": {"acc": beta4},
                           "odds-unsquashed": {"acc": unsquashed},
                           "label-oracle": {"acc": oracle}},
                "probabilities": {"odds": {"acc": prob}, "odds-beta4": {"acc": prob4}}}
    rec = {"config": {"strategy": "fedgo", "alpha": 0.1, "seed": 0},
           "rounds": [{"round": 1, "diagnostics": diag(0.5, 0.6, 0.5, 0.75, 0.4, 1.0)},
                      {"round": 2, "diagnostics": diag(0.7, 0.8, 0.7, 0.85, 0.8, 1.0)}]}
    lines = gap_table([rec]).splitlines()
    # odds 60 %, oracle 100 %: beta 4 at 70 % closes a quarter of the 40-point gap
    assert lines[2] == ("| 0.1 | 0 | 60.0 | 70.0 (+25 % of gap) | 60.0 (+0 % of gap) | "
                        "80.0 (+50 % of gap) | 60.0 (+0 % of gap) | 100.0 |")


def test_update_rewrites_the_report_tables_in_place_and_keeps_the_rest(tmp_path):
    from fedgo_lab.report import update_tables
    recs = [curve("fedgo", 0, [0.1, 0.70]), curve("fedavg", 0, [0.1, 0.65])]
    readme = tmp_path / "README.md"
    readme.write_text("# title\n\n| alpha | seed | fedgo (%) | fedgo − feddf |\n|---|---|---|---|\n"
                      "| 0.1 | 0 | 1.0 | +9.9 |\n\ntext after\n\n| a | b | c |\n|---|---|---|\n")
    assert update_tables(readme, recs) == ["| alpha | seed | fedgo (%) | fedgo − feddf |"]
    assert readme.read_text() == (
        "# title\n\n| alpha | seed | fedgo (%) | fedgo − fedavg |\n|---|---|---|---|\n"
        "| 0.1 | 0 | 70.0 | +5.0 |\n\ntext after\n\n| a | b | c |\n|---|---|---|\n")
    # every report table is found by its own header: made from other records, all five are redone
    from fedgo_lab.report import communication_table, gap_table, seed_differences, summary_table
    for rec in recs:  # what the communication table reads
        rec["bytes"] = {"pre_fl_down": 0}
        for r in rec["rounds"]:
            r["bytes"] = {"down": 0}
    stale = [curve("fedgo", 1, [0.1, 0.30])]
    tables = [summary_table(stale), seed_differences(stale), seed_differences(stale, last=3),
              seed_differences(stale, last=None), gap_table(stale), communication_table([])]
    readme.write_text("\n\n".join(tables) + "\n")
    assert len(update_tables(readme, recs)) == 6
    assert "| fedgo | 0.1 | 0 |" in readme.read_text() and "30.0" not in readme.read_text()


def test_report_of_prints_one_rows_differences_over_three_windows(tmp_path, capsys):
    import json
    from fedgo_lab.report import main
    beta4 = curve("fedgo", 0, [0.1, 0.5, 0.7])
    beta4["config"]["odds-beta"] = 4.0
    for name, rec in (("a", beta4), ("b", curve("fedgo", 0, [0.1, 0.6, 0.5]))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "record.json").write_text(json.dumps(rec))
    assert main([str(tmp_path), "--of", "fedgo[beta=4]"]) == 0
    tables = capsys.readouterr().out.strip().split("\n\n")
    assert [t.splitlines()[2] for t in tables] == [  # last round, last 3 (round 0 never counts:
        # here rounds 1-2), rounds 1-2
        "| 0.1 | 0 | 70.0 | +20.0 |", "| 0.1 | 0 | 60.0 | +5.0 |", "| 0.1 | 0 | 60.0 | +5.0 |"]


def test_report_against_keeps_the_rows_named_and_an_unknown_row_fails_naming_the_rows(
        tmp_path, capsys):
    import json
    import pytest
    from fedgo_lab.report import main
    for name, rec in (("a", curve("fedgo", 0, [0.1, 0.7])), ("b", curve("fedavg", 0, [0.1, 0.6])),
                      ("c", curve("feddf", 0, [0.1, 0.4]))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "record.json").write_text(json.dumps(rec))
    assert main([str(tmp_path), "--of", "fedgo", "--against", "feddf"]) == 0
    table = capsys.readouterr().out.split("\n\n")[0].splitlines()
    assert table[0] == "| alpha | seed | fedgo (%) | fedgo − feddf |"
    assert table[2] == "| 0.1 | 0 | 70.0 | +30.0 |"
    for argv in (["--of", "fedgo", "--against", "fedprox"], ["--of", "fedgoo"]):
        with pytest.raises(SystemExit):
            main([str(tmp_path), *argv])
        err = capsys.readouterr().err
        assert "no row named" in err and "fedavg, feddf, fedgo" in err
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--against", "fedavg"])
    assert "give --of too" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the folder after --against: it took the folder as a row
        main(["--of", "fedgo", "--against", "feddf", str(tmp_path)])
    assert "name the folders before --metric and --against" in capsys.readouterr().err


def test_report_warns_when_a_table_mixes_devices(tmp_path, capsys):
    import json
    from fedgo_lab.report import main
    gpu = curve("fedgo", 1, [0.1, 0.6])
    gpu["device"] = "NVIDIA H100 80GB HBM3, in process"
    for name, rec in (("cpu", curve("fedgo", 0, [0.1, 0.5])), ("gpu", gpu)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "record.json").write_text(json.dumps(rec))
    assert main([str(tmp_path / "cpu")]) == 0
    assert "warning" not in capsys.readouterr().err  # one device (unnamed: a CPU flwr run)
    assert main([str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "different devices" in err and "'CPU'" in err and "H100" in err


def test_the_horizon_table_shows_both_windows_the_best_round_and_the_time_to_target():
    from fedgo_lab.report import horizon_table, seed_differences
    fedavg = curve("fedavg", 0, [0.1, 0.2, 0.3, 0.5, 0.6, 0.7])  # target 70 %
    fedgo = curve("fedgo", 0, [0.1, 0.6, 0.7, 0.65, 0.6, 0.6])
    fedgo["timings"] = {"generator_training": 100.0, "discriminator_training": 20.0}
    for rec, seconds in ((fedavg, 5.0), (fedgo, 30.0)):
        for r in rec["rounds"]:
            r["round_seconds"] = seconds if r["round"] else 0.0
            r["ensemble_test_acc"] = r["server_test_acc"] - 0.05
    rows = horizon_table([fedavg, fedgo], window=2).splitlines()
    assert rows[0].split("|")[5:9] == [" server acc, first 2 (%) ", " server acc, last 2 (%) ",
                                       " best round (%) ", " ensemble acc, last 2 (%) "]
    # fedgo: first two rounds 60, 70 -> 65; last two 60, 60; best 70; ensemble 55; round 2;
    # 100 + 20 s of pre-FL and two 30 s rounds
    assert rows[3] == ("| fedgo | 0.1 | 0 | 5 | 65.00 | 60.00 | 70.00 | "
                       "55.00 | 2.0 | 180 (70%) |")  # one seed: one value, no spread
    assert rows[2].endswith("| 5.0 | 25 (70%) |")  # fedavg: five 5 s rounds
    first = seed_differences([fedavg, fedgo], of="fedgo", first=2).splitlines()
    assert first[0].startswith("| alpha | seed | fedgo, mean of first 2 (%) |")
    assert first[2] == "| 0.1 | 0 | 65.0 | +40.0 |"  # 65 against fedavg's 25


def test_the_lasting_table_sets_each_teacher_beside_the_averaged_model():
    from fedgo_lab.report import lasting_table
    sure = {"kept": 0.5, "acc": 0.9, "averaged_acc": 0.8}
    rounds = [{"round": 0, "server_test_acc": 0.1}] + [
        {"round": t, "server_test_acc": 0.7, "ensemble_test_acc": 0.6,
         "diagnostics": {"averaged": {"acc": 0.75},
                         "logits": {"active+averaged": {"acc": 0.65 + 0.01 * t}},
                         "lasting": {"floor": {"acc": 0.72, "own_share": 0.3},
                                     "confident": {"0.9": sure}}}} for t in (1, 2, 3)]
    for t in (2, 3):  # past global models from round 2 on
        rounds[t]["diagnostics"]["lasting"]["past"] = {"acc": 0.7 + 0.02 * t}
    rows = lasting_table({"config": {}, "rounds": rounds}, window=2).splitlines()
    assert rows[2] == ("| 1-2 | 70.0 | 75.0 | 60.0 | 72.0 | 66.5 | 74.0 | 30.0 | 50.0 | 90.0 "
                       "| 80.0 | active+averaged (logits) -8.5 |")
    for t in (1, 2, 3):  # the best label-free rule: uniform in rounds 1-2, not in round 3;
        rounds[t]["diagnostics"]["logits"]["uniform"] = {"acc": 0.9 - 0.1 * t}
        rounds[t]["diagnostics"]["logits"]["label-oracle"] = {"acc": 0.95}  # it reads labels
    rows = lasting_table({"config": {}, "rounds": rounds}, window=2).splitlines()
    assert rows[2].endswith("| 80.0 | uniform (logits) +0.0 |")  # 75 against 75
    assert rows[3].endswith("| 80.0 | active+averaged (logits) -7.0 |")  # 68 against 60
    assert rows[3].startswith("| 3-3 | 70.0 | 75.0 | 60.0 | 72.0 | 68.0 | 76.0 |")
    del rounds[2]["diagnostics"]["lasting"]["past"]  # a record made before the key
    assert lasting_table({"config": {}, "rounds": rounds[:3]}).splitlines()[2].startswith(
        "| 1-2 | 70.0 | 75.0 | 60.0 | 72.0 | 66.5 | - | 30.0 |")
    assert "no lasting diagnostics" in lasting_table({"config": {}, "rounds": rounds[:1]})


def test_the_window_table_gives_each_rows_mean_over_seeds_of_each_n_rounds(tmp_path, capsys):
    import json
    import pytest
    from fedgo_lab.report import CENTRAL, main, window_table
    fedavg = [curve("fedavg", s, [0.1, 0.2, 0.4, 0.5, 0.7 + s / 10]) for s in (0, 1)]
    fedgo = curve("fedgo", 0, [0.1, 0.6, 0.6, 0.7, 0.5])
    for r in fedgo["rounds"][1:]:
        r["diagnostics"] = {"averaged": {"acc": r["server_test_acc"] + 0.1}}
    table = window_table(fedavg + [fedgo], window=2).splitlines()
    assert table[2] == "| rounds | fedavg (seeds 0,1) | fedgo (seeds 0) |"
    # round 0 never counts; fedavg rounds 1-2: 30 in both seeds; rounds 3-4: 60 and 65
    assert table[4:] == ["| 1-2 | 30.0 | 60.0 |", "| 3-4 | 62.5 | 60.0 |"]
    central = curve("fedavg", 0, [0.1] * 9)  # the central reference's rounds are epochs
    central["config"].update(strategy=CENTRAL, alpha=None)
    assert window_table(fedavg + [fedgo, central], window=2).splitlines()[4:] == table[4:]
    # a dotted path into the rounds; a row whose records lack it gets no column
    table = window_table(fedavg + [fedgo], 3, ("diagnostics.averaged.acc",)).splitlines()
    assert table[2:] == ["| rounds | fedgo diagnostics.averaged.acc (seeds 0) |", "|---|---|",
                         "| 1-3 | 73.3 |", "| 4-4 | 60.0 |"]
    for i, rec in enumerate(fedavg + [fedgo]):
        (tmp_path / str(i)).mkdir()
        (tmp_path / str(i) / "record.json").write_text(json.dumps(rec))
    assert main([str(tmp_path), "--windows", "2"]) == 0
    assert "| 3-4 | 62.5 | 60.0 |" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # a metric no round has fails naming it
        main([str(tmp_path), "--windows", "2", "--metric", "diagnostics.averaged.acc", "nosuch"])
    assert "--metric nosuch: no round" in capsys.readouterr().err


def test_the_per_class_table_sets_each_class_teacher_beside_the_average_early_and_late(
        tmp_path, capsys):
    import json
    from fedgo_lab.report import main, per_class_table
    nan = float("nan")

    def per_class(teacher, weight):  # three classes, the third never in the test split
        return {"teacher_acc": [teacher, 0.9, nan], "averaged_acc": [0.8, 0.8, nan],
                "weight_on_holder": [weight, 0.7, nan], "holder_share": [0.6, 0.9, 0.5]}

    rounds = [{"round": 0}] + [{"round": t, "diagnostics": {"per_class": per_class(a, w)}}
                               for t, a, w in ((1, 0.9, 0.6), (2, 0.5, 0.3), (3, 0.7, 0.4))]
    text = per_class_table({"rounds": rounds}, window=1)
    head, _, table = text.partition("\n\n")
    assert head.startswith("early: rounds 1-1, late: rounds 2-3")
    rows = table.splitlines()
    assert rows[2] == "| 0 | 0.60 | 0.60 | 0.35 | +10.0 | -20.0 | 80.0 | 60.0 |"
    assert rows[3] == "| 1 | 0.90 | 0.70 | 0.70 | +10.0 | +10.0 | 80.0 | 90.0 |"
    assert rows[4] == "| 2 | 0.50 | - | - | - | - | - | - |"
    assert "r =" not in head  # two classes with scores: no correlation to speak of
    assert "no per-class diagnostics" in per_class_table({"rounds": rounds[:1]})
    for name, rec in (("with", curve("fedgo", 0, [0.1, 0.5, 0.6, 0.7])),
                      ("without", curve("fedgo", 1, [0.1, 0.5]))):
        if name == "with":
            rec["rounds"] = [{**r, **x} for r, x in zip(rec["rounds"], rounds)]
        (tmp_path / name).mkdir()
        (tmp_path / name / "record.json").write_text(json.dumps({"run_name": name, **rec}))
    assert main([str(tmp_path), "--per-class", "1"]) == 0  # one table: the record that has them
    out = capsys.readouterr().out
    assert out.count("### ") == 1 and "### with" in out and rows[2] in out


def test_the_kept_table_counts_the_rounds_that_kept_the_averaged_model():
    """A guard's choice or FedDF as published's best_step 0 is the averaged model kept; a
    round that chose nothing (no step distilled) is counted in neither."""
    from fedgo_lab.report import kept_table
    guarded = curve("fedgo", 0, [0.1] * 6)
    choices = ["averaged", "distilled", None, "averaged", "averaged"]
    for r, kept in zip(guarded["rounds"][1:], choices):
        if kept:
            r["guard"] = {"kept": kept}
    guarded["run_name"] = "g"
    published = curve("feddf", 1, [0.1] * 6)
    published["config"].update({"feddf-published": True, "val-size": 10})
    for r, step in zip(published["rounds"][1:], [0, 300, 0, 0, 500]):
        r["best_step"] = step
    published["run_name"] = "p"
    plain = curve("fedavg", 0, [0.1] * 6)
    plain["run_name"] = "f"
    lines = kept_table([plain, guarded, published], window=3).splitlines()
    assert lines[2] == "| run | row | alpha | seed | 1-3 | 4-5 | all |"
    assert lines[4:] == ["| p | feddf-published (labelled val, 500 steps) | 0.1 | 1 | 2/3 | 1/2 | 3/5 |",
                         "| g | fedgo | 0.1 | 0 | 1/2 | 2/2 | 3/4 |"]
    assert kept_table([plain], 3).startswith("no record chooses")


def test_paired_differences_say_leads_only_where_the_interval_is_above_zero():
    from fedgo_lab.report import paired_interval, paired_table, verdict
    mean, low, high = paired_interval([2.0, 2.5, 3.0])
    assert mean == 2.5 and low == pytest.approx(2.5 - 4.303 * 0.5 / 3 ** 0.5, abs=1e-3)
    assert verdict(mean, low, high, 3) == "leads"
    assert verdict(*paired_interval([1.0, -2.0, 3.0]), 3) == "level"
    assert verdict(*paired_interval([-1.0, -1.5, -1.2]), 3) == "trails"

    def rec(strategy, seed, acc):  # acc from round 1 on, 0.5 over the first 10 rounds
        return {"config": {"strategy": strategy, "alpha": 0.1, "seed": seed},
                "rounds": [{"round": t, "server_test_acc": acc if t > 10 else 0.5 + t / 100}
                           for t in range(22)]}
    records = [rec("fedgo", 0, 0.80), rec("fedgo", 1, 0.82), rec("fedavg", 0, 0.78),
               rec("fedavg", 1, 0.79), rec("fedprox", 0, 0.85)]
    table = paired_table(records, "fedgo", ["fedavg", "fedprox"], window=10).splitlines()
    # the first 10 rounds equal: +0.0 in both seeds, an interval of zero width is "level"
    assert table[2].startswith("| - | 0.1 | fedavg | 0, 1 | +0.0, +0.0: +0.00 [+0.00, +0.00] | "
                               "level | +2.0, +3.0: +2.50 [")
    # two seeds: t(1) is wide; FedAvg's target (75 %) first reached at round 11 by both
    assert table[2].endswith("| level | 11.0 ± 0.0; 11.0 ± 0.0 (75%) |")
    assert table[3] == ("| - | 0.1 | fedprox | 0 | +0.00 | one seed | -5.00 | one seed "
                        "| 11.0; 11.0 (75%) |")
    # only the baseline that ends highest (FedProx's 85 % against FedAvg's 78.5 %), the same row
    strongest = paired_table(records, "fedgo", ["fedavg", "fedprox"], window=10,
                             only_strongest=True).splitlines()
    assert strongest[2:] == [table[3]]