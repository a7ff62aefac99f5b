"""Read-only access to a log directory from any process, and ``check``.

``LogReader`` is what a CLI tool, an offline consumer or the Spark ``brokerlog`` data source uses: it
never writes (no recovery, no index rebuild — a stale index only costs a scan), sees only what is on
disk, and tolerates a live writer: an incomplete record at the end of the last segment is simply
"not written yet", and segments deleted by retention disappear from its listing.
"""

from __future__ import annotations

import bisect
import logging
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import CorruptRecord, LogFormatError
from .format import (
    FILE_HEADER_SIZE,
    INDEX_ENTRY,
    INDEX_ENTRY_SIZE,
    MAGIC_INDEX,
    MAGIC_LOG,
    READ_CHUNK,
    Record,
    decode_records,
    index_name,
    read_file_header,
    segment_name,
    unpack_file_header,
)
from .scan import Damage, iter_units, scan_segment
from .segment import OpenReaders, SegmentReader, SegmentSummary, list_segment_files

log = logging.getLogger(__name__)

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """One segment as seen on disk."""

    base_offset: int
    path: str
    index_path: str
    size: int
    last_offset: int | None        # None: no readable record
    first_timestamp: int | None
    last_timestamp: int | None     # the newest (largest) timestamp in the segment


class LogReader:
    """Read a log directory written by a ``CommitLog`` (possibly in another, running process).

    Descriptors are opened once per segment and read with ``os.pread``. Not thread-safe: give each
    thread its own reader. Use as a context manager or call ``close``.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self._dir = os.fspath(directory)
        if not os.path.isdir(self._dir):
            raise FileNotFoundError(f"no log directory {self._dir}")
        self._readers: dict[int, SegmentReader] = {}
        self._open = OpenReaders()  # the segments whose descriptors stay open between reads
        self._bases: list[int] = []
        self._summaries: dict[int, tuple[int, SegmentSummary]] = {}
        self._unreadable: set[int] = set()
        self.refresh()

    @property
    def directory(self) -> str:
        return self._dir

    def refresh(self) -> None:
        """Re-list the directory: pick up new segments, forget deleted ones."""
        logs, _ = list_segment_files(self._dir)
        present = set(logs)
        for base in [b for b in self._readers if b not in present]:
            self._readers.pop(base).close()
            self._open.forget(base)
            self._summaries.pop(base, None)
        for base in logs:
            if base not in self._readers:
                self._readers[base] = SegmentReader(self._dir, base)
        self._bases = logs

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()
        self._open.clear()
        self._bases = []

    def __enter__(self) -> LogReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- segments

    def _reader(self, base: int) -> SegmentReader:
        """Segment ``base``'s reader, about to be used (at most ``MAX_OPEN_READERS`` stay open)."""
        return self._open.use(base, self._readers[base])

    def _size(self, base: int) -> int | None:
        try:
            return self._reader(base).size()
        except FileNotFoundError:
            return None  # deleted by retention since the listing
        except LogFormatError as exc:
            if base not in self._unreadable:
                self._unreadable.add(base)
                log.warning("log %s: segment %d is unreadable: %s", self._dir, base, exc)
            return None

    def _summary(self, base: int, size: int) -> SegmentSummary:
        cached = self._summaries.get(base)
        if cached is not None and cached[0] == size:
            return cached[1]
        summary = self._reader(base).summary(size)
        self._summaries[base] = (size, summary)
        return summary

    def segments(self) -> list[SegmentInfo]:
        """The segments on disk, oldest first, with last offset and first/newest timestamps (from the
        first record header, the last index entry and the records after it: cheap)."""
        self.refresh()
        out = []
        for base in self._bases:
            size = self._size(base)
            if size is None:
                continue
            s = self._summary(base, size)
            r = self._readers[base]  # paths only
            out.append(SegmentInfo(base, r.path, r.index_path, size, s.last_offset, s.first_timestamp,
                                   s.max_timestamp))
        return out

    @property
    def start_offset(self) -> int | None:
        """First offset on disk (None for an empty log)."""
        self.refresh()
        return self._bases[0] if self._bases else None

    @property
    def end_offset(self) -> int:
        """One past the last offset on disk (0 for an empty log)."""
        self.refresh()
        for base in reversed(self._bases):
            size = self._size(base)
            if size is None:
                continue
            last = self._summary(base, size).last_offset
            return base if last is None else last + 1
        return 0

    def locate(self, offset: int) -> tuple[str, int] | None:
        """(segment path, byte position of a record at or before ``offset``) — a valid ``start_pos``
        for ``iter_records`` — or None when the log has no segment for it."""
        self.refresh()
        i = bisect.bisect_right(self._bases, offset) - 1
        if i < 0:
            return None
        base = self._bases[i]
        size = self._size(base)
        if size is None:
            return None
        reader = self._reader(base)
        return reader.path, reader.locate(offset, size)

    # -- reading

    def read(self, from_offset: int, max_records: int = 1000, max_bytes: int = 1 << 20) -> list[Record]:
        """Records with offset >= ``from_offset`` (from the first present one if it was deleted), at
        most ``max_records``, stopping before ``max_bytes`` of encoded records (at least one).

        A corrupt record ends the reading of its segment (logged once) and reading continues with
        the next segment.
        """
        self.refresh()
        out: list[Record] = []
        if not self._bases or max_records <= 0 or max_bytes <= 0:
            return out
        from_offset = max(from_offset, self._bases[0])
        bytes_left = max_bytes
        i = max(bisect.bisect_right(self._bases, from_offset) - 1, 0)
        last_i = len(self._bases) - 1
        for j in range(i, len(self._bases)):
            base = self._bases[j]
            size = self._size(base)
            if size is None:
                continue
            recs, nbytes, limited = self._reader(base).read(
                max(from_offset, base), size, max_records=max_records - len(out), max_bytes=bytes_left,
                final=j != last_i)
            if out and nbytes > bytes_left:
                break
            out += recs
            bytes_left -= nbytes
            if recs:
                from_offset = recs[-1].offset + 1
            if limited or len(out) >= max_records or bytes_left <= 0:
                break
        return out

    def offset_for_time(self, timestamp_ms: int) -> int | None:
        """Offset of the first record with ``timestamp_ms >= timestamp_ms`` (None if there is none).

        Uses each segment's newest timestamp to pick the segment, the index's running-max timestamps to
        jump into it, then walks record headers.
        """
        self.refresh()
        for base in self._bases:
            size = self._size(base)
            if size is None:
                continue
            s = self._summary(base, size)
            if s.max_timestamp is None or s.max_timestamp < timestamp_ms:
                continue
            reader = self._reader(base)
            fd = reader.fd()
            found = _find_time(fd, reader.time_lookup(timestamp_ms, size), size, timestamp_ms, reader.version)
            if found is not None:
                return found
        return None


def _find_time(fd: int, pos: int, end: int, timestamp_ms: int, version: int) -> int | None:
    """Walk records (batches, in version 2) from ``pos`` to the first whole one whose (max)
    timestamp reaches ``timestamp_ms``; in a batch, decode that batch only."""
    for u in iter_units(fd, pos, end, version, READ_CHUNK // 16):
        if isinstance(u, Damage):
            return None
        if u.max_ts >= timestamp_ms:
            if version == 1:
                return u.offset
            try:
                recs, _ = decode_records(u.data, u.at, u.at + u.end - u.pos, version=version)
            except CorruptRecord:
                return None
            return next((r.offset for r in recs if r.timestamp_ms >= timestamp_ms), None)
    return None


# --------------------------------------------------------------------------------------------- check

@dataclass(slots=True)
class SegmentCheck:
    """What ``check`` found in one segment."""

    base_offset: int
    path: str
    size: int
    ok: bool
    records: int = 0
    first_offset: int | None = None
    last_offset: int | None = None
    first_timestamp: int | None = None
    last_timestamp: int | None = None
    first_bad_position: int | None = None
    error: str | None = None
    bytes_unreadable: int = 0
    tail_incomplete: bool = False   # last segment only: an unfinished record a restart would truncate
    index_ok: bool = True
    index_error: str | None = None
    index_entries: int = 0


@dataclass(slots=True)
class CheckReport:
    """The result of ``check``: per segment plus problems between segments (gaps, orphan files)."""

    directory: str
    segments: list[SegmentCheck] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every record readable, every index right, no gaps or stray files."""
        return not self.problems and all(s.ok and s.index_ok for s in self.segments)

    @property
    def records(self) -> int:
        return sum(s.records for s in self.segments)

    def to_dict(self) -> dict[str, Any]:
        return {"directory": self.directory, "ok": self.ok, "records": self.records,
                "segments": [asdict(s) for s in self.segments], "problems": list(self.problems)}

    def format_text(self) -> str:
        """A table for ``brokerd log check``."""
        lines = [f"log {self.directory}: {len(self.segments)} segments, {self.records} records, "
                 f"{'OK' if self.ok else 'PROBLEMS FOUND'}"]
        for s in self.segments:
            span = "empty" if s.first_offset is None else f"offsets {s.first_offset}..{s.last_offset}"
            state = "ok" if s.ok else f"BAD at position {s.first_bad_position}: {s.error} " \
                                      f"({s.bytes_unreadable} bytes unreadable)"
            if s.tail_incomplete:
                state += f" (incomplete record at the end: {s.error}; truncated on next open)"
            idx = "index ok" if s.index_ok else f"INDEX BAD: {s.index_error}"
            lines.append(f"  {os.path.basename(s.path)}  {s.size:>12} B  {s.records:>9} records  {span}  "
                         f"{state}; {idx}")
        lines += [f"  problem: {p}" for p in self.problems]
        return "\n".join(lines)


def check(directory: str | os.PathLike[str]) -> CheckReport:
    """Verify every segment of a log directory record by record (lengths, CRC, consecutive offsets)
    and every index entry; change nothing. For ``brokerd log check`` and for tests."""
    directory = os.fspath(directory)
    report = CheckReport(directory)
    logs, indexes = list_segment_files(directory)
    for base in sorted(set(indexes) - set(logs)):
        report.problems.append(f"index {index_name(base)} has no segment")
    prev: SegmentCheck | None = None
    for i, base in enumerate(logs):
        seg = _check_segment(directory, base, last=i == len(logs) - 1)
        report.segments.append(seg)
        if prev is not None and prev.last_offset is not None and base != prev.last_offset + 1:
            if base > prev.last_offset + 1:
                report.problems.append(f"offsets {prev.last_offset + 1}..{base - 1} missing between "
                                       f"segments {prev.base_offset} and {base}")
            else:
                report.problems.append(f"segment {base} overlaps segment {prev.base_offset} "
                                       f"(which goes to offset {prev.last_offset})")
        prev = seg
    return report


def _check_segment(directory: str, base: int, *, last: bool) -> SegmentCheck:
    path = os.path.join(directory, segment_name(base))
    try:
        fd = os.open(path, os.O_RDONLY | _O_CLOEXEC)
    except OSError as exc:
        return SegmentCheck(base, path, 0, ok=False, error=f"cannot open: {exc}", index_ok=False)
    try:
        size = os.fstat(fd).st_size
        seg = SegmentCheck(base, path, size, ok=True)
        try:
            got, version = read_file_header(os.pread(fd, FILE_HEADER_SIZE, 0), MAGIC_LOG, path)
            if got != base:
                raise LogFormatError(f"header says base offset {got}")
        except (ValueError, LogFormatError) as exc:
            seg.ok = False
            seg.error = f"bad header: {exc}"
            seg.first_bad_position = 0
            seg.bytes_unreadable = size
            seg.index_ok = False
            seg.index_error = "segment unreadable"
            return seg
        entries, seg.index_error = _load_index(directory, base)
        seg.index_entries = len(entries)
        expected = {pos: (rel, ts) for rel, pos, ts in entries}
        res = scan_segment(fd, base, size, check_index=expected, version=version)
    finally:
        os.close(fd)
    seg.records = res.records
    seg.first_offset = res.first_offset
    seg.last_offset = res.last_offset
    seg.first_timestamp = res.first_timestamp
    seg.last_timestamp = res.max_timestamp
    if res.error is not None:
        seg.error = res.error
        seg.first_bad_position = res.valid_end
        seg.bytes_unreadable = size - res.valid_end
        if last and res.incomplete:
            seg.tail_incomplete = True
        else:
            seg.ok = False
    if seg.index_error is None and res.index_mismatch is not None:
        seg.index_error = res.index_mismatch
    if seg.index_error is None and res.records and not entries:
        seg.index_error = "no entries"
    seg.index_ok = seg.index_error is None
    return seg


def _load_index(directory: str, base: int) -> tuple[list[tuple[int, int, int]], str | None]:
    path = os.path.join(directory, index_name(base))
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return [], "missing"
    try:
        got = unpack_file_header(data, MAGIC_INDEX, path)
    except (ValueError, LogFormatError) as exc:
        return [], f"bad header: {exc}"
    if got != base:
        return [], f"header says base offset {got}"
    body = len(data) - FILE_HEADER_SIZE
    error = None
    if body % INDEX_ENTRY_SIZE:
        error = f"{body % INDEX_ENTRY_SIZE} trailing bytes (partial entry)"
    entries = [INDEX_ENTRY.unpack_from(data, p)
               for p in range(FILE_HEADER_SIZE, len(data) - INDEX_ENTRY_SIZE + 1, INDEX_ENTRY_SIZE)]
    for a, b in zip(entries, entries[1:], strict=False):
        if not (b[0] > a[0] and b[1] > a[1] and b[2] >= a[2]):
            error = error or f"entries out of order at relative offset {b[0]}"
            break
    return entries, error
