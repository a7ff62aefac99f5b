"""One segment on disk: listing, index lookup and reads (scanning is ``scan``).

Shared by the writer-side ``CommitLog`` and the read-only ``LogReader`` so both read the same way:
positional reads (``os.pread``) on descriptors opened once — never seek+read, which would race between
readers sharing a descriptor and would never be safe next to the writer thread.
"""

from __future__ import annotations

import logging
import os
import zlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import msgpack

from .errors import CorruptRecord, LogFormatError
from .format import (
    BATCH_HEADER_SIZE,
    FILE_HEADER_SIZE,
    INDEX_ENTRY,
    INDEX_ENTRY_SIZE,
    MAGIC_INDEX,
    MAGIC_LOG,
    READ_CHUNK,
    RECORD_FIXED_BODY,
    RECORD_HEADER,
    RECORD_HEADER_SIZE,
    BatchHeader,
    Record,
    batch_header_at,
    decode_batch_body,
    decode_records,
    index_name,
    nominal_size,
    parse_segment_name,
    read_file_header,
    record_size_at,
    segment_name,
    skip_to_offset,
    unit_header_size,
    unpack_file_header,
)
from .scan import ScanResult, scan_segment

log = logging.getLogger(__name__)

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def list_segment_files(directory: str) -> tuple[list[int], list[int]]:
    """Sorted base offsets of the ``.log`` files and of the ``.index`` files in ``directory``."""
    logs: list[int] = []
    indexes: list[int] = []
    for name in os.listdir(directory):
        parsed = parse_segment_name(name)
        if parsed is not None:
            (logs if parsed[1] == "log" else indexes).append(parsed[0])
    logs.sort()
    indexes.sort()
    return logs, indexes


@dataclass(slots=True)
class SegmentSummary:
    """Cheap facts about a segment, from its first record header, last index entry and tail."""

    first_timestamp: int | None
    last_offset: int | None
    max_timestamp: int | None


class SegmentReader:
    """Reads one segment file by positional reads on descriptors opened once (lazily).

    Not thread-safe by design: each reader (the log's event loop, a LogReader) owns its own instances.
    Keeps a hint (next offset → position) so that consecutive reads continue where the last one ended
    without an index lookup.
    """

    __slots__ = ("base", "path", "index_path", "version", "_fd", "_ifd", "_hint", "_reported", "_index_bad")

    def __init__(self, directory: str, base: int) -> None:
        self.base = base
        self.path = os.path.join(directory, segment_name(base))
        self.index_path = os.path.join(directory, index_name(base))
        self._fd: int | None = None
        self._ifd: int | None = None
        self._hint: tuple[int, int] | None = None
        self._reported: set[int] = set()
        self._index_bad = False  # an entry did not point at its record: scan instead until reopened
        self.version = 1  # the segment's format version, known once fd() has read the header

    # -- descriptors

    def fd(self) -> int:
        """The segment's read descriptor; raises OSError (e.g. deleted) or LogFormatError (bad header)."""
        if self._fd is None:
            fd = os.open(self.path, os.O_RDONLY | _O_CLOEXEC)
            try:
                _base, self.version = read_file_header(os.pread(fd, FILE_HEADER_SIZE, 0), MAGIC_LOG, self.path)
            except (ValueError, LogFormatError) as exc:
                os.close(fd)
                raise LogFormatError(str(exc)) from None
            self._fd = fd
        return self._fd

    def _index_fd(self) -> int | None:
        if self._ifd is None:
            try:
                ifd = os.open(self.index_path, os.O_RDONLY | _O_CLOEXEC)
            except FileNotFoundError:
                return None
            try:
                base = unpack_file_header(os.pread(ifd, FILE_HEADER_SIZE, 0), MAGIC_INDEX, self.index_path)
            except (ValueError, LogFormatError):
                os.close(ifd)
                return None
            if base != self.base:
                os.close(ifd)
                return None
            self._ifd = ifd
        return self._ifd

    def reopen_index(self) -> None:
        """Forget the index descriptor (the index was rewritten by rename)."""
        if self._ifd is not None:
            os.close(self._ifd)
            self._ifd = None
        self._hint = None
        self._index_bad = False

    def size(self) -> int:
        return os.fstat(self.fd()).st_size

    def close(self) -> None:
        for fd in (self._fd, self._ifd):
            if fd is not None:
                os.close(fd)
        self._fd = self._ifd = None
        self._hint = None

    # -- index

    def index_entry_count(self) -> int:
        ifd = None if self._index_bad else self._index_fd()
        if ifd is None:
            return 0
        return max(0, (os.fstat(ifd).st_size - FILE_HEADER_SIZE) // INDEX_ENTRY_SIZE)

    def index_entry(self, i: int) -> tuple[int, int, int] | None:
        ifd = self._index_fd()
        if ifd is None:
            return None
        data = os.pread(ifd, INDEX_ENTRY_SIZE, FILE_HEADER_SIZE + i * INDEX_ENTRY_SIZE)
        if len(data) < INDEX_ENTRY_SIZE:
            return None
        return INDEX_ENTRY.unpack(data)

    def lookup(self, offset: int, end_pos: int) -> tuple[int, int | None]:
        """(position, offset of the record there) of a record at or before ``offset``: binary search
        of the sparse index, one 16-byte pread per probe. Falls back to the first record (offset
        None: not known) when there is no usable entry. The caller verifies the record found there."""
        if self._hint is not None and self._hint[0] == offset and self._hint[1] <= end_pos:
            return self._hint[1], offset
        rel = offset - self.base
        return self._last_entry_before(lambda entry: entry[0] <= rel, end_pos)

    def time_lookup(self, timestamp_ms: int, end_pos: int) -> int:
        """Position from which to scan for the first record with timestamp >= ``timestamp_ms``: the
        last indexed record whose running max timestamp is still below it (all before it are too)."""
        return self._verified(*self._last_entry_before(lambda entry: entry[2] < timestamp_ms, end_pos))

    def _last_entry_before(self, before: Callable[[tuple[int, int, int]], bool],
                           end_pos: int) -> tuple[int, int | None]:
        """Binary search of the sparse index (one 16-byte pread per probe) for the last entry for
        which ``before`` holds (it must hold for a prefix of the entries) and whose position lies
        before ``end_pos``: (position, offset of the record there), or the first record (offset
        None: not known) when there is none."""
        lo, hi = 0, self.index_entry_count()
        best: tuple[int, int | None] = (FILE_HEADER_SIZE, None)
        while lo < hi:
            mid = (lo + hi) // 2
            entry = self.index_entry(mid)
            if entry is None:
                hi = mid
                continue
            if before(entry):
                if FILE_HEADER_SIZE <= entry[1] < end_pos:
                    best = (entry[1], self.base + entry[0])
                lo = mid + 1
            else:
                hi = mid
        return best

    def locate(self, offset: int, end_pos: int) -> int:
        """Position of a record at or before ``offset``, verified to be a record boundary."""
        return self._verified(*self.lookup(offset, end_pos))

    def _verified(self, pos: int, expect: int | None) -> int:
        fd = self.fd()
        if expect is None or _unit_holds(os.pread(fd, unit_header_size(self.version), pos), expect, self.version):
            return pos
        self._index_bad = True
        self._hint = None
        return FILE_HEADER_SIZE

    # -- reading

    def read(self, from_offset: int, end_pos: int, *, max_records: int, max_bytes: int,
             final: bool) -> tuple[list[Record], int, bool]:
        """Records with offset >= ``from_offset`` up to byte ``end_pos``; returns (records, their
        encoded size, limited).

        ``limited`` is True when ``max_records``/``max_bytes`` stopped the read before ``end_pos``:
        the caller must stop there too. Otherwise the segment has nothing more for this read — its
        end was reached, or a corrupt record ends it (logged once per position) — and the caller goes
        on with the next segment. ``final`` says the segment is complete up to ``end_pos``, so an
        incomplete record there is damage; otherwise (a live tail seen by another process) it is
        just not written yet.
        """
        fd = self.fd()
        if self.version != 1:
            return self._read_batches(fd, from_offset, end_pos, max_records=max_records,
                                      max_bytes=max_bytes, final=final)
        start, expect = self.lookup(from_offset, end_pos)
        pos = start
        out: list[Record] = []
        nbytes = 0
        need = 0
        chunk = 65536  # grows while a call keeps reading, so small reads stay small
        skipping = True
        limited = False
        while pos < end_pos and len(out) < max_records and nbytes < max_bytes:
            want = min(end_pos - pos, max(need, min(chunk, max(max_bytes - nbytes, 4096))))
            chunk = min(chunk * 4, READ_CHUNK)
            data = os.pread(fd, want, pos)
            n = len(data)
            p = 0
            if expect is not None and pos == start:
                if not _record_header_is(data, expect):
                    # The index (or hint) does not point at the record it names: it is stale or
                    # damaged. Scan from the start, and ignore the index until it is reopened.
                    if start == FILE_HEADER_SIZE:
                        expect = None
                    else:
                        self._index_bad = True
                        self._hint = None
                        start = pos = FILE_HEADER_SIZE
                        expect = None
                        continue
                expect = None
            if skipping:
                p, _first, found = skip_to_offset(data, 0, n, from_offset)
                skipping = not found
            if not skipping:
                try:
                    records, consumed = decode_records(data, p, max_records=max_records - len(out),
                                                       max_bytes=max_bytes - nbytes)
                except CorruptRecord as exc:
                    out += exc.records
                    nbytes += exc.consumed
                    pos += exc.position
                    self._report(pos, exc.reason)
                    break
                out += records
                nbytes += consumed
                p += consumed
                if records and (len(out) >= max_records or (p < n and _whole_record_at(data, p))):
                    pos += p
                    limited = True
                    break  # a limit stopped the decode
            pos += p
            if p == n:
                if n < want:
                    break  # the file is shorter than end_pos said (truncated under us)
                need = 0
                continue
            # A partial record remains: read it whole next time, unless the data ends with it.
            if n < want or pos + (n - p) >= end_pos:
                if final:
                    self._report(pos, f"incomplete record ({end_pos - pos} bytes at the end)")
                break
            need = max(record_size_at(data, p) or 0, RECORD_HEADER_SIZE)
        else:
            limited = pos < end_pos  # the loop condition: a limit was reached before the end
        if out:
            self._hint = (out[-1].offset + 1, pos)
        return out, nbytes, limited

    def _read_batches(self, fd: int, from_offset: int, end_pos: int, *, max_records: int, max_bytes: int,
                      final: bool) -> tuple[list[Record], int, bool]:
        """``read`` of a version 2 segment. A batch is read and CRC-checked whole; the limits are
        applied record by record (``max_bytes`` at each record's ``nominal_size``), so a read may end
        inside a batch: the hint then points at that batch, and the next read skips what it gave."""
        start, expect = self.lookup(from_offset, end_pos)
        pos = start
        out: list[Record] = []
        nbytes = 0
        need = 0
        chunk = 65536
        limited = False
        crc32 = zlib.crc32
        while pos < end_pos and not limited:
            want = min(end_pos - pos, max(need, min(chunk, max(max_bytes - nbytes, 4096))))
            chunk = min(chunk * 4, READ_CHUNK)
            data = os.pread(fd, want, pos)
            n = len(data)
            if expect is not None:
                if not _unit_holds(data, expect, 2):
                    self._index_bad = True
                    self._hint = None
                    if start == FILE_HEADER_SIZE:
                        expect = None
                    else:
                        start = pos = FILE_HEADER_SIZE
                        expect = None
                        continue
                expect = None
            p = 0
            bad: str | None = None
            while True:
                h = batch_header_at(data, p)
                if h is None:
                    break
                if isinstance(h, str):
                    bad = h
                    break
                rend = p + 8 + h.length
                if rend > n:
                    break
                if h.base + h.count > from_offset:
                    with memoryview(data) as mv:
                        ok = crc32(mv[p + 8:rend]) == h.crc
                    if not ok:
                        bad = "CRC mismatch"
                        break
                    try:
                        recs = decode_batch_body(data, h, p)
                    except (ValueError, msgpack.UnpackException) as exc:
                        bad = str(exc)
                        break
                    for r in recs:
                        if r[0] < from_offset:
                            continue
                        size = nominal_size(r)
                        if out and (nbytes + size > max_bytes or len(out) >= max_records):
                            limited = True
                            break
                        out.append(r)
                        nbytes += size
                    if limited:
                        break
                    if len(out) >= max_records or nbytes >= max_bytes:
                        limited = pos + rend < end_pos  # more after this batch
                        p = rend
                        break
                p = rend
            pos += p
            if bad is not None:
                self._report(pos, bad)
                break
            if limited:
                break
            if p == n:
                if n < want:
                    break
                need = 0
                continue
            if n < want or pos + (n - p) >= end_pos:
                if final:
                    self._report(pos, f"incomplete batch ({end_pos - pos} bytes at the end)")
                break
            need = max(record_size_at(data, p) or 0, BATCH_HEADER_SIZE)
        if out:
            # The batch holding the next record: where the read stopped (inside a batch: its start).
            self._hint = (out[-1].offset + 1, pos)
        return out, nbytes, limited

    def _report(self, position: int, reason: str) -> None:
        if position not in self._reported:
            self._reported.add(position)
            log.warning("%s: corrupt record at position %d (%s); skipping to the next segment",
                        self.path, position, reason)

    def summary(self, end_pos: int) -> SegmentSummary:
        """First timestamp, last offset and max timestamp, from the last index entry and the tail
        after it (at most one index interval plus a record): cheap enough to do per segment."""
        fd = self.fd()
        first_ts: int | None = None
        version = self.version
        head = os.pread(fd, unit_header_size(version), FILE_HEADER_SIZE)
        if version == 1 and len(head) == RECORD_HEADER_SIZE and end_pos > FILE_HEADER_SIZE:
            first_ts = RECORD_HEADER.unpack(head)[3]
        elif version != 1 and end_pos > FILE_HEADER_SIZE:
            h = batch_header_at(head, 0)
            first_ts = h.first_ts if isinstance(h, BatchHeader) else None
        n = self.index_entry_count()
        entry = self.index_entry(n - 1) if n else None
        res: ScanResult | None = None
        if entry is not None and FILE_HEADER_SIZE <= entry[1] < end_pos:
            res = scan_segment(fd, self.base, end_pos, start_pos=entry[1],
                               expect_offset=self.base + entry[0], max_timestamp=entry[2], version=version)
            if res.records == 0:
                res = None  # the entry does not point at a good record: do not trust it
        if res is None:
            res = scan_segment(fd, self.base, end_pos, version=version)
        return SegmentSummary(first_ts, res.last_offset, res.max_timestamp)


# Segments whose read descriptors (log and index: two each) stay open between reads. Every client
# connection of a worker is a descriptor too and a worker keeps only a small reserve beside its
# clients (cluster/limits.py), so a log of hundreds of segments must not hold two for each.
MAX_OPEN_READERS = 16


class OpenReaders:
    """The segment readers whose descriptors stay open: the least recently used beyond ``limit``
    is closed (it reopens when read again)."""

    __slots__ = ("limit", "_open")

    def __init__(self, limit: int = MAX_OPEN_READERS) -> None:
        self.limit = limit
        self._open: OrderedDict[int, SegmentReader] = OrderedDict()  # by base, least recent first

    def use(self, base: int, reader: SegmentReader) -> SegmentReader:
        """``reader`` (segment ``base``) is about to be read: the most recent now."""
        open_ = self._open
        if base in open_:
            open_.move_to_end(base)
        else:
            open_[base] = reader
            if len(open_) > self.limit:
                open_.popitem(last=False)[1].close()
        return reader

    def forget(self, base: int) -> None:
        """Segment ``base`` is gone (its reader is closed by the caller)."""
        self._open.pop(base, None)

    def clear(self) -> None:
        self._open.clear()


def _unit_holds(data: bytes, offset: int, version: int) -> bool:
    """True when ``data`` starts with a plausible header of the record ``offset`` (version 1) or of
    a batch holding it (version 2)."""
    if version == 1:
        return _record_header_is(data, offset)
    h = batch_header_at(data, 0)
    return isinstance(h, BatchHeader) and h.base <= offset < h.base + h.count


def _record_header_is(data: bytes, offset: int) -> bool:
    """True when ``data`` starts with a plausible header of the record ``offset``."""
    if len(data) < RECORD_HEADER_SIZE:
        return False
    length, _crc, off, _ts, _oo, _fl, _r, ol, cl, tl, pl, yl = RECORD_HEADER.unpack_from(data, 0)
    return bool(off == offset and length == RECORD_FIXED_BODY + ol + cl + tl + pl + yl)


def _whole_record_at(data: bytes, pos: int) -> bool:
    """True when a whole record starts at ``pos`` in ``data`` (so a decode stopped for a limit)."""
    size = record_size_at(data, pos)
    return size is not None and pos + size <= len(data)
