"""``CommitLog``: the per-router segmented commit log, written from an asyncio event loop.

Why it is shaped this way:

* ``append_fields`` runs once per PUBLISH on the event loop, so it only keeps a tuple of the record's
  fields and counts the offset — no encoding, no syscall. ``flush`` encodes the whole batch at once
  (format version 2: one ``msgpack.packb`` and one CRC) and places it (segment roll, index entry).
  A log writing version 1 encodes each record at append instead (its format has a CRC per record).
* ``flush`` (scheduled automatically ``linger_ms``, 2 ms by default, after the first append of a
  batch; at the end of the loop iteration with ``--fsync always``) hands the batch
  to ONE background thread that does ``pwrite`` and, per the fsync policy, ``fsync``, then reports back
  with ``loop.call_soon_threadsafe``. The loop never waits for the disk; batches that queue up during
  an fsync share the next one (group commit). A small batch that waits for no fsync is written by
  the loop itself while the thread is idle (``WriterThread.write_inline``: no hand-off per batch).
* The broker holds QoS 1/2 acknowledgements on ``on_durable`` / ``wait_durable`` when it runs with
  ``--fsync always``, and on ``on_written`` otherwise (a record in the kernel survives a crash of
  the process; one still in this batch would not); a failed write puts the log in a failed state in which ``append`` raises
  ``LogUnavailable``, so the broker refuses publishes rather than acknowledging what it cannot store.
* Reads are positional (``os.pread``) on descriptors opened once, and cover records still in memory,
  so a consumer never forces the writer to flush.

Without a loop (``loop=None``: CLI tools, tests, batch jobs) the same code runs synchronously:
``flush`` writes (and fsyncs per policy) before returning.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import heapq
import itertools
import logging
import operator
import os
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

import msgpack

from brokerd.router.log.errors import LogFormatError, LogUnavailable
from brokerd.router.log.format import (
    BATCH_HEADER_SIZE,
    FILE_HEADER_SIZE,
    FORMAT_VERSION,
    INDEX_ENTRY,
    INDEX_ENTRY_SIZE,
    MAGIC_INDEX,
    MAGIC_LOG,
    MAX_ARRAY_HEADER,
    MAX_SEGMENT_POSITION,
    Record,
    decode_records,
    encode_batch,
    encode_record_into,
    index_name,
    nominal_size,
    pack_file_header,
    read_file_header,
    segment_name,
    skip_to_offset,
)
from brokerd.router.log.segment import (
    NO_INDEX_YET,
    OpenReaders,
    SegmentReader,
    list_segment_files,
    scan_segment,
    write_index,
)
from brokerd.router.log.writer import (
    RECOVER,
    STOP,
    SYNC,
    Batch,
    Chunk,
    FsyncPolicy,
    Report,
    WriterCore,
    WriterThread,
    delete_item,
)

log = logging.getLogger(__name__)

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NO_TS = -(1 << 63)
_time_ns = time.time_ns
_first_item = operator.itemgetter(0)
_new_tuple = tuple.__new__


class DeletedSegment(NamedTuple):
    """A segment removed by retention."""

    base_offset: int
    last_offset: int | None
    size: int
    reason: str  # "size" or "age"


class SegmentState(NamedTuple):
    """The log's own view of one segment (``CommitLog.segments``)."""

    base_offset: int
    path: str
    size: int             # bytes assigned, including records not yet written
    written_size: int     # bytes on disk
    last_offset: int | None
    max_timestamp: int | None
    active: bool


class _Seg:
    """Loop-side bookkeeping of one segment."""

    __slots__ = ("base", "size", "written_end", "last_offset", "max_ts", "reader")

    def __init__(self, directory: str, base: int, size: int, written_end: int,
                 last_offset: int | None, max_ts: int | None) -> None:
        self.base = base
        self.size = size
        self.written_end = written_end
        self.last_offset = last_offset
        self.max_ts = max_ts
        self.reader = SegmentReader(directory, base)


class CommitLog:
    """A directory of segments, appended to from one event loop (or synchronously without one).

    Parameters (all but ``directory`` keyword-only):

    * ``router_id``: default ``origin_router`` of records appended here.
    * ``loop``: the event loop the log belongs to; ``None`` selects synchronous mode.
    * ``fsync``: ``"always"`` | ``"interval"`` | ``"never"`` (see ``FsyncPolicy``);
      ``fsync_interval_ms``: the ``interval`` period.
    * ``segment_bytes``: roll to a new segment once the next record would pass this size.
    * ``index_interval_bytes``: one index entry per this many bytes of records.
    * ``retention_bytes`` / ``retention_hours``: limits applied by ``enforce_retention``.
    * ``max_batch_bytes``: flush as soon as a batch reaches this size, even mid-iteration.
    * ``max_unsynced_bytes``: with ``interval``, also fsync once this many bytes wait for it.
    * ``page_cache_bytes``: how much of the newest written data stays in the page cache; the writer
      hands older pages back to the kernel (see ``WriterCore``). ``None``: leave it to the kernel.
    * ``autoflush``: with a loop, schedule ``flush`` after the first append of a batch: ``linger_ms``
      later, or with ``call_soon`` (the batch is one loop iteration's worth of appends).
    * ``linger_ms``: with a loop and fsync ``interval``/``never``, the automatic flush comes this long
      after the first append of a batch (sooner once ``max_batch_bytes`` wait), not at the end of
      that loop iteration; ``0``: at the end of the iteration (what ``always`` does anyway: acks
      wait for the write). Why: each flush costs the same whatever its size (a msgpack call, a
      header, a batch to place, a writer round: a thread wake-up, a GIL round trip, a ``pwritev``
      and a report to the loop), and a busy loop iteration holds only tens of PUBLISHes; one flush
      per couple of milliseconds spreads that over hundreds. Appended records are readable from
      memory meanwhile.
    * ``format_version``: 2 (default; one CRC and one msgpack body per batch, see FORMAT.md) or 1
      (a header and a CRC per record: for readers that only know version 1, e.g. a pipeline not yet
      upgraded). Segments of either version are read whatever this says; an active segment of
      the other version is closed and the next flush starts a new segment.

    Opening recovers the directory (see ``FORMAT.md``): blocking work, so an async caller should use
    ``await CommitLog.open_async(...)``.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        router_id: str = "",
        loop: asyncio.AbstractEventLoop | None = None,
        fsync: FsyncPolicy | str = FsyncPolicy.INTERVAL,
        fsync_interval_ms: int = 1000,
        segment_bytes: int = 64 << 20,
        index_interval_bytes: int = 4096,
        retention_bytes: int | None = None,
        retention_hours: float | None = None,
        max_batch_bytes: int = 1 << 20,
        max_unsynced_bytes: int = 4 << 20,
        page_cache_bytes: int | None = 16 << 20,
        autoflush: bool = True,
        format_version: int = FORMAT_VERSION,
        linger_ms: float = 2.0,
    ) -> None:
        try:
            self._policy = FsyncPolicy(fsync)
        except ValueError:
            raise ValueError(f"fsync must be one of always, interval, never; not {fsync!r}") from None
        if not 1 <= fsync_interval_ms <= 3_600_000:
            raise ValueError("fsync_interval_ms must be between 1 and 3600000")
        if not 4096 <= segment_bytes <= MAX_SEGMENT_POSITION:
            raise ValueError(f"segment_bytes must be between 4096 and {MAX_SEGMENT_POSITION}")
        if index_interval_bytes < 1:
            raise ValueError("index_interval_bytes must be positive")
        if retention_bytes is not None and retention_bytes < 0:
            raise ValueError("retention_bytes must be >= 0")
        if retention_hours is not None and retention_hours < 0:
            raise ValueError("retention_hours must be >= 0")
        if max_unsynced_bytes < 1:
            raise ValueError("max_unsynced_bytes must be positive")
        if page_cache_bytes is not None and page_cache_bytes < 0:
            raise ValueError("page_cache_bytes must be >= 0")
        if format_version not in (1, 2):
            raise ValueError("format_version must be 1 or 2")
        if not 0 <= linger_ms <= 1000:
            raise ValueError("linger_ms must be between 0 and 1000")
        self._version = format_version
        if format_version == 1:
            self.append_fields = self._append_fields_v1  # type: ignore[method-assign]
        self._dir = os.fspath(directory)
        self.router_id = router_id
        self._router_b = router_id.encode()
        self._loop = loop
        self._interval_s = fsync_interval_ms / 1000.0
        self._segment_bytes = segment_bytes
        self._index_interval = index_interval_bytes
        self.retention_bytes = retention_bytes
        self.retention_hours = retention_hours
        self._max_batch = max_batch_bytes
        self._autoflush = autoflush and loop is not None

        # Segments (loop side).
        self._segs: list[_Seg] = []
        self._bases: list[int] = []
        self._by_base: dict[int, _Seg] = {}
        self._open_readers = OpenReaders()  # the segments whose read descriptors stay open
        # Active segment as the appender sees it (including bytes not yet written).
        self._seg_base = -1
        self._seg_size = 1 << 62       # no active segment: the first append rolls
        self._seg_index_size = FILE_HEADER_SIZE
        self._last_index_pos = NO_INDEX_YET
        self._seg_max_ts = _NO_TS
        # The batch being filled, and the chunk (part of it for one segment) being filled.
        # Version 1: the batch being filled is a list of encoded pieces joined once at flush (a growing
        # bytearray is re-allocated, and in a fragmented heap copied, every 12.5 % of growth, which
        # made memmove the biggest log cost on the loop at 1 KiB payloads); ``_buf_len`` its bytes.
        # Version 2: the records' field tuples, encoded at flush (``_flush_v2``); ``_buf_len`` the
        # bytes of their payloads, what ``max_batch_bytes`` is compared with.
        self._buf: list[Any] = []
        self._buf_len = 0
        self._must_roll = False  # the active segment is of the other format version: never append to it
        # One packer for the life of the log: its buffer is allocated once and stays warm. A fresh
        # one per flush (msgpack.packb) allocates 256 KiB each time, written into fresh pages.
        self._pack = msgpack.Packer().pack
        self._buf_first = 0
        self._chunks: list[Chunk] = []
        self._chunk_buf_start = 0
        self._chunk_file_pos = 0
        self._chunk_index = bytearray()
        self._chunk_index_pos = FILE_HEADER_SIZE
        self._chunk_new = False
        self._inflight: deque[Batch] = deque()  # flushed, not yet reported written
        self._round = 0  # the writer core's round of the newest report applied
        linger_s = linger_ms / 1000.0 if self._policy is not FsyncPolicy.ALWAYS else 0.0
        self._linger_s = linger_s
        # What the first append of a batch calls to have the batch flushed (no method call between).
        self._armed = False  # a flush is scheduled (_autoflush_cb clears it)
        self._arm_flush: Callable[[], object] = (
            functools.partial(loop.call_later, linger_s, self._autoflush_cb) if loop is not None and linger_s
            else functools.partial(loop.call_soon, self._autoflush_cb) if loop is not None
            else _nothing)

        self._error: OSError | None = None
        self._closed = False
        # Why append refuses (None when healthy). A fresh exception per raise: re-raising one instance
        # would grow its traceback on every refused publish.
        self._refuse: str | None = None
        self._durable_cbs: list[Callable[[int], Any]] = []
        self._written_cbs: list[Callable[[int], Any]] = []
        # Called with (first offset, last offset, the records' msgpack body) for each version 2
        # batch as it is flushed: replication sends those bytes to followers as they are.
        self.on_batch: Callable[[int, int, bytes], Any] | None = None
        self._error_cbs: list[Callable[[OSError | None], Any]] = []
        self._waiters: list[tuple[int, int, asyncio.Future[int], bool]] = []
        self._recover_futs: list[asyncio.Future[bool]] = []
        self._seq = itertools.count()
        self._unreadable: set[int] = set()
        self.read_records = 0  # what read() returned, for the stats snapshot (log.read_records)
        self.read_bytes = 0  # their payload bytes

        self._next_offset = self._recover()
        self._buf_first = self._next_offset
        self._written_offset = self._durable_offset = self._next_offset - 1
        self._core = WriterCore(self._dir, self._policy, self._interval_s,
                                written_offset=self._written_offset, durable_offset=self._durable_offset,
                                page_cache_bytes=page_cache_bytes, max_unsynced_bytes=max_unsynced_bytes,
                                version=format_version)
        self._thread: WriterThread | None = None
        if loop is not None:
            self._thread = WriterThread(self._core, self._report_threadsafe,
                                        name=f"commitlog-writer:{os.path.basename(self._dir)}")

    @classmethod
    async def open_async(cls, directory: str | os.PathLike[str], **kwargs: Any) -> CommitLog:
        """Open (and recover) in a worker thread so the running loop is not blocked; the log is
        bound to the running loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, functools.partial(cls, directory, loop=loop, **kwargs))

    # ------------------------------------------------------------------------------------ properties

    @property
    def directory(self) -> str:
        return self._dir

    @property
    def fsync_policy(self) -> FsyncPolicy:
        return self._policy

    @property
    def format_version(self) -> int:
        """The format version of the segments this log writes (1 or 2)."""
        return self._version

    @property
    def next_offset(self) -> int:
        """Offset the next append gets."""
        return self._next_offset

    @property
    def written_offset(self) -> int:
        """Last offset handed to the OS (readable by other processes); -1 when none."""
        return self._written_offset

    @property
    def durable_offset(self) -> int:
        """Last offset known fsynced (for ``never``: what was synced at open or by flush(fsync=True))."""
        return self._durable_offset

    @property
    def start_offset(self) -> int:
        """First offset still in the log (retention moves it forward)."""
        return self._segs[0].base if self._segs else self._buf_first  # records not flushed yet count

    @property
    def error(self) -> OSError | None:
        """The OSError that put the log in the failed state, None when healthy."""
        return self._error

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pending_records(self) -> int:
        """Records appended but not yet reported written."""
        return self._next_offset - 1 - self._written_offset

    def start_at(self, offset: int) -> None:
        """Make an empty log begin at ``offset`` (a replica of another router's log starts where
        its leader is when it is chosen, and keeps the leader's offsets)."""
        if self._segs or self._buf or self._inflight or self._next_offset != self._buf_first:
            raise ValueError("start_at: the log is not empty")
        self._next_offset = self._buf_first = offset
        self._written_offset = self._durable_offset = offset - 1
        thread = self._thread
        if thread is None:
            self._core.written_offset = self._core.durable_offset = offset - 1
            return
        with thread._lock:  # the writer thread is idle (nothing was handed to it), but say so
            self._core.written_offset = self._core.durable_offset = offset - 1
            thread._handed = thread._last_durable = offset - 1

    # -------------------------------------------------------------------------------------- append

    def append(self, topic: str | bytes, payload: bytes, *, qos: int = 0, retain: bool = False,
               client_id: str | bytes = b"", properties: bytes = b"",
               origin_router: str | bytes | None = None, origin_offset: int | None = None,
               timestamp_ms: int | None = None) -> int:
        """Add a record to the current batch and return its offset. No I/O happens here.

        String fields may be given as ``str`` or UTF-8 bytes. ``origin_router``/``origin_offset``
        default to this log's router and the new offset; a forwarded record passes its origin so
        readers can count each message once.
        Raises LogUnavailable in the failed or closed state, ValueError for out-of-range fields.
        """
        if self._version != 1:
            # Version 2 keeps strings as str: no encode here and decode in append_bytes.
            if self._refuse is not None:
                raise LogUnavailable(self._refuse, self._error)
            t = topic if type(topic) is str else bytes(topic).decode()
            c = client_id if type(client_id) is str else bytes(client_id).decode()
            o = origin_router if origin_router is None or type(origin_router) is str \
                else bytes(origin_router).decode()
            if (qos.__class__ is not int or not 0 <= qos <= 2 or len(t) > 0x3FFF or len(c) > 0x3FFF
                    or (o is not None and len(o) > 0x3FFF)
                    or len(payload) > 0xFFFFFFFF or len(properties) > 0xFFFFFFFF):
                # Rare: measure the strings in UTF-8 (a character takes at most 4 bytes, so shorter
                # strings cannot pass the 65535-byte limit) and raise what is wrong.
                _check_fields(qos, (len(t.encode()), len(c.encode()), len((o or "").encode())),
                              (len(properties), len(payload)))
            return self.append_fields(_time_ns() // 1_000_000 if timestamp_ms is None else timestamp_ms,
                                      o, origin_offset, c, t, int(qos), bool(retain), bytes(properties),
                                      bytes(payload))
        return self.append_bytes(
            topic.encode() if type(topic) is str else topic,  # type: ignore[union-attr]
            payload, qos, retain,
            client_id.encode() if type(client_id) is str else client_id,  # type: ignore[union-attr]
            properties, _time_ns() // 1_000_000 if timestamp_ms is None else timestamp_ms,
            origin_router.encode() if type(origin_router) is str else origin_router,  # type: ignore[union-attr,arg-type]
            origin_offset)

    def append_fields(self, timestamp_ms: int, origin_router: str | None, origin_offset: int | None,
                      client_id: str, topic: str, qos: int, retain: bool, properties: bytes,
                      payload: bytes) -> int:
        """The broker's per-PUBLISH append: positional, in ``Record``'s field order, strings as the
        message holds them (``str``), ``origin_router``/``origin_offset`` None for this log's router
        and the new offset. No validation: the caller passes what the MQTT codec checked (QoS 0-2,
        strings under 64 KiB); ``append``/``append_bytes`` validate.

        It runs once per message on the event loop, where each Python-level call shows in the
        broker's CPU per message, so it only keeps a tuple of the fields: the batch is encoded at
        flush, all records with one ``msgpack.packb`` and one CRC (``_flush_v2``). The tuple holds
        references to immutable values, so nothing the caller does later changes the record.
        """
        if self._refuse is not None:
            raise LogUnavailable(self._refuse, self._error)
        offset = self._next_offset
        self._next_offset = offset + 1
        buf = self._buf
        buf.append((timestamp_ms, self.router_id if origin_router is None else origin_router,
                    offset if origin_offset is None else origin_offset, client_id, topic, qos, retain,
                    properties, payload))
        n = self._buf_len = self._buf_len + len(payload)
        if len(buf) == 1:
            if self._autoflush and not self._armed:
                self._armed = True
                self._arm_flush()
        elif n >= self._max_batch:
            self.flush()
        return offset

    def _append_fields_v1(self, timestamp_ms: int, origin_router: str | None, origin_offset: int | None,
                          client_id: str, topic: str, qos: int, retain: bool, properties: bytes,
                          payload: bytes) -> int:
        """``append_fields`` of a log that writes version 1."""
        return self._append_v1(topic.encode(), payload, qos, retain, client_id.encode(), properties,
                               timestamp_ms, None if origin_router is None else origin_router.encode(),
                               origin_offset)

    def append_bytes(self, topic: bytes, payload: bytes, qos: int, retain: bool, client_id: bytes,
                     properties: bytes, timestamp_ms: int, origin_router: bytes | None = None,
                     origin_offset: int | None = None) -> int:
        """``append`` with positional arguments, strings as UTF-8 bytes and a timestamp given; checks
        the fields (ValueError, nothing appended) where ``append_fields`` trusts its caller."""
        if self._version == 1:
            return self._append_v1(topic, payload, qos, retain, client_id, properties, timestamp_ms,
                                   origin_router, origin_offset)
        if self._refuse is not None:
            raise LogUnavailable(self._refuse, self._error)
        _check_fields(qos, (len(topic), len(client_id), 0 if origin_router is None else len(origin_router)),
                      (len(properties), len(payload)))
        return self.append_fields(timestamp_ms, None if origin_router is None else bytes(origin_router).decode(),
                                  origin_offset, bytes(client_id).decode(), bytes(topic).decode(), int(qos),
                                  bool(retain), bytes(properties), bytes(payload))

    def _append_v1(self, topic: bytes, payload: bytes, qos: int, retain: bool, client_id: bytes,
                   properties: bytes, timestamp_ms: int, origin_router: bytes | None = None,
                   origin_offset: int | None = None) -> int:
        """Version 1 append: encodes the record straight into the batch buffer and does the segment
        bookkeeping (roll, index entry) per record."""
        if self._refuse is not None:
            raise LogUnavailable(self._refuse, self._error)
        offset = self._next_offset
        start = self._buf_len
        n = encode_record_into(self._buf, offset, timestamp_ms,
                               self._router_b if origin_router is None else origin_router,
                               offset if origin_offset is None else origin_offset,
                               client_id, topic, qos, retain, properties, payload)
        pos = self._seg_size
        if (pos + n > self._segment_bytes and pos > FILE_HEADER_SIZE) or self._must_roll:
            self._roll(offset, start)  # the record just encoded at ``start`` opens the new segment
            pos = FILE_HEADER_SIZE
        if timestamp_ms > self._seg_max_ts:
            self._seg_max_ts = timestamp_ms
        if pos - self._last_index_pos >= self._index_interval:
            self._chunk_index += INDEX_ENTRY.pack(offset - self._seg_base, pos, self._seg_max_ts)
            self._last_index_pos = pos
            self._seg_index_size += INDEX_ENTRY_SIZE
        self._seg_size = pos + n
        self._buf_len = start + n
        self._next_offset = offset + 1
        if start == 0:
            if self._autoflush and not self._armed:
                self._armed = True
                self._arm_flush()
        elif start + n >= self._max_batch:
            self.flush()
        return offset

    def append_record(self, record: Record) -> int:
        """Append a decoded record (e.g. one read from another log), keeping its origin and
        timestamp; it gets this log's next offset."""
        return self.append_fields(record.timestamp_ms, record.origin_router, record.origin_offset,
                                  record.client_id, record.topic, record.qos, record.retain,
                                  record.properties, record.payload)

    def _roll(self, offset: int, buf_pos: int) -> None:
        """Start a new segment at ``offset``; its file is created by the writer with the first chunk."""
        self._close_chunk(buf_pos)
        if self._segs:
            old = self._segs[-1]
            old.size = self._seg_size
            old.last_offset = offset - 1 if offset > old.base else old.last_offset
            old.max_ts = self._seg_max_ts if self._seg_max_ts != _NO_TS else old.max_ts
        seg = _Seg(self._dir, offset, FILE_HEADER_SIZE, 0, None, None)
        self._segs.append(seg)
        self._bases.append(offset)
        self._by_base[offset] = seg
        self._seg_base = offset
        self._seg_size = FILE_HEADER_SIZE
        self._seg_index_size = FILE_HEADER_SIZE
        self._last_index_pos = NO_INDEX_YET
        self._seg_max_ts = _NO_TS
        self._chunk_file_pos = FILE_HEADER_SIZE
        self._chunk_index_pos = FILE_HEADER_SIZE
        self._chunk_new = True
        self._must_roll = False

    def _close_chunk(self, buf_end: int) -> None:
        """End the chunk being filled at ``buf_end`` of the batch buffer; the next one continues the
        active segment right after it."""
        if buf_end > self._chunk_buf_start:
            self._chunks.append(Chunk(self._seg_base, self._chunk_file_pos, self._chunk_buf_start, buf_end,
                                      bytes(self._chunk_index), self._chunk_index_pos, self._chunk_new))
            self._chunk_file_pos += buf_end - self._chunk_buf_start
            self._chunk_index = bytearray()
            self._chunk_index_pos = self._seg_index_size
            self._chunk_new = False
        self._chunk_buf_start = buf_end

    def _autoflush_cb(self) -> None:
        """The linger is up. One timer at a time: a batch flushed before its timer (the broker
        writes a batch at once when an acknowledgement waits for it) leaves the timer armed for
        the next batch, which is then flushed a little sooner, rather than one timer per batch -
        at a fixed rate of QoS 1 messages a timer (and its callback) per message."""
        self._armed = False
        if not self._closed and self._buf:
            self.flush()

    # --------------------------------------------------------------------------------------- flush

    def flush(self, *, fsync: bool = False) -> None:
        """Hand the current batch to the writer (with a loop) or write it now (without one).

        ``fsync=True`` forces an fsync of everything written so far whatever the policy — for
        ``never``/``interval`` the only way to move ``durable_offset`` on demand.
        In synchronous mode a write failure raises LogUnavailable (the log is then failed).
        """
        if self._closed:
            return
        batch = None
        if self._buf and self._version != 1:
            batch = self._flush_v2()
            self._inflight.append(batch)
        elif self._buf:
            self._close_chunk(self._buf_len)
            if self._segs:
                active = self._segs[-1]
                active.size = self._seg_size
                active.last_offset = self._next_offset - 1
                if self._seg_max_ts != _NO_TS:
                    active.max_ts = self._seg_max_ts
            batch = Batch(b"".join(self._buf), self._chunks, self._buf_first, self._next_offset - 1)
            self._inflight.append(batch)
            self._buf = []
            self._buf_len = 0
            self._chunks = []
            self._chunk_buf_start = 0
            self._buf_first = self._next_offset
        elif not fsync:
            return
        self._hand(batch, fsync)

    def append_batch(self, first: int, records: list[Any], body: bytes | None) -> None:
        """Append records another log packed, keeping the bytes it packed (``body``: the msgpack
        of ``records``, field tuples in ``append_fields`` order, or None to pack them here;
        ``first`` must be the next offset): a replica takes its leader's batch with no
        per-record call, and writes it now."""
        if self._version == 1 or self._buf:
            if self._buf:
                self.flush()
            if self._version == 1:
                for rec in records:
                    self.append_fields(*rec)
                self.flush()
                return
        if self._refuse is not None:
            raise LogUnavailable(self._refuse, self._error)
        if first != self._next_offset:
            raise ValueError(f"append_batch: batch starts at {first}, the log at {self._next_offset}")
        self._buf = records
        self._next_offset = first + len(records)
        batch = self._flush_v2(body)
        self._inflight.append(batch)
        self._hand(batch, False)

    def _hand(self, batch: Batch | None, fsync: bool) -> None:
        """Give a flushed batch (and an fsync request) to the writer, or write it now."""
        if self._thread is not None:
            if batch is not None:
                report = self._thread.write_inline(batch, batch.size) if not fsync else None
                if report is None:
                    self._thread.put(batch)
                else:
                    self._apply_report(report)
            if fsync:
                self._thread.put(SYNC)
        else:
            report = self._core.process([batch] if batch is not None else [], force_sync=fsync)
            self._apply_report(report)
            if report.error is not None:
                raise LogUnavailable(f"commit log {self._dir}: write failed: {report.error}",
                                     report.error) from report.error

    def _flush_v2(self, body: bytes | None = None) -> Batch:
        """Encode the pending records as version 2 batches and place them in the segments.

        Normally that is one ``msgpack.packb`` of all the records (C), one CRC, a few struct packs
        and one index entry at most: the per-record cost of the log on the loop is then the tuple
        ``append_fields`` kept plus the packing, and nothing else. Only when the batch does not fit
        the active segment are the records packed one by one to cut it at segment boundaries.
        """
        recs = self._buf
        first = self._buf_first
        self._buf = []
        self._buf_len = 0
        self._buf_first = self._next_offset
        chunks: list[Chunk] = []
        if body is None:
            body = self._pack(recs)
        if self.on_batch is not None:
            self.on_batch(first, self._next_offset - 1, body)
        if not self._must_roll and (self._seg_size + BATCH_HEADER_SIZE + len(body) <= self._segment_bytes
                                    or (len(recs) == 1 and self._seg_size == FILE_HEADER_SIZE)):
            self._place_batch(first, recs, body, chunks)
        else:
            self._place_split(first, recs, chunks)
        active = self._segs[-1]
        active.size = self._seg_size
        active.last_offset = self._next_offset - 1
        active.max_ts = self._seg_max_ts
        return Batch(b"", chunks, first, self._next_offset - 1)

    def _place_split(self, first: int, recs: list[Any], chunks: list[Chunk]) -> None:
        """Cut ``recs`` into batches that fit their segments, rolling as needed; a record bigger
        than a segment gets a segment (and a batch) of its own."""
        pack = self._pack
        sizes = [len(pack(r)) for r in recs]
        i, n = 0, len(recs)
        while i < n:
            if self._must_roll:
                self._roll_v2(first + i)
            room = self._segment_bytes - self._seg_size - BATCH_HEADER_SIZE - MAX_ARRAY_HEADER
            j = i
            while j < n and sizes[j] <= room:
                room -= sizes[j]
                j += 1
            if j == i:
                if self._seg_size > FILE_HEADER_SIZE:
                    self._roll_v2(first + i)
                    continue
                j = i + 1
            part = recs[i:j]
            self._place_batch(first + i, part, pack(part), chunks)
            i = j

    def _place_batch(self, base: int, recs: list[Any], body: bytes, chunks: list[Chunk]) -> None:
        """Put one batch at the end of the active segment: header, index entry, chunk."""
        max_ts = max(map(_first_item, recs))
        header, body = encode_batch(base, recs, body, max_ts)
        pos = self._seg_size
        size = len(header) + len(body)
        if max_ts > self._seg_max_ts:
            self._seg_max_ts = max_ts
        index = b""
        index_pos = self._seg_index_size
        if pos - self._last_index_pos >= self._index_interval:
            index = INDEX_ENTRY.pack(base - self._seg_base, pos, self._seg_max_ts)
            self._last_index_pos = pos
            self._seg_index_size += INDEX_ENTRY_SIZE
        buf_start = chunks[-1].buf_end if chunks else 0
        chunks.append(Chunk(self._seg_base, pos, buf_start, buf_start + size, index, index_pos,
                            self._chunk_new, (header, body)))
        self._chunk_new = False
        self._seg_size = pos + size

    def _roll_v2(self, offset: int) -> None:
        """Start a new segment at ``offset`` (version 2: no chunk is open between flushes)."""
        self._chunk_buf_start = 0
        self._roll(offset, 0)

    # ---------------------------------------------------------------------------------- durability

    def on_durable(self, callback: Callable[[int], Any]) -> Callable[[], None]:
        """Call ``callback(durable_offset)`` on the event loop each time ``durable_offset`` advances.
        Returns a function that unregisters it."""
        self._durable_cbs.append(callback)
        return functools.partial(_remove, self._durable_cbs, callback)

    def on_written(self, callback: Callable[[int], Any]) -> Callable[[], None]:
        """Call ``callback(written_offset)`` on the event loop each time ``written_offset`` advances:
        the records up to it are in the kernel (they survive a crash of this process, not of the
        machine). Returns a function that unregisters it."""
        self._written_cbs.append(callback)
        return functools.partial(_remove, self._written_cbs, callback)

    def on_error(self, callback: Callable[[OSError | None], Any]) -> Callable[[], None]:
        """Call ``callback(error)`` on the loop when the log fails, ``callback(None)`` when it
        recovers. Returns a function that unregisters it."""
        self._error_cbs.append(callback)
        return functools.partial(_remove, self._error_cbs, callback)

    async def wait_durable(self, offset: int, *, fail_on_error: bool = True) -> int:
        """Wait until ``offset`` is durable; return the durable offset then.

        With ``fail_on_error`` (default) raise LogUnavailable if the log is or becomes failed before
        that — the caller should then not acknowledge; the record stays pending and is written if
        the log recovers. Requires a loop.
        """
        if self._durable_offset >= offset:
            return self._durable_offset
        if fail_on_error and self._refuse is not None:
            raise LogUnavailable(self._refuse, self._error)
        if self._loop is None:
            raise RuntimeError("wait_durable needs a CommitLog opened with a loop")
        fut: asyncio.Future[int] = self._loop.create_future()
        heapq.heappush(self._waiters, (offset, next(self._seq), fut, fail_on_error))
        return await fut

    def _report_threadsafe(self, report: Report) -> None:
        """Called on the writer thread: move the report onto the loop."""
        try:
            self._loop.call_soon_threadsafe(self._apply_report, report)  # type: ignore[union-attr]
        except RuntimeError:  # loop closed: close() applies the final report itself
            pass

    def _apply_report(self, report: Report) -> None:
        """Runs on the loop (or inline in synchronous mode). Idempotent: offsets only move forward.
        Reports come from the thread and from the loop's own writes: one from an older round than
        the last applied may arrive later (through ``call_soon_threadsafe``), and says nothing
        about whether the log is failed now."""
        if report.round >= self._round:
            self._round = report.round
        elif report.error is not self._error:
            report = report._replace(error=self._error)  # stale: the newer round said it
        written = report.written_offset
        if written > self._written_offset:
            inflight = self._inflight
            by_base = self._by_base
            while inflight and inflight[0].last_offset <= written:
                batch = inflight.popleft()
                for c in batch.chunks:
                    seg = by_base.get(c.base)
                    if seg is not None:
                        end = c.file_pos + c.buf_end - c.buf_start
                        if end > seg.written_end:
                            seg.written_end = end
            self._written_offset = written
            for cb in list(self._written_cbs):
                try:
                    cb(written)
                except Exception:
                    log.exception("commit log on_written callback failed")
        if report.error is not None and self._error is None:
            self._enter_failed(report.error)
        elif report.error is not None:
            log.debug("commit log %s: retry failed: %s", self._dir, report.error)
        elif self._error is not None:
            self._error = None
            if not self._closed:
                self._refuse = None
            log.warning("commit log %s: writes succeed again; accepting appends", self._dir)
            self._call_error_cbs(None)
        durable = report.durable_offset
        if durable > self._durable_offset:
            self._durable_offset = durable
            for cb in list(self._durable_cbs):
                try:
                    cb(durable)
                except Exception:
                    log.exception("commit log on_durable callback failed")
            waiters = self._waiters
            while waiters and waiters[0][0] <= durable:
                fut = heapq.heappop(waiters)[2]
                if not fut.done():
                    fut.set_result(durable)
        if report.recover_attempted:
            futs, self._recover_futs = self._recover_futs, []
            for f in futs:
                if not f.done():
                    f.set_result(self._error is None)

    def _enter_failed(self, error: OSError) -> None:
        self._error = error
        self._refuse = f"commit log {self._dir} unavailable: {error}"
        log.error("commit log %s: write failed (%s); refusing appends until a retry succeeds; "
                  "%d records are kept in memory, not durable", self._dir, error,
                  self._next_offset - 1 - self._durable_offset)
        self._fail_waiters(LogUnavailable(self._refuse, error), only_fail_on_error=True)
        self._call_error_cbs(error)

    def _fail_waiters(self, exc: LogUnavailable, *, only_fail_on_error: bool) -> None:
        keep = []
        for entry in self._waiters:
            if entry[3] or not only_fail_on_error:
                if not entry[2].done():
                    entry[2].set_exception(exc)
            else:
                keep.append(entry)
        heapq.heapify(keep)
        self._waiters = keep

    def _call_error_cbs(self, error: OSError | None) -> None:
        for cb in list(self._error_cbs):
            try:
                cb(error)
            except Exception:
                log.exception("commit log on_error callback failed")

    def try_recover(self) -> bool:
        """Retry the writes that failed (the broker calls this periodically while ``error`` is set).

        Synchronous mode: retries now and returns whether the log is healthy. With a loop: queues the
        retry and returns False while failed (the outcome arrives through ``error``, ``on_error`` and
        ``on_durable``; ``await recover()`` waits for it). Returns True when not failed.
        """
        if self._error is None or self._closed:
            return self._error is None
        if self._thread is None:
            self._apply_report(self._core.process([], recover=True))
            return self._error is None
        self._thread.put(RECOVER)
        return False

    async def recover(self) -> bool:
        """Retry the failed writes and wait for the outcome: True when the log is healthy again."""
        if self._error is None or self._closed or self._thread is None:
            return self.try_recover()
        fut: asyncio.Future[bool] = self._loop.create_future()  # type: ignore[union-attr]
        self._recover_futs.append(fut)
        self._thread.put(RECOVER)
        return await fut

    # ---------------------------------------------------------------------------------------- read

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
            if type(buf) is list:  # version 2 records not flushed yet: their field tuples
                recs, nbytes = _take([_new_tuple(Record, (_first + i, *t)) for i, t in enumerate(buf)],
                                     from_offset, max_records - len(out), bytes_left, at_least_one=not out)
            else:
                recs, nbytes = _read_buffer(buf, from_offset, max_records - len(out), bytes_left,
                                            at_least_one=not out, version=self._version)
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
        what is not flushed yet: version 1 bytes, version 2 the list of field tuples."""
        bufs: list[tuple[Any, int, int]] = [(b.content(), b.first_offset, b.last_offset) for b in self._inflight]
        if self._buf:
            pending = b"".join(self._buf) if self._version == 1 else self._buf
            bufs.append((pending, self._buf_first, self._next_offset - 1))
        return bufs

    # ----------------------------------------------------------------------------------- retention

    def enforce_retention(self, now_ms: int | None = None) -> list[DeletedSegment]:
        """Delete whole segments beyond ``retention_bytes`` (total size of the segment files) or
        whose newest record is older than ``retention_hours``; oldest first, never the active one,
        never one with unwritten data. Returns what was deleted. The unlinks run on the writer
        thread (with a loop), so this does no I/O on the loop. The broker calls it periodically."""
        if self.retention_bytes is None and self.retention_hours is None:
            return []
        if self._segs:
            self._segs[-1].size = self._seg_size
        total = sum(s.size for s in self._segs)
        now_ms = _time_ns() // 1_000_000 if now_ms is None else now_ms
        cutoff = None if self.retention_hours is None else now_ms - int(self.retention_hours * 3_600_000)
        deleted: list[DeletedSegment] = []
        while len(self._segs) > 1:
            seg = self._segs[0]
            if seg.written_end < seg.size:
                break
            if self.retention_bytes is not None and total > self.retention_bytes:
                reason = "size"
            elif cutoff is not None and (seg.max_ts is None or seg.max_ts < cutoff):
                reason = "age"
            else:
                break
            self._segs.pop(0)
            self._bases.pop(0)
            del self._by_base[seg.base]
            self._open_readers.forget(seg.base)
            seg.reader.close()
            total -= seg.size
            deleted.append(DeletedSegment(seg.base, seg.last_offset, seg.size, reason))
        if deleted:
            bases = [d.base_offset for d in deleted]
            if self._thread is not None:
                self._thread.put(delete_item(bases))
            else:
                self._core.process([], deletes=bases)
            log.info("commit log %s: retention deleted %d segment(s), offsets %d..%s", self._dir,
                     len(deleted), deleted[0].base_offset, deleted[-1].last_offset)
        return deleted

    def segments(self) -> list[SegmentState]:
        """The log's view of its segments, oldest first (no I/O)."""
        out = []
        for i, s in enumerate(self._segs):
            active = i == len(self._segs) - 1
            out.append(SegmentState(
                s.base, s.reader.path, self._seg_size if active else s.size, s.written_end,
                (self._next_offset - 1 if self._next_offset > s.base else None) if active else s.last_offset,
                (self._seg_max_ts if self._seg_max_ts != _NO_TS else s.max_ts) if active else s.max_ts,
                active))
        return out

    def join_history(self, directory: str, last: int) -> int:
        """Take the segments of a closed log in ``directory`` in as this log's oldest: the records
        of this log's partition below ``start_offset`` (up to ``last``), fetched from a node that
        holds them (``router.replication.HistoryState``: a replica placed at its leader's
        high-water mark, a log continued after a lost disk). ``directory`` must be on this log's
        file system (the files are moved); their indexes are checked as at recovery. Returns how
        many segments joined. A gap between the history and the log stays a gap (reads skip it).

        A log that has no segment yet gets its empty first one on disk before the history
        joins, so that a reopen goes on at its offset, not at the end of the history.

        Blocking (renames, fsyncs, index checks): a log with a loop joins with
        ``await join_history_async(...)``, which does the same work in a thread."""
        create = self._join_begin(last)
        return self._join_end(self._join_disk(directory, create), create)

    async def join_history_async(self, directory: str, last: int) -> int:
        """``join_history`` with its disk work in a thread of the loop's executor: the loop never
        waits for the disk (a history of many segments takes an fsync and an index check each).
        Appends, flushes and reads go on meanwhile; the history's segments lie below everything
        they touch, and join the log's view of its segments once on disk. A log closed meanwhile
        finds them in its directory when it is opened again."""
        create = self._join_begin(last)
        loop = asyncio.get_running_loop()
        segs = await loop.run_in_executor(None, self._join_disk, directory, create)
        return self._join_end(segs, create)

    def _join_begin(self, last: int) -> int | None:
        """Check a join on the loop; the base of the empty first segment to create, if the log has none."""
        if last >= self.start_offset:
            raise ValueError(f"join_history: a history to {last} for a log that starts at {self.start_offset}")
        return None if self._segs else self._buf_first

    def _join_disk(self, directory: str, create: int | None) -> list[_Seg] | None:
        """The disk part of a join (any thread): create the empty first segment if asked, move the
        history's files in, fsync the directory, check each segment as recovery does. None: the
        history holds no segment. Reads only what never changes after ``__init__``.

        The empty segment is written in place (``O_CREAT``, its header at 0, no truncation, no
        rename): if a flush rolls into the same segment meanwhile, the writer creates the same
        file with the same header, so neither write undoes the other."""
        logs, _ = list_segment_files(directory)
        if not logs:
            return None
        if create is not None:
            for name, magic in ((segment_name(create), MAGIC_LOG), (index_name(create), MAGIC_INDEX)):
                fd = os.open(os.path.join(self._dir, name), os.O_CREAT | os.O_WRONLY | _O_CLOEXEC, 0o600)
                try:
                    os.pwrite(fd, pack_file_header(magic, create, self._version), 0)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            _fsync_dir(self._dir)  # the segment is on disk before any history file is
        for base in logs:
            for name in (segment_name(base), index_name(base)):
                os.rename(os.path.join(directory, name), os.path.join(self._dir, name))
        _fsync_dir(self._dir)
        return [self._scan_closed(base) for base in logs]

    def _join_end(self, segs: list[_Seg] | None, create: int | None) -> int:
        """On the loop: the history's segments become the log's oldest."""
        if segs is None or self._closed:
            return 0
        if create is not None and not self._segs:  # nothing flushed meanwhile: the empty segment is the active one
            self._add_seg(_Seg(self._dir, create, FILE_HEADER_SIZE, FILE_HEADER_SIZE, None, None))
            self._seg_base = create
            self._seg_size = self._seg_index_size = FILE_HEADER_SIZE
            self._last_index_pos = NO_INDEX_YET
            self._seg_max_ts = _NO_TS
            self._chunk_file_pos = self._chunk_index_pos = FILE_HEADER_SIZE
            self._chunk_new = False
        current, self._segs, self._bases, self._by_base = self._segs, [], [], {}
        for seg in (*segs, *current):
            self._add_seg(seg)
        return len(segs)

    def stats(self) -> dict[str, Any]:
        """Counters for the broker's stats snapshot."""
        return {
            "start_offset": self.start_offset,
            "next_offset": self._next_offset,
            "written_offset": self._written_offset,
            "durable_offset": self._durable_offset,
            "pending_records": self.pending_records,
            "segments": len(self._segs),
            "bytes": sum(s.size for s in self._segs[:-1]) + (self._seg_size if self._segs else 0),
            "error": None if self._error is None else str(self._error),
            "read_records": self.read_records,
            "read_bytes": self.read_bytes,
        }

    # ------------------------------------------------------------------------------------- closing

    def close(self) -> None:
        """Flush, write and (unless ``never``) fsync what is pending, stop the writer thread.

        Blocks until the writer is done: call it at shutdown, or use ``aclose`` from a coroutine."""
        if self._closed:
            return
        self._begin_close()
        if self._thread is not None:
            self._thread.put(STOP)
            self._thread.join()
            report = self._thread.last_report
        else:
            report = self._core.process([], recover=True, stop=True)
        self._end_close(report)

    async def aclose(self) -> None:
        """``close`` without blocking the loop while the writer finishes."""
        if self._closed:
            return
        self._begin_close()
        if self._thread is not None:
            self._thread.put(STOP)
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
            report = self._thread.last_report
        else:
            report = self._core.process([], recover=True, stop=True)
        self._end_close(report)

    def _begin_close(self) -> None:
        if self._buf:
            try:
                self.flush()
            except LogUnavailable:
                pass
        self._closed = True
        self._refuse = f"commit log {self._dir} is closed"

    def _end_close(self, report: Report | None) -> None:
        if report is not None:
            self._apply_report(report)
        lost = self._next_offset - 1 - self._written_offset
        if lost > 0:
            log.error("commit log %s closed in the failed state: %d records were not written",
                      self._dir, lost)
        self._fail_waiters(LogUnavailable(f"commit log {self._dir} is closed"), only_fail_on_error=False)
        for f in self._recover_futs:
            if not f.done():
                f.set_result(False)
        for seg in self._segs:
            seg.reader.close()

    def __enter__(self) -> CommitLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"CommitLog({self._dir!r}, offsets {self.start_offset}..{self._next_offset - 1}, "
                f"fsync={self._policy.value}{', FAILED' if self._error else ''})")

    # ------------------------------------------------------------------------------------ recovery

    def _recover(self) -> int:
        """Bring the directory to a consistent state; return the next offset.

        * orphan ``.index`` files (their ``.log`` was deleted) are removed;
        * older segments: their index is checked cheaply (header, first and last entry, the records
          after the last entry) and rebuilt if it does not match; corruption found there is logged,
          not repaired (reads skip it; ``check`` reports it);
        * the last segment is scanned record by record and truncated at the first incomplete or bad
          record; its index is rebuilt if it differs from what the scan produced;
        * the last segment and the directory are fsynced, so ``durable_offset`` starts at the end.
        """
        os.makedirs(self._dir, mode=0o700, exist_ok=True)
        for name in os.listdir(self._dir):
            if name.endswith(".index.tmp"):
                _unlink(os.path.join(self._dir, name))
        logs, indexes = list_segment_files(self._dir)
        for base in sorted(set(indexes) - set(logs)):
            log.warning("commit log %s: removing index %d without a segment", self._dir, base)
            _unlink(os.path.join(self._dir, f"{base:020d}.index"))
        if not logs:
            return 0
        for base in logs[:-1]:
            self._load_closed(base)
        return self._recover_tail(logs[-1])

    def _add_seg(self, seg: _Seg) -> None:
        self._segs.append(seg)
        self._bases.append(seg.base)
        self._by_base[seg.base] = seg

    def _load_closed(self, base: int) -> None:
        self._add_seg(self._scan_closed(base))

    def _scan_closed(self, base: int) -> _Seg:
        """A closed segment as recovery finds it (index checked, rebuilt if wrong), not yet one of
        the log's: blocking, and it changes nothing of the log's state (a join runs it in a thread)."""
        seg = _Seg(self._dir, base, 0, 0, None, None)
        reader = seg.reader
        size = os.stat(reader.path).st_size
        seg.size = seg.written_end = size
        try:
            fd = reader.fd()
            os.fsync(fd)  # pages a crashed predecessor left dirty: durable_offset starts at the end
        except (LogFormatError, OSError) as exc:
            log.warning("commit log %s: segment %d is unreadable (%s); reads will skip it",
                        self._dir, base, exc)
            return seg
        res = None
        problem = self._index_problem(reader, size)
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
            res = scan_segment(fd, base, size, index_interval=self._index_interval, version=reader.version)
            if problem is not None:
                log.warning("commit log %s: index of segment %d rebuilt (%s)", self._dir, base, problem)
                write_index(self._dir, base, res.index, version=reader.version)
                reader.reopen_index()
        if res.error is not None:
            log.warning("commit log %s: segment %d has a bad record at position %d (%s); %d bytes after "
                        "it are unreadable; reads skip to the next segment", self._dir, base,
                        res.valid_end, res.error, size - res.valid_end)
        seg.last_offset = res.last_offset
        seg.max_ts = res.max_timestamp
        reader.close()  # recovery opened every segment: reads reopen the ones they need
        return seg

    def _index_problem(self, reader: SegmentReader, size: int) -> str | None:
        """Why an older segment's index cannot be trusted, None if it can. Checks every entry is in
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

    def _recover_tail(self, base: int) -> int:
        path = os.path.join(self._dir, segment_name(base))
        fd = os.open(path, os.O_RDWR | _O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            if size < FILE_HEADER_SIZE:
                log.warning("commit log %s: segment %d has a partial header (%d bytes); rewritten",
                            self._dir, base, size)
                os.ftruncate(fd, 0)
                os.pwrite(fd, pack_file_header(MAGIC_LOG, base, self._version), 0)
                size = FILE_HEADER_SIZE
                version = self._version
            else:
                got, version = read_file_header(os.pread(fd, FILE_HEADER_SIZE, 0), MAGIC_LOG, path)
                if got != base:
                    raise LogFormatError(f"{path}: header says base offset {got}")
            res = scan_segment(fd, base, size, index_interval=self._index_interval, version=version)
            if res.error is not None:
                log.warning("commit log %s: segment %s: truncated at position %d, %d bytes dropped (%s)",
                            self._dir, segment_name(base), res.valid_end, size - res.valid_end, res.error)
                os.ftruncate(fd, res.valid_end)
            if version != self._version:
                if res.last_offset is None:
                    # Empty: it becomes a segment of the version this log writes.
                    os.pwrite(fd, pack_file_header(MAGIC_LOG, base, self._version), 0)
                    version = self._version
                else:
                    # Written in the other version (an upgrade, or format_version changed): closed as
                    # it is; the next flush starts a new segment.
                    self._must_roll = True
            os.fsync(fd)
        finally:
            os.close(fd)
        # The index: rebuild unless it is exactly what the scan produced.
        ipath = os.path.join(self._dir, f"{base:020d}.index")
        existing = b""
        try:
            with open(ipath, "rb") as f:
                data = f.read()
            ok_header = read_file_header(data, MAGIC_INDEX, ipath)[1] == version
            existing = data[FILE_HEADER_SIZE:]
        except (OSError, ValueError, LogFormatError):
            ok_header = False
        if not ok_header or existing != bytes(res.index):
            if ok_header and bytes(res.index).startswith(existing):
                log.debug("commit log %s: index of the last segment completed", self._dir)
            else:
                log.warning("commit log %s: index of segment %d did not match its records; rebuilt",
                            self._dir, base)
            write_index(self._dir, base, res.index, version=version)
        _fsync_dir(self._dir)
        seg = _Seg(self._dir, base, res.valid_end, res.valid_end, res.last_offset, res.max_timestamp)
        self._add_seg(seg)
        self._seg_base = base
        self._seg_size = res.valid_end
        self._seg_index_size = FILE_HEADER_SIZE + len(res.index)
        self._last_index_pos = res.last_index_pos
        self._seg_max_ts = res.max_timestamp if res.max_timestamp is not None else _NO_TS
        self._chunk_file_pos = res.valid_end
        self._chunk_index_pos = self._seg_index_size
        self._chunk_new = False
        return res.last_offset + 1 if res.last_offset is not None else base


def _read_buffer(buf: bytes, from_offset: int, max_records: int, max_bytes: int, *,
                 at_least_one: bool, version: int = 1) -> tuple[list[Record], int]:
    """Decode records >= ``from_offset`` from a pending batch buffer (records, or version 2
    batches, back to back)."""
    if version != 1:
        recs, _ = decode_records(buf, verify=False, version=version)
        return _take(recs, from_offset, max_records, max_bytes, at_least_one=at_least_one)
    end = len(buf)
    pos, _first, found = skip_to_offset(buf, 0, end, from_offset)
    if not found:
        return [], 0
    with memoryview(buf) as mv:
        data = bytes(mv[pos:end])
    recs, consumed = decode_records(data, max_records=max_records, max_bytes=max_bytes, verify=False)
    if recs and consumed > max_bytes and not at_least_one:
        return [], 0
    return recs, consumed


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


def _check_fields(qos: int, strings: tuple[int, ...], blobs: tuple[int, ...]) -> None:
    """The limits version 1 has in its header (and MQTT has anyway), kept for every version so a
    log's appends take the same values whatever it writes; given the fields' byte lengths.
    Raises ValueError."""
    if qos not in (0, 1, 2):
        raise ValueError(f"qos must be 0, 1 or 2, not {qos!r}")
    if any(n > 0xFFFF for n in strings) or any(n > 0xFFFFFFFF for n in blobs):
        raise ValueError("record field out of range (strings are at most 65535 bytes, properties "
                         "and payload under 4 GiB)")


def _nothing() -> None:
    pass


def _remove(lst: list[Any], item: Any) -> None:
    try:
        lst.remove(item)
    except ValueError:
        pass


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | _O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
