"""ClientApp: hands each message to the running strategy's handler for its message type.

Handlers live with their strategy (fedgo_app/strategies/<name>.py) and are registered with it;
this file registers every message type some strategy answers and never changes when a
strategy is added. FedAvg's clients answer query (partition id, n_k), train (ClientUpdate)
and evaluate; FedGO's also train.discriminator (Algorithm 3).
"""

from __future__ import annotations

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fedgo_app.client_context import Local
from fedgo_app.config import Config
from fedgo_app.strategies import STRATEGIES

app = ClientApp()


def _dispatch(message_type: str):
    def handle(message: Message, context: Context) -> Message:
        local = Local.of(context, Config.from_run_config(context.run_config))
        return STRATEGIES.handler(local.cfg, message_type)(message, local)
    return handle


for _type in STRATEGIES.message_types():
    _category, _, _action = _type.partition(".")
    getattr(app, _category)(_action or "default")(_dispatch(_type))
