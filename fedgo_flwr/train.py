"""Local classifier training (ClientUpdate), evaluation and batched prediction."""

from __future__ import annotations

import contextlib
import os
import time
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from fedgo_flwr.batches import augment, minibatches, to_unit_range


def resolve_device(name: str = "auto") -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("server-device is 'cuda' but no CUDA device is visible")
    if name == "cuda":
        deterministic_cuda()
    return torch.device(name)


@contextlib.contextmanager
def channels_last(model: nn.Module, device: torch.device, enabled: bool = True):
    """The model on `device` in the channels-last memory format while the block runs (1.3x
    the CNN's images/s on the CPU, training and inference alike, the same result up to float
    noise: python -m fedgo_lab.throughput), handed back in the contiguous one. A forward
    that `.view`s a convolution's output cannot take the format: the error says so."""
    model.to(device, memory_format=torch.channels_last if enabled
             else torch.contiguous_format)
    try:
        yield model
    except RuntimeError as err:
        if enabled and "view size is not compatible" in str(err):
            raise RuntimeError(f"{type(model).__name__} cannot run in the channels-last memory "
                               "format: its forward `.view`s a convolution's output; use "
                               "`.flatten(1)` or `.reshape` there") from err
        raise
    finally:
        model.to(memory_format=torch.contiguous_format)


def device_name(device: torch.device) -> str:
    """What a record says made it: the GPU's name or CPU."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"


def deterministic_cuda() -> None:
    """One seed fixes a CUDA run as it fixes a CPU one: deterministic cuDNN and cuBLAS kernels
    (without them a seeded client update already differs between two calls on a GPU). cuBLAS
    reads its workspace setting when the process first uses it, hence before any work."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)


# How classifiers are trained, on the clients and in the server's distillation: Adam (the
# paper's main tables) or SGD with momentum (its Table 8, VGG11: lr 0.01, momentum 0.9).
OPTIMIZERS = ("adam", "sgd")


def classifier_optimizer(params, lr: float, name: str = "adam",
                         momentum: float = 0.9) -> torch.optim.Optimizer:
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum)
    raise ValueError(f"optimizer {name!r}; allowed: {', '.join(OPTIMIZERS)}")


def descend(opt: torch.optim.Optimizer, batches: Iterable[torch.Tensor],
            batch_loss: Callable[[torch.Tensor], torch.Tensor]) -> float:
    """One optimiser step per batch on batch_loss(batch), a batch being a tensor of indices;
    returns the mean loss per item (nan when no step was taken)."""
    total, count = 0.0, 0
    for batch in batches:
        loss = batch_loss(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        total += loss.item() * len(batch)
        count += len(batch)
    return total / count if count else float("nan")


def minibatch_descent(opt: torch.optim.Optimizer, n: int, *, epochs: int, batch_size: int,
                      gen: torch.Generator,
                      batch_loss: Callable[[torch.Tensor], torch.Tensor],
                      after_epoch: Callable[[int], None] | None = None) -> float:
    """`epochs` passes over n items in shuffled minibatches (see descend); after_epoch(e) is
    called after the last step of epoch e (1-based), drawing nothing from `gen`."""
    def batches():
        for epoch in range(1, epochs + 1):
            yield from minibatches(n, batch_size, gen)
            if after_epoch is not None:
                after_epoch(epoch)

    return descend(opt, batches(), batch_loss)


def train_classifier(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int,
                     batch_size: int, lr: float, flip: bool, seed: int, device: torch.device,
                     extra_loss: Callable[[nn.Module], torch.Tensor] | None = None,
                     batch_term: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
                     | None = None,
                     crop: int = 0, optimizer: str = "adam", momentum: float = 0.9,
                     channels_last_format: bool = True,
                     after_step: Callable[[], None] | None = None) -> dict[str, float]:
    """Adam (or SGD, see classifier_optimizer) on cross-entropy for `epochs` passes over
    (x, y); x is uint8 images, augmented (batches.augment) by `crop` and `flip`. The model
    trains in the channels-last memory format (1.3x the images/s of the CNN on one CPU thread,
    the same result up to float noise: python -m fedgo_lab.throughput) and is handed back in
    the contiguous one.
    `extra_loss(model)`, a strategy's term of the local objective (FedProx's proximal term),
    is added to every minibatch's loss, and so is `batch_term(inputs, logits, labels)`, a term
    of the minibatch itself (FedGKD's distillation from a teacher on the same inputs);
    `after_step()` runs after every optimiser step (SCAFFOLD's correction)."""
    start = time.perf_counter()
    gen = torch.Generator().manual_seed(seed)

    def batch_loss(idx: torch.Tensor) -> torch.Tensor:
        xb = augment(to_unit_range(x[idx]).to(device), gen, flip=flip, crop=crop)
        logits, yb = model(xb), y[idx].to(device)
        loss = F.cross_entropy(logits, yb)
        if batch_term is not None:
            loss = loss + batch_term(xb, logits, yb)
        return loss if extra_loss is None else loss + extra_loss(model)

    with channels_last(model.train(), device, channels_last_format):
        opt = classifier_optimizer(model.parameters(), lr, optimizer, momentum)
        if after_step is not None:
            opt.register_step_post_hook(lambda *_: after_step())
        loss = minibatch_descent(opt, len(y), epochs=epochs, batch_size=batch_size, gen=gen,
                                 batch_loss=batch_loss)
    return {"train-loss": loss, "train-seconds": time.perf_counter() - start}


def inference_batch_size(device: torch.device) -> int:
    """Large batches keep a GPU busy; on a CPU, batches past ~128 images spill the caches and
    measured up to 2x slower per image (8 CNNs on 1,024 images: 180 vs 360 images/s)."""
    return 1024 if device.type == "cuda" else 128


@torch.no_grad()
def apply_in_batches(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, *,
                     device: torch.device, flip: bool = False,
                     batch_size: int | None = None) -> torch.Tensor:
    """fn over uint8 images x (all flipped when `flip`) in [-1, 1], batch by batch, on the CPU."""
    batch_size = batch_size or inference_batch_size(device)
    out = []
    for idx in minibatches(len(x), batch_size, shuffle=False):
        xb = to_unit_range(x[idx]).to(device)
        out.append(fn(xb.flip(-1) if flip else xb).float().cpu())
    return torch.cat(out) if out else torch.empty(0)


def predict_logits(model: nn.Module, x: torch.Tensor, *, device: torch.device,
                   flip: bool = False) -> torch.Tensor:
    """Logits f(x; theta) for uint8 images x (in the channels-last format, see
    `channels_last`)."""
    with channels_last(model.eval(), device):
        return apply_in_batches(model, x, device=device, flip=flip)


def accuracy_and_loss(logits: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Accuracy and mean cross-entropy of logits (or log-probabilities) against labels."""
    loss = F.cross_entropy(logits, y).item()
    acc = (logits.argmax(1) == y).float().mean().item()
    return acc, loss


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *,
             device: torch.device) -> tuple[float, float]:
    return accuracy_and_loss(predict_logits(model, x, device=device), y)
