"""What a session holds between a PUBLISH sent and its acknowledgement, and the mark of a message
read from a range: the session (``router.session``) and its transfer (``router.session_transfer``)
both make them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .message import Message

# Inflight states
AWAIT_ACK = 0  # PUBLISH sent, waiting for PUBACK (QoS 1) or PUBREC (QoS 2)
AWAIT_COMP = 1  # PUBREL sent, waiting for PUBCOMP

# A message read from a range (another router's log on this node, or a spool) carries, as its
# ``log_offset``, RANGED minus its position in that range: negative, so it is no position in this
# router's log (``position``), and what the snapshot names its range from while it is held.
RANGED = -2


class Inflight:
    """One packet id of the session's window: the message sent (None once a QoS 2 one was
    released by PUBREL: only its id waits for PUBCOMP), and where its flow is."""

    __slots__ = ("msg", "qos", "retain", "state")

    def __init__(self, msg: Message | None, qos: int, retain: bool) -> None:
        self.msg = msg
        self.qos = qos
        self.retain = retain
        self.state = AWAIT_ACK
