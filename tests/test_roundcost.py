"""fedgo_lab.roundcost: seeded in-process runs, each stage's seconds a round, FedAvg's the
unit."""

import json

import pytest

from fedgo_lab import roundcost

pytestmark = pytest.mark.app


def test_roundcost_prints_each_stage_against_fedavg(tiny_data_dir, capsys):
    roundcost.main(["--rounds", "2", "--partitions", "4", "--strategies", "fedavg", "fedgo",
                    "fedgo+teachers-per-image=1",
                    "--config", f'data-dir="{tiny_data_dir}"', "distill-size=0",
                    "test-size=0", "generator-steps=2", "discriminator-epochs=1",
                    "generator-width=8", "discriminator-width=8", "fraction-train=0.5",
                    'model="mlp"'])
    out = capsys.readouterr().out
    results = json.loads(out.split("\nJSON ", 1)[1])
    assert list(results) == ["fedavg", "fedgo", "fedgo+teachers-per-image=1"]
    fedavg, fedgo = results["fedavg"], results["fedgo"]
    assert fedavg["round_s"]["pseudo_labelling"] == 0 < fedgo["round_s"]["pseudo_labelling"]
    assert fedgo["pre_fl_s"]["discriminator_training"] > 0 and len(fedgo["acc"]) == 2
    assert 0 < fedavg["round_cpu_s"] < fedgo["round_cpu_s"]  # the labelling and distillation
    top = results["fedgo+teachers-per-image=1"]
    assert len(top["dropped_weight"]) == 2 and fedgo["dropped_weight"] == []
    assert "| fedavg | 0.0 |" in out and "| 1.00 |" in out
