"""Retention: which of a log's oldest segments go, by size (``retention_bytes``) or age
(``retention_hours``).

Whole segments only, oldest first, never the active one and never one with data not yet written:
a segment is the unit the writer creates and deletes, and a reader holding its descriptor keeps
reading it after the unlink. The decision is pure (it reads the log's bookkeeping); the log then
forgets the segments and has its writer unlink them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import NamedTuple

from .loader import Seg
from .segment import OpenReaders
from .writer import WriterCore, WriterThread, delete_item

# The log's messages keep the logger they always had: operators filter on it.
log = logging.getLogger("brokerd.router.log.commitlog")


class DeletedSegment(NamedTuple):
    """A segment removed by retention."""

    base_offset: int
    last_offset: int | None
    size: int
    reason: str  # "size" or "age"


def past_retention(segs: Sequence[Seg], retention_bytes: int | None, retention_hours: float | None,
                   now_ms: int) -> list[DeletedSegment]:
    """The oldest segments of ``segs`` (the last is the active one, its ``size`` up to date) that
    retention deletes: while the files' total passes ``retention_bytes`` ("size"), or the newest
    record of a segment is older than ``retention_hours`` ("age")."""
    total = sum(s.size for s in segs)
    cutoff = None if retention_hours is None else now_ms - int(retention_hours * 3_600_000)
    deleted: list[DeletedSegment] = []
    for seg in segs[:-1]:
        if seg.written_end < seg.size:
            break
        if retention_bytes is not None and total > retention_bytes:
            reason = "size"
        elif cutoff is not None and (seg.max_ts is None or seg.max_ts < cutoff):
            reason = "age"
        else:
            break
        total -= seg.size
        deleted.append(DeletedSegment(seg.base, seg.last_offset, seg.size, reason))
    return deleted


class Retention:
    """``CommitLog.enforce_retention`` (a mixin: the state is the log's own)."""

    retention_bytes: int | None
    retention_hours: float | None
    _dir: str
    _segs: list[Seg]
    _bases: list[int]
    _by_base: dict[int, Seg]
    _open_readers: OpenReaders
    _seg_size: int
    _core: WriterCore
    _thread: WriterThread | None

    def enforce_retention(self, now_ms: int | None = None) -> list[DeletedSegment]:
        """Delete whole segments beyond ``retention_bytes`` (total size of the segment files) or
        whose newest record is older than ``retention_hours``; oldest first, never the active one,
        never one with unwritten data. Returns what was deleted. The unlinks run on the writer
        thread (with a loop), so this does no I/O on the loop. The broker calls it periodically."""
        if self.retention_bytes is None and self.retention_hours is None:
            return []
        if self._segs:
            self._segs[-1].size = self._seg_size
        now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        deleted = past_retention(self._segs, self.retention_bytes, self.retention_hours, now_ms)
        for _ in deleted:
            seg = self._segs.pop(0)
            self._bases.pop(0)
            del self._by_base[seg.base]
            self._open_readers.forget(seg.base)
            seg.reader.close()
        if deleted:
            bases = [d.base_offset for d in deleted]
            if self._thread is not None:
                self._thread.put(delete_item(bases))
            else:
                self._core.process([], deletes=bases)
            log.info("commit log %s: retention deleted %d segment(s), offsets %d..%s", self._dir,
                     len(deleted), deleted[0].base_offset, deleted[-1].last_offset)
        return deleted
