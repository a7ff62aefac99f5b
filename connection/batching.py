"""End-of-tick batching: many small writes in one loop iteration become one syscall.

A fan-out or a read of many pipelined packets produces many small outgoing packets for the same
socket (or mesh peer, or log) within one event-loop iteration. Everything that buffers output marks
itself dirty here; one ``call_soon`` per iteration, not per message, flushes all of them. That is
what turns N sends into one ``writelines`` per connection per tick.
"""

from __future__ import annotations

import asyncio
from typing import Protocol


class Flushable(Protocol):
    def flush(self) -> None: ...


class EndOfTick:
    __slots__ = ("_loop", "_dirty", "_scheduled")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._dirty: list[Flushable] = []
        self._scheduled = False

    def mark(self, item: Flushable) -> None:
        """Flush ``item`` at the end of this iteration. The caller marks once per dirty period."""
        self._dirty.append(item)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._run)

    def _run(self) -> None:
        # Flushing may mark new items (a flush that triggers more output); loop until quiet so that
        # nothing waits a whole extra iteration.
        while self._dirty:
            dirty, self._dirty = self._dirty, []
            for item in dirty:
                item.flush()
        self._scheduled = False
