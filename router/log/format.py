"""Byte format of the commit log: file headers, records, index entries — the one copy of it.

Everything that reads or writes log bytes (the writer, the in-process reader, ``LogReader``, ``check``,
the Spark ``brokerlog`` data source) goes through the structs and functions here, so the format exists
exactly once. ``FORMAT.md`` next to this file is the human-readable description; keep both in step.

All integers are little-endian.

File header (16 bytes, at position 0 of every ``.log`` and ``.index`` file)::

    magic        4s   b"BKLG" (segment) or b"BKIX" (index)
    version      u8   FORMAT_VERSION (1)
    reserved     3x   zero
    base_offset  u64  offset of the first record of the segment (also in the file name)

Record (48-byte fixed header, then the variable fields in this order)::

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
import os
import struct
import zlib
from collections.abc import Iterator
from typing import NamedTuple

from router.log.errors import CorruptRecord, LogFormatError

log = logging.getLogger(__name__)

MAGIC_LOG = b"BKLG"
MAGIC_INDEX = b"BKIX"
FORMAT_VERSION = 1

FILE_HEADER = struct.Struct("<4sB3xQ")
FILE_HEADER_SIZE = FILE_HEADER.size  # 16

RECORD_HEADER = struct.Struct("<IIQqqBBHHHII")
RECORD_HEADER_SIZE = RECORD_HEADER.size  # 48
# The same fixed header without length and crc: what the encoder packs before computing the CRC.
_RECORD_BODY = struct.Struct("<QqqBBHHHII")
_LENGTH_CRC = struct.Struct("<II")
RECORD_FIXED_BODY = _RECORD_BODY.size  # 40 = RECORD_HEADER_SIZE - 8

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
    origin_offset: int
    client_id: str
    topic: str
    qos: int
    retain: bool
    properties: bytes
    payload: bytes

    def encoded_size(self) -> int:
        """Bytes this record takes on disk."""
        return (RECORD_HEADER_SIZE + len(self.origin_router.encode()) + len(self.client_id.encode())
                + len(self.topic.encode()) + len(self.properties) + len(self.payload))


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


def pack_file_header(magic: bytes, base_offset: int) -> bytes:
    return FILE_HEADER.pack(magic, FORMAT_VERSION, base_offset)


def unpack_file_header(data: bytes, magic: bytes, what: str = "file") -> int:
    """Validate a file header and return its base offset.

    Raises LogFormatError for a wrong magic or an unknown version (never guessed at: a newer version
    must fail loudly rather than be truncated as garbage), ValueError when ``data`` is short.
    """
    if len(data) < FILE_HEADER_SIZE:
        raise ValueError(f"{what}: header is {len(data)} bytes, need {FILE_HEADER_SIZE}")
    got_magic, version, base = FILE_HEADER.unpack_from(data, 0)
    if got_magic != magic:
        raise LogFormatError(f"{what}: bad magic {got_magic!r}, expected {magic!r}")
    if version != FORMAT_VERSION:
        raise LogFormatError(f"{what}: format version {version}, this reader knows {FORMAT_VERSION}")
    return base


# --------------------------------------------------------------------------------------------- encode

_pack_body = _RECORD_BODY.pack
_pack_length_crc = _LENGTH_CRC.pack
_join = b"".join
_crc32 = zlib.crc32


def encode_record_into(parts: list[bytes], offset: int, timestamp_ms: int, origin_router: bytes,
                       origin_offset: int, client_id: bytes, topic: bytes, qos: int, retain: bool,
                       properties: bytes, payload: bytes) -> int:
    """Encode one record as two pieces appended to ``parts`` (the length+CRC prefix and the body,
    which the log joins per batch) and return its size; ``parts`` is untouched on error.

    This runs once per PUBLISH on the broker's event loop, so it is one function with no tuple
    returned and no keyword arguments: one ``b"".join`` of the body, one CRC over it, two list
    appends. That measured faster than CRC-ing the pieces one by one, than packing into a
    preallocated buffer through a memoryview, and than deferring the encoding to flush time (which
    costs a tuple per record to keep the fields). Raises ValueError for out-of-range fields.
    """
    if qos not in (0, 1, 2):
        raise ValueError(f"qos must be 0, 1 or 2, not {qos!r}")
    ol = len(origin_router)
    cl = len(client_id)
    tl = len(topic)
    pl = len(properties)
    yl = len(payload)
    try:
        body = _join((_pack_body(offset, timestamp_ms, origin_offset, qos | RETAIN_FLAG if retain else qos,
                                 0, ol, cl, tl, pl, yl),
                      origin_router, client_id, topic, properties, payload))
        n = len(body)
        prefix = _pack_length_crc(n, _crc32(body))
    except struct.error as exc:
        raise ValueError(f"record field out of range: {exc} (strings are at most 65535 bytes, "
                         f"properties and payload under 4 GiB)") from None
    parts.append(prefix)
    parts.append(body)
    return n + 8


def encode_record(offset: int, timestamp_ms: int, origin_router: str | bytes, origin_offset: int,
                  client_id: str | bytes, topic: str | bytes, qos: int = 0, retain: bool = False,
                  properties: bytes = b"", payload: bytes = b"") -> bytes:
    """The bytes of one record, for tools and tests (the log's append path uses the same code)."""
    parts: list[bytes] = []
    encode_record_into(parts, offset, timestamp_ms, _utf8(origin_router), origin_offset, _utf8(client_id),
                       _utf8(topic), qos, retain, bytes(properties), bytes(payload))
    return b"".join(parts)


def _utf8(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


# --------------------------------------------------------------------------------------------- decode

_MAX = 1 << 62


def decode_records(buffer: bytes | bytearray | memoryview, start: int = 0, end: int | None = None, *,
                   max_records: int | None = None, max_bytes: int | None = None,
                   verify: bool = True) -> tuple[list[Record], int]:
    """Decode the complete records in ``buffer[start:end]``; return (records, bytes consumed).

    Built for throughput, since the Spark pipeline decodes millions of records with it: one
    ``unpack_from`` per record straight from the buffer (no per-record copies except the field values
    themselves), a memoryview for the CRC, and ``tuple.__new__`` to build each Record.

    Stops without error at an incomplete record at the end (the caller reads more and calls again from
    ``start + consumed``), after ``max_records`` records, or before a record that would take the total
    past ``max_bytes`` (at least one record is always returned if one is complete).
    Raises CorruptRecord when a header's lengths disagree, the CRC does not match (``verify``) or a
    string is not UTF-8; the exception carries the records decoded before the bad one.
    """
    buf = buffer if type(buffer) is bytes else bytes(buffer)
    if end is None or end > len(buf):
        end = len(buf)
    left = max_records if max_records is not None else _MAX
    limit_pos = start + max_bytes if max_bytes is not None else _MAX
    out: list[Record] = []
    if left <= 0:
        return out, 0
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
                   target: int) -> tuple[int, int | None, bool]:
    """Walk record headers (no decoding, no CRC) from ``start`` to the first record with
    offset >= ``target``; return (position, offset of the first record seen or None, found).

    Used after an index lookup, which lands up to one index interval before the wanted record.
    ``found`` is False when the walk ran out of data first: the position is then where to resume.
    """
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


# ------------------------------------------------------------------------------------------- files

READ_CHUNK = 4 << 20


def iter_record_batches(path: str | os.PathLike[str], start_pos: int = 0, end_pos: int | None = None, *,
                        chunk_size: int = READ_CHUNK, verify: bool = True,
                        errors: str = "stop") -> Iterator[list[Record]]:
    """Yield lists of records from one segment file, read with ``os.pread`` in ``chunk_size`` pieces.

    ``start_pos`` must be a record boundary (0 means just after the file header; an index position
    from ``LogReader.locate`` is one); ``end_pos`` bounds the bytes read (default: the size at open).
    An incomplete record at the end is not an error: the segment may be being written. On a corrupt
    record, ``errors="stop"`` logs a warning and ends the iteration (what the log's own readers do),
    ``errors="raise"`` raises CorruptRecord.
    """
    if errors not in ("stop", "raise"):
        raise ValueError("errors must be 'stop' or 'raise'")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        unpack_file_header(os.pread(fd, FILE_HEADER_SIZE, 0), MAGIC_LOG, os.fspath(path))
        if end_pos is None:
            end_pos = os.fstat(fd).st_size
        pos = max(start_pos, FILE_HEADER_SIZE)
        need = 0
        while pos < end_pos:
            want = min(end_pos - pos, max(chunk_size, need))
            data = os.pread(fd, want, pos)
            try:
                records, consumed = decode_records(data, verify=verify)
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
            need = max(size or 0, RECORD_HEADER_SIZE)
    finally:
        os.close(fd)


def iter_records(path: str | os.PathLike[str], start_pos: int = 0, end_pos: int | None = None, *,
                 chunk_size: int = READ_CHUNK, verify: bool = True,
                 errors: str = "stop") -> Iterator[Record]:
    """Yield the records of one segment file; see ``iter_record_batches`` (faster for bulk work)."""
    for batch in iter_record_batches(path, start_pos, end_pos, chunk_size=chunk_size, verify=verify,
                                     errors=errors):
        yield from batch
