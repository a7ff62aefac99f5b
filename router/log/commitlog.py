"""``CommitLog``: the per-router segmented commit log, written from an asyncio event loop.

This module holds the appender: appends and flushes (format version 2 batches placed in segments).
The rest of ``CommitLog`` is by concern, in mixins that share its state (so the append path reads
its attributes with no hop): ``durability`` (the writer's reports, callbacks, the failed state,
closing), ``reads``, ``retention``, ``history`` (joining fetched history); ``loader`` recovers the
directory at open. ``writer`` is the thread that does the I/O, ``segment`` and ``format`` the bytes.

Why it is shaped this way:

* ``append_fields`` runs once per PUBLISH on the event loop, so it only keeps a tuple of the record's
  fields and counts the offset — no encoding, no syscall. ``flush`` encodes the whole batch at once
  (format version 2: one ``msgpack.packb`` and one CRC) and places it (segment roll, index entry).
  Version 1 segments (older logs) are read, never written.
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
import functools
import itertools
import logging
import operator
import os
import time
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

import msgpack

from .durability import Durability
from .errors import LogUnavailable
from .format import (
    BATCH_HEADER_SIZE,
    FILE_HEADER_SIZE,
    FORMAT_VERSION,
    INDEX_ENTRY,
    INDEX_ENTRY_SIZE,
    MAX_ARRAY_HEADER,
    MAX_SEGMENT_POSITION,
    Record,
    encode_batch,
)
from .history import HistoryJoin
from .loader import NO_TS, Seg, load
from .reads import Reads
from .retention import DeletedSegment, Retention
from .scan import NO_INDEX_YET
from .segment import OpenReaders
from .writer import (
    SYNC,
    Batch,
    Chunk,
    FsyncPolicy,
    WriterCore,
    WriterThread,
)

log = logging.getLogger(__name__)

_time_ns = time.time_ns
_first_item = operator.itemgetter(0)

__all__ = ["CommitLog", "DeletedSegment", "SegmentState"]


class SegmentState(NamedTuple):
    """The log's own view of one segment (``CommitLog.segments``)."""

    base_offset: int
    path: str
    size: int             # bytes assigned, including records not yet written
    written_size: int     # bytes on disk
    last_offset: int | None
    max_timestamp: int | None
    active: bool


class CommitLog(Durability, Reads, Retention, HistoryJoin):
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
    * ``format_version``: 2, the only version written (one CRC and one msgpack body per batch, see
      FORMAT.md). Version 1 segments (an older log) are read; an active segment of version 1 is
      closed and the next flush starts a new segment.

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
        if format_version != FORMAT_VERSION:
            raise ValueError(f"format_version must be {FORMAT_VERSION} (version 1 logs are read, not written)")
        if not 0 <= linger_ms <= 1000:
            raise ValueError("linger_ms must be between 0 and 1000")
        self._version = format_version
        self._dir = os.fspath(directory)
        self.router_id = router_id
        self._loop = loop
        self._interval_s = fsync_interval_ms / 1000.0
        self._segment_bytes = segment_bytes
        self._index_interval = index_interval_bytes
        self.retention_bytes = retention_bytes
        self.retention_hours = retention_hours
        self._max_batch = max_batch_bytes
        self._autoflush = autoflush and loop is not None

        # Segments (loop side).
        self._segs: list[Seg] = []
        self._bases: list[int] = []
        self._by_base: dict[int, Seg] = {}
        self._open_readers = OpenReaders()  # the segments whose read descriptors stay open
        # Active segment as the appender sees it (including bytes not yet written).
        self._seg_base = -1
        self._seg_size = 1 << 62       # no active segment: the first append rolls
        self._seg_index_size = FILE_HEADER_SIZE
        self._last_index_pos = NO_INDEX_YET
        self._seg_max_ts = NO_TS
        # The batch being filled: the records' field tuples, encoded at flush (``_flush_v2``);
        # ``_buf_len`` the bytes of their payloads, what ``max_batch_bytes`` is compared with.
        self._buf: list[Any] = []
        self._buf_len = 0
        self._must_roll = False  # the active segment is of the other format version: never append to it
        # One packer for the life of the log: its buffer is allocated once and stays warm. A fresh
        # one per flush (msgpack.packb) allocates 256 KiB each time, written into fresh pages.
        self._pack = msgpack.Packer().pack
        self._buf_first = 0
        self._chunk_new = False  # the next chunk placed opens its segment (the writer creates the file)
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

        loaded = load(self._dir, self._version, self._index_interval)
        for seg in loaded.segments:
            self._add_seg(seg)
        if loaded.tail is not None:
            self._set_active(*loaded.tail)
        self._must_roll = loaded.must_roll
        self._next_offset = loaded.next_offset
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
        """The format version of the segments this log writes (2)."""
        return self._version

    @property
    def next_offset(self) -> int:
        """Offset the next append gets."""
        return self._next_offset

    @property
    def start_offset(self) -> int:
        """First offset still in the log (retention moves it forward)."""
        return self._segs[0].base if self._segs else self._buf_first  # records not flushed yet count

    @property
    def closed(self) -> bool:
        return self._closed

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
        # Strings are kept as str: no encode here and decode in append_bytes.
        if self._refuse is not None:
            raise LogUnavailable(self._refuse, self._error)
        # ``type(x) is str`` does not narrow mypy's else branch (x is bytes-like there): hence the
        # ignores, for isinstance would take a str subclass that bytes() refuses today.
        t = topic if type(topic) is str else bytes(topic).decode()  # type: ignore[arg-type]
        c = client_id if type(client_id) is str else bytes(client_id).decode()  # type: ignore[arg-type]
        o = origin_router if origin_router is None or type(origin_router) is str \
            else bytes(origin_router).decode()  # type: ignore[arg-type]
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

    def append_bytes(self, topic: bytes, payload: bytes, qos: int, retain: bool, client_id: bytes,
                     properties: bytes, timestamp_ms: int, origin_router: bytes | None = None,
                     origin_offset: int | None = None) -> int:
        """``append`` with positional arguments, strings as UTF-8 bytes and a timestamp given; checks
        the fields (ValueError, nothing appended) where ``append_fields`` trusts its caller."""
        if self._refuse is not None:
            raise LogUnavailable(self._refuse, self._error)
        _check_fields(qos, (len(topic), len(client_id), 0 if origin_router is None else len(origin_router)),
                      (len(properties), len(payload)))
        return self.append_fields(timestamp_ms, None if origin_router is None else bytes(origin_router).decode(),
                                  origin_offset, bytes(client_id).decode(), bytes(topic).decode(), int(qos),
                                  bool(retain), bytes(properties), bytes(payload))

    def append_record(self, record: Record) -> int:
        """Append a decoded record (e.g. one read from another log), keeping its origin and
        timestamp; it gets this log's next offset."""
        return self.append_fields(record.timestamp_ms, record.origin_router, record.origin_offset,
                                  record.client_id, record.topic, record.qos, record.retain,
                                  record.properties, record.payload)

    def _roll(self, offset: int) -> None:
        """Start a new segment at ``offset``; its file is created by the writer with the first chunk."""
        if self._segs:
            old = self._segs[-1]
            old.size = self._seg_size
            old.last_offset = offset - 1 if offset > old.base else old.last_offset
            old.max_ts = self._seg_max_ts if self._seg_max_ts != NO_TS else old.max_ts
        self._add_seg(Seg(self._dir, offset, FILE_HEADER_SIZE, 0, None, None))
        self._set_active(offset, FILE_HEADER_SIZE, FILE_HEADER_SIZE, NO_INDEX_YET, NO_TS)
        self._chunk_new = True
        self._must_roll = False

    def _set_active(self, base: int, size: int, index_size: int, last_index_pos: int, max_ts: int) -> None:
        """Where appends go on: the active segment as the appender sees it (``loader.Tail``'s fields)."""
        self._seg_base = base
        self._seg_size = size
        self._seg_index_size = index_size
        self._last_index_pos = last_index_pos
        self._seg_max_ts = max_ts
        self._chunk_new = False

    def _add_seg(self, seg: Seg) -> None:
        self._segs.append(seg)
        self._bases.append(seg.base)
        self._by_base[seg.base] = seg

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
        if self._buf:
            batch = self._flush_v2()
            self._inflight.append(batch)
        elif not fsync:
            return
        self._hand(batch, fsync)

    def append_batch(self, first: int, records: list[Any], body: bytes | None) -> None:
        """Append records another log packed, keeping the bytes it packed (``body``: the msgpack
        of ``records``, field tuples in ``append_fields`` order, or None to pack them here;
        ``first`` must be the next offset): a replica takes its leader's batch with no
        per-record call, and writes it now."""
        if self._buf:
            self.flush()
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
        return Batch(chunks, first, self._next_offset - 1)

    def _place_split(self, first: int, recs: list[Any], chunks: list[Chunk]) -> None:
        """Cut ``recs`` into batches that fit their segments, rolling as needed; a record bigger
        than a segment gets a segment (and a batch) of its own."""
        pack = self._pack
        sizes = [len(pack(r)) for r in recs]
        i, n = 0, len(recs)
        while i < n:
            if self._must_roll:
                self._roll(first + i)
            room = self._segment_bytes - self._seg_size - BATCH_HEADER_SIZE - MAX_ARRAY_HEADER
            j = i
            while j < n and sizes[j] <= room:
                room -= sizes[j]
                j += 1
            if j == i:
                if self._seg_size > FILE_HEADER_SIZE:
                    self._roll(first + i)
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

    # -------------------------------------------------------------------------------------- segments

    def segments(self) -> list[SegmentState]:
        """The log's view of its segments, oldest first (no I/O)."""
        out = []
        for i, s in enumerate(self._segs):
            active = i == len(self._segs) - 1
            out.append(SegmentState(
                s.base, s.reader.path, self._seg_size if active else s.size, s.written_end,
                (self._next_offset - 1 if self._next_offset > s.base else None) if active else s.last_offset,
                (self._seg_max_ts if self._seg_max_ts != NO_TS else s.max_ts) if active else s.max_ts,
                active))
        return out

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

    # ------------------------------------------------------------------------------------- context

    def __enter__(self) -> CommitLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"CommitLog({self._dir!r}, offsets {self.start_offset}..{self._next_offset - 1}, "
                f"fsync={self._policy.value}{', FAILED' if self._error else ''})")


def _check_fields(qos: int, strings: tuple[int, ...], blobs: tuple[int, ...]) -> None:
    """The limits version 1 has in its header (and MQTT has anyway), kept so a log's appends take
    the same values whatever version wrote its older segments; given the fields' byte lengths.
    Raises ValueError."""
    if qos not in (0, 1, 2):
        raise ValueError(f"qos must be 0, 1 or 2, not {qos!r}")
    if any(n > 0xFFFF for n in strings) or any(n > 0xFFFFFFFF for n in blobs):
        raise ValueError("record field out of range (strings are at most 65535 bytes, properties "
                         "and payload under 4 GiB)")


def _nothing() -> None:
    pass
