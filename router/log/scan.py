"""Scanning a segment record by record (batch by batch): recovery, ``check`` and index rebuilds.

Why apart from ``segment``'s reads: a scan verifies every CRC and offset from a position to an end
and says where and why it stopped, which reads never need; it runs at open, in ``brokerd log
check`` and when an index is rebuilt (``write_index`` replaces one atomically), never per read.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from .format import (
    FILE_HEADER_SIZE,
    INDEX_ENTRY,
    MAGIC_INDEX,
    READ_CHUNK,
    RECORD_FIXED_BODY,
    RECORD_HEADER,
    RECORD_HEADER_SIZE,
    batch_header_at,
    index_name,
    pack_file_header,
    record_size_at,
    unit_header_size,
)

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
NO_INDEX_YET = -(1 << 62)  # "last indexed position" of a segment without entries: next record is indexed


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
    count: int      # type: ignore[assignment]  # records: 1 in version 1 (hides tuple.count)
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
            n = os.write(fd, view)  # not inside the slice: mypyc evaluates a memoryview slice's start twice
            view = view[n:]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
