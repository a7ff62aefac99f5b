"""A writer of format version 1 logs, for the tests that need old logs (the broker writes version 2).

Why a fixture: ``CommitLog`` appends version 2 only, and every reader still reads version 1, so a
log written by an older broker has to be made somewhere. This writes the bytes ``CommitLog`` with
``format_version=1`` wrote: the same records (``encode_record``: FORMAT.md's version 1 record), the
same segment rolls and sparse index entries, so the recovery tests can damage single records at
known places. ``router.log.format`` decodes them.
"""

from __future__ import annotations

import os
import struct
import time
import zlib
from typing import Any

from brokerd.router.log.format import (
    FILE_HEADER_SIZE,
    INDEX_ENTRY,
    MAGIC_INDEX,
    MAGIC_LOG,
    RETAIN_FLAG,
    index_name,
    pack_file_header,
    segment_name,
)

_NO_INDEX_YET = -(1 << 62)  # as router.log.scan.NO_INDEX_YET: the first record is indexed
# A version 1 record header without its length and crc (format.RECORD_HEADER's last ten fields):
# the bytes the CRC covers start here.
_FIXED_BODY = struct.Struct("<QqqBBHHHII")
_LENGTH_CRC = struct.Struct("<II")


def encode_record(offset: int, timestamp_ms: int, origin_router: str | bytes, origin_offset: int,
                  client_id: str | bytes, topic: str | bytes, qos: int = 0, retain: bool = False,
                  properties: bytes = b"", payload: bytes = b"") -> bytes:
    """The bytes of one version 1 record. Raises ValueError for out-of-range fields."""
    if qos not in (0, 1, 2):
        raise ValueError(f"qos must be 0, 1 or 2, not {qos!r}")
    o, c, t, p, y = _utf8(origin_router), _utf8(client_id), _utf8(topic), bytes(properties), bytes(payload)
    try:
        fixed = _FIXED_BODY.pack(offset, timestamp_ms, origin_offset, qos | RETAIN_FLAG if retain else qos, 0,
                                 len(o), len(c), len(t), len(p), len(y))
    except struct.error as exc:
        raise ValueError(f"record field out of range: {exc}") from None
    body = b"".join((fixed, o, c, t, p, y))
    return _LENGTH_CRC.pack(len(body), zlib.crc32(body)) + body


class V1LogWriter:
    """Append version 1 records to a new (or version 1) log directory; files are written on close.

    ``append`` takes ``CommitLog.append``'s arguments and returns the record's offset."""

    def __init__(self, directory: str | os.PathLike[str], *, router_id: str = "", segment_bytes: int = 64 << 20,
                 index_interval_bytes: int = 4096, start_offset: int = 0) -> None:
        self.directory = os.fspath(directory)
        self.router_id = router_id
        self.segment_bytes = segment_bytes
        self.index_interval = index_interval_bytes
        self.next_offset = start_offset
        # base -> (record pieces, index entries); the last one is the active segment.
        self._segments: dict[int, tuple[list[bytes], bytearray]] = {}
        self._base = -1
        self._size = 1 << 62  # no segment yet: the first append rolls
        self._last_index_pos = _NO_INDEX_YET
        self._max_ts = -(1 << 63)

    def append(self, topic: str | bytes, payload: bytes, *, qos: int = 0, retain: bool = False,
               client_id: str | bytes = b"", properties: bytes = b"", origin_router: str | bytes | None = None,
               origin_offset: int | None = None, timestamp_ms: int | None = None) -> int:
        offset = self.next_offset
        ts = time.time_ns() // 1_000_000 if timestamp_ms is None else timestamp_ms
        record = encode_record(offset, ts, self.router_id if origin_router is None else origin_router,
                               offset if origin_offset is None else origin_offset, client_id, topic, qos,
                               retain, properties, payload)
        n = len(record)
        pos = self._size
        if pos + n > self.segment_bytes and pos > FILE_HEADER_SIZE:
            self._segments[offset] = ([], bytearray())
            self._base = offset
            self._last_index_pos = _NO_INDEX_YET
            self._max_ts = -(1 << 63)
            pos = FILE_HEADER_SIZE
        records, index = self._segments[self._base]
        self._max_ts = max(self._max_ts, ts)
        if pos - self._last_index_pos >= self.index_interval:
            index += INDEX_ENTRY.pack(offset - self._base, pos, self._max_ts)
            self._last_index_pos = pos
        records.append(record)
        self._size = pos + n
        self.next_offset = offset + 1
        return offset

    def append_fields(self, timestamp_ms: int, origin_router: str | None, origin_offset: int | None,
                      client_id: str, topic: str, qos: int, retain: bool, properties: bytes,
                      payload: bytes) -> int:
        """``CommitLog.append_fields``'s positional form."""
        return self.append(topic, payload, qos=qos, retain=retain, client_id=client_id, properties=properties,
                           origin_router=origin_router, origin_offset=origin_offset, timestamp_ms=timestamp_ms)

    def close(self) -> None:
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        for base, (records, index) in self._segments.items():
            with open(os.path.join(self.directory, segment_name(base)), "wb") as f:
                f.write(pack_file_header(MAGIC_LOG, base, 1) + b"".join(records))
            with open(os.path.join(self.directory, index_name(base)), "wb") as f:
                f.write(pack_file_header(MAGIC_INDEX, base, 1) + bytes(index))
        self._segments.clear()

    def __enter__(self) -> V1LogWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _utf8(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)
