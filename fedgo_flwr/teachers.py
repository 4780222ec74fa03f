"""The round's client models as the teacher: logits of every model on a set of images, either
stacked (parameters stacked and one vmapped forward per batch, torch.func) or model by model,
with bf16 mixed precision on a GPU."""

from __future__ import annotations

import contextlib
import copy
import math

import torch
from torch import nn
from torch.func import functional_call, stack_module_state

from fedgo_flwr.train import apply_in_batches, predict_logits

# Samples times models per stacked forward: the activation memory of one batch of 1024
# through a single model, whatever the number of teachers.
MODEL_SAMPLES_PER_BATCH = 1024


def server_autocast(device: torch.device, enabled: bool = True):
    """bf16 autocast for server forward passes on a GPU; nothing on the CPU."""
    if enabled and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@torch.no_grad()
def stacked_logits(nets: list[nn.Module], x: torch.Tensor, *, device: torch.device,
                   flip: bool = False, amp: bool = False) -> torch.Tensor:
    """f(x; theta_k) of every net, [K, N, C], in one vmapped forward per batch; the nets share
    one architecture and run in eval mode (BatchNorm running statistics)."""
    for net in nets:
        net.to(device).eval()
    params, buffers = stack_module_state(nets)
    skeleton = copy.deepcopy(nets[0]).to("meta")

    def one(p, b, xb):
        return functional_call(skeleton, (p, b), (xb,))

    every_net = torch.vmap(one, in_dims=(0, 0, None))

    def forward(xb: torch.Tensor) -> torch.Tensor:
        with server_autocast(device, amp):
            return every_net(params, buffers, xb).transpose(0, 1)  # [B, K, C]

    batch = max(1, MODEL_SAMPLES_PER_BATCH // len(nets))
    return apply_in_batches(forward, x, device=device, flip=flip,
                            batch_size=batch).transpose(0, 1).contiguous()


def same_architecture(nets: list[nn.Module]) -> list[list[int]]:
    """Indices of the nets grouped by architecture (class and parameter shapes): what
    stack_module_state can stack together."""
    groups: dict[tuple, list[int]] = {}
    for i, net in enumerate(nets):
        shapes = tuple((name, tuple(t.shape)) for name, t in net.state_dict().items())
        groups.setdefault((type(net), shapes), []).append(i)
    return list(groups.values())


def teacher_logits(nets: list[nn.Module], x: torch.Tensor, *, device: torch.device,
                   flip: bool = False, amp: bool = False,
                   stacked: bool | None = None) -> torch.Tensor:
    """f(x; theta_k) of every net, [K, N, C]. By default stacked on a GPU, where one forward
    replaces K small kernel launches per layer, and model by model on the CPU, where the work
    is compute-bound and the stacked (grouped) convolutions measured slower; `python -m
    fedgo_lab.perf` prints both on the machine at hand."""
    if not nets:
        raise ValueError("teacher_logits needs at least one model")
    if stacked is None:
        stacked = device.type == "cuda"
    if stacked:
        groups = same_architecture(nets)
        if len(groups) == 1:
            return stacked_logits(nets, x, device=device, flip=flip, amp=amp)
        # Mixed architectures (client-models): one stacked forward per architecture.
        parts = [stacked_logits([nets[i] for i in group], x, device=device, flip=flip, amp=amp)
                 for group in groups]
        out = torch.empty((len(nets),) + parts[0].shape[1:], dtype=parts[0].dtype,
                          device=parts[0].device)
        for group, part in zip(groups, parts):
            out[group] = part
        return out
    with server_autocast(device, amp):
        return torch.stack([predict_logits(net, x, device=device, flip=flip) for net in nets])


def top_teacher_logits(nets: list[nn.Module], x: torch.Tensor, log_odds: torch.Tensor,
                       num_examples: torch.Tensor, per_image: int, *, device: torch.device,
                       flip: bool = False, amp: bool = False
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FedGO's ensemble of the `per_image` teachers of largest odds weight on each image
    (eq. 9: n_k Phi_k(x), from log Phi_k [K, N] and n_k [K]): their logits [K, N, C], 0 for
    the others; the log-odds with the others' set to -inf (weight 0); the weight left out on
    each image [N]."""
    log_weights = log_odds + num_examples.to(log_odds.dtype).log()[:, None]
    keep = torch.zeros(log_weights.shape, dtype=torch.bool)
    keep.scatter_(0, log_weights.topk(min(per_image, len(nets)), dim=0).indices, True)
    dropped = 1 - (torch.softmax(log_weights, 0) * keep).sum(0)
    logits = kept_teacher_logits(nets, x, keep, device=device, flip=flip, amp=amp)
    return logits, log_odds.masked_fill(~keep, -math.inf), dropped


def kept_teacher_logits(nets: list[nn.Module], x: torch.Tensor, keep: torch.Tensor, *,
                        device: torch.device, flip: bool = False,
                        amp: bool = False) -> torch.Tensor:
    """f(x; theta_k) [K, N, C] where keep [K, N] is set, 0 elsewhere: each net runs on its
    kept images only, so K teachers cost sum_k |keep_k| forwards, not K N."""
    out = None
    for k, net in enumerate(nets):
        rows = keep[k].nonzero().squeeze(1)
        if len(rows) == 0:
            continue
        with server_autocast(device, amp):
            logits = predict_logits(net, x[rows], device=device, flip=flip)
        if out is None:
            out = torch.zeros((len(nets), len(x), logits.shape[-1]), dtype=logits.dtype)
        out[k, rows] = logits.to(out.dtype)
    if out is None:
        raise ValueError("kept_teacher_logits: no teacher is kept for any image")
    return out


class PastTeachers:
    """theta_s of the last rounds, oldest first (`past_teachers`, not in the papers), and their
    logits. Each round's global model (as the guard kept it: the one the next round's clients
    start from) is remembered and joins from the next round on; the last `keep` stay. A past
    global model does not change while it stays a teacher, so its logits on an image (one
    view) are computed once, when first asked for, and kept until it leaves."""

    def __init__(self, keep: int):
        if not isinstance(keep, int) or keep < 0:
            raise ValueError(f"past_teachers is {keep!r}; allowed: an integer >= 0")
        self.keep = keep
        self.states: list[dict[str, torch.Tensor]] = []
        self.pending: dict[str, torch.Tensor] | None = None  # this round's, a teacher next round
        self._logits: dict[tuple[int, int, bool], tuple] = {}

    def begin_round(self) -> None:
        """The last round's global model joins the past teachers."""
        if self.pending is not None:
            self.add(self.pending)
            self.pending = None

    def remember(self, state: dict[str, torch.Tensor]) -> None:
        """The round's global model, a teacher from the next round on (if any are kept)."""
        if self.keep:
            self.pending = state

    def state_dict(self) -> dict:
        """What a checkpoint holds of them (the states, oldest first, and the pending one)."""
        return {"states": self.states, "pending": self.pending}

    def load_state_dict(self, state: dict) -> None:
        self.states, self.pending = list(state.get("states", [])), state.get("pending")

    def add(self, state: dict[str, torch.Tensor]) -> None:
        self.states = (self.states + [state])[-self.keep:]
        self._logits = {k: hit for k, hit in self._logits.items()
                        if any(hit[0] is s for s in self.states)}

    def last(self, count: int) -> list[dict[str, torch.Tensor]]:
        return self.states[max(0, len(self.states) - count):] if count else []

    def logits(self, states: list[dict[str, torch.Tensor]], x: torch.Tensor, load, *,
               samples: torch.Tensor | None = None, device: torch.device, flip: bool = False,
               amp: bool = False) -> torch.Tensor:
        """f(x[samples]; theta) of these past models, [P, S, C] (all of x: samples None;
        `load`: a state to its model). Only the images not met before are forwarded."""
        idx = torch.arange(len(x)) if samples is None else samples
        rows = []
        for state in states:
            # an entry holds its state and images, so their ids stay theirs while it lives
            key = (id(state), id(x), flip)
            if key not in self._logits:
                self._logits[key] = (state, x, None)
            cached = self._logits[key][2]
            missing = idx if cached is None else idx[cached[idx, 0].isnan()]
            if len(missing):
                out = teacher_logits([load(state)], x[missing], device=device, flip=flip,
                                     amp=amp)[0]
                if cached is None:
                    cached = torch.full((len(x), out.shape[-1]), float("nan"))
                    self._logits[key] = (state, x, cached)
                cached[missing] = out
            rows.append(cached[idx])
        return torch.stack(rows)
