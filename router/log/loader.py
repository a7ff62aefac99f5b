"""Loading a log directory at open: recovery in numbered passes, as Kafka's ``LogLoader`` does.

1. Leftovers: ``.index.tmp`` files (an index rewrite cut short) and indexes whose ``.log`` is gone.
2. Closed segments: each index is checked cheaply (header, entries in order, the records after the
   last entry) and rebuilt if it does not match; damage found there is logged, not repaired (reads
   skip it; ``check`` reports it). The pages a crashed predecessor left dirty are fsynced.
3. The tail: the last segment is scanned record by record (batch by batch) and truncated at the
   first incomplete or bad one; a tail of the other format version is closed as it is.
4. The tail's index: rebuilt unless it is exactly what the scan produced.
5. The directory is fsynced, so ``durable_offset`` starts at the end.

History segments a join left in the directory (the log closed while a join was on) are closed
segments like the others: pass 2 takes them in. ``load_closed`` is also what a join checks the
history's segments with. Blocking work throughout: nothing here touches an open log's state.
"""

from __future__ import annotations

import logging
import operator
import os
import sys
from typing import NamedTuple

from .errors import LogFormatError
from .format import (
    FILE_HEADER_SIZE,
    INDEX_ENTRY,
    INDEX_ENTRY_SIZE,
    MAGIC_INDEX,
    MAGIC_LOG,
    pack_file_header,
    read_file_header,
    segment_name,
)
from .scan import scan_segment, write_index
from .segment import SegmentReader, list_segment_files
from .segments import NO_TS, Seg

# The log's messages keep the logger they always had: operators filter on it.
log = logging.getLogger("brokerd.router.log.commitlog")

O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class Tail(NamedTuple):
    """Where the appender goes on in the last segment."""

    base: int
    size: int
    index_size: int
    last_index_pos: int
    max_ts: int  # NO_TS when the segment holds no record


class Loaded(NamedTuple):
    """What loading found: the segments oldest first (the last is the tail), and where appends go on."""

    segments: list[Seg]
    next_offset: int
    tail: Tail | None
    must_roll: bool  # the tail is of the other format version: the next flush starts a segment


def load(directory: str, version: int, index_interval: int) -> Loaded:
    """Bring ``directory`` to a consistent state (passes 1 to 5 above) for a log writing ``version``."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    for name in os.listdir(directory):
        if name.endswith(".index.tmp"):
            unlink(os.path.join(directory, name))
    logs, indexes = list_segment_files(directory)
    for base in sorted(set(indexes) - set(logs)):
        log.warning("commit log %s: removing index %d without a segment", directory, base)
        unlink(os.path.join(directory, f"{base:020d}.index"))
    if not logs:
        return Loaded([], 0, None, False)
    segs = [load_closed(directory, base, index_interval) for base in logs[:-1]]
    seg, tail, must_roll = _load_tail(directory, logs[-1], version, index_interval)
    segs.append(seg)
    next_offset = seg.last_offset + 1 if seg.last_offset is not None else seg.base
    return Loaded(segs, next_offset, tail, must_roll)


def load_closed(directory: str, base: int, index_interval: int) -> Seg:
    """A closed segment as recovery finds it (index checked, rebuilt if wrong), not yet one of
    the log's: blocking, and it changes nothing of the log's state (a join runs it in a thread)."""
    seg = Seg(directory, base, 0, 0, None, None)
    reader = seg.reader
    size = os.stat(reader.path).st_size
    seg.size = seg.written_end = size
    try:
        fd = reader.fd()
        os.fsync(fd)  # pages a crashed predecessor left dirty: durable_offset starts at the end
    except (LogFormatError, OSError) as exc:
        log.warning("commit log %s: segment %d is unreadable (%s); reads will skip it",
                    directory, base, exc)
        return seg
    res = None
    problem = index_problem(reader, size)
    if problem is None:
        reader.reopen_index()
        n = reader.index_entry_count()
        last = reader.index_entry(n - 1) if n else None
        if last is not None:
            res = scan_segment(fd, base, size, start_pos=last[1], expect_offset=base + last[0],
                               max_timestamp=last[2], version=reader.version)
            if res.records == 0:
                problem, res = "last entry does not point at a good record", None
        elif size > FILE_HEADER_SIZE:
            problem = "no entries"
    if res is None:
        res = scan_segment(fd, base, size, index_interval=index_interval, version=reader.version)
        if problem is not None:
            log.warning("commit log %s: index of segment %d rebuilt (%s)", directory, base, problem)
            write_index(directory, base, res.index, version=reader.version)
            reader.reopen_index()
    if res.error is not None:
        log.warning("commit log %s: segment %d has a bad record at position %d (%s); %d bytes after "
                    "it are unreadable; reads skip to the next segment", directory, base,
                    res.valid_end, res.error, size - res.valid_end)
    seg.last_offset = res.last_offset
    seg.max_ts = res.max_timestamp
    reader.close()  # recovery opened every segment: reads reopen the ones they need
    return seg


def index_problem(reader: SegmentReader, size: int) -> str | None:
    """Why a closed segment's index cannot be trusted, None if it can. Checks every entry is in
    order and inside the segment (fast: C-level slices over the index bytes), and that the first
    entry is the first record; the caller then verifies the records after the last entry."""
    try:
        with open(reader.index_path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return "missing"
    try:
        ibase, iversion = read_file_header(data, MAGIC_INDEX, reader.index_path)
    except (ValueError, LogFormatError) as exc:
        return f"bad header: {exc}"
    if ibase != reader.base:
        return "header names another segment"
    if iversion != reader.version:
        return f"index of format version {iversion} for a version {reader.version} segment"
    body = memoryview(data)[FILE_HEADER_SIZE:]
    if len(body) % INDEX_ENTRY_SIZE:
        return "partial entry"
    if not body:
        return "no entries" if size > FILE_HEADER_SIZE else None
    if sys.byteorder == "little":
        words = body.cast("I")  # entry = u32 rel, u32 pos, i64 ts: words 0 and 1 of every 4
        rels = words[0::4].tolist()
        positions = words[1::4].tolist()
    else:  # pragma: no cover - the format is little-endian; big-endian hosts take the slow path
        entries = list(INDEX_ENTRY.iter_unpack(body))
        rels = [e[0] for e in entries]
        positions = [e[1] for e in entries]
    if rels[0] != 0 or positions[0] != FILE_HEADER_SIZE:
        return "first entry is not the first record"
    if positions[-1] >= size:
        return "an entry points past the end of the segment"
    if not (all(map(operator.lt, rels, rels[1:])) and all(map(operator.lt, positions, positions[1:]))):
        return "entries out of order"
    return None


def _load_tail(directory: str, base: int, version: int, index_interval: int) -> tuple[Seg, Tail, bool]:
    """Passes 3 to 5: the last segment scanned and truncated, its index made to match, the
    directory fsynced. Returns the segment, where appends go on in it, and whether it must roll."""
    path = os.path.join(directory, segment_name(base))
    must_roll = False
    fd = os.open(path, os.O_RDWR | O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if size < FILE_HEADER_SIZE:
            log.warning("commit log %s: segment %d has a partial header (%d bytes); rewritten",
                        directory, base, size)
            os.ftruncate(fd, 0)
            os.pwrite(fd, pack_file_header(MAGIC_LOG, base, version), 0)
            size = FILE_HEADER_SIZE
            seg_version = version
        else:
            got, seg_version = read_file_header(os.pread(fd, FILE_HEADER_SIZE, 0), MAGIC_LOG, path)
            if got != base:
                raise LogFormatError(f"{path}: header says base offset {got}")
        res = scan_segment(fd, base, size, index_interval=index_interval, version=seg_version)
        if res.error is not None:
            log.warning("commit log %s: segment %s: truncated at position %d, %d bytes dropped (%s)",
                        directory, segment_name(base), res.valid_end, size - res.valid_end, res.error)
            os.ftruncate(fd, res.valid_end)
        if seg_version != version:
            if res.last_offset is None:
                # Empty: it becomes a segment of the version this log writes.
                os.pwrite(fd, pack_file_header(MAGIC_LOG, base, version), 0)
                seg_version = version
            else:
                # Written in the other version (an upgrade): closed as it is; the next flush
                # starts a new segment.
                must_roll = True
        os.fsync(fd)
    finally:
        os.close(fd)
    # Pass 4, the index: rebuild unless it is exactly what the scan produced.
    ipath = os.path.join(directory, f"{base:020d}.index")
    existing = b""
    try:
        with open(ipath, "rb") as f:
            data = f.read()
        ok_header = read_file_header(data, MAGIC_INDEX, ipath)[1] == seg_version
        existing = data[FILE_HEADER_SIZE:]
    except (OSError, ValueError, LogFormatError):
        ok_header = False
    if not ok_header or existing != bytes(res.index):
        if ok_header and bytes(res.index).startswith(existing):
            log.debug("commit log %s: index of the last segment completed", directory)
        else:
            log.warning("commit log %s: index of segment %d did not match its records; rebuilt",
                        directory, base)
        write_index(directory, base, res.index, version=seg_version)
    fsync_dir(directory)  # pass 5
    seg = Seg(directory, base, res.valid_end, res.valid_end, res.last_offset, res.max_timestamp)
    tail = Tail(base, res.valid_end, FILE_HEADER_SIZE + len(res.index), res.last_index_pos,
                res.max_timestamp if res.max_timestamp is not None else NO_TS)
    return seg, tail, must_roll


def unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
