"""Requests every live peer answers: an interest announcement's acknowledgements, a takeover's
answers. A ``Waiter``'s future completes when the last peer answers, falls silent, or the request
expires; ``Requests`` numbers them (one series for both kinds) and finds them by number;
``Deadlines`` expires them with one timer for all."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import TYPE_CHECKING, Any

from .limits import log

if TYPE_CHECKING:
    from collections.abc import Callable

# A timer may run this much before its time (asyncio runs what is due within the clock's resolution).
_EARLY = time.get_clock_info("monotonic").resolution


class Waiter:
    """A request answered by every live peer (interest acks, takeover answers)."""

    __slots__ = ("future", "waiting", "result", "missed", "offers", "ends")

    def __init__(self, loop: asyncio.AbstractEventLoop, peers: set[str]) -> None:
        # Completes with a takeover's result (``MeshPort.takeover``), or an interest's ends.
        self.future: asyncio.Future[dict | None] = loop.create_future()
        self.waiting = peers
        self.result: dict | None = None
        self.missed: set[str] = set()  # peers that fell silent or timed out instead of answering
        self.offers: list[tuple[str | None, int, dict]] = []  # takeover: (router, request, session) offered
        # Interest: each acknowledging router's log end when it took the announcement in. The
        # future of an interest waiter completes with this dict (``Router.hand_on``'s marks).
        self.ends: dict[str, int] | None = None

    def answer(self, router_id: str, result: dict | None = None) -> None:
        self.waiting.discard(router_id)
        if result is not None and self.result is None:
            self.result = result
        if not self.waiting:
            self.finish()

    def finish(self) -> None:
        if not self.future.done():
            self.future.set_result(self.ends if self.ends is not None else self.result)


class Requests:
    """This router's open requests by number: the parts that ask (``interest``, ``takeover``)
    open them, the parts that read answers (``transfer`` too) find them, and a peer that falls
    silent answers all of them at once, empty (``peer_gone``)."""

    __slots__ = ("waiters", "_ids")

    def __init__(self) -> None:
        self.waiters: dict[int, Waiter] = {}
        self._ids = itertools.count(1)

    def open(self, waiter: Waiter) -> int:
        """A number for ``waiter``, under which its answers find it."""
        req = next(self._ids)
        self.waiters[req] = waiter
        return req

    def get(self, req: int) -> Waiter | None:
        return self.waiters.get(req)

    def answer(self, req: int, router_id: str, result: Any = None) -> None:
        """``router_id`` answered request ``req`` (or left: counts as an empty answer)."""
        waiter = self.waiters.get(req)
        if waiter is not None:
            waiter.answer(router_id, result)
            if waiter.future.done():
                del self.waiters[req]

    def expire(self, req: int, what: str) -> None:
        """Request ``req`` is over: whoever has not answered yet counts as missed."""
        waiter = self.waiters.pop(req, None)
        if waiter is not None and not waiter.future.done():
            log.warning("mesh: %s request %d unanswered by %s; continuing", what, req,
                        ", ".join(sorted(waiter.waiting)))
            waiter.missed |= waiter.waiting
            waiter.finish()

    def peer_gone(self, router_id: str) -> None:
        """``router_id`` fell silent, left or restarted: it answers nothing more."""
        for req, waiter in list(self.waiters.items()):
            if router_id in waiter.waiting:
                waiter.missed.add(router_id)
            self.answer(req, router_id)


class Deadlines:
    """Requests' deadlines on one timer, the earliest's, instead of one timer each: a connection
    storm asked once per CONNECT and left a timer per request to fire seconds after its answer
    came. A request answered in time is ``discard``-ed; one past its deadline goes to ``due``,
    which may ``add`` it again (a session still arriving)."""

    __slots__ = ("_loop", "_due", "_at", "_timer")

    def __init__(self, loop: asyncio.AbstractEventLoop, due: Callable[[int], None]) -> None:
        self._loop = loop
        self._due = due
        self._at: dict[int, float] = {}  # request → its deadline (the loop's clock)
        self._timer: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._at)

    def add(self, req: int, delay: float) -> None:
        """``req`` is due ``delay`` seconds from now, unless discarded first."""
        when = self._loop.time() + delay
        self._at[req] = when
        timer = self._timer
        if timer is None or when < timer.when():
            self._arm(when)

    def discard(self, req: int) -> None:
        """``req`` was answered: nothing is due for it (the timer, where it was the earliest,
        finds nothing to do when it runs and is set for the next)."""
        self._at.pop(req, None)

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._timer = None
        at = self._at
        now = self._loop.time() + _EARLY
        due = [req for req, when in at.items() if when <= now]
        for req in due:
            del at[req]
        for req in due:
            self._due(req)  # (may add it again, setting the timer for then)
        if at:
            earliest = min(at.values())
            if self._timer is None or earliest < self._timer.when():
                self._arm(earliest)
