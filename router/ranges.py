"""What a session still has to read besides its own router's log: records of another router's
log on this node (``LogRange``) or a spool file of copies moved from another node
(``router.spool.SpoolRange``), and where each router's log lies.
"""

from __future__ import annotations

import logging
import os
from typing import Any, ClassVar, Literal

from mypy_extensions import mypyc_attr

from .log import LogReader
from .spool import SpoolRange, is_spool

log = logging.getLogger("brokerd.router.session")  # (where these lines were always logged)

STALL_LIMIT_S = 10.0  # a log range whose records do not appear on disk for this long is given up


@mypyc_attr(allow_interpreted_subclasses=True)  # a unit test's range that counts its reads
class LogRange:
    """Records ``[start, end)`` of another router's log on this node that a session moved here has
    still to read: a takeover on one node moves an offline backlog as a position, not as copies
    (any size, no memory). Read lazily, like the session's own log position, when it drains."""

    __slots__ = ("directory", "start", "end", "_reader", "_stalled")
    copies: ClassVar[Literal[False]] = False  # its reads are log records, matched against the session's subscriptions

    def __init__(self, directory: str, start: int, end: int) -> None:
        self.directory = directory
        self.start = start
        self.end = end
        self._reader: Any = None
        self._stalled = 0.0

    def read(self, batch: int, now: float) -> list | None:
        """The next records of the range (possibly none yet: the other router's writer may not
        have written them), or None once the range is done or cannot be read, or its records
        stayed missing for STALL_LIMIT_S by ``now`` (its session's clock, ``Clock.now()``: the
        range reads none of its own, so the stall is tested with a ``FakeClock``)."""
        if self.start >= self.end:
            self.close()
            return None
        try:
            if self._reader is None:
                self._reader = LogReader(self.directory)
            records = self._reader.read(self.start, max_records=min(batch, self.end - self.start))
        except OSError as exc:
            log.warning("log range %s [%d, %d) unreadable (%s): given up", self.directory, self.start,
                        self.end, exc)
            self.close()
            return None
        records = [r for r in records if r.offset < self.end]
        if records:
            self.start = records[-1].offset + 1
            self._stalled = 0.0
            return records
        if not self._stalled:
            self._stalled = now
        elif now - self._stalled > STALL_LIMIT_S:
            log.warning("log range %s [%d, %d): records missing for %.0f s (retention?): given up",
                        self.directory, self.start, self.end, STALL_LIMIT_S)
            self.close()
            return None
        return records

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def to_list(self) -> list:
        return [self.directory, self.start, self.end]

    def for_export(self) -> LogRange:
        """A reader of the same records for a move's export (this one stays the session's)."""
        return LogRange(*self.to_list())

    def discard(self) -> None:
        """Read and acknowledged to its end (another router's log: nothing to delete)."""
        self.close()


def router_log_dir(root: str, router_id: str) -> str:
    """Where the log of router ``router_id`` (``<node>/<worker>``) lies under ``root`` (a data
    directory: a node's own routers' logs, and the replicas of other nodes' beside them):
    ``<root>/<node>/<worker>``. ``log_router_id`` is the inverse."""
    return os.path.join(root, *router_id.split("/"))


def log_router_id(directory: str) -> str:
    """The id of the router whose commit log is in ``directory`` (``router_log_dir``'s inverse)."""
    path = os.path.abspath(directory)
    return f"{os.path.basename(os.path.dirname(path))}/{os.path.basename(path)}"


Range = LogRange | SpoolRange
"""What a session reads before its own log: told apart by ``copies`` (True: a spool's)."""


def make_range(directory: str, start: int, end: int, spans: Any = None) -> Range:
    """A range a session still has to read, from its plain values (snapshot, takeover header):
    another router's log on this node, or a spool file of a backlog moved from another node
    (with its ``spans``)."""
    return SpoolRange(directory, start, end, spans) if is_spool(directory) else LogRange(directory, start, end)
