"""What a session holds between a PUBLISH sent and its acknowledgement, and the mark of a message
read from a range: the session (``router.session``) and its transfer (``router.session_transfer``)
both make them. And the window on a resume: what goes again at once, and what waits, in order,
for the new connection's Receive Maximum to make room (``held_back``, ``resend_held_back``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from brokerd.connection.codec import encode, with_dup
from brokerd.connection.packets import Pubrel

if TYPE_CHECKING:
    from brokerd.connection.protocol import Connection

    from .message import Message
    from .session import Session

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


def held_back(inflight: dict[int, Inflight], conn: Connection) -> OrderedDict[int, Inflight] | tuple[()]:
    """A resume's window: a PUBREL goes again at once (its PUBLISH was received; it holds a place
    until PUBCOMP); the PUBLISHes are returned, in order, to wait before the queue, as Mosquitto
    puts them back in its queue. Each goes out as an acknowledgement frees a place, keeping its
    packet id, since the client may have it (a QoS 2 one received before the connection broke
    must not be delivered twice)."""
    level = conn.protocol_level
    unsent: OrderedDict[int, Inflight] = OrderedDict()
    for pid, entry in inflight.items():
        if entry.state == AWAIT_ACK:
            unsent[pid] = entry
        else:
            conn.send(encode(Pubrel(pid), level))
    return unsent or ()


def resend_held_back(session: Session, conn: Connection) -> bool:
    """Resend (DUP) what a resume held back (``Session.unsent``), oldest first, while the window
    has room; whether it all went (the window may take more). One expired, too large for this
    connection or no longer readable is dropped, as Mosquitto drops expired messages from the
    window when it resends; one no longer in ``inflight`` as it was (the window replaced: a move
    away) is passed over."""
    inflight = session.inflight
    unsent = session.unsent
    assert unsent.__class__ is OrderedDict  # (the caller saw it not empty)
    clock = session.clock
    level = conn.protocol_level
    outbound = conn.outbound
    while unsent and len(inflight) - len(unsent) < session.receive_max:
        pid, entry = unsent.popitem(last=False)
        if inflight.get(pid) is not entry or entry.state != AWAIT_ACK:
            continue
        msg = entry.msg
        assert msg is not None  # kept until its PUBREC
        parts = msg.encoded(level, entry.qos, entry.retain, clock) if outbound is None else \
            outbound.parts(msg, entry.qos, entry.retain, clock)
        if parts is None or (msg.expires_ms and msg.expired(clock.unix() * 1000)):
            del inflight[pid]
            if parts is None:
                session.stats.drop_too_large += 1
            else:
                session.stats.drop_expired += 1
            session.dropped += 1
            continue
        if session.acl is not None and not session.readable(msg):
            del inflight[pid]  # its read grant was revoked since it was sent
            session.stats.drop_revoked += 1
            session.dropped += 1
            continue
        head, tail = parts
        conn.send(with_dup(head) + pid.to_bytes(2, "big") + tail)
    if unsent:
        return False
    session.unsent = ()
    return True
