"""Batch norm in the federated pipeline: the buffers are averaged like the weights, the
teachers label with their running (evaluation) statistics, and distillation updates the
student's statistics on U."""

import pytest
import torch

from fedgo_flwr.distill import distill, draw_batches
from fedgo_flwr.models import create_classifier
from fedgo_flwr.aggregation import mean
from fedgo_flwr.teachers import teacher_logits

CPU = torch.device("cpu")
pytestmark = pytest.mark.unit


def bn_model(seed: int, shift: float) -> torch.nn.Module:
    """vgg11-bn whose running statistics come from training-mode passes on shifted noise."""
    torch.manual_seed(seed)
    net = create_classifier("vgg11-bn", 3, 10, 32).train()
    with torch.no_grad():
        for _ in range(3):
            net(torch.randn(8, 3, 32, 32) + shift)
    return net.eval()


def test_batch_norm_buffers_are_averaged_by_n_k():
    a, b = bn_model(0, 0.0), bn_model(1, 2.0)
    avg = mean([a.state_dict(), b.state_dict()], [100, 300], a.state_dict())
    name = "convs.1.running_mean"
    assert not torch.allclose(a.state_dict()[name], b.state_dict()[name])
    torch.testing.assert_close(avg[name], 0.25 * a.state_dict()[name] +
                               0.75 * b.state_dict()[name])
    torch.testing.assert_close(avg["convs.1.running_var"], 0.25 * a.state_dict()[
        "convs.1.running_var"] + 0.75 * b.state_dict()["convs.1.running_var"])
    tracked = avg["convs.1.num_batches_tracked"]
    assert tracked.dtype == torch.int64 and tracked.item() == 3


def test_teachers_label_with_their_running_statistics():
    """A teacher's logits for an image do not depend on the batch it comes in (evaluation
    statistics), and differ from what batch statistics would give."""
    net = bn_model(0, 1.0)
    x = torch.randint(0, 256, (6, 3, 32, 32), dtype=torch.uint8)
    together = teacher_logits([net], x, device=CPU)[0]
    alone = torch.cat([teacher_logits([net], x[i:i + 1], device=CPU)[0] for i in range(6)])
    torch.testing.assert_close(together, alone, rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        batch_stats = net.train()(x.float() / 127.5 - 1)
    assert not torch.allclose(together, batch_stats, atol=1e-3)


def test_distillation_updates_the_students_statistics_on_u():
    student = bn_model(0, 0.0)
    before = {k: v.clone() for k, v in student.state_dict().items()}
    u = torch.full((32, 3, 32, 32), 250, dtype=torch.uint8)  # bright images: other statistics
    u[:, :, ::2] = 5
    targets = torch.full((1, 32, 10), 0.1)
    batches = draw_batches(32, 1, epochs=1, batch_size=8, seed=0)
    distill(student, u, targets, batches=batches, lr=1e-3, device=CPU)
    after = student.state_dict()
    assert not student.training  # handed back in evaluation mode
    assert after["convs.1.num_batches_tracked"] == before["convs.1.num_batches_tracked"] + 4
    assert not torch.allclose(after["convs.1.running_var"], before["convs.1.running_var"])
