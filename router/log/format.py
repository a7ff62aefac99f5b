"""Byte format of the commit log: file headers, records, index entries — the one copy of it.

Everything that reads or writes log bytes (the writer, the in-process reader, ``LogReader``, ``check``,
the Spark ``brokerlog`` data source) goes through the structs and functions here, so the format exists
exactly once. Version 1 is decoded here and no longer written (its records are encoded only by the
test fixture ``tests/log_v1_fixture.py``, for old logs). ``FORMAT.md`` next to this file is the
human-readable description; keep both in step.

All integers are little-endian.

File header (16 bytes, at position 0 of every ``.log`` and ``.index`` file)::

    magic        4s   b"BKLG" (segment) or b"BKIX" (index)
    version      u8   1 or 2 (FORMAT_VERSION, 2, is what a CommitLog writes; see "version 2" below)
    reserved     3x   zero
    base_offset  u64  offset of the first record of the segment (also in the file name)

Record of a version 1 segment (48-byte fixed header, then the variable fields in this order)::

    length         u32  bytes after the crc field (40 + sum of the five variable lengths)
    crc            u32  zlib.crc32 of those ``length`` bytes (everything after this field)
    offset         u64  per-log sequence number
    timestamp_ms   i64  wall clock, ms since the epoch
    origin_offset  i64  offset of the record in its origin router's log (-1: unknown)
    flags          u8   bits 0-1 qos, bit 2 retain, others zero
    reserved       u8   zero
    origin_len     u16  } lengths of origin_router (UTF-8), client_id (UTF-8), topic (UTF-8),
    client_len     u16  } properties (opaque bytes), payload (bytes)
    topic_len      u16  }
    props_len      u32  }
    payload_len    u32  }
    origin_router, client_id, topic, properties, payload

The redundancy between ``length`` and the field lengths is deliberate: a reader can reject a damaged
header before trusting ``length`` (which could otherwise make it skip or wait for gigabytes).

Index entry (16 bytes, after the index file header)::

    relative_offset  u32  offset - base_offset of an indexed record
    position         u32  byte position of that record in the segment file
    max_timestamp    i64  largest timestamp_ms of the segment's records up to and including it

Entries are fixed-width and sorted on both offset and position (and max_timestamp never decreases),
so they can be binary-searched with positional reads and used for time lookups.
"""

from __future__ import annotations

import logging
import operator
import os
import struct
import zlib
from collections.abc import Iterator
from typing import Any, NamedTuple

import msgpack

from .errors import CorruptRecord, LogFormatError

log = logging.getLogger(__name__)

MAGIC_LOG = b"BKLG"
MAGIC_INDEX = b"BKIX"
FORMAT_VERSION = 2           # what a CommitLog writes unless told otherwise
READABLE_VERSIONS = (1, 2)   # what every reader here reads

FILE_HEADER = struct.Struct("<4sB3xQ")
FILE_HEADER_SIZE = FILE_HEADER.size  # 16

RECORD_HEADER = struct.Struct("<IIQqqBBHHHII")
RECORD_HEADER_SIZE = RECORD_HEADER.size  # 48
RECORD_FIXED_BODY = RECORD_HEADER_SIZE - 8  # 40: the fixed header after length and crc, which the CRC covers

INDEX_ENTRY = struct.Struct("<IIq")
INDEX_ENTRY_SIZE = INDEX_ENTRY.size  # 16

QOS_MASK = 0x03
RETAIN_FLAG = 0x04

MAX_SEGMENT_POSITION = 0xFFFFFFFF  # index positions are u32: a record must start below 4 GiB

assert FILE_HEADER_SIZE == 16 and RECORD_HEADER_SIZE == 48 and INDEX_ENTRY_SIZE == 16


class Record(NamedTuple):
    """One log record as decoded. A NamedTuple because decoding builds millions of them: a tuple is
    the cheapest object CPython can make and converts to a Spark Row without a copy per field."""

    offset: int
    timestamp_ms: int
    origin_router: str
    origin_offset: int | None  # None: a copy whose origin did not say where its log holds it
    client_id: str
    topic: str
    qos: int
    retain: bool
    properties: bytes
    payload: bytes


def segment_name(base_offset: int) -> str:
    """``<base offset zero-padded to 20 digits>.log`` — sorts lexically in offset order, like Kafka."""
    return f"{base_offset:020d}.log"


def index_name(base_offset: int) -> str:
    return f"{base_offset:020d}.index"


def parse_segment_name(name: str) -> tuple[int, str] | None:
    """(base offset, "log" | "index") for a segment or index file name, None for anything else."""
    stem, dot, ext = name.partition(".")
    if len(stem) != 20 or not stem.isdigit() or ext not in ("log", "index") or not dot:
        return None
    return int(stem), ext


def pack_file_header(magic: bytes, base_offset: int, version: int = FORMAT_VERSION) -> bytes:
    return FILE_HEADER.pack(magic, version, base_offset)


def read_file_header(data: bytes, magic: bytes, what: str = "file") -> tuple[int, int]:
    """Validate a file header and return (base offset, format version).

    Raises LogFormatError for a wrong magic or an unknown version (never guessed at: a newer version
    must fail loudly rather than be truncated as garbage), ValueError when ``data`` is short.
    """
    if len(data) < FILE_HEADER_SIZE:
        raise ValueError(f"{what}: header is {len(data)} bytes, need {FILE_HEADER_SIZE}")
    got_magic, version, base = FILE_HEADER.unpack_from(data, 0)
    if got_magic != magic:
        raise LogFormatError(f"{what}: bad magic {got_magic!r}, expected {magic!r}")
    if version not in READABLE_VERSIONS:
        raise LogFormatError(f"{what}: format version {version}, this reader knows "
                             f"{', '.join(map(str, READABLE_VERSIONS))}")
    return base, version


def unpack_file_header(data: bytes, magic: bytes, what: str = "file") -> int:
    """``read_file_header`` for callers that only need the base offset."""
    return read_file_header(data, magic, what)[0]


_crc32 = zlib.crc32


# --------------------------------------------------------------------------------------------- decode

_MAX = 1 << 62


def decode_records(buffer: bytes | bytearray | memoryview, start: int = 0, end: int | None = None, *,
                   max_records: int | None = None, max_bytes: int | None = None,
                   verify: bool = True, version: int = 1) -> tuple[list[Record], int]:
    """Decode the complete records in ``buffer[start:end]``; return (records, bytes consumed).

    Built for throughput, since the Spark pipeline decodes millions of records with it: one
    ``unpack_from`` per record straight from the buffer (no per-record copies except the field values
    themselves), a memoryview for the CRC, and ``tuple.__new__`` to build each Record.

    Stops without error at an incomplete record at the end (the caller reads more and calls again from
    ``start + consumed``), after ``max_records`` records, or before a record that would take the total
    past ``max_bytes`` (at least one record is always returned if one is complete).
    Raises CorruptRecord when a header's lengths disagree, the CRC does not match (``verify``) or a
    string is not UTF-8; the exception carries the records decoded before the bad one.

    ``version`` 2 (bytes of a version 2 segment) decodes whole batches: the limits then stop before
    a batch (``max_bytes`` counting batch bytes), at least one batch is returned if one is complete.
    """
    buf = buffer if type(buffer) is bytes else bytes(buffer)
    if end is None or end > len(buf):
        end = len(buf)
    left = max_records if max_records is not None else _MAX
    limit_pos = start + max_bytes if max_bytes is not None else _MAX
    out: list[Record] = []
    if left <= 0:
        return out, 0
    if version != 1:
        return _decode_v2(buf, start, end, left, limit_pos, verify)
    append = out.append
    unpack = RECORD_HEADER.unpack_from
    crc32 = zlib.crc32
    new = tuple.__new__
    rec_type = Record
    mv = memoryview(buf)
    pos = start
    last_header = end - RECORD_HEADER_SIZE
    try:
        while pos <= last_header:
            length, crc, off, ts, oofs, flags, _res, ol, cl, tl, pl, yl = unpack(buf, pos)
            if length != RECORD_FIXED_BODY + ol + cl + tl + pl + yl:
                raise CorruptRecord(pos, f"length {length} does not match its field lengths", out,
                                    pos - start)
            rend = pos + 8 + length
            if rend > end or (rend > limit_pos and out):
                break
            if verify and crc32(mv[pos + 8:rend]) != crc:
                raise CorruptRecord(pos, "CRC mismatch", out, pos - start)
            a = pos + RECORD_HEADER_SIZE
            b = a + ol
            c = b + cl
            d = c + tl
            e = d + pl
            append(new(rec_type, (off, ts, buf[a:b].decode(), oofs, buf[b:c].decode(),
                                  buf[c:d].decode(), flags & QOS_MASK, flags & RETAIN_FLAG != 0,
                                  buf[d:e], buf[e:rend])))
            pos = rend
            left -= 1
            if not left:
                break
    except UnicodeDecodeError:
        raise CorruptRecord(pos, "string field is not UTF-8", out, pos - start) from None
    return out, pos - start


def record_size_at(buffer: bytes | bytearray | memoryview, pos: int) -> int | None:
    """Total size of the record starting at ``pos`` from its length field, None if fewer than 4 bytes."""
    if len(buffer) - pos < 4:
        return None
    return 8 + int.from_bytes(buffer[pos:pos + 4], "little")


def skip_to_offset(buffer: bytes | bytearray, start: int, end: int,
                   target: int, version: int = 1) -> tuple[int, int | None, bool]:
    """Walk record headers (no decoding, no CRC) from ``start`` to the first record with
    offset >= ``target``; return (position, offset of the first record seen or None, found).

    Used after an index lookup, which lands up to one index interval before the wanted record.
    ``found`` is False when the walk ran out of data first: the position is then where to resume.
    Version 2: the batch holding that record (``skip_batches_to_offset``).
    """
    if version != 1:
        return skip_batches_to_offset(buffer, start, end, target)
    unpack = RECORD_HEADER.unpack_from
    pos = start
    first: int | None = None
    while pos + RECORD_HEADER_SIZE <= end:
        length, _crc, off = unpack(buffer, pos)[:3]
        if first is None:
            first = off
        if off >= target:
            return pos, first, True
        if pos + 8 + length > end:
            break
        pos += 8 + length
    return pos, first, False


# ------------------------------------------------------------------------------------ version 2

# A version 2 segment holds batches: one header and one CRC for all the records one flush wrote.
#
#     length     u32  bytes after the crc field (32 + the body's length)
#     crc        u32  zlib.crc32 of those ``length`` bytes (the rest of the header and the body)
#     base       u64  offset of the batch's first record; the others follow one by one
#     first_ts   i64  timestamp_ms of the first record
#     max_ts     i64  largest timestamp_ms in the batch
#     count      u32  records in the batch (>= 1)
#     head_crc   u32  zlib.crc32 of length, base, first_ts, max_ts and count as packed here
#     body            a msgpack array of ``count`` arrays, one per record:
#                     [timestamp_ms, origin_router, origin_offset, client_id, topic, qos, retain,
#                      properties, payload] (str, str, str as msgpack str; properties and payload bin)
#
# ``head_crc`` lets a reader trust ``length`` and ``count`` before it reads the body (the job the
# redundant field lengths do in version 1), so a damaged header never makes it skip or wait for
# gigabytes; ``crc`` then covers everything after itself, as in version 1.
BATCH_HEADER = struct.Struct("<IIQqqII")
BATCH_HEADER_SIZE = BATCH_HEADER.size  # 40
BATCH_FIXED_BODY = BATCH_HEADER_SIZE - 8  # 32: what ``length`` counts besides the body
_BATCH_HEAD_FIELDS = struct.Struct("<IQqqI")  # what head_crc covers: length, base, first_ts, max_ts, count
_BATCH_REST = struct.Struct("<QqqII")         # the header after length and crc
_LENGTH_CRC_V2 = struct.Struct("<II")
MAX_ARRAY_HEADER = 5  # bytes of a msgpack array header, at most (what a batch's body adds to its records)
assert BATCH_HEADER_SIZE == 40

_packb = msgpack.packb
_unpackb = msgpack.unpackb
_first_item = operator.itemgetter(0)

FieldTuple = tuple[int, str, int | None, str, str, int, bool, bytes, bytes]
"""A record as a version 2 batch holds it: ``Record`` without the offset, in ``Record``'s order."""


def encode_batch(base_offset: int, records: list[Any], body: bytes | None = None,
                 max_ts: int | None = None) -> tuple[bytes, bytes]:
    """(header, body) of a version 2 batch of ``records`` (``FieldTuple``s, offsets from
    ``base_offset``); ``body`` and ``max_ts`` may be given when the caller already has them.

    One ``msgpack.packb`` (C) packs every record and one ``zlib.crc32`` covers them: that is the
    point of version 2. Encoding a version 1 record is a handful of Python-level calls per record
    (struct pack, join, CRC), ~0.8 us at 16 B against ~0.2 us here, on the broker's event loop.
    """
    if body is None:
        body = _packb(records)
    first_ts = records[0][0]
    if max_ts is None:
        max_ts = max(map(_first_item, records))
    count = len(records)
    length = BATCH_FIXED_BODY + len(body)
    head_crc = _crc32(_BATCH_HEAD_FIELDS.pack(length, base_offset, first_ts, max_ts, count))
    rest = _BATCH_REST.pack(base_offset, first_ts, max_ts, count, head_crc)
    return _LENGTH_CRC_V2.pack(length, _crc32(body, _crc32(rest))) + rest, body


def encode_batch_bytes(base_offset: int, records: list[Any]) -> bytes:
    """The bytes of one version 2 batch, for tools and tests."""
    return b"".join(encode_batch(base_offset, records))


def record_fields(record: Record) -> FieldTuple:
    """A decoded record as a batch holds it (to copy records between logs)."""
    return record[1:]


class BatchHeader(NamedTuple):
    length: int
    crc: int
    base: int
    first_ts: int
    max_ts: int
    count: int  # type: ignore[assignment]  # a field named count hides tuple.count, as intended

    @property
    def size(self) -> int:
        return 8 + self.length

    @property
    def last_offset(self) -> int:
        return self.base + self.count - 1


def batch_header_at(buffer: bytes | bytearray | memoryview, pos: int) -> BatchHeader | str | None:
    """The batch header at ``pos``: a BatchHeader when it is intact, None when fewer than
    ``BATCH_HEADER_SIZE`` bytes are left, or why it is damaged (a str)."""
    if len(buffer) - pos < BATCH_HEADER_SIZE:
        return None
    length, crc, base, first_ts, max_ts, count, head_crc = BATCH_HEADER.unpack_from(buffer, pos)
    if _crc32(_BATCH_HEAD_FIELDS.pack(length, base, first_ts, max_ts, count)) != head_crc:
        return "batch header CRC mismatch"
    if count < 1 or length <= BATCH_FIXED_BODY or max_ts < first_ts:
        return f"batch header fields are impossible (count {count}, length {length})"
    return BatchHeader(length, crc, base, first_ts, max_ts, count)


def decode_batch_body(buffer: bytes | memoryview, header: BatchHeader, pos: int) -> list[Record]:
    """The records of the (CRC-checked) batch at ``pos``; raises ValueError when the body does not
    hold ``count`` records of the right shape (only a writer bug can do that past the CRC)."""
    with memoryview(buffer) as mv:
        items = _unpackb(mv[pos + BATCH_HEADER_SIZE:pos + 8 + header.length], use_list=False)
    if type(items) is not tuple or len(items) != header.count:
        raise ValueError("batch body does not hold its count of records")
    new = tuple.__new__
    rec = Record
    base = header.base
    try:
        out = [new(rec, (base + i, *t)) for i, t in enumerate(items)]
    except TypeError:
        raise ValueError("batch body holds something other than records") from None
    for r in out[:1]:
        if len(r) != 10:
            raise ValueError("batch body records have the wrong number of fields")
    return out


def _decode_v2(buf: bytes, start: int, end: int, left: int, limit_pos: int,
               verify: bool) -> tuple[list[Record], int]:
    """``decode_records`` for version 2: whole batches only (limits apply between batches)."""
    out: list[Record] = []
    pos = start
    crc32 = _crc32
    with memoryview(buf) as mv:
        while True:
            h = batch_header_at(mv[:end], pos)
            if h is None:
                break
            if isinstance(h, str):
                raise CorruptRecord(pos, h, out, pos - start)
            rend = pos + 8 + h.length
            if rend > end or (out and (rend > limit_pos or len(out) + h.count > left)):
                break
            if verify and crc32(mv[pos + 8:rend]) != h.crc:
                raise CorruptRecord(pos, "CRC mismatch", out, pos - start)
            try:
                out += decode_batch_body(mv, h, pos)
            except (ValueError, msgpack.UnpackException) as exc:
                raise CorruptRecord(pos, str(exc), out, pos - start) from None
            pos = rend
            if len(out) >= left:
                break
    return out, pos - start


def nominal_size(record: Record) -> int:
    """The bytes ``record`` takes in version 1: what ``max_bytes`` limits of reads count in every
    version, so a limit means the same whatever the segments' format (a version 2 record has no
    size of its own: its batch's body is one msgpack array)."""
    return (RECORD_HEADER_SIZE + len(record[2].encode()) + len(record[4].encode()) + len(record[5].encode())
            + len(record[8]) + len(record[9]))


def skip_batches_to_offset(buffer: bytes | bytearray | memoryview, start: int, end: int,
                           target: int) -> tuple[int, int | None, bool]:
    """``skip_to_offset`` for version 2: the position of the batch holding the first record with
    offset >= ``target`` (headers only: no CRC of the bodies, no decoding)."""
    pos = start
    first: int | None = None
    with memoryview(buffer) as mv:
        view = mv[:end]
        while True:
            h = batch_header_at(view, pos)
            if not isinstance(h, BatchHeader):
                break
            if first is None:
                first = h.base
            if h.base + h.count > target:
                return pos, first, True
            if pos + 8 + h.length > end:
                break
            pos += 8 + h.length
    return pos, first, False


def unit_header_size(version: int) -> int:
    """Smallest complete unit: a record header (v1) or a batch header (v2)."""
    return RECORD_HEADER_SIZE if version == 1 else BATCH_HEADER_SIZE


# ------------------------------------------------------------------------------------------- files

READ_CHUNK = 4 << 20


def iter_record_batches(path: str | os.PathLike[str], start_pos: int = 0, end_pos: int | None = None, *,
                        chunk_size: int = READ_CHUNK, verify: bool = True,
                        errors: str = "stop") -> Iterator[list[Record]]:
    """Yield lists of records from one segment file, read with ``os.pread`` in ``chunk_size`` pieces.

    ``start_pos`` must be a record boundary (0 means just after the file header; an index position
    from ``LogReader.locate`` is one; in a version 2 segment: a batch boundary, so the first batch may
    hold records before the one located); ``end_pos`` bounds the bytes read (default: the size at
    open).
    An incomplete record at the end is not an error: the segment may be being written. On a corrupt
    record, ``errors="stop"`` logs a warning and ends the iteration (what the log's own readers do),
    ``errors="raise"`` raises CorruptRecord.
    """
    if errors not in ("stop", "raise"):
        raise ValueError("errors must be 'stop' or 'raise'")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        _base, version = read_file_header(os.pread(fd, FILE_HEADER_SIZE, 0), MAGIC_LOG, os.fspath(path))
        min_unit = unit_header_size(version)
        if end_pos is None:
            end_pos = os.fstat(fd).st_size
        pos = max(start_pos, FILE_HEADER_SIZE)
        need = 0
        while pos < end_pos:
            want = min(end_pos - pos, max(chunk_size, need))
            data = os.pread(fd, want, pos)
            try:
                records, consumed = decode_records(data, verify=verify, version=version)
            except CorruptRecord as exc:
                if exc.records:
                    yield exc.records
                if errors == "raise":
                    raise CorruptRecord(pos + exc.position, exc.reason) from None
                log.warning("%s: corrupt record at position %d (%s); stopped reading this segment",
                            path, pos + exc.position, exc.reason)
                return
            if records:
                yield records
            if consumed == len(data) and len(data) == want:
                pos += consumed
                need = 0
                continue
            # What is left is the start of a record: read it whole next time, unless the data ends here.
            if len(data) < want or pos + len(data) >= end_pos:
                return
            pos += consumed
            size = record_size_at(data, consumed)
            need = max(size or 0, min_unit)
    finally:
        os.close(fd)


def iter_records(path: str | os.PathLike[str], start_pos: int = 0, end_pos: int | None = None, *,
                 chunk_size: int = READ_CHUNK, verify: bool = True,
                 errors: str = "stop") -> Iterator[Record]:
    """Yield the records of one segment file; see ``iter_record_batches`` (faster for bulk work)."""
    for batch in iter_record_batches(path, start_pos, end_pos, chunk_size=chunk_size, verify=verify,
                                     errors=errors):
        yield from batch
