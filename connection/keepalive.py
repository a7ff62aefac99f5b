"""Keepalive deadlines of a worker's connections, in one-second buckets under one timer.

Why not a timer per connection: uvloop's TimerHandle and the libuv timer behind it were about 600
of the 3,600 bytes an idle connection held (tracemalloc, 2,000 idle connections); a set entry here
is a few dozen. The work stays proportional to what is due, as before: a read only stamps the
connection (``ConnectionState.heard_at``), nothing is touched per packet, and when a connection's
bucket comes due it is either closed (idle for its whole keepalive, MQTT-3.1.2-24) or moved to the
bucket of its new deadline. No bucket due, no timer: an idle worker with no connections wakes for
nothing. Deadlines are rounded up to the next whole second of the loop's clock: a keepalive
expires up to a second late, never early. A connection's first deadline, until its CONNECT is
accepted, is its CONNECT timeout (``MQTTConnection.connection_made``): no timer per connect either.

Each bucket is a dict (insertion order, values unused), not a set: a set's table is kept at most 60 %
full and grows fourfold, a dict's entries are packed (2,000 connections: 86 -> about 40 bytes
each). A connection holds its bucket's own key object (``_Bucket.key``), not an int of its own
(32 bytes each: the loop's clock in seconds is beyond CPython's cached small ints).
"""

from __future__ import annotations

import heapq
import math
from typing import Protocol

from .loop import Loop, Timer


class Kept(Protocol):
    keepalive_key: int | None  # the bucket it is in (None: none)

    def check_keepalive(self) -> None: ...


class _Bucket(dict[Kept, None]):
    """The connections due at one second (the keys; the values are None), and that second."""

    __slots__ = ("key",)

    def __init__(self, key: int) -> None:
        super().__init__()
        self.key = key


class KeepaliveWheel:
    __slots__ = ("_loop", "_buckets", "_keys", "_timer")

    def __init__(self, loop: Loop) -> None:
        self._loop = loop
        self._buckets: dict[int, _Bucket] = {}
        self._keys: list[int] = []  # a heap of the buckets' keys
        self._timer: Timer | None = None

    def __len__(self) -> int:
        return sum(len(b) for b in self._buckets.values())

    def add(self, conn: Kept, deadline: float) -> None:
        """Check ``conn`` at ``deadline`` (the loop's clock), or up to a second after."""
        self.discard(conn)
        key = math.ceil(deadline)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(key)
            heapq.heappush(self._keys, key)
            if self._keys[0] == key:  # sooner than the timer set: move it
                if self._timer is not None:
                    self._timer.cancel()
                self._timer = self._loop.call_at(key, self._due)
        bucket[conn] = None
        conn.keepalive_key = bucket.key

    def discard(self, conn: Kept) -> None:
        key = conn.keepalive_key
        if key is None:
            return
        conn.keepalive_key = None
        bucket = self._buckets.get(key)
        if bucket is not None:
            bucket.pop(conn, None)
            # An empty bucket stays until it comes due (its key is in the heap): a dict entry.

    def _due(self) -> None:
        self._fired()
        now = self._loop.time()
        keys, buckets = self._keys, self._buckets
        while keys and keys[0] <= now:
            bucket = buckets.pop(heapq.heappop(keys), None)
            for conn in bucket or ():
                conn.keepalive_key = None
                conn.check_keepalive()  # closes it, or adds it again at its new deadline
        if keys and self._timer is None:
            self._timer = self._loop.call_at(keys[0], self._due)

    def _fired(self) -> None:
        """The timer ran. (A method, not ``self._timer = None`` in ``_due``: mypy would take the
        attribute for None through the checks below, where a connection checked may have set a
        timer again, and compiled, mypyc would raise on that timer.)"""
        self._timer = None

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._buckets.clear()
        self._keys.clear()
