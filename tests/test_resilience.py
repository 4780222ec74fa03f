"""Checkpoints, resuming, and nodes that go missing, on the in-process grid (the real ServerApp
and ClientApp code; the real runtime's kill-and-resume is in test_first_run.py, lost SuperNodes
in test_deploy.py)."""

import json
import threading

import pytest
import torch

import client_app.app as client_module
from fedgo_app.config import ConfigError
from fedgo_app.server import checkpoint
from fedgo_lab.inprocess import InProcessGrid
from server_app.app import run

# Each strategy with state that carries across rounds, and FedAvg.
RESUMABLE = {
    "fedavg": {},
    "fedgo": {"past_teachers": 2},  # the past global models it keeps as teachers resume too
    "fedgen": {"fedgen_generator_steps": 3},
    "dafkd": {"dafkd_gan_rounds": 2},
    # the server's G, optimiser and retained pseudo-data resume; the clients' own models live
    # on the clients (a resumed run is a new run: their context.state starts empty), so AF,
    # which starts from them, is off here
    "fedbpg": {"personal_test_fraction": 0.25, "fedbpg_adaptive_fusion": False,
               "fedbpg_generator_steps": 2, "fedbpg_tune_steps": 3, "fedbpg_batch_size": 8},
}


def _run(cfg, partitions=4, grid=None):
    grid = grid or InProcessGrid(client_module.app, cfg.to_run_config(), partitions)
    path = run(grid, cfg)
    return json.loads(path.read_text()), torch.load(path.parent / "model.pt"), grid


@pytest.mark.parametrize("strategy", RESUMABLE)
def test_a_run_resumed_after_round_two_ends_with_the_uninterrupted_model(strategy, tiny_config,
                                                                        tmp_path):
    cfg = tiny_config.replace(strategy=strategy, num_server_rounds=3, checkpoint_keep=3,
                              **RESUMABLE[strategy])
    record, model, _ = _run(cfg)
    saved = sorted(p.name for p in (cfg.results_path / "tiny" / "checkpoints").iterdir())
    assert saved == ["round-0001.pt", "round-0002.pt", "round-0003.pt"]

    # The same config but for where things are (another results-dir).
    again = cfg.replace(results_dir=str(tmp_path / "elsewhere"),
                        resume_from=str(checkpoint.path_of(cfg.results_path / "tiny", 2)))
    resumed, resumed_model, grid = _run(again)
    assert resumed["config"] == record["config"]
    assert resumed["resumed"][0]["after_round"] == 2
    assert [r["round"] for r in resumed["rounds"]] == [0, 1, 2, 3]
    assert resumed["rounds"][:3] == record["rounds"][:3]  # rounds 0-2 came from the checkpoint
    asked = {m.metadata.message_type for m in grid.sent}
    assert "train.discriminator" not in asked  # FedGO's pre-FL stage is not redone
    for name, tensor in model.items():
        assert torch.allclose(resumed_model[name].double(), tensor.double(), atol=1e-6), name
    timing = ("seconds", "round_seconds", "client_seconds", "cpu_seconds")
    final = {k: v for k, v in record["rounds"][3].items() if k not in timing}
    # the model agrees to 1e-6; its recorded losses to the last bits (a reduction's order
    # can depend on where a tensor lies in memory, on some CPUs' kernels)
    for k, v in final.items():
        assert resumed["rounds"][3][k] == (pytest.approx(v, rel=1e-6) if isinstance(v, float)
                                           else v), k


def test_a_checkpoint_of_format_1_resumes(tiny_config, tmp_path):
    """Checkpoints written before the strategy's state was the library's `state_dict` (the
    round beside it, past teachers as past_globals/next_past) still resume."""
    cfg = tiny_config.replace(strategy="fedgo", num_server_rounds=3, checkpoint_keep=3,
                              past_teachers=2)
    record, model, _ = _run(cfg)
    path = checkpoint.path_of(cfg.results_path / "tiny", 2)
    saved = torch.load(path, weights_only=True)
    old = dict(saved["strategy"])
    del old["rounds_done"]
    past = old.pop("past")
    old["past_globals"], old["next_past"] = past["states"], past["pending"]
    assert past["states"]  # (a past teacher to carry)
    torch.save({**saved, "format": 1, "strategy": old}, path)
    again = cfg.replace(results_dir=str(tmp_path / "elsewhere"), resume_from=str(path))
    resumed, resumed_model, _ = _run(again)
    assert resumed["resumed"][0]["after_round"] == 2
    for name, tensor in model.items():
        assert torch.allclose(resumed_model[name].double(), tensor.double(), atol=1e-6), name


def test_resuming_with_another_config_fails_naming_the_keys(tiny_config):
    cfg = tiny_config.replace(strategy="fedavg", num_server_rounds=1)
    _run(cfg)
    other = cfg.replace(seed=5, alpha=0.1, resume_from=str(cfg.results_path / "tiny"))
    with pytest.raises(ConfigError, match=r"key\(s\) \['alpha', 'seed'\] differ .* "
                                          r"\{'alpha': 0.5, 'seed': 0\}"):
        run(InProcessGrid(client_module.app, other.to_run_config(), 4), other)


def test_checkpoints_are_pruned_and_resume_from_takes_a_run_folder(tiny_config):
    cfg = tiny_config.replace(strategy="fedavg", num_server_rounds=3, checkpoint_keep=1)
    _run(cfg)
    folder = cfg.results_path / "tiny"
    assert [p.name for p in (folder / "checkpoints").iterdir()] == ["round-0003.pt"]
    assert checkpoint.find(folder).name == "round-0003.pt"
    none = tiny_config.replace(strategy="fedavg", run_name="none", checkpoint_keep=0)
    _run(none)
    assert not (none.results_path / "none" / "checkpoints").exists()
    with pytest.raises(FileNotFoundError, match="resume-from = .*none.*no checkpoint there"):
        checkpoint.find(none.results_path / "none")


class ScriptedGrid(InProcessGrid):
    """Calls before[t](grid) and after[t](grid) around pushing round t's train messages."""

    def __init__(self, *args, before=None, after=None):
        super().__init__(*args)
        self.before, self.after = before or {}, after or {}

    def push_messages(self, messages):
        messages = list(messages)
        rounds = {int(m.content.config_records["config"]["server-round"]) for m in messages
                  if m.metadata.message_type == "train"}
        for t in rounds & set(self.before):
            self.before[t](self)
        ids = super().push_messages(messages)
        for t in rounds & set(self.after):
            self.after[t](self)
        return ids

    def node(self, partition: int) -> int:
        return next(n for n, c in self.nodes.items() if c.node_config["partition-id"] == partition)


class SlowDiscriminatorGrid(ScriptedGrid):
    """Partition 2's node goes offline as the discriminators are asked for (its answer waits)
    and comes back when round 1's training is sent."""

    def push_messages(self, messages):
        messages = list(messages)
        if any(m.metadata.message_type == "train.discriminator" for m in messages):
            self.offline.add(self.node(2))
        return super().push_messages(messages)


def test_a_discriminator_that_comes_after_the_pre_fl_wait_joins_the_odds(tiny_config, caplog):
    cfg = tiny_config.replace(strategy="fedgo", num_server_rounds=3, fraction_train=1.0,
                              round_timeout=1.0)
    grid = SlowDiscriminatorGrid(client_module.app, cfg.to_run_config(), 4,
                                 before={1: lambda g: g.back_online(g.node(2))})
    record, _, _ = _run(cfg, grid=grid)
    assert record["pre_fl"]["replies"]["usable"] == 3  # in the stage's wait
    assert record["pre_fl"]["joined_late"] == [2]  # and the fourth when it came
    assert "discriminator of client 2 in: 4 of 4" in caplog.text
    assert all(r["replies"]["usable"] == 4 for r in record["rounds"][1:])


def test_a_missing_node_is_named_dropped_after_a_missed_round_and_rejoins(tiny_config):
    cfg = tiny_config.replace(strategy="fedgo", num_server_rounds=4, fraction_train=1.0,
                              join_timeout=1.0, round_timeout=1.0)
    # Partition 3's node is offline at the start and connects during round 1; partition 1's
    # goes offline when round 2 starts and comes back (answering round 2 late) in round 3.
    grid = ScriptedGrid(client_module.app, cfg.to_run_config(), 4,
                        before={2: lambda g: g.offline.add(g.node(1))},
                        after={1: lambda g: g.back_online(g.node(3)),
                               3: lambda g: g.back_online(g.node(1))})
    grid.offline.add(grid.node(3))
    record, _, _ = _run(cfg, grid=grid)
    assert record["clients"]["missing_at_start"] == [3]
    assert record["pre_fl"]["replies"]["usable"] == 3  # partition 3 has no discriminator
    rounds = {r["round"]: r for r in record["rounds"]}
    assert rounds[1]["clients"] == [0, 1, 2]
    assert rounds[2]["clients"] == [0, 1, 2, 3]  # 3 joined when its node connected
    assert rounds[2]["replies"]["missing"] == [1]
    assert rounds[2]["replies"]["late"] == [1]  # its answer came during round 3, unused
    assert rounds[3]["clients"] == [0, 2, 3] and rounds[3]["replies"]["absent"] == [1]
    assert rounds[4]["clients"] == [0, 1, 2, 3]  # 1 rejoined
    assert all(r["replies"]["usable"] == len(r["clients"]) - len(r["replies"]["missing"])
               for r in rounds.values() if r["round"] > 0)
    # 3 had no discriminator: it was asked for one when it joined, and it joined the odds
    assert record["pre_fl"]["joined_late"] == [3]
    assert rounds[4]["ensemble_test_acc"] > 0


def test_a_node_lost_after_it_is_listed_is_one_that_did_not_answer(tiny_config):
    # Partition 2's node is listed but gone when discovery queries it: discovery goes on
    # without it (it is not a node that failed to load its partition).
    cfg = tiny_config.replace(strategy="fedgo", num_server_rounds=3, fraction_train=1.0,
                              join_timeout=1.0, round_timeout=1.0)
    # Partition 1's node is lost when round 2 starts: still listed, the SuperLink answers
    # its messages with "Node Unavailable" from its own node id.
    grid = ScriptedGrid(client_module.app, cfg.to_run_config(), 4,
                        before={2: lambda g: g.lost.add(g.node(1))})
    grid.lost.add(grid.node(2))
    record, _, _ = _run(cfg, grid=grid)
    assert record["clients"]["missing_at_start"] == [2]
    assert record["pre_fl"]["replies"]["usable"] == 3
    rounds = {r["round"]: r for r in record["rounds"]}
    assert rounds[1]["clients"] == [0, 1, 3]
    assert "Node Unavailable" in rounds[2]["replies"]["failed"]["1"]
    assert rounds[2]["replies"]["usable"] == 2
    assert rounds[3]["clients"] == [0, 3] and rounds[3]["replies"]["absent"] == [1]


class SlowToAnswerGrid(ScriptedGrid):
    """Partition 2's node is connected but answers discovery 1.5 s late, as a SuperNode on a
    busy machine whose ClientApp process is slow to start."""

    def push_messages(self, messages):
        messages = list(messages)
        if any(m.metadata.message_type == "query" and m.metadata.dst_node_id == self.node(2)
               for m in messages):
            self.offline.add(self.node(2))  # its reply is held until it is back
            threading.Timer(1.5, self.back_online, (self.node(2),)).start()
        return super().push_messages(messages)


def test_a_connected_node_slower_than_the_join_timeout_is_waited_for(tiny_config):
    """The join-timeout bounds the wait for partitions whose node has not connected; a node
    that is connected and asked has a round's wait (round-timeout) to answer."""
    cfg = tiny_config.replace(strategy="fedavg", num_server_rounds=1, fraction_train=1.0,
                              join_timeout=0.5, round_timeout=30.0)
    record, _, _ = _run(cfg, grid=SlowToAnswerGrid(client_module.app, cfg.to_run_config(), 4))
    assert record["clients"]["missing_at_start"] == []
    assert sorted(record["clients"]["num_examples"]) == ["0", "1", "2", "3"]


def test_require_all_clients_fails_fast_naming_the_missing_partition(tiny_config):
    cfg = tiny_config.replace(strategy="fedavg", join_timeout=1.0, require_all_clients=True)
    grid = ScriptedGrid(client_module.app, cfg.to_run_config(), 4)
    grid.offline.add(grid.node(2))
    with pytest.raises(TimeoutError, match=r"partitions \[2\] of 4 did not answer within 1s"):
        run(grid, cfg)
