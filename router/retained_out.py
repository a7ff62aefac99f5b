"""The retained messages a SUBSCRIBE is owed, sent a slice per loop turn after its SUBACK.

A '#' over 50,000 retained messages took 108 ms of its worker in one turn (about 2 s at the old
default limit), and every other client of that worker waited. Now the first slice goes out with the
SUBACK and the rest follow, SLICE at a time, each in a later turn of the loop, so the other clients'
packets are read and answered in between.

Live messages may arrive meanwhile: the walk (``RetainedStore.iter_match``) leaves out every
topic set after the SUBACK (``before``: those went out live, as the subscription was already in
place) and every topic cleared or replaced since (it finds a node's message as it is when it gets
there), so nothing is sent twice, and nothing old after something newer. A subscription
unsubscribed or replaced meanwhile stops its walk, and so does the end of its session (its
subscriptions go with it).

What is owed is the session's, not the connection's: a session that outlives its connection
(clean start 0, a session expiry) goes on taking its QoS 1/2 retained messages offline, queued
(bounded by --max-queued), as when they were all queued with the SUBACK; resumed meanwhile, it
gets the rest on its new connection. A session moved to another router (``finish``) takes what is
owed with it: its walks are finished first.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from brokerd.connection.packets import Subscription

    from .message import Message
    from .session import Session

SLICE = 256  # retained messages, walks, or pauses of a walk (``retained.PAUSE_NODES`` nodes) per loop turn

_open: dict[Session, RetainedOut] = {}  # each session's walks (one object per session, in order)


class RetainedOut:
    __slots__ = ("session", "walks", "_scheduled")

    def __init__(self, session: Session, walks: list[tuple[Subscription, Generator[Message | None, None, None]]]) -> None:
        self.session = session
        self.walks = deque(walks)
        self._scheduled = False

    def start(self) -> None:
        """Send the first slice now (a small set goes out whole, with the SUBACK), the rest later.
        A session with walks still open takes these behind them, in order."""
        walking = _open.get(self.session)
        if walking is not None:
            walking.walks.extend(self.walks)
            self.walks.clear()
            return
        _open[self.session] = self
        self._run()

    def _run(self, budget: int | None = SLICE) -> None:
        """A slice of the walks (all of them: ``budget`` None), then the next in a later turn."""
        self._scheduled = False
        walks = self.walks
        session = self.session
        try:
            acl = session.acl
            while walks and (budget is None or budget > 0):
                sub, walk = walks[0]
                if session.subscriptions.get(sub.topic_filter) is not sub:  # unsubscribed, replaced, ended
                    walks.popleft()
                    walk.close()
                    if budget is not None:
                        budget -= 1
                    continue
                for msg in walk:
                    if budget is not None:
                        budget -= 1
                    if msg is not None and (acl is None or acl.may_read(session.username, session.client_id,
                                                                        msg.topic)):
                        self._deliver(session, sub, msg)
                    if budget is not None and budget <= 0:
                        break
                else:  # a walk counts too: 100,000 filters that match nothing took 300 ms in one turn
                    walks.popleft()
                    if budget is not None:
                        budget -= 1
        except BaseException:
            self.close()
            raise
        if not walks:
            self.close()
        elif not self._scheduled:
            self._scheduled = True
            self.session.clock.call_soon(self._run)

    @staticmethod
    def _deliver(session: Session, sub: Subscription, msg: Message) -> None:
        qos = min(msg.qos, sub.qos)
        if sub.sub_id:
            msg = msg.with_ids((sub.sub_id,))
        cursor = session.cursor
        if qos and cursor is not None and 0 <= msg.log_offset < cursor:
            # Offline (or catching up), a session reads what it missed from the log from its
            # cursor on; a retained message logged before that is no part of it: a copy is queued.
            if not sub.sub_id:  # else ``with_ids`` made it a copy already
                msg = msg.clone()
            msg.log_offset = -1
        session.deliver(msg, qos, True)

    def close(self) -> None:
        """Stop every walk (the store tidies once no walk is open)."""
        if _open.get(self.session) is self:
            del _open[self.session]
        while self.walks:
            self.walks.popleft()[1].close()


def finish(session: Session) -> None:
    """Walk what ``session`` is still owed to the end, now: it is moving to another router, which
    takes what it has queued (bounded by --max-queued) and nothing of this router's walks."""
    walking = _open.get(session)
    if walking is not None:
        walking._run(None)
