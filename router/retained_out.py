"""The retained messages a SUBSCRIBE is owed, sent a slice per loop turn after its SUBACK.

A '#' over 50,000 retained messages took 108 ms of its worker in one turn (about 2 s at the old
default limit), and every other client of that worker waited. Now the first slice goes out with the
SUBACK and the rest follow, SLICE at a time, each in a later turn of the loop, so the other clients'
packets are read and answered in between.

Live messages may arrive meanwhile: the walk (``RetainedStore.iter_match``) leaves out every
topic set after the SUBACK (``before``: those went out live, as the subscription was already in
place) and every topic cleared or replaced since (it finds a node's message as it is when it gets
there), so nothing is sent twice, and nothing old after something newer. A subscription
unsubscribed or replaced meanwhile stops its walk; a connection that closes stops them all.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from brokerd.connection.packets import Subscription

    from .message import Message
    from .session import Session

SLICE = 256  # retained messages (or pauses of the walk: ``retained.PAUSE_NODES`` nodes) per loop turn


class RetainedOut:
    __slots__ = ("session", "conn", "walks")

    def __init__(self, session: Session, walks: list[tuple[Subscription, Iterator[Message | None]]]) -> None:
        self.session = session
        self.conn = session.conn
        self.walks = deque(walks)

    def start(self) -> None:
        """Send the first slice now (a small set goes out whole, with the SUBACK), the rest later."""
        self._run()

    def _run(self) -> None:
        walks = self.walks
        session = self.session
        try:
            if self.conn is None or self.conn.closing or session.conn is not self.conn:
                self.close()
                return
            budget = SLICE
            acl = session.acl
            while walks and budget > 0:
                sub, walk = walks[0]
                if session.subscriptions.get(sub.topic_filter) is not sub:  # unsubscribed or replaced
                    walks.popleft()
                    walk.close()
                    continue
                for msg in walk:
                    budget -= 1
                    if msg is not None and (acl is None or acl.may_read(session.username, session.client_id,
                                                                        msg.topic)):
                        session.deliver(msg.with_ids((sub.sub_id,)) if sub.sub_id else msg, min(msg.qos, sub.qos),
                                        True)
                    if budget <= 0:
                        break
                else:
                    walks.popleft()
        except BaseException:
            self.close()
            raise
        if walks:
            asyncio.get_running_loop().call_soon(self._run)

    def close(self) -> None:
        """Stop every walk (the store tidies once no walk is open)."""
        while self.walks:
            self.walks.popleft()[1].close()
