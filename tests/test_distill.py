import copy

import torch

import pytest

from fedgo_flwr.distill import (confident_batches, cosine_lr, distill, draw_batches,
                                ensemble_log_probs, floored, kl_to_targets, pseudo_labels,
                                view_pseudo_labels)
from fedgo_flwr.models import CNN
from fedgo_flwr.teachers import teacher_logits
from fedgo_flwr.weighting import odds_weights


def test_pseudo_labels_weight_logits_then_softmax():
    logits = torch.tensor([[[2.0, 0.0]], [[0.0, 4.0]]])  # K=2, B=1, C=2
    w = torch.tensor([[0.75], [0.25]])
    torch.testing.assert_close(ensemble_log_probs(logits, w),
                               torch.log_softmax(torch.tensor([[1.5, 1.0]]), -1))
    torch.testing.assert_close(pseudo_labels(logits, w), torch.softmax(torch.tensor([[1.5, 1.0]]), -1))


def test_probability_space_mixes_the_clients_predictions():
    logits = torch.tensor([[[2.0, 0.0]], [[0.0, 4.0]]])
    w = torch.tensor([[0.75], [0.25]])
    mixture = 0.75 * torch.softmax(logits[0], -1) + 0.25 * torch.softmax(logits[1], -1)
    torch.testing.assert_close(pseudo_labels(logits, w, "probabilities"), mixture)
    # A client with weight 0 contributes nothing, even with extreme logits.
    w0 = torch.tensor([[1.0], [0.0]])
    extreme = torch.tensor([[[2.0, 0.0]], [[0.0, 1e4]]])
    torch.testing.assert_close(pseudo_labels(extreme, w0, "probabilities"),
                               torch.softmax(extreme[0], -1))
    with pytest.raises(ValueError, match="allowed: logits, probabilities"):
        ensemble_log_probs(logits, w, "margins")


def test_one_distillation_step_lowers_the_kl():
    # Adam's first step moves every weight by lr (a sign step): small enough to descend.
    torch.manual_seed(0)
    u = torch.randint(0, 256, (64, 1, 28, 28), dtype=torch.uint8)
    student = CNN()
    targets = torch.softmax(torch.randn(1, 64, 10) * 3, -1)
    x = u.float() / 127.5 - 1
    with torch.no_grad():
        before = kl_to_targets(student(x), targets[0]).item()
    info = distill(student, u, targets, lr=1e-4, device=torch.device("cpu"),
                   batches=draw_batches(64, 1, epochs=1, batch_size=64, seed=0))
    with torch.no_grad():
        after = kl_to_targets(student(x), targets[0]).item()
    assert abs(info["distill_loss"] - before) < 1e-4  # the one step saw the same batch
    assert after < before


def test_two_views_pair_flipped_images_with_their_own_labels():
    # A student that can only be taught consistently if flipped inputs meet flipped targets.
    u = torch.zeros(2, 1, 28, 28, dtype=torch.uint8)
    u[:, :, :, :14] = 255  # left half bright; its mirror is right half bright
    targets = torch.tensor([[[1.0, 0.0]] * 2, [[0.0, 1.0]] * 2])  # view 0 -> class 0, 1 -> 1
    student = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 2))
    distill(student, u, targets, lr=1e-2, device=torch.device("cpu"),
            batches=draw_batches(2, 2, epochs=200, batch_size=2, seed=0))
    x = u.float() / 127.5 - 1
    assert student(x).argmax(1).tolist() == [0, 0]
    assert student(x.flip(-1)).argmax(1).tolist() == [1, 1]


def test_cosine_schedule_over_rounds():
    assert cosine_lr(1e-3, 1, 10) == 1e-3
    assert cosine_lr(1e-3, 6, 10) < 1e-3 / 2 + 1e-12
    assert cosine_lr(1e-3, 10, 10) < cosine_lr(1e-3, 9, 10)


def test_draw_batches_pass_over_u_once_per_epoch_with_seeded_views():
    batches = draw_batches(10, 2, epochs=3, batch_size=4, seed=5)
    assert [len(b) for b in batches] == [4, 4, 2] * 3
    for e in range(3):
        assert sorted((torch.cat(batches[3 * e:3 * e + 3]) % 10).tolist()) == list(range(10))
    views = torch.cat(batches) // 10
    assert set(views.tolist()) == {0, 1}
    assert all(torch.equal(a, b) for a, b in zip(batches, draw_batches(10, 2, epochs=3,
                                                                     batch_size=4, seed=5)))
    assert not all(torch.equal(a, b) for a, b in zip(batches, draw_batches(10, 2, epochs=3,
                                                                         batch_size=4, seed=6)))
    assert (torch.cat(draw_batches(10, 1, epochs=2, batch_size=4, seed=5)) < 10).all()


def test_a_view_drawn_per_round_holds_for_every_pass_and_halves_the_labelling():
    n = 50
    per_pass = draw_batches(n, 2, epochs=3, batch_size=8, seed=5)
    per_round = draw_batches(n, 2, epochs=3, batch_size=8, seed=5, view_draw="per-round")
    met = torch.cat(per_round).unique()
    assert len(met) == n  # one view of each image, whichever pass meets it
    assert sorted((met % n).tolist()) == list(range(n))
    assert set((met // n).tolist()) == {0, 1}  # both views occur across the images
    assert len(torch.cat(per_pass).unique()) > n  # per pass: some images meet both views
    for e in range(3):  # still every image once a pass
        assert sorted((torch.cat(per_round[7 * e:7 * e + 7]) % n).tolist()) == list(range(n))
    with pytest.raises(ValueError, match="per-pass, per-round"):
        draw_batches(n, 2, epochs=1, batch_size=8, seed=5, view_draw="per-epoch")


def test_the_floor_keeps_the_server_models_label_where_it_is_surer():
    ensemble = torch.log(torch.tensor([[0.6, 0.3, 0.1], [0.9, 0.05, 0.05]]))
    own = torch.log(torch.tensor([[0.1, 0.8, 0.1], [0.2, 0.7, 0.1]]))
    out = floored(ensemble, own)
    torch.testing.assert_close(out[0], own[0])  # 0.8 > 0.6: its own label
    torch.testing.assert_close(out[1], ensemble[1])  # 0.7 < 0.9: the ensemble's


def test_confident_batches_keep_only_the_sure_pseudo_labels():
    targets = torch.tensor([[[0.9, 0.1], [0.5, 0.5], [0.2, 0.8]],
                            [[0.6, 0.4], [0.95, 0.05], [0.55, 0.45]]])  # [V=2, |U|=3, C]
    batches = [torch.tensor([0, 4, 1]), torch.tensor([5, 2]), torch.tensor([1])]
    kept = confident_batches(batches, targets, 0.8)
    assert [b.tolist() for b in kept] == [[0, 4], [2]]  # the last batch, emptied, is dropped


def test_only_the_views_the_batches_meet_are_labelled_and_those_exactly():
    torch.manual_seed(0)
    nets = [torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3)) for _ in range(2)]
    u = torch.randint(0, 256, (12, 1, 4, 4), dtype=torch.uint8)
    n_k = torch.tensor([1.0, 3.0])
    log_odds = torch.randn(2, 2, 12)  # [views, K, |U|]

    batches = draw_batches(12, 2, epochs=1, batch_size=5, seed=1)
    targets = view_pseudo_labels(
        lambda v, s: (teacher_logits(nets, u[s], device=torch.device("cpu"), flip=v == 1),
                      log_odds[v][:, s]), 12, n_k, odds_weights, batches, views=2)
    met = torch.cat(batches)
    labelled = ~targets.isnan().any(-1)
    assert labelled.sum() == 12  # one pass: one view per image, half of the work
    assert labelled.flatten()[met].all()
    x = u.float() / 127.5 - 1
    for v, view_x in enumerate((x, x.flip(-1))):
        logits = torch.stack([net(view_x) for net in nets]).detach()
        full = pseudo_labels(logits, odds_weights(logits, log_odds[v], n_k))
        torch.testing.assert_close(targets[v][labelled[v]], full[labelled[v]])


def test_the_optimizer_key_chooses_adam_or_sgd_with_momentum():
    """optimizer = sgd (the paper's Table 8) trains clients and the server by SGD with
    momentum: one distillation step moves each parameter by -lr * grad."""
    from fedgo_flwr.train import classifier_optimizer
    net = CNN()
    assert isinstance(classifier_optimizer(net.parameters(), 0.01), torch.optim.Adam)
    sgd = classifier_optimizer(net.parameters(), 0.01, "sgd", 0.5)
    assert isinstance(sgd, torch.optim.SGD) and sgd.defaults["momentum"] == 0.5
    with pytest.raises(ValueError, match="allowed: adam, sgd"):
        classifier_optimizer(net.parameters(), 0.01, "rmsprop")
    torch.manual_seed(0)
    student = CNN()
    u = torch.randint(0, 256, (8, 1, 28, 28), dtype=torch.uint8)
    targets = torch.softmax(torch.randn(1, 8, 10), -1)
    batch = [torch.arange(8)]
    from fedgo_flwr.distill import batch_loss_fn
    reference = copy.deepcopy(student)
    batch_loss_fn(reference, u, targets, torch.device("cpu"))(batch[0]).backward()
    distill(student, u, targets, batches=batch, lr=0.1, device=torch.device("cpu"),
            optimizer="sgd")
    expected = reference.fc2.weight - 0.1 * reference.fc2.weight.grad
    torch.testing.assert_close(student.fc2.weight, expected)


def test_the_channels_last_student_learns_what_the_contiguous_one_does(monkeypatch):
    """The speed-up's format changes the sums' order only: after a pass of distillation the
    two students' weights agree to float noise, and the student comes back contiguous."""
    import fedgo_flwr.distill as module
    torch.manual_seed(0)
    u = torch.randint(0, 256, (256, 1, 28, 28), dtype=torch.uint8)
    targets = torch.softmax(torch.randn(2, 256, 10) * 3, -1)
    batches = draw_batches(256, 2, epochs=1, batch_size=64, seed=0)
    students = {}
    for fast in (True, False):
        monkeypatch.setattr(module, "CHANNELS_LAST", fast)
        torch.manual_seed(1)
        students[fast] = CNN()
        distill(students[fast], u, targets, lr=1e-3, device=torch.device("cpu"),
                batches=batches)
    # Adam's normalised step can turn a noise-sized gradient into a step of up to lr: some
    # weights may differ by a fraction of one step (lr = 1e-3), the rest by rounding. How many
    # depends on the CPU's kernels: on an AVX-512 machine (2026-11-29) 4.7 % of conv1's
    # weights moved by more than 1e-5, at most 1.2e-4; a wrong layout moves nearly all by more
    for name, w in students[True].state_dict().items():
        assert w.is_contiguous(), name
        diff = (w - students[False].state_dict()[name]).abs()
        assert diff.max() < 5e-4 and (diff > 1e-5).float().mean() < 0.1, (name, diff.max())
    x = u.float() / 127.5 - 1
    with torch.no_grad():
        torch.testing.assert_close(students[True](x), students[False](x), atol=1e-3, rtol=0)
    moved = max((w - CNN().state_dict()[n]).abs().max().item()
                for n, w in students[False].state_dict().items())
    assert moved > 1e-3  # the students did learn: the agreement is not of untouched weights
