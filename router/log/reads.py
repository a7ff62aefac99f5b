"""Reads of a ``CommitLog`` by the process that writes it: segments on disk, then batches in memory.

Why apart from the appender: session catch-up, recovery and replication read here, never the
broker's per-message path. Disk reads are positional (``os.pread``) on descriptors the log keeps
(``OpenReaders`` bounds them); records not yet written are decoded from the batches the writer
holds and from the field tuples not yet flushed, so a consumer never forces the writer to flush.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

from .errors import LogFormatError
from .format import FILE_HEADER_SIZE, FORMAT_VERSION, Record, decode_records, nominal_size
from .messages import Batch
from .segments import LogSegments

# The log's messages keep the logger they always had: operators filter on it.
log = logging.getLogger("brokerd.router.log.commitlog")

_new_tuple = tuple.__new__


class LogReads:
    """``CommitLog.read``'s work: the log's segments on disk, then the batches in memory.

    Holds the log's segments and its queue of batches handed to the writer (both shared, never
    rebound); the appender's batch not flushed yet and the offsets are passed in per read.
    """

    def __init__(self, directory: str, segments: LogSegments, inflight: deque[Batch]) -> None:
        self._dir = directory
        self._segments = segments
        self._inflight = inflight
        self._unreadable: set[int] = set()  # segments whose read failure was logged (once each)

    def read(self, from_offset: int, max_records: int, max_bytes: int, next_offset: int,
             written_offset: int, unflushed: list[Any], unflushed_first: int) -> list[Record]:
        """Records from ``from_offset`` (at least the log's start) up to ``next_offset``: on disk
        to ``written_offset``, then from the batches handed to the writer, then from
        ``unflushed`` (field tuples, the first at ``unflushed_first``). ``CommitLog.read`` says
        what the limits do."""
        out: list[Record] = []
        if max_records <= 0 or max_bytes <= 0 or from_offset >= next_offset:
            return out
        bytes_left = max_bytes
        if from_offset <= written_offset:
            open_readers = self._segments.open_readers
            for seg in self._segments.starting(from_offset):
                if seg.base > written_offset:
                    break
                if seg.written_end <= FILE_HEADER_SIZE:
                    continue
                open_readers.use(seg.base, seg.reader)
                try:
                    recs, nbytes, limited = seg.reader.read(
                        max(from_offset, seg.base), seg.written_end, max_records=max_records - len(out),
                        max_bytes=bytes_left, final=True)
                except LogFormatError as exc:
                    if seg.base not in self._unreadable:
                        self._unreadable.add(seg.base)
                        log.warning("commit log %s: cannot read segment %d: %s", self._dir, seg.base, exc)
                    continue
                if out and nbytes > bytes_left:
                    return out  # the one record a segment read always returns would pass max_bytes
                out += recs
                bytes_left -= nbytes
                if recs:
                    from_offset = recs[-1].offset + 1
                if limited or len(out) >= max_records or bytes_left <= 0:
                    return out
        from_offset = max(from_offset, written_offset + 1)
        for buf, _first, last in self._pending_buffers(unflushed, unflushed_first, next_offset):
            if last < from_offset:
                continue
            if type(buf) is list:  # records not flushed yet: their field tuples
                recs = [_new_tuple(Record, (_first + i, *t)) for i, t in enumerate(buf)]
            else:  # batches handed to the writer: their bytes
                recs = decode_records(buf, verify=False, version=FORMAT_VERSION)[0]
            recs, nbytes = _take(recs, from_offset, max_records - len(out), bytes_left, at_least_one=not out)
            out += recs
            bytes_left -= nbytes
            if not recs or recs[-1].offset < last:
                break  # a limit stopped it inside this buffer
            from_offset = last + 1
            if len(out) >= max_records or bytes_left <= 0:
                break
        return out

    def _pending_buffers(self, unflushed: list[Any], unflushed_first: int,
                         next_offset: int) -> list[tuple[Any, int, int]]:
        """(bytes, first, last) of each batch handed to the writer but not reported written, then
        what is not flushed yet: the list of its records' field tuples."""
        bufs: list[tuple[Any, int, int]] = [(b.content(), b.first_offset, b.last_offset) for b in self._inflight]
        if unflushed:
            bufs.append((unflushed, unflushed_first, next_offset - 1))
        return bufs


def _take(recs: list[Record], from_offset: int, max_records: int, max_bytes: int, *,
          at_least_one: bool) -> tuple[list[Record], int]:
    """The records >= ``from_offset`` of ``recs`` within the limits, ``max_bytes`` counted in
    ``nominal_size`` (what a version 1 record takes, as segment reads count); (records, bytes)."""
    out: list[Record] = []
    nbytes = 0
    for r in recs:
        if r.offset < from_offset:
            continue
        size = nominal_size(r)
        if len(out) >= max_records or (nbytes + size > max_bytes and (out or not at_least_one)):
            break
        out.append(r)
        nbytes += size
    return out, nbytes
