"""End-of-tick batching: many small writes in one loop iteration become one syscall.

A fan-out or a read of many pipelined packets produces many small outgoing packets for the same
socket (or mesh peer, or log) within one event-loop iteration. Everything that buffers output marks
itself dirty here; one ``call_soon`` per iteration, not per message, flushes all of them. That is
what turns N sends into one ``writelines`` per connection per tick.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import ClassVar, Protocol


class Flushable(Protocol):
    def flush(self) -> None: ...


class Soon(Protocol):
    """What ``EndOfTick`` needs of a loop: ``call_soon`` (an asyncio loop, or a fake one in a test)."""

    def call_soon(self, callback: Callable[[], object], /) -> object: ...


class EndOfTick:
    """One ``call_soon`` per loop iteration, which flushes everything marked dirty in it.

    Two kinds of item. ``mark``: a connection's output, which ``flush_since`` may also write
    early for a quiet client. ``mark_end``: the mesh's batch and the log, written at the end of
    the iteration only: the mesh's frames are worth filling (a frame's costs are per frame, not
    per message; reached by ``flush_since``, a fan-out across workers lost 12 %), and the log's
    write has a fixed cost (written for each quiet client's read, 2.4 times an iteration at a
    fixed rate). An end-only item may wait for the next iteration's end instead (``mark_next``).

    End-only items flush first in the pass, in the order they were marked (in a publish the mesh
    before the log): the mesh's frames reach ZeroMQ's I/O thread (and the
    receiving worker) while this worker writes its sockets and its log, which is the order the
    mesh's own ``call_soon`` had (its wait for the next iteration put it ahead of that
    iteration's pass); nothing the mesh sends waits for the log's write (a frame's mark is the
    log's next offset, taken as the messages were appended).
    """

    __slots__ = ("_loop", "_dirty", "_end", "_next", "_scheduled", "_early")

    EARLY_PER_TURN: ClassVar[int] = 4  # quiet clients' outputs written at once per iteration; later ones wait

    def __init__(self, loop: Soon) -> None:
        self._loop = loop
        self._dirty: list[Flushable] = []
        self._end: list[Flushable] = []  # end-only: never reached by ``flush_since``
        self._next: list[Flushable] = []  # end-only, for the next iteration's end
        self._scheduled = False
        self._early = 0

    def pending(self) -> int:
        """A mark for ``flush_since``: how many items are dirty now."""
        return len(self._dirty)

    def flush_since(self, mark: int) -> None:
        """Write now what became dirty after ``pending()`` returned ``mark``: what one quiet
        client's packet caused (a device's command, a probe) need not wait for the busy clients'
        reads and writes of the rest of this iteration. At most ``EARLY_PER_TURN`` times an
        iteration, so that many quiet publishers to one subscriber still share its writes.
        End-only items (``mark_end``) wait for the end."""
        if self._early >= self.EARLY_PER_TURN:
            return
        self._early += 1
        dirty = self._dirty
        for i in range(mark, len(dirty)):
            dirty[i].flush()  # flushed again at the end of the iteration: a no-op if nothing new

    def mark(self, item: Flushable) -> None:
        """Flush ``item`` at the end of this iteration. The caller marks once per dirty period."""
        self._dirty.append(item)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._run)

    def mark_end(self, item: Flushable) -> None:
        """Flush ``item`` at the end of this iteration and only then (never by ``flush_since``)."""
        self._end.append(item)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._run)

    def mark_next(self, item: Flushable) -> None:
        """Flush ``item`` at the end of the next iteration, not this one (called from its
        ``flush``: an end-only item that waits once more to fill)."""
        self._next.append(item)
        if not self._scheduled:  # (outside a pass: this iteration's pass hands it on to the next)
            self._scheduled = True
            self._loop.call_soon(self._run)

    def _run(self) -> None:
        # Flushing may mark new items (a flush that triggers more output); loop until quiet so that
        # nothing waits a whole extra iteration.
        failed: Exception | None = None
        while self._end or self._dirty:
            if self._end:
                end, self._end = self._end, []
                for item in end:
                    try:
                        item.flush()
                    except Exception as exc:  # (the mesh's frames) the connections and log still write
                        failed = exc
            while self._dirty:
                dirty, self._dirty = self._dirty, []
                for item in dirty:
                    item.flush()
        self._early = 0
        if self._next:  # what waits for the next iteration's end: one ``call_soon`` for it all
            self._end, self._next = self._next, []
            self._loop.call_soon(self._run)
        else:
            self._scheduled = False
        if failed is not None:
            raise failed  # to the loop's exception handler, as a callback of its own would have


class TurnBudget:
    """How many packets all of a worker's connections together may decode and handle in one loop
    iteration before each busy connection is cut to a few (``MIN_SHARE``) per turn.

    A per-connection budget bounds a turn by ``busy connections x budget``; with twenty busy QoS 1
    clients that is still hundreds of packets ahead of a quiet client's one. This bounds the turn
    itself, so a quiet client's message waits about the same whatever the number of busy ones.
    The count starts over once per iteration (a ``call_soon`` scheduled by the first share taken).
    """

    MIN_SHARE: ClassVar[int] = 4  # every connection still makes progress every turn
    __slots__ = ("_loop", "per_turn", "left", "_scheduled", "fan_budget", "delivered")

    def __init__(self, loop: asyncio.AbstractEventLoop, per_turn: int, fan_budget: int = 0,
                 delivered: Callable[[], int] | None = None) -> None:
        """``per_turn``: packets per turn for all connections (0: no limit). ``fan_budget``: most
        deliveries one connection's packets may cause in a turn (0: no limit), with ``delivered``
        a running total of deliveries. A packet is not a unit of work when one publish reaches
        fifty subscribers: a connection whose packets were delivered ``f`` times each last turn
        gets at most ``fan_budget / f`` packets this turn (a delivery counting once more per KiB
        of the connection's mean packet size: ``MQTTConnection._decoded``), so a fan-out's turn
        is bounded and a quiet client's message does not wait behind thousands of deliveries."""
        self._loop = loop
        self.per_turn = per_turn or sys.maxsize  # 0: no limit on the turn (a fan budget alone)
        self.left = self.per_turn
        self._scheduled = False
        self.fan_budget = fan_budget if delivered is not None else 0
        self.delivered = delivered

    def share(self, cap: int) -> int:
        """Packets the calling connection may take now (at most ``cap``); it subtracts what it took
        from ``left``."""
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._start_over)
        left = self.left
        if left >= cap:
            return cap
        return left if left > self.MIN_SHARE else self.MIN_SHARE

    def _start_over(self) -> None:
        self.left = self.per_turn
        self._scheduled = False
