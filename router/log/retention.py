"""Retention: which of a log's oldest segments go, by size (``retention_bytes``) or age
(``retention_hours``).

Whole segments only, oldest first, never the active one and never one with data not yet written:
a segment is the unit the writer creates and deletes, and a reader holding its descriptor keeps
reading it after the unlink. The decision is pure (``past_retention``: the log's bookkeeping in,
the segments to delete out); ``drop_past_retention`` takes them out of the log's segments, and the
log has its writer unlink them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from .segments import LogSegments, Seg


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


def drop_past_retention(segments: LogSegments, retention_bytes: int | None, retention_hours: float | None,
                        now_ms: int) -> list[DeletedSegment]:
    """Take the segments past retention out of ``segments`` (readers closed) and return them,
    oldest first; their files are the writer's to unlink."""
    deleted = past_retention(segments.all, retention_bytes, retention_hours, now_ms)
    segments.drop_oldest(len(deleted))
    return deleted
