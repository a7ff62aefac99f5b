"""The figures a router's stats snapshot is made of, apart from the socket that publishes them
(``cluster.stats``): the worker's traffic (``ConnectionSet``), rates over windows (``RateRing``),
a client's row, and a fold over many connections or sessions split across loop turns
(``SlicedFold``), so that a snapshot never holds every client's packets back.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from brokerd.connection.protocol import Traffic

if TYPE_CHECKING:
    import asyncio

    from brokerd.connection.protocol import MQTTConnection
    from brokerd.router.ports import ClientHandle

__all__ = ["RATE_KEYS", "WINDOWS", "ConnectionSet", "RateRing", "SlicedFold", "client_bytes", "client_row",
           "fold_in_slices"]

WINDOWS: tuple[tuple[str, float], ...] = (("1s", 1.0), ("1min", 60.0), ("5min", 300.0), ("15min", 900.0))
RATE_KEYS = ("msgs_in", "msgs_out", "bytes_in", "bytes_out", "mesh_msgs_in", "mesh_msgs_out",
             "mesh_bytes_in", "mesh_bytes_out", "log_records", "log_bytes", "connects")


# -- the worker's connections and their traffic -----------------------------------------------------

class ConnectionSet(set):
    """The worker's set of live connections, and ``traffic``: what all of them, closed ones
    included, carried (each connection adds to it as it counts: ``connection.protocol.Traffic``)."""

    __slots__ = ("traffic",)

    def __init__(self, items: Iterable[MQTTConnection] = ()) -> None:
        super().__init__(items)
        self.traffic = Traffic()


# -- rates ------------------------------------------------------------------------------------------

class RateRing:
    """Counter samples of the last 15 minutes, one per snapshot: rates over any window in O(1)."""

    def __init__(self, interval: float, keys: tuple[str, ...] = RATE_KEYS) -> None:
        self.interval = interval
        self.keys = keys
        self._ring: deque[tuple[float, tuple[int, ...]]] = deque(
            maxlen=math.ceil(WINDOWS[-1][1] / interval) + 2)

    def push(self, t: float, values: tuple[int, ...]) -> None:
        self._ring.append((t, values))

    def rates(self) -> dict[str, dict[str, float]]:
        ring = self._ring
        out: dict[str, dict[str, float]] = {}
        if not ring:
            return {name: dict.fromkeys(self.keys, 0.0) for name, _ in WINDOWS}
        t1, v1 = ring[-1]
        last = len(ring) - 1
        for name, seconds in WINDOWS:
            t0, v0 = ring[max(0, last - max(1, round(seconds / self.interval)))]
            dt = t1 - t0
            out[name] = {k: ((b - a) / dt if dt > 0 else 0.0) for k, a, b in zip(self.keys, v0, v1, strict=True)}
        return out


# -- clients ----------------------------------------------------------------------------------------

def client_bytes(client: ClientHandle) -> int:
    """What a client is ranked by in ``top``: bytes in and out."""
    c = client.conn.counters
    total: int = c.bytes_in + c.bytes_out  # (``conn`` is a port's ``Any``)
    return total


def client_row(client: ClientHandle) -> dict[str, Any]:
    """A client as ``top`` and the connection list show it."""
    conn = client.conn
    c = conn.counters
    session = client.session
    return {"client_id": client.client_id, "peer": conn.peer, "protocol": conn.protocol_level,
            "bytes_in": c.bytes_in, "bytes_out": c.bytes_out, "msgs_in": c.msgs_in, "msgs_out": c.msgs_out,
            "queued": len(session.queue) if session is not None else 0,
            "inflight": len(session.inflight) if session is not None else 0,
            "dropped": session.dropped if session is not None else 0}


# -- folds across loop turns ------------------------------------------------------------------------

class SlicedFold:
    """Fold ``items`` a slice of ``size`` per loop iteration: ``acc = step(part, acc)``, then
    ``done(acc)``. What a snapshot must walk over every connection or session (the top clients,
    the queued and in-flight count) is walked so, when there are more than a slice of them,
    rather than in one go that holds every client's packets back."""

    __slots__ = ("loop", "items", "size", "pos", "acc", "step", "done")

    def __init__(self, loop: asyncio.AbstractEventLoop, items: list[Any], acc: Any,
                 step: Callable[[list[Any], Any], Any], done: Callable[[Any], None], size: int) -> None:
        self.loop = loop
        self.items = items
        self.size = size
        self.pos = 0
        self.acc = acc
        self.step = step
        self.done = done
        loop.call_soon(self._next)

    def _next(self) -> None:
        end = self.pos + self.size
        self.acc = self.step(self.items[self.pos:end], self.acc)
        self.pos = end
        if end < len(self.items):
            self.loop.call_soon(self._next)
        else:
            self.done(self.acc)


def fold_in_slices(loop: asyncio.AbstractEventLoop | None, items: list[Any], acc: Any,
                   step: Callable[[list[Any], Any], Any], done: Callable[[Any], None],
                   size: int) -> SlicedFold | None:
    """``done(step(items, acc))`` at once when ``items`` fit in one slice of ``size`` (or there is
    no loop), returning None; else a ``SlicedFold`` under way."""
    if len(items) <= size or loop is None:
        done(step(items, acc))
        return None
    return SlicedFold(loop, items, acc, step, done, size)
