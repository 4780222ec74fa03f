import torch

from fedgo_flwr.distill import cosine_lr, distill, ensemble_logits, kl_to_targets, pseudo_labels
from fedgo_flwr.models import CNN


def test_pseudo_labels_weight_logits_then_softmax():
    logits = torch.tensor([[[2.0, 0.0]], [[0.0, 4.0]]])  # K=2, B=1, C=2
    w = torch.tensor([[0.75], [0.25]])
    torch.testing.assert_close(ensemble_logits(logits, w), torch.tensor([[1.5, 1.0]]))
    torch.testing.assert_close(pseudo_labels(logits, w), torch.softmax(torch.tensor([[1.5, 1.0]]), -1))


def test_one_distillation_step_lowers_the_kl():
    # Adam's first step moves every weight by lr (a sign step): small enough to descend.
    torch.manual_seed(0)
    u = torch.randint(0, 256, (64, 1, 28, 28), dtype=torch.uint8)
    student = CNN()
    targets = torch.softmax(torch.randn(1, 64, 10) * 3, -1)
    x = u.float() / 127.5 - 1
    with torch.no_grad():
        before = kl_to_targets(student(x), targets[0]).item()
    info = distill(student, u, targets, epochs=1, batch_size=64, lr=1e-4, seed=0,
                   device=torch.device("cpu"))
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
    distill(student, u, targets, epochs=200, batch_size=2, lr=1e-2, seed=0,
            device=torch.device("cpu"))
    x = u.float() / 127.5 - 1
    assert student(x).argmax(1).tolist() == [0, 0]
    assert student(x.flip(-1)).argmax(1).tolist() == [1, 1]


def test_cosine_schedule_over_rounds():
    assert cosine_lr(1e-3, 1, 10) == 1e-3
    assert cosine_lr(1e-3, 6, 10) < 1e-3 / 2 + 1e-12
    assert cosine_lr(1e-3, 10, 10) < cosine_lr(1e-3, 9, 10)
