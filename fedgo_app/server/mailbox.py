"""Grid.send_and_receive, with each reply attributed to the node it answers for, and replies
that come after their wait counted as late."""

from __future__ import annotations

import time
from typing import Callable

from flwr.app import Message
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid

# Error replies the SuperLink makes itself (the node went away, or the message expired): the
# node did not answer, nothing is known about its partition.
NO_ANSWER = frozenset({ErrorCode.NODE_UNAVAILABLE, ErrorCode.MESSAGE_UNAVAILABLE,
                       ErrorCode.REPLY_MESSAGE_UNAVAILABLE})


class Mailbox:
    """Grid.send_and_receive that attributes each reply to the node it answers for and, for
    a round, keeps the ids of the messages its wait left unanswered, so a reply that arrives
    after its round's wait ended is still seen, as late, when the next round starts (a late
    discriminator is used then; a late model is not)."""

    def __init__(self, grid: Grid, poll: float = 1.0):
        self.grid, self.poll = grid, poll
        self.pending: dict[str, tuple[int, int]] = {}  # message id -> (node id, round)
        self.destination: dict[str, int] = {}  # message id -> node, of the last wait's messages

    def node_of(self, reply: Message) -> int:
        """The node a reply answers for: an error reply the SuperLink makes for a node that
        went offline comes from the SuperLink itself."""
        return self.destination.get(reply.metadata.reply_to_message_id,
                                    reply.metadata.src_node_id)

    def send_and_receive(self, messages: list[Message], timeout: float,
                         server_round: int | None = None,
                         arrived: Callable[[Message], None] | None = None) -> list[Message]:
        """Push `messages`, wait up to `timeout` for their replies, calling `arrived(reply)`
        on each as it comes; with `server_round`, the unanswered ones are kept for
        `late_replies`."""
        messages = list(messages)
        waiting = dict(zip(self.grid.push_messages(messages), (m.metadata.dst_node_id
                                                                 for m in messages)))
        self.destination = dict(waiting)  # its replies are attributed before the next wait
        deadline, replies = time.monotonic() + timeout, []
        while waiting:
            got = list(self.grid.pull_messages(list(waiting)))
            for reply in got:
                waiting.pop(reply.metadata.reply_to_message_id, None)
                if arrived is not None:
                    arrived(reply)
            replies += got
            if not waiting or time.monotonic() >= deadline:
                break
            time.sleep(self.poll)
        if server_round is not None:
            self.pending.update({mid: (node, server_round) for mid, node in waiting.items()})
        return replies

    def late_replies(self) -> list[tuple[int, int, Message]]:
        """(node id, round, reply) of each reply that came after its wait ended, since last
        asked."""
        if not self.pending:
            return []
        late = []
        for reply in self.grid.pull_messages(list(self.pending)):
            sent = self.pending.pop(reply.metadata.reply_to_message_id, None)
            if sent is not None and not reply.has_error():
                late.append((*sent, reply))
        return late
