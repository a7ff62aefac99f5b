"""One segment on disk: listing, scanning (recovery, check, index rebuild), index lookup and reads.

Shared by the writer-side ``CommitLog`` and the read-only ``LogReader`` so both read the same way:
positional reads (``os.pread``) on descriptors opened once — never seek+read, which would race between
readers sharing a descriptor and would never be safe next to the writer thread.
"""

from __future__ import annotations

import logging
import os
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import msgpack

from brokerd.router.log.errors import CorruptRecord, LogFormatError
from brokerd.router.log.format import (
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
    pack_file_header,
    parse_segment_name,
    read_file_header,
    record_size_at,
    segment_name,
    skip_to_offset,
    unit_header_size,
    unpack_file_header,
)

log = logging.getLogger(__name__)

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
NO_INDEX_YET = -(1 << 62)  # "last indexed position" of a segment without entries: next record is indexed


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
class ScanResult:
    """What a record-by-record scan of (part of) a segment found."""

    end: int                      # position the scan was asked to reach
    valid_end: int                # position after the last good record
    records: int = 0
    first_offset: int | None = None
    last_offset: int | None = None
    first_timestamp: int | None = None
    max_timestamp: int | None = None
    index: bytearray = field(default_factory=bytearray)  # entries (no header) for the scanned part
    last_index_pos: int = NO_INDEX_YET
    error: str | None = None      # why it stopped before ``end``; None if it reached it cleanly
    incomplete: bool = False      # the error is an incomplete record at the very end
    index_mismatch: str | None = None  # set when ``check_index`` was given and did not match

    @property
    def clean(self) -> bool:
        return self.error is None


class Unit(NamedTuple):
    """An intact record (version 1) or batch (version 2) found by ``iter_units``."""

    pos: int        # file position
    end: int        # file position after it
    offset: int     # offset of its (first) record
    count: int      # records: 1 in version 1
    first_ts: int
    max_ts: int
    data: bytes     # the chunk read that holds it whole, at ``at``
    at: int


class Damage(NamedTuple):
    """Where and why ``iter_units`` stopped before the end."""

    pos: int
    reason: str
    incomplete: bool  # an unfinished unit at the very end (a torn write), not a bad one


def _parse_records(data: bytes, p: int) -> Iterator[tuple[int, int, int, int, int] | str]:
    """(end, offset, 1, ts, ts) of each whole, intact version 1 record in ``data`` from ``p``; a
    reason (str) for a damaged one, which ends the walk."""
    unpack = RECORD_HEADER.unpack_from
    crc32 = zlib.crc32
    n = len(data)
    with memoryview(data) as mv:
        while p + RECORD_HEADER_SIZE <= n:
            length, crc, off, ts, _oo, _fl, _r, ol, cl, tl, pl, yl = unpack(data, p)
            if length != RECORD_FIXED_BODY + ol + cl + tl + pl + yl:
                yield f"record length {length} does not match its field lengths"
                return
            rend = p + 8 + length
            if rend > n:
                return
            if crc32(mv[p + 8:rend]) != crc:
                yield "CRC mismatch"
                return
            yield rend, off, 1, ts, ts
            p = rend


def _parse_batches(data: bytes, p: int) -> Iterator[tuple[int, int, int, int, int] | str]:
    """``_parse_records`` for version 2 batches: header CRC, then CRC; bodies are not decoded (the
    CRC is what proves them), so a scan runs at CRC speed."""
    crc32 = zlib.crc32
    n = len(data)
    with memoryview(data) as mv:
        while True:
            h = batch_header_at(data, p)
            if h is None:
                return
            if isinstance(h, str):
                yield h
                return
            rend = p + 8 + h.length
            if rend > n:
                return
            if crc32(mv[p + 8:rend]) != h.crc:
                yield "CRC mismatch"
                return
            yield rend, h.base, h.count, h.first_ts, h.max_ts
            p = rend


def iter_units(fd: int, start: int, end: int, version: int,
               chunk_size: int = READ_CHUNK) -> Iterator[Unit | Damage]:
    """Walk the records (version 1) or batches (version 2) of a segment from ``start`` (a unit
    boundary) to ``end`` with positional reads of ``chunk_size`` (a unit bigger than that is read
    whole), checking each (lengths, CRC). Ends with a ``Damage`` if it stops before ``end``."""
    parse = _parse_records if version == 1 else _parse_batches
    what = "record" if version == 1 else "batch"
    min_unit = unit_header_size(version)
    pos = start
    need = 0
    while pos < end:
        want = min(end - pos, max(chunk_size, need))
        data = os.pread(fd, want, pos)
        n = len(data)
        p = 0
        for u in parse(data, 0):
            if isinstance(u, str):
                yield Damage(pos + p, u, False)
                return
            yield Unit(pos + p, pos + u[0], u[1], u[2], u[3], u[4], data, p)
            p = u[0]
        pos += p
        if p == n and n == want:
            need = 0
            continue
        # A partial unit remains: read it whole next time, unless the data ends here.
        if n < want or pos + (n - p) >= end:
            yield Damage(pos, f"incomplete {what} ({end - pos} bytes at the end)", True)
            return
        need = max(record_size_at(data, p) or 0, min_unit)


def scan_segment(fd: int, base: int, end: int, *, start_pos: int = FILE_HEADER_SIZE,
                 expect_offset: int | None = None, max_timestamp: int | None = None,
                 index_interval: int | None = None, last_index_pos: int = NO_INDEX_YET,
                 check_index: dict[int, tuple[int, int]] | None = None,
                 chunk_size: int = READ_CHUNK, version: int = 1) -> ScanResult:
    """Check records from ``start_pos`` to ``end``: header lengths, CRC and consecutive offsets.

    This is the recovery and ``check`` primitive; it builds no Record objects, so a 64 MiB tail is
    verified at CRC speed plus one ``unpack_from`` per record. With ``index_interval`` it also produces
    the index entries the writer would have written (same rule: the first record, then any record
    starting at least ``index_interval`` bytes after the last indexed one). ``check_index`` maps index
    positions to (relative offset, max timestamp) as found in an index file; each is verified.

    ``version`` is the segment's format version; in version 2 the unit checked and indexed is a
    batch (its header CRC, its CRC, its base offset), each index entry naming the batch's first
    record and the running max timestamp up to the end of that batch.
    """
    res = ScanResult(end=end, valid_end=start_pos, max_timestamp=max_timestamp,
                     last_index_pos=last_index_pos)
    expect = base if expect_offset is None else expect_offset
    max_ts = max_timestamp
    pack_entry = INDEX_ENTRY.pack
    matched: set[int] = set()
    for u in iter_units(fd, start_pos, end, version, chunk_size):
        if isinstance(u, Damage):
            res.error, res.incomplete = u.reason, u.incomplete
            break
        fpos, off = u.pos, u.offset
        if off != expect:
            res.error = f"offset {off} where {expect} was expected"
            break
        if max_ts is None or u.max_ts > max_ts:
            max_ts = u.max_ts
        if res.first_offset is None:
            res.first_offset = off
            res.first_timestamp = u.first_ts
        if index_interval is not None and fpos - res.last_index_pos >= index_interval:
            res.index += pack_entry(off - base, fpos, max_ts)
            res.last_index_pos = fpos
        if check_index is not None:
            entry = check_index.get(fpos)
            if entry is not None:
                matched.add(fpos)
                if entry != (off - base, max_ts) and res.index_mismatch is None:
                    res.index_mismatch = (f"entry at position {fpos} says offset {base + entry[0]} / "
                                          f"max timestamp {entry[1]}, record has {off} / {max_ts}")
        expect = off + u.count
        res.records += u.count
        res.last_offset = expect - 1
        res.valid_end = u.end
        res.max_timestamp = max_ts
    if check_index is not None and res.index_mismatch is None and len(matched) != len(check_index):
        # Entries past a corrupt record cannot be verified; anything else unmatched is wrong.
        stray = sorted(p for p in check_index
                       if p not in matched and (p < res.valid_end or res.error is None or res.incomplete))
        if stray:
            res.index_mismatch = f"{len(stray)} entries do not point at a record (first at position {stray[0]})"
    return res


def write_index(directory: str, base: int, entries: bytes | bytearray, *, fsync: bool = True,
                version: int = 1) -> None:
    """Replace a segment's index atomically (temp file + rename), so a reader never sees half of it."""
    path = os.path.join(directory, index_name(base))
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC, 0o600)
    try:
        data = pack_file_header(MAGIC_INDEX, base, version) + bytes(entries)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


@dataclass(slots=True)
class SegmentSummary:
    """Cheap facts about a segment, from its first record header, last index entry and tail."""

    first_timestamp: int | None
    last_offset: int | None
    max_timestamp: int | None
    tail_error: str | None  # the tail scan stopped early (corrupt, or incomplete on a live segment)


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
        return SegmentSummary(first_ts, res.last_offset, res.max_timestamp, res.error)


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
    return off == offset and length == RECORD_FIXED_BODY + ol + cl + tl + pl + yl


def _whole_record_at(data: bytes, pos: int) -> bool:
    """True when a whole record starts at ``pos`` in ``data`` (so a decode stopped for a limit)."""
    size = record_size_at(data, pos)
    return size is not None and pos + size <= len(data)
