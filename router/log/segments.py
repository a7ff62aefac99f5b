"""The log's segments as its event loop sees them: one ``Seg`` each, in one ``LogSegments``.

Why one object: the appender rolls into new segments, the writer's reports move their written
ends, reads find the segment of an offset, retention drops the oldest and a history join puts
older ones in front. Each of those parts holds this same object; none holds another's state.
No I/O here but closing read descriptors.

Invariants, one line per field of ``LogSegments``:

* ``all``: oldest first, base offsets increasing; the last is the active one, appended to. The
  list is changed in place, never rebound (the appender keeps a reference to it).
* ``bases``: ``all``'s base offsets, for ``bisect``.
* ``by_base``: ``all`` by base offset (a writer's report names its chunks' segments by base).
* ``open_readers``: the readers of ``all`` whose descriptors stay open (at most its limit).

The active ``Seg``'s ``size``, ``last_offset`` and ``max_ts`` are the appender's, brought up to
date at every flush and roll; records appended since the last flush are not in them.
"""

from __future__ import annotations

import bisect
from typing import NamedTuple

from .segment import OpenReaders, SegmentReader

NO_TS = -(1 << 63)  # "no timestamp yet" of the active segment (any record's is newer)


class Seg:
    """Loop-side bookkeeping of one segment."""

    __slots__ = ("base", "size", "written_end", "last_offset", "max_ts", "reader")

    def __init__(self, directory: str, base: int, size: int, written_end: int,
                 last_offset: int | None, max_ts: int | None) -> None:
        self.base = base
        self.size = size                # bytes assigned, including those not yet written
        self.written_end = written_end  # bytes on disk (reads stop there)
        self.last_offset = last_offset
        self.max_ts = max_ts
        self.reader = SegmentReader(directory, base)


class SegmentState(NamedTuple):
    """The log's own view of one segment (``CommitLog.segments``)."""

    base_offset: int
    path: str
    size: int             # bytes assigned, including records not yet written
    written_size: int     # bytes on disk
    last_offset: int | None
    max_timestamp: int | None
    active: bool


class LogSegments:
    """A log's segments, oldest first (see the module docstring for the invariants)."""

    __slots__ = ("all", "bases", "by_base", "open_readers")

    def __init__(self) -> None:
        self.all: list[Seg] = []
        self.bases: list[int] = []
        self.by_base: dict[int, Seg] = {}
        self.open_readers = OpenReaders()

    def __len__(self) -> int:
        return len(self.all)

    def add(self, seg: Seg) -> Seg:
        """``seg`` becomes the newest (the active) segment."""
        self.all.append(seg)
        self.bases.append(seg.base)
        self.by_base[seg.base] = seg
        return seg

    def prepend(self, segs: list[Seg]) -> None:
        """``segs`` (oldest first, all below the current oldest) become the oldest segments."""
        self.all[:0] = segs
        self.bases[:0] = [s.base for s in segs]
        self.by_base.update((s.base, s) for s in segs)

    def drop_oldest(self, n: int) -> None:
        """Forget the ``n`` oldest segments and close their readers (their files are the writer's)."""
        for seg in self.all[:n]:
            del self.by_base[seg.base]
            self.open_readers.forget(seg.base)
            seg.reader.close()
        del self.all[:n]
        del self.bases[:n]

    def starting(self, offset: int) -> list[Seg]:
        """The segments from the one that holds ``offset`` on (from the oldest if it is older)."""
        return self.all[max(bisect.bisect_right(self.bases, offset) - 1, 0):]

    def states(self, next_offset: int) -> list[SegmentState]:
        """``CommitLog.segments``: the active one's last offset counts the records not flushed yet."""
        out = []
        last = len(self.all) - 1
        for i, s in enumerate(self.all):
            end = (next_offset - 1 if next_offset > s.base else None) if i == last else s.last_offset
            out.append(SegmentState(s.base, s.reader.path, s.size, s.written_end, end, s.max_ts, i == last))
        return out

    def close(self) -> None:
        """Close every read descriptor (the log is closed)."""
        for seg in self.all:
            seg.reader.close()
