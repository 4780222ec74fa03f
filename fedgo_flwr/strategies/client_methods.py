"""The clients' axis (docs/library.md, "Client methods under any server"): what clients do
beyond plain local training, under any server update. A `ClientMethod` is passed to any
strategy of the library as `client_method=`: FedAvg's (`ServerUpdateFedAvg`), FedDF's, FedGO's.
SCAFFOLD's control variates (scaffold.ControlVariates), FedUV's regularisers
(feduv.UniformVariance) and FedGKD's teacher term (fedgkd.HistoricalTeacher) are the library's;
FedProx's proximal term stays the `proximal_mu` keyword, Flower's own convention for it.

A method has a server side, run by the strategy around its own round:

- `payload`: what every train message carries besides the model (arrays and config entries);
- `reply_templates`: the arrays every train reply must carry besides the model (names and
  shapes; a reply without them, or with others' shapes, is left out of its round);
- `server_step`: what the server does with the round's average before the strategy's own update
  (SCAFFOLD's x + eta_g (mean y_i - x) and its c); the strategy's update (a distillation)
  then starts from what `server_step` returns, and the next round's clients receive its result;
- `state_dict` / `load_state_dict`: what a checkpoint holds of it;

and a client side, `terms`: the hooks of the library's local loop (`local_update`, the one
client step of every method here; `fedgo_flwr.client.register` answers its message types).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from flwr.app import ArrayRecord, Message, RecordDict
from torch import nn

from fedgo_flwr.inputs import labelled
from fedgo_flwr.strategies.base import ClientModel
from fedgo_flwr.strategies.messages import CLIENT_TRAINING, METHOD_KEY, message_seed, model_reply
from fedgo_flwr.strategies.label_counts import train_as_configured

METHODS: dict[str, type[ClientMethod]] = {}  # name -> class, filled as the modules load


@dataclass
class LocalTerms:
    """What a method changes in the local loop: the module trained (FedUV's view of the
    model as features then head; None: the model), a term of the model added to every
    minibatch's loss (`extra_loss(model)`), a term of the minibatch (`batch_term(inputs,
    logits, labels)`), what runs after each optimiser step (`after_step()`), and what the
    reply carries once training ends (`finish()` -> (ArrayRecords, metrics))."""
    module: nn.Module | None = None
    extra_loss: Callable[[nn.Module], torch.Tensor] | None = None
    batch_term: Callable[..., torch.Tensor] | None = None
    after_step: Callable[[], None] | None = None
    finish: Callable[[], tuple[dict[str, ArrayRecord], dict]] | None = None


class ClientMethod:
    """Plain local training changed by a method of the clients' own (see the module's text).
    A subclass names itself (`name`, the train config's "client-method"), its train message
    type and the arrays its replies carry, and overrides what it changes."""

    name = ""
    message_type = ""  # what its clients answer (fedgo_flwr.client.register: `local_update`)
    client_training = CLIENT_TRAINING  # train-config keys the library's loop must be told

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.name in METHODS:
            raise ValueError(f"client method {cls.name!r} is already registered")
        METHODS[cls.name] = cls

    def bind(self, strategy) -> None:
        """Called once by the strategy that takes it (its model_fn, its clients)."""
        self.strategy = strategy

    # --- server side
    def payload(self, server_round: int, arrays: ArrayRecord
                ) -> tuple[dict[str, ArrayRecord], dict]:
        """(ArrayRecords, config entries) a train message carries besides the model, given
        the round's model `arrays`."""
        return {}, {}

    def reply_templates(self) -> dict[str, dict[str, torch.Tensor]]:
        """name -> the arrays (names, shapes) of each ArrayRecord a train reply carries
        besides the model."""
        return {}

    def server_step(self, server_round: int, averaged: ArrayRecord, models: list[ClientModel]
             ) -> tuple[ArrayRecord, dict[str, float]]:
        """The round's average as the method's server leaves it, and its round metrics."""
        return averaged, {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restores what `state_dict` gave."""

    # --- client side
    @staticmethod
    def terms(message: Message, model: nn.Module, state: RecordDict,
              device: torch.device) -> LocalTerms:
        """The local loop's hooks for this round, over `model` (holding the received weights)
        and the node's `state` (its context.state)."""
        return LocalTerms()


def method_of(message: Message) -> type[ClientMethod]:
    """The method a train message's config names."""
    name = message.content.config_records["config"].get(METHOD_KEY)
    if name not in METHODS:
        raise ValueError(f"the train config's {METHOD_KEY!r} is {name!r}; this client knows "
                         f"{', '.join(sorted(METHODS))}")
    return METHODS[name]


def proximal_term(model: nn.Module, anchor: list[torch.Tensor], mu: float) -> torch.Tensor:
    """FedProx's (mu / 2) sum over parameters of ||w - w^t||^2, to add to a client's loss;
    `anchor` holds the received global parameters w^t (detached), `mu` the value Flower's
    `FedProx` sends as "proximal-mu" in the train config. Its gradient is mu (w - w^t)."""
    return 0.5 * mu * sum(((w - a) ** 2).sum() for w, a in zip(model.parameters(), anchor))


def with_proximal(terms: LocalTerms, model: nn.Module, mu: float, device: torch.device
                  ) -> LocalTerms:
    """`terms` with FedProx's term around `model`'s current (received) weights added."""
    anchor = [w.detach().clone().to(device) for w in model.parameters()]
    extra = terms.extra_loss
    terms.extra_loss = (lambda m: proximal_term(m, anchor, mu)) if extra is None else (
        lambda m: proximal_term(m, anchor, mu) + extra(m))
    return terms


def terms_of(message: Message, model: nn.Module, state: RecordDict | None,
             device: torch.device) -> LocalTerms:
    """The local loop's terms a train message asks for: those of the method its config names
    ("client-method"; none: plain training), with FedProx's where it has "proximal-mu"."""
    conf = message.content.config_records["config"]
    method = method_of(message) if METHOD_KEY in conf else ClientMethod
    terms = method.terms(message, model, state if state is not None else RecordDict(), device)
    if "proximal-mu" in conf:
        terms = with_proximal(terms, model, float(conf["proximal-mu"]), device)
    return terms


def local_update(message: Message, model: nn.Module, data, state: RecordDict | None = None, *,
                 device: str | torch.device = "cpu", seed: int | None = None) -> Message:
    """A client's round (ClientUpdate) under the method its train config names
    ("client-method"; none: plain local training), with FedProx's term where the config has
    "proximal-mu": `model` (the user's, given the received weights) trained on `data`
    (labelled: (images, labels), a Dataset or a DataLoader) with the method's terms, its state
    in `state` (the node's context.state; SCAFFOLD's c_i). Settings from the train config as
    label_counts.TRAINING reads them. The reply holds ArrayRecord "arrays" (and the method's own, e.g. SCAFFOLD's
    "control-delta") and MetricRecord "metrics" (num-examples, the loss under
    "train-loss-key", train-seconds, and the method's own)."""
    conf, device = message.content.config_records["config"], torch.device(device)
    x, y = labelled(data)
    model.load_state_dict(message.content.array_records["arrays"].to_torch_state_dict())
    terms = terms_of(message, model, state, device)
    result = train_as_configured(terms.module or model, x, y, conf, device=device,
                                 extra_loss=terms.extra_loss, batch_term=terms.batch_term,
                                 after_step=terms.after_step,
                                 seed=message_seed(message) if seed is None else seed)
    arrays, metrics = terms.finish() if terms.finish else ({}, {})
    return model_reply(message, model, len(y), result, arrays, metrics)
