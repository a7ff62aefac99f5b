"""Interest: which topic filters this router's subscriptions want from the others.

Changes collected in a loop iteration travel as one INTEREST frame to every live peer; one that
adds a filter (or a ``barrier``, one without changes) is numbered and waits, bounded by
``ACK_TIMEOUT_S``, until every live peer acknowledges it (INTEREST_ACK, with its log's end then):
a SUBACK after that reaches the new subscriber from any router. A router that joins, or is heard
again, gets everything as one full announcement that replaces the last (``_announce_all``).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from brokerd.router.mesh_format import INTEREST, INTEREST_ACK

from .limits import ACK_TIMEOUT_S
from .waiter import Waiter

if TYPE_CHECKING:
    import asyncio

    from brokerd.router.router import Router

    from .peer import Peer


class InterestMixin:
    """The ``Mesh``'s interest announcements and the requests peers answer."""

    loop: asyncio.AbstractEventLoop
    router: Router
    peers: dict[str, Peer]
    closed: bool
    _dirty: bool
    _interest_batch: list[tuple[str, bool | int]]
    _interest_waiter: Waiter | None
    _waiters: dict[int, Waiter]
    _req_ids: itertools.count

    if TYPE_CHECKING:  # the other parts' methods this one calls (the ``Mesh`` is their union)
        def _frame(self, kind: int, body: Any) -> bytes: ...
        def _send(self, peer: Peer, kind: int, body: Any) -> None: ...
        def _mark(self) -> None: ...
        def _flush(self) -> None: ...
        def _alive(self) -> set[str]: ...
        def _expire_waiter(self, req: int, what: str) -> None: ...
        def _confirm_again(self, peer: Peer) -> None: ...

    def announce_interest(self, topic_filter: str, add: bool | int) -> asyncio.Future | None:
        self._interest_batch.append((topic_filter, add))
        self._mark()
        if not add:
            return None
        alive = self._alive()
        if not alive:
            return None
        if self._interest_waiter is None:
            self._interest_waiter = Waiter(self.loop, alive)
        return self._interest_waiter.future

    def barrier(self) -> asyncio.Future | None:
        """An interest announcement without changes: every peer answers it after whatever it sent
        before (one PUSH socket per direction keeps a peer's frames in order), so a SUBACK that
        waits for it hands out retained messages as new as any that peer acknowledged to its
        publisher before this subscriber subscribed."""
        alive = self._alive()
        if not alive or self.closed:
            return None
        if self._interest_waiter is None:
            self._interest_waiter = Waiter(self.loop, alive)
        self._mark()
        return self._interest_waiter.future

    def _announce_all(self, peer: Peer) -> None:
        """Everything this router announces, as one full announcement (it replaces the last)."""
        changes = self.router.interest_announcements()
        for i in range(0, max(len(changes), 1), 5000):
            self._send(peer, INTEREST, [None, changes[i:i + 5000], i == 0])

    def _answer(self, req: int, router_id: str, result: Any = None) -> None:
        """``router_id`` answered request ``req`` (or left: counts as an empty answer)."""
        waiter = self._waiters.get(req)
        if waiter is not None:
            waiter.answer(router_id, result)
            if waiter.future.done():
                del self._waiters[req]

    def _flush_interest(self) -> None:
        """This loop iteration's interest changes (or a barrier): one frame for every live peer."""
        changes, self._interest_batch = self._interest_batch, []
        waiter, self._interest_waiter = self._interest_waiter, None
        seq = None
        if waiter is not None:
            seq = next(self._req_ids)
            waiter.ends = {}
            self._waiters[seq] = waiter
            self.loop.call_later(ACK_TIMEOUT_S, self._expire_waiter, seq, "interest")
        frame = self._frame(INTEREST, [seq, changes])
        for peer in self.peers.values():
            if peer.alive and peer.link is not None:
                peer.link.send(frame)

    # -- frames received ------------------------------------------------------------------------

    def _on_interest(self, peer: Peer, body: Any, size: int) -> None:
        router = self.router
        sender = peer.router_id
        seq, changes = body[0], body[1]
        if len(body) == 3 and body[2]:
            router.peer_left(sender)  # a full announcement replaces everything it said before
            peer.interest_known = True
        for topic_filter, add in changes:
            router.peer_interest(sender, topic_filter, add)
        if seq is not None:
            if self._dirty:  # what was collected before it goes first: the answer follows it
                self._flush()
            # With where this router's log is now: its own messages from there on that the
            # filters match go to the announcer (a session moved there counts on it).
            commit_log = router.commit_log
            self._send(peer, INTEREST_ACK, [seq, commit_log.next_offset if commit_log is not None else -1])

    def _on_interest_ack(self, peer: Peer, body: Any, size: int) -> None:
        seq, end = body
        waiter = self._waiters.get(seq)
        if waiter is not None and waiter.ends is not None:
            waiter.ends[peer.router_id] = end
        self._answer(seq, peer.router_id)

    def _on_resync(self, peer: Peer, body: Any, size: int) -> None:
        self._announce_all(peer)
        self._confirm_again(peer)  # it had taken us for silent: our confirmations may be lost
