"""An in-process Grid for tests and the performance benchmark: the real ServerApp and
ClientApp code, with messages handed straight to `client_app(message, context)` one after the
other instead of travelling through a SuperLink. The real runtime (SuperLink + Ray) is what
`flwr run` uses and what tests/test_flwr_run.py exercises."""

from __future__ import annotations

import itertools

from flwr.app import Context, Message, RecordDict
from flwr.app.error import Error
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

RUN_ID = 7


class InProcessGrid(Grid):
    def __init__(self, client_app, run_config: dict, num_partitions: int,
                 tamper=None):
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = RUN_ID, 1, 1
        self.client_app = client_app
        self.tamper = tamper  # optional fn(reply) -> reply, to fake misbehaving clients
        self.nodes = {1000 + 17 * i: Context(run_id=RUN_ID, node_id=1000 + 17 * i,
                                             node_config={"partition-id": i,
                                                          "num-partitions": num_partitions},
                                             state=RecordDict(), run_config=dict(run_config))
                      for i in range(num_partitions)}
        self.sent: list[Message] = []
        self._ids = itertools.count()

    def set_run(self, run):  # pragma: no cover - not used in process
        pass

    @property
    def run(self):  # pragma: no cover
        raise NotImplementedError

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return Message(content, dst_node_id=dst_node_id, message_type=message_type)

    def get_node_ids(self):
        return list(self.nodes)

    def push_messages(self, messages):  # pragma: no cover
        raise NotImplementedError

    def pull_messages(self, message_ids):  # pragma: no cover
        raise NotImplementedError

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            self.sent.append(msg)
            msg.metadata.__dict__["_message_id"] = str(next(self._ids))
            context = self.nodes[msg.metadata.dst_node_id]
            try:
                reply = self.client_app(msg, context)
            except Exception as exc:  # the real runtime turns exceptions into error replies
                reply = Message(Error(code=0, reason=repr(exc)), reply_to=msg)
            replies.append(self.tamper(reply) if self.tamper else reply)
        return replies
