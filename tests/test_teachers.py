import copy

import pytest
import torch
from torch import nn

from fedgo_flwr.models import Discriminator, create_classifier
from fedgo_flwr.teachers import PastTeachers, teacher_logits, top_teacher_logits
from fedgo_flwr.train import predict_logits
from fedgo_flwr.weighting import odds_weights
from fedgo_lab.perf import cached_distill, max_difference, naive_distill

CPU = torch.device("cpu")


def trained_bn_stats(net: torch.nn.Module, size: int) -> torch.nn.Module:
    """A net whose BatchNorm running statistics are no longer the initial ones."""
    net.train()
    with torch.no_grad():
        for _ in range(3):
            net(torch.randn(16, net_channels(net), size, size))
    return net.eval()


def net_channels(net: torch.nn.Module) -> int:
    return next(m for m in net.modules() if isinstance(m, torch.nn.Conv2d)).in_channels


@pytest.mark.parametrize("model,channels,size", [("cnn", 1, 28), ("resnet18", 3, 16)])
def test_stacked_teachers_equal_model_by_model(model, channels, size):
    torch.manual_seed(0)
    nets = [trained_bn_stats(create_classifier(model, channels, 10, size), size)
            for _ in range(3)]
    x = torch.randint(0, 256, (10, channels, size, size), dtype=torch.uint8)
    for flip in (False, True):
        stacked = teacher_logits(nets, x, device=CPU, flip=flip, stacked=True)
        loop = teacher_logits(nets, x, device=CPU, flip=flip, stacked=False)
        one_by_one = torch.stack([predict_logits(n, x, device=CPU, flip=flip) for n in nets])
        assert stacked.shape == (3, 10, 10)
        torch.testing.assert_close(stacked, one_by_one, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(loop, one_by_one)
    assert not torch.allclose(teacher_logits(nets, x, device=CPU, flip=True),
                              teacher_logits(nets, x, device=CPU))


def test_stacked_teachers_of_mixed_architectures_stack_per_architecture():
    """The GPU default (stacked) with client-models: one stacked forward per architecture, the
    rows in the nets' order (stack_module_state alone refuses nets of different classes)."""
    torch.manual_seed(0)
    nets = [create_classifier(m, 1, 10, 28) for m in ("cnn", "mlp", "cnn", "mlp", "mlp")]
    x = torch.randint(0, 256, (6, 1, 28, 28), dtype=torch.uint8)
    stacked = teacher_logits(nets, x, device=CPU, stacked=True)
    one_by_one = torch.stack([predict_logits(n, x, device=CPU) for n in nets])
    torch.testing.assert_close(stacked, one_by_one, rtol=1e-5, atol=1e-5)


def test_teacher_logits_needs_a_model():
    with pytest.raises(ValueError, match="at least one model"):
        teacher_logits([], torch.zeros(1, 1, 28, 28, dtype=torch.uint8), device=CPU)


def test_past_teachers_keep_the_last_models_and_compute_their_logits_once():
    """`past-teachers`: the last `keep` states, oldest first; a model's logits on a set of
    images and view are what teacher_logits gives, computed once, again for other images."""
    torch.manual_seed(0)
    states = [create_classifier("cnn", 1, 10, 28).state_dict() for _ in range(3)]
    loaded = []

    def load(state):
        loaded.append(state)
        net = create_classifier("cnn", 1, 10, 28)
        net.load_state_dict(state)
        return net

    past, cpu = PastTeachers(keep=2), torch.device("cpu")
    for state in states:
        past.add(state)
    assert past.states == states[1:] and past.last(1) == states[2:] and past.last(0) == []
    x = torch.randn(6, 1, 28, 28)
    first = past.logits(past.states, x, load, device=cpu, flip=True)
    expected = teacher_logits([load(s) for s in states[1:]], x, device=cpu, flip=True)
    assert torch.allclose(first, expected, atol=1e-6) and first.shape == (2, 6, 10)
    loaded.clear()
    assert torch.equal(past.logits(past.states, x, load, device=cpu, flip=True), first)
    assert loaded == []  # kept
    some = torch.tensor([4, 1])
    assert torch.equal(past.logits(past.states, x, load, samples=some, device=cpu, flip=True),
                       first[:, some]) and loaded == []
    loaded.clear()
    y = torch.randn(6, 1, 28, 28)  # met a few at a time: only the new ones are forwarded
    part = past.logits(past.states[:1], y, load, samples=torch.tensor([0, 2]), device=cpu)
    whole = past.logits(past.states[:1], y, load, device=cpu)
    assert torch.allclose(whole, teacher_logits([load(states[1])], y, device=cpu), atol=1e-6)
    assert torch.equal(whole[:, [0, 2]], part) and len(loaded) == 3
    loaded.clear()
    past.logits(past.states[1:], x, load, device=cpu)  # the other view
    past.logits(past.states[1:], x.clone(), load, device=cpu)  # other images
    assert len(loaded) == 2
    past.add(states[0])  # states[1] leaves, and its logits with it
    assert all(hit[0] is not states[1] for hit in past._logits.values())


@pytest.mark.parametrize("epochs", [1, 2])
def test_cached_and_naive_pseudo_labelling_distill_the_same_student(epochs):
    """The fast path (odds once, pseudo-labels once per round and view) against Algorithm 2
    run literally (every teacher and discriminator on every minibatch): same student."""
    torch.manual_seed(0)
    nets = [create_classifier("cnn", 1, 10, 28) for _ in range(3)]
    discriminators = [Discriminator(1, 28, 8) for _ in range(3)]
    n_k = torch.tensor([50.0, 300.0, 120.0])
    u = torch.randint(0, 256, (96, 1, 28, 28), dtype=torch.uint8)
    student = create_classifier("cnn", 1, 10, 28)
    fast, naive = copy.deepcopy(student), copy.deepcopy(student)
    kwargs = dict(epochs=epochs, batch_size=16, lr=1e-3, seed=3, device=CPU)
    a = cached_distill(fast, u, nets, discriminators, n_k, odds_weights, **kwargs)
    b = naive_distill(naive, u, nets, discriminators, n_k, odds_weights, **kwargs)
    assert max_difference(student, fast) > 1e-3  # the students did learn
    assert max_difference(fast, naive) < 1e-4
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-4)


@pytest.mark.e2e(seconds=60)  # the whole harness command, one FedGO round in its own process
def test_perf_command_prints_both_sections(tiny_data_dir, tmp_path):
    """`python -m fedgo_lab.perf` end to end on tiny data: the comparison and one real round
    (in its own process) at a value of K, and a second K the pool cannot be split into (120
    clients of at least 5 of 500 images), which is reported without losing the first."""
    import subprocess
    import sys

    from conftest import REPO

    run = subprocess.run(
        [sys.executable, "-m", "fedgo_lab.perf", "--clients", "3", "120", "--out",
         str(tmp_path / "perf"), "--server-epochs", "1", "--distill-size", "200", "--alpha", "1.0",
         "--config", f'data-dir="{tiny_data_dir}"',
         "generator-steps=1", "generator-width=8", "discriminator-width=8",
         "discriminator-epochs=1", "test-size=100"],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    out = run.stdout
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-3000:]
    assert "the round at K = 120 failed" in out and "could not load their partition" in run.stderr
    assert "| cached + batched |" in out and "| naive loop |" in out
    difference = float(out.split("distilled students: ")[1].split()[0])
    assert difference < 1e-4
    rows = [line for line in out.splitlines() if line.startswith("| 3 |")]
    assert len(rows) == 1
    assert "K = 3: a client's discriminator training costs" in out
    # the rounds' records where it says, the K = 3 round's made in its own process
    assert f"records of the rounds: {tmp_path / 'perf'}" in out
    assert (tmp_path / "perf" / "perf-K3" / "record.json").is_file()
    bad = subprocess.run([sys.executable, "-m", "fedgo_lab.perf", "--config", "alpha=oops"],
                         cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and "--config" in bad.stderr


def test_a_model_that_views_a_convolution_output_is_told_how_to_run_channels_last():
    """The server runs models in the channels-last format; a forward that `.view`s a
    convolution's output cannot, and the error says what to change, not only PyTorch's."""
    class Viewing(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.fc = nn.Conv2d(1, 4, 3, padding=1), nn.Linear(4 * 28 * 28, 10)

        def forward(self, x):
            h = self.conv(x)
            return self.fc(h.view(h.size(0), -1))

    x = torch.randint(0, 256, (3, 1, 28, 28), dtype=torch.uint8)
    net = Viewing()
    with pytest.raises(RuntimeError, match=r"Viewing cannot run in the channels-last .*flatten"):
        predict_logits(net, x, device=torch.device("cpu"))
    assert net.conv.weight.is_contiguous()  # handed back as it came


def test_top_teachers_run_each_net_only_on_the_images_it_keeps():
    """Hand case: 3 teachers, 4 images, 2 a image by the log weights below; each net's logits
    are its own where kept and 0 elsewhere, and the weight left out is the softmax's third."""
    torch.manual_seed(0)
    nets = [create_classifier("cnn", 1, 10, 28).eval() for _ in range(3)]
    x = torch.randint(0, 256, (4, 1, 28, 28), dtype=torch.uint8)
    log_w = torch.tensor([[0.0, 2.0, 1.0, -5.0],
                          [1.0, 1.0, 0.0, 0.0],
                          [2.0, 0.0, 3.0, 0.0]])
    logits, masked, dropped = top_teacher_logits(nets, x, log_w, torch.ones(3), 2, device=CPU)
    keep = masked.isfinite()
    assert torch.equal(masked[keep], log_w[keep])
    assert keep.tolist() == [[False, True, True, False], [True, True, False, True],
                             [True, False, True, True]]
    full = teacher_logits(nets, x, device=CPU)
    torch.testing.assert_close(logits[keep], full[keep], rtol=1e-5, atol=1e-5)
    assert torch.equal(logits[~keep], torch.zeros_like(logits[~keep]))
    torch.testing.assert_close(dropped, torch.softmax(log_w, 0).min(0).values)
    everything, masked, none = top_teacher_logits(nets, x, log_w, torch.ones(3), 5, device=CPU)
    assert torch.equal(masked, log_w) and torch.allclose(none, torch.zeros(4), atol=1e-6)
    torch.testing.assert_close(everything, full, rtol=1e-5, atol=1e-5)
    # eq. 9's weight is n_k Phi_k: a client with far more examples is every image's top teacher
    _, masked, _ = top_teacher_logits(nets, x, log_w, torch.tensor([1.0, 1.0, 1e6]), 1,
                                      device=CPU)
    assert masked[2].isfinite().all() and not masked[:2].isfinite().any()


def test_a_rounds_global_model_teaches_from_the_next_round_and_survives_a_checkpoint():
    """PastTeachers' round: the model remembered in round t joins at round t + 1's start; a
    checkpoint (state_dict) carries both the teachers and the one still pending; none are
    remembered with keep = 0; a negative keep names the keyword."""
    a, b = {"w": torch.zeros(1)}, {"w": torch.ones(1)}
    past = PastTeachers(keep=1)
    past.begin_round()
    past.remember(a)
    assert past.states == [] and past.pending is a
    past.begin_round()
    past.remember(b)
    assert past.states == [a] and past.pending is b
    resumed = PastTeachers(keep=1)
    resumed.load_state_dict(past.state_dict())
    resumed.begin_round()
    assert resumed.states == [b] and resumed.pending is None  # keep 1: a left
    off = PastTeachers(keep=0)
    off.remember(a)
    off.begin_round()
    assert off.states == [] and off.pending is None
    with pytest.raises(ValueError, match="past_teachers is -1; allowed: an integer >= 0"):
        PastTeachers(keep=-1)
