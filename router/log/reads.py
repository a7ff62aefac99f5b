"""Reads of a ``CommitLog`` by the process that writes it: segments on disk, then batches in memory.

Why apart from the appender: session catch-up, recovery and replication read here, never the
broker's per-message path. Disk reads are positional (``os.pread``) on descriptors the log keeps
(``OpenReaders`` bounds them); records not yet written are decoded from the batches the writer
holds and from the field tuples not yet flushed, so a consumer never forces the writer to flush.
"""

from __future__ import annotations

import bisect
import logging
from collections import deque
from typing import TYPE_CHECKING, Any

from .errors import LogFormatError
from .format import FILE_HEADER_SIZE, FORMAT_VERSION, Record, decode_records, nominal_size
from .loader import Seg
from .segment import OpenReaders
from .writer import Batch

# The log's messages keep the logger they always had: operators filter on it.
log = logging.getLogger("brokerd.router.log.commitlog")

_new_tuple = tuple.__new__


class Reads:
    """``CommitLog.read`` (a mixin: the state is the log's own)."""

    _dir: str
    _segs: list[Seg]
    _bases: list[int]
    _open_readers: OpenReaders
    _unreadable: set[int]
    _inflight: deque[Batch]
    _buf: list[Any]
    _buf_first: int
    _next_offset: int
    _written_offset: int
    read_records: int
    read_bytes: int

    if TYPE_CHECKING:  # the log's own property (a declared attribute would be writable)
        @property
        def start_offset(self) -> int: ...

    def read(self, from_offset: int, max_records: int = 1000, max_bytes: int = 1 << 20) -> list[Record]:
        """Records from ``from_offset`` on (clamped to ``start_offset``), from disk with positional
        reads and, past ``written_offset``, from the batches still in memory. Never flushes.

        Returns at most ``max_records`` records and stops before exceeding ``max_bytes`` of encoded
        records (but returns at least one). A corrupt record ends the reading of its segment and
        reading goes on with the next one (logged once). Counted in ``read_records`` and
        ``read_bytes`` (session catch-up and recovery read here; never the hot path).
        """
        out = self._read(from_offset, max_records, max_bytes)
        if out:
            self.read_records += len(out)
            self.read_bytes += sum(len(r.payload) for r in out)
        return out

    def _read(self, from_offset: int, max_records: int, max_bytes: int) -> list[Record]:
        out: list[Record] = []
        if max_records <= 0 or max_bytes <= 0:
            return out
        from_offset = max(from_offset, self.start_offset)
        if from_offset >= self._next_offset:
            return out
        bytes_left = max_bytes
        if from_offset <= self._written_offset:
            i = max(bisect.bisect_right(self._bases, from_offset) - 1, 0)
            for seg in self._segs[i:]:
                if seg.base > self._written_offset:
                    break
                if seg.written_end <= FILE_HEADER_SIZE:
                    continue
                self._open_readers.use(seg.base, seg.reader)
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
        from_offset = max(from_offset, self._written_offset + 1)
        for buf, _first, last in self._pending_buffers():
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

    def _pending_buffers(self) -> list[tuple[Any, int, int]]:
        """(bytes, first, last) of each batch handed to the writer but not reported written, then
        what is not flushed yet: the list of its records' field tuples."""
        bufs: list[tuple[Any, int, int]] = [(b.content(), b.first_offset, b.last_offset) for b in self._inflight]
        if self._buf:
            bufs.append((self._buf, self._buf_first, self._next_offset - 1))
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
