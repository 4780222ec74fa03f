"""An in-process Grid: runs a ServerApp's grid against a ClientApp in one process, for tests
and quick experiments (the performance benchmark's rounds). The real ServerApp and ClientApp
code, with messages handed straight to `client_app(message, context)` one after the other
instead of travelling through a SuperLink; nodes can be taken offline and brought back, or
lost (still listed, answered by the SuperLink's "Node Unavailable" error). Every message and
reply travels as the real runtime sends it: serialised to Flower's protobuf bytes and read
back (`wire`), so what reaches a client or the server is what the wire carries; so does each
node's Context between its messages (`kept`), as the simulation hands it to and from a Ray
worker, so what a client keeps in `context.state` must survive the trip. The real runtime
(SuperLink + Ray) is what `flwr run` uses and what tests/test_flwr_run.py exercises."""

from __future__ import annotations

import itertools

from flwr.app import Context, Message, RecordDict
from flwr.app.error import Error
from flwr.common.serde import (context_from_proto, context_to_proto, message_from_proto,
                               message_to_proto)
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.serverapp import Grid
from flwr.proto.message_pb2 import Context as ProtoContext, Message as ProtoMessage
from flwr.supercore.task_identity import TaskIdentity

RUN_ID = 7


def wire(message: Message) -> Message:
    """The message as it arrives: to Flower's protobuf bytes and back."""
    return message_from_proto(ProtoMessage.FromString(message_to_proto(message)
                                                      .SerializeToString()))


def kept(context: Context) -> Context:
    """A node's Context as the next message finds it: to Flower's protobuf bytes and back."""
    return context_from_proto(ProtoContext.FromString(context_to_proto(context)
                                                      .SerializeToString()))


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
        self.offline: set[int] = set()  # nodes that neither list nor answer
        self.held: dict[str, Message] = {}  # messages to offline nodes
        self.lost: set[int] = set()  # listed, but gone before its messages reach it
        self.replies: dict[str, Message] = {}
        self._ids = itertools.count()

    def set_run(self, run):  # pragma: no cover - not used in process
        pass

    @property
    def run(self):  # pragma: no cover
        raise NotImplementedError

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return Message(content, dst_node_id=dst_node_id, message_type=message_type)

    def get_node_ids(self):
        return [n for n in self.nodes if n not in self.offline]

    def push_messages(self, messages):
        """Each message is answered at once, except those to an offline node: they wait
        until `back_online`, as a SuperLink keeps them for a node that reconnects."""
        ids = []
        for msg in messages:
            self.sent.append(msg)
            mid = str(next(self._ids))
            msg.metadata.__dict__["_message_id"] = mid
            ids.append(mid)
            msg = wire(msg)
            if msg.metadata.dst_node_id in self.lost:
                self.replies[mid] = self._unavailable(msg)
            elif msg.metadata.dst_node_id in self.offline:
                self.held[mid] = msg
            else:
                self.replies[mid] = self._answer(msg)
        return ids

    def pull_messages(self, message_ids):
        return [self.replies.pop(i) for i in message_ids if i in self.replies]

    def send_and_receive(self, messages, *, timeout=None):
        return self.pull_messages(self.push_messages(messages))

    def back_online(self, node_id: int) -> None:
        self.offline.discard(node_id)
        for mid, msg in [(m, msg) for m, msg in self.held.items()
                         if msg.metadata.dst_node_id == node_id]:
            self.replies[mid] = self._answer(self.held.pop(mid))

    @staticmethod
    def _unavailable(msg):
        """The error reply a SuperLink makes, from its own node id, for a node that stopped
        sending heartbeats."""
        reply = Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason="Error: Node Unavailable"),
                        reply_to=msg)
        reply.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID
        return reply

    def _answer(self, msg):
        node = msg.metadata.dst_node_id
        context = self.nodes[node]
        try:
            reply = self.client_app(msg, context)
            self.nodes[node] = kept(context)
        except Exception as exc:  # the real runtime turns exceptions into error replies
            reply = Message(Error(code=0, reason=repr(exc)), reply_to=msg)
        return wire(self.tamper(reply) if self.tamper else reply)
