"""Time and timers for the router's rules, injected (h11's habit: the caller owns the clock).

Every rule with a time in it (message expiry, will delay, session expiry, the QoS 2 sweep, a
fenced copy's wait) asks its ``Clock``, never ``time`` or the event loop directly, so that a
unit test drives it with a ``FakeClock``: no broker process, no sleeping.

Two readings, because the rules need both:
- ``now()``: monotonic seconds (the loop's ``time()``), for waits inside this process;
- ``unix()``: wall-clock seconds since the epoch, for times that travel with a message or a
  session (an expiry deadline, a will's due time, a takeover's arrival time) to other routers
  and across restarts.

What is made without a clock (a ``Router``, a ``Session``, a ``Message`` asked for its time left)
reads ``LOOP_CLOCK``. A ``FakeClock`` also answers what an event loop is asked for time
(``time``, ``call_soon``/``call_later``/``call_at``), so the connection's parts, which take their
loop (``connection/`` imports nothing of the router's), are driven by one too.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Any, Final, Protocol

__all__ = ["LOOP_CLOCK", "Clock", "FakeClock", "LoopClock", "Timer"]


class Timer(Protocol):
    """What ``call_later`` / ``call_at`` return: the one thing a rule does with it is cancel it."""

    def cancel(self) -> None: ...


class Clock(Protocol):
    def now(self) -> float: ...

    def unix(self) -> float: ...

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> Timer: ...

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> Timer: ...

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> Timer: ...


_wall: Final = time.time
"""Final: compiled, a static, not the ``time`` module's attribute looked up at each reading (the
reading of a message's time when it is published: 530 -> about 200 instructions)."""


class LoopClock:
    """The event loop's time and timers: what a broker runs with. The loop is looked up at each
    call (as ``asyncio.get_event_loop()`` was at each rule before), so a router may be made
    before its loop runs."""

    __slots__ = ()

    def now(self) -> float:
        return asyncio.get_event_loop().time()

    def unix(self) -> float:
        return _wall()

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> Timer:
        return asyncio.get_event_loop().call_soon(callback, *args)

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> Timer:
        return asyncio.get_event_loop().call_later(delay, callback, *args)

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> Timer:
        return asyncio.get_event_loop().call_at(when, callback, *args)


LOOP_CLOCK: Final = LoopClock()
"""Final: compiled, a default of ``LOOP_CLOCK`` and its ``unix()`` are direct calls, as cheap as the
``time.time()`` a message read before it was given a clock."""


class _FakeTimer:
    __slots__ = ("when", "callback", "args", "cancelled")

    def __init__(self, when: float, callback: Callable[..., Any], args: tuple) -> None:
        self.when = when
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    """A clock that moves only when told (``advance``): the timers due run then, in the order of
    their times (ties: the order they were set), each at its own time, so a timer set by another
    timer within the same advance runs too if it falls within it. Wall time moves with it.

    ``call_soon`` is a timer due now: it runs at the next ``run_ready`` (one turn of a loop: what
    was due when it began, not what those callbacks schedule) or ``advance`` (every turn, until
    nothing is due)."""

    def __init__(self, now: float = 1000.0, unix: float = 1_700_000_000.0) -> None:
        self._now = now
        self._offset = unix - now
        self._timers: list[tuple[float, int, _FakeTimer]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    def unix(self) -> float:
        return self._now + self._offset

    def time(self) -> float:
        """``now()`` under the name an event loop gives it: a part that takes a loop for its time
        and timers (``connection.keepalive``, ``connection.guard``) takes this clock."""
        return self._now

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> _FakeTimer:
        return self.call_at(self._now, callback, *args)

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> _FakeTimer:
        return self.call_at(self._now + max(delay, 0.0), callback, *args)

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> _FakeTimer:
        timer = _FakeTimer(when, callback, args)
        heapq.heappush(self._timers, (when, next(self._seq), timer))
        return timer

    def advance(self, seconds: float) -> None:
        """Move time on by ``seconds``, running every timer that falls due meanwhile."""
        end = self._now + seconds
        timers = self._timers
        while timers and timers[0][0] <= end:
            when, _, timer = heapq.heappop(timers)
            if timer.cancelled:
                continue
            self._now = max(self._now, when)
            timer.callback(*timer.args)
        self._now = end

    def run_ready(self) -> int:
        """One turn of the loop: run what is due now and was set before this call; what those
        callbacks set with ``call_soon`` waits for the next turn. Returns how many ran."""
        timers = self._timers
        due: list[tuple[float, int, _FakeTimer]] = []
        while timers and timers[0][0] <= self._now:
            due.append(heapq.heappop(timers))
        ran = 0
        for i, (_, _, timer) in enumerate(due):
            if timer.cancelled:
                continue
            try:
                timer.callback(*timer.args)
            except BaseException:
                for entry in due[i + 1:]:  # what this turn did not reach stays due
                    heapq.heappush(timers, entry)
                raise
            ran += 1
        return ran

    @property
    def pending(self) -> int:
        """Timers set and neither run nor cancelled."""
        return sum(1 for _, _, t in self._timers if not t.cancelled)
