"""Interest: which topic filters this router's subscriptions want from the others.

Changes collected in a loop iteration travel as one INTEREST frame to every live peer; one that
adds a filter (or a ``barrier``, one without changes) is numbered and waits, bounded by
``ACK_TIMEOUT_S``, until every live peer acknowledges it (INTEREST_ACK, with its log's end then):
a SUBACK after that reaches the new subscriber from any router. A router that joins, or is heard
again, gets everything as one full announcement that replaces the last (``announce_all``).

What the frames mean is the sans-IO core, ``announcements.InterestCore``; ``Interest`` is its
shell: the requests' futures and timeouts, the frames packed and sent, the router told (``_actions``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from brokerd.router.mesh_format import INTEREST_ACK

from . import announcements, effects, membership
from .announcements import Floors, InterestCore
from .limits import ACK_TIMEOUT_S
from .waiter import Waiter

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable

    from brokerd.router.router import Router

    from .peer import Peer
    from .waiter import Requests


class Interest:
    """The ``Mesh``'s interest announcements, owned: this tick's changes (``batch``) and the
    request that waits for their acknowledgements (``waiter``), which ``forwarding`` sends with
    the tick's publishes (``flush``)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, router: Router, peers: dict[str, Peer],
                 requests: Requests, send: Callable[[Peer, int, Any], None], mark: Callable[[], None],
                 flush_collected: Callable[[], None]) -> None:
        self.loop = loop
        self.router = router
        self.peers = peers
        self.requests = requests
        self._send = send  # (framing) a frame to one peer
        self._mark = mark  # (forwarding) something to send at the end of this tick
        self._flush_collected = flush_collected  # (forwarding) send what this tick collected, now
        self.closed = False
        self.core = InterestCore()  # this tick's changes (``batch``), what frames mean
        self.waiter: Waiter | None = None  # their request, where one waits for acknowledgements
        # Where each peer took our filters in: the router reads them (``Router.interest_taken``).
        self.floors = Floors({})
        router.interest_taken = self.floors.floors

    @property
    def batch(self) -> list[tuple[str, bool | int]]:
        """This tick's changes (the core's), which ``forwarding`` looks at."""
        return self.core.batch

    def announce(self, topic_filter: str, add: bool | int) -> asyncio.Future | None:
        """``MeshPort.announce_interest``."""
        self.core.collect(topic_filter, add)
        self._mark()
        if not add:
            return None
        return self._wait()

    def barrier(self) -> asyncio.Future | None:
        """An interest announcement without changes: every peer answers it after whatever it sent
        before (one PUSH socket per direction keeps a peer's frames in order), so a SUBACK that
        waits for it hands out retained messages as new as any that peer acknowledged to its
        publisher before this subscriber subscribed."""
        if self.closed:
            return None
        future = self._wait()
        if future is not None:
            self._mark()
        return future

    def _wait(self) -> asyncio.Future | None:
        """The future of this tick's request, which every live peer answers; None with none."""
        alive = membership.alive(self.peers)
        if not alive:
            return None
        if self.waiter is None:
            self.waiter = Waiter(self.loop, alive)
        return self.waiter.future

    def announce_all(self, peer: Peer) -> None:
        """Everything this router announces, as one full announcement (it replaces the last);
        its last frame is numbered, so that the peer's acknowledgement says where it took it in
        (``floors``)."""
        waiter = Waiter(self.loop, {peer.router_id})
        waiter.ends = {}
        seq = self.requests.open(waiter)
        self.loop.call_later(ACK_TIMEOUT_S, self.requests.expire, seq, "interest")
        self.floors.full(peer.router_id, seq)
        for frame in InterestCore.full(peer, self.router.interest_announcements(), seq):
            self._send(*frame)

    def flush(self) -> None:
        """This loop iteration's interest changes (or a barrier): one frame to each live peer
        (numbered for each: ``framing``)."""
        waiter, self.waiter = self.waiter, None
        seq = None
        if waiter is not None:
            waiter.ends = {}
            seq = self.requests.open(waiter)
            self.loop.call_later(ACK_TIMEOUT_S, self.requests.expire, seq, "interest")
        adds = any(add for _, add in self.core.batch)
        out = self.core.out(seq)
        sent: list[str] = []
        for peer in self.peers.values():
            if peer.alive and peer.link is not None:
                self._send(peer, out.kind, out.body)
                sent.append(peer.router_id)
        if adds:
            self.floors.added(seq, sent, self.peers.keys() - sent)

    def peer_gone(self, router_id: str) -> None:
        """``router_id`` fell silent: this tick's request does not wait for it."""
        if self.waiter is not None:
            self.waiter.answer(router_id)

    # -- frames received ------------------------------------------------------------------------

    def on_interest(self, peer: Peer, body: Any, size: int) -> None:
        actions = self._actions
        for effect in InterestCore.received(peer, body):
            actions[effect.__class__](self, effect)

    def on_interest_ack(self, peer: Peer, body: Any, size: int) -> None:
        seq, router_id, end = InterestCore.acknowledged(peer, body)
        self.floors.acknowledged(router_id, seq, end)  # (before its waits complete: they read it)
        waiter = self.requests.get(seq)
        if waiter is not None and waiter.ends is not None:
            waiter.ends[router_id] = end
        self.requests.answer(seq, router_id)

    def _replaced(self, effect: announcements.Replaced) -> None:
        self.router.peer_left(effect.router_id)  # a full announcement replaces everything it said before

    def _changed(self, effect: announcements.Changed) -> None:
        self.router.peer_interest(*effect)

    def _flush_now(self, effect: effects.Flush) -> None:
        self._flush_collected()  # what was collected before it goes first: the answer follows it

    def _acknowledge(self, effect: announcements.Acknowledge) -> None:
        # With where this router's log is now: its own messages from there on that the filters
        # match go to the announcer (a session moved there counts on it).
        commit_log = self.router.commit_log
        self._send(effect.peer, INTEREST_ACK, [effect.seq, commit_log.next_offset if commit_log is not None else -1])

    # effect -> its action (the core's effects, ``announcements``)
    _actions: dict[type, Callable[[Interest, Any], None]] = {
        announcements.Replaced: _replaced, announcements.Changed: _changed, effects.Flush: _flush_now,
        announcements.Acknowledge: _acknowledge,
    }
