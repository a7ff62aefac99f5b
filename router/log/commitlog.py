"""``CommitLog``: the per-router segmented commit log, written from an asyncio event loop.

This module holds the append path and ``CommitLog``, assembled from parts it owns, each in its
module, all holding the one state they share, the log's segments (``segments.LogSegments``):
``config`` (its options), ``loader`` (recovery at open), ``active`` (where batches are placed),
``handoff`` (requests to the writer), ``durability``, ``reads``, ``retention``, ``history``. ``writer`` is the thread that
does the I/O (``messages``: what passes to it and back), ``segment`` and ``format`` the bytes.
The append path reads the log's own attributes, with no hop through a part.

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
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import msgpack

from . import fields
from .active import ActiveSegment
from .config import LogConfig
from .durability import Durability
from .errors import LogUnavailable
from .format import FORMAT_VERSION, Record
from .handoff import Handoff
from .history import HistoryJoin
from .loader import load
from .messages import Batch, Report
from .reads import LogReads
from .retention import DeletedSegment, drop_past_retention
from .segments import LogSegments, Seg, SegmentState
from .writer import FsyncPolicy, WriterCore, WriterThread

log = logging.getLogger(__name__)

_time_ns = time.time_ns

__all__ = ["CommitLog", "DeletedSegment", "SegmentState"]


class CommitLog:
    """A directory of segments, appended to from one event loop (or synchronously without one).

    ``router_id``: default ``origin_router`` of records appended here. ``loop``: the event loop the
    log belongs to; ``None`` selects synchronous mode. The other keyword arguments are the log's
    options (``config.LogConfig``: what each means and its range).

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
        self.config = config = LogConfig(
            LogConfig.policy(fsync), fsync_interval_ms, segment_bytes, index_interval_bytes, retention_bytes,
            retention_hours, max_batch_bytes, max_unsynced_bytes, page_cache_bytes, autoflush, format_version,
            linger_ms).checked()
        self._policy = config.fsync
        self._version = format_version
        self._dir = os.fspath(directory)
        self.router_id = router_id
        self.retention_bytes = retention_bytes
        self.retention_hours = retention_hours
        self._max_batch = max_batch_bytes
        self._autoflush = autoflush and loop is not None

        self._segments = segments = LogSegments()  # shared by the parts below
        # The batch being filled: the records' field tuples, encoded at flush (``_flush_v2``);
        # ``_buf_len`` the bytes of their payloads, what ``max_batch_bytes`` is compared with.
        self._buf: list[Any] = []
        self._buf_len = 0
        # One packer for the life of the log: its buffer is allocated once and stays warm. A fresh
        # one per flush (msgpack.packb) allocates 256 KiB each time, written into fresh pages.
        self._pack = msgpack.Packer().pack
        self._active = ActiveSegment(self._dir, segment_bytes, index_interval_bytes, segments, self._pack)
        self._buf_first = 0
        self._inflight: deque[Batch] = deque()  # flushed, not yet reported written
        self._linger_s = linger_s = config.linger_s
        # What the first append of a batch calls to have the batch flushed (no method call between).
        self._armed = False  # a flush is scheduled (_autoflush_cb clears it; ``at_iteration_end`` too)
        self._loop = loop
        self._timer: asyncio.TimerHandle | None = None  # the linger's, armed at an iteration's end
        self._arm_flush: Callable[[], object] = (
            functools.partial(loop.call_later, linger_s, self._autoflush_cb) if loop is not None and linger_s
            else functools.partial(loop.call_soon, self._autoflush_cb) if loop is not None
            else _nothing)

        self._closed = False
        # Why append refuses (None when healthy). A fresh exception per raise: re-raising one instance
        # would grow its traceback on every refused publish.
        self._refuse: str | None = None
        # Called with (first offset, last offset, the records' msgpack body) for each version 2
        # batch as it is flushed: replication sends those bytes to followers as they are.
        self.on_batch: Callable[[int, int, bytes], Any] | None = None
        self.read_records = 0  # what read() returned, for the stats snapshot (log.read_records)
        self.read_bytes = 0  # their payload bytes

        loaded = load(self._dir, self._version, index_interval_bytes)
        for seg in loaded.segments:
            segments.add(seg)
        if loaded.tail is not None:
            self._active.resume(*loaded.tail)
        self._active.must_roll = loaded.must_roll
        self._next_offset = loaded.next_offset
        self._buf_first = self._next_offset

        # The parts.
        self._durability = durability = Durability(self._dir, loop, segments, self._inflight,
                                                   self._next_offset - 1, self._failed, self._healthy)
        self._apply_report = durability.apply  # the writer's reports, straight to their part
        self._reads = LogReads(self._dir, segments, self._inflight)
        self._history = HistoryJoin(self._dir, self._version, index_interval_bytes, segments)
        self._core = WriterCore(self._dir, self._policy, fsync_interval_ms / 1000.0,
                                written_offset=self._next_offset - 1, durable_offset=self._next_offset - 1,
                                page_cache_bytes=page_cache_bytes, max_unsynced_bytes=max_unsynced_bytes,
                                version=format_version)
        self._thread: WriterThread | None = None
        if loop is not None:
            self._thread = WriterThread(self._core, durability.report_threadsafe,
                                        name=f"commitlog-writer:{os.path.basename(self._dir)}")
        self._handoff = Handoff(self._dir, self._core, self._thread, durability.apply)
        # ``flush``'s own way for a small batch: the loop writes it (None: no thread to spare it).
        self._write_inline: Callable[[Batch, int], Report | None] | None = (
            self._thread.write_inline if self._thread is not None else None)

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
        return self._segments.all[0].base if self._segments.all else self._buf_first  # records not flushed yet count

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def written_offset(self) -> int:
        """Last offset handed to the OS (readable by other processes); -1 when none."""
        return self._durability.written_offset

    @property
    def durable_offset(self) -> int:
        """Last offset known fsynced (for ``never``: what was synced at open or by flush(fsync=True))."""
        return self._durability.durable_offset

    @property
    def error(self) -> OSError | None:
        """The OSError that put the log in the failed state, None when healthy."""
        return self._durability.error

    @property
    def pending_records(self) -> int:
        """Records appended but not yet reported written."""
        return self._next_offset - 1 - self._durability.written_offset

    def start_at(self, offset: int) -> None:
        """Make an empty log begin at ``offset`` (a replica of another router's log starts where
        its leader is when it is chosen, and keeps the leader's offsets)."""
        if self._segments.all or self._buf or self._inflight or self._next_offset != self._buf_first:
            raise ValueError("start_at: the log is not empty")
        self._next_offset = self._buf_first = offset
        self._durability.start_at(offset)
        self._handoff.start_at(offset)

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
        if self._refuse is not None:
            raise LogUnavailable(self._refuse, self._durability.error)
        return self.append_fields(*fields.from_values(topic, payload, qos, retain, client_id, properties,
                                                      origin_router, origin_offset, timestamp_ms))

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
            raise LogUnavailable(self._refuse, self._durability.error)
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
            raise LogUnavailable(self._refuse, self._durability.error)
        return self.append_fields(*fields.from_bytes(topic, payload, qos, retain, client_id, properties,
                                                     timestamp_ms, origin_router, origin_offset))

    def append_record(self, record: Record) -> int:
        """Append a decoded record (e.g. one read from another log), keeping its origin and
        timestamp; it gets this log's next offset."""
        return self.append_fields(record.timestamp_ms, record.origin_router, record.origin_offset,
                                  record.client_id, record.topic, record.qos, record.retain,
                                  record.properties, record.payload)

    def _autoflush_cb(self) -> None:
        """The linger is up. One timer at a time: a batch flushed before its timer (the broker
        writes a batch at once when an acknowledgement waits for it) leaves the timer armed for
        the next batch, which is then flushed a little sooner, rather than one timer per batch -
        at a fixed rate of QoS 1 messages a timer (and its callback) per message."""
        self._armed = False
        self._timer = None
        if not self._closed and self._buf:
            self.flush()

    def use_iteration_end(self, mark: Callable[[], object]) -> None:
        """The first append of each batch calls ``mark`` instead of arming the linger's timer, and
        whoever ``mark`` tells calls ``at_iteration_end`` at the end of that loop iteration (the
        broker: ``router.acks``, through the worker's end-of-iteration pass, which writes the
        log anyway when an acknowledgement waits). Why: at a fixed rate of QoS 1 messages every
        batch is written by that pass, and a timer armed for it only made each wait of the loop
        a timed one (an hrtimer set and cancelled in the kernel) and woke it for nothing. No
        effect with ``--fsync always`` (no linger) or without autoflush."""
        if self._autoflush and self._linger_s:
            self._arm_flush = mark

    def at_iteration_end(self) -> None:
        """The end of a loop iteration in which a batch began (``use_iteration_end``), after the
        pass's own write, if any: a batch still unwritten (nothing waits for it: QoS 0) gets the
        linger's timer; the next batch's first append marks again."""
        if not self._buf:
            self._armed = False
        elif self._timer is None and not self._closed:
            # (mypy: armed only where a loop runs the log (``_autoflush``))
            self._timer = self._loop.call_later(self._linger_s, self._autoflush_cb)  # type: ignore[union-attr]

    # --------------------------------------------------------------------------------------- flush

    def flush(self, *, fsync: bool = False) -> None:
        """Hand the current batch to the writer (with a loop) or write it now (without one).

        ``fsync=True`` forces an fsync of everything written so far whatever the policy — for
        ``never``/``interval`` the only way to move ``durable_offset`` on demand.
        In synchronous mode a write failure raises LogUnavailable (the log is then failed).
        """
        if self._closed:
            return
        if not self._buf:
            if fsync:
                self._handoff.hand(None, True)
            return
        batch = self._flush_v2()
        if not fsync and not self._inflight and self._write_inline is not None:
            # The commonest flush, a quiet broker's message or two: the loop writes it itself
            # (``WriterThread.write_inline``) and takes the report at once (``Durability.wrote``),
            # with no hand-off and no queue of batches in flight.
            report = self._write_inline(batch, batch.size)
            if report is not None:
                self._durability.wrote(report, batch)
                return
            self._inflight.append(batch)
            self._handoff.hand(batch, False, inline=False)
            return
        self._inflight.append(batch)
        self._handoff.hand(batch, fsync)

    def append_batch(self, first: int, records: list[Any], body: bytes | None) -> None:
        """Append records another log packed, keeping the bytes it packed (``body``: the msgpack
        of ``records``, field tuples in ``append_fields`` order, or None to pack them here;
        ``first`` must be the next offset): a replica takes its leader's batch with no
        per-record call, and writes it now."""
        if self._buf:
            self.flush()
        if self._refuse is not None:
            raise LogUnavailable(self._refuse, self._durability.error)
        if first != self._next_offset:
            raise ValueError(f"append_batch: batch starts at {first}, the log at {self._next_offset}")
        self._buf = records
        self._next_offset = first + len(records)
        batch = self._flush_v2(body)
        self._inflight.append(batch)
        self._handoff.hand(batch, False)

    def _flush_v2(self, body: bytes | None = None) -> Batch:
        """Encode the pending records as version 2 batches and place them in the segments.

        Normally that is one ``msgpack.packb`` of all the records (C) and one batch placed
        (``ActiveSegment.place``): the per-record cost of the log on the loop is then the tuple
        ``append_fields`` kept plus the packing, and nothing else.
        """
        recs = self._buf
        first = self._buf_first
        self._buf = []
        self._buf_len = 0
        self._buf_first = self._next_offset
        if body is None:
            body = self._pack(recs)
        if self.on_batch is not None:
            self.on_batch(first, self._next_offset - 1, body)
        return Batch(self._active.place(first, recs, body), first, self._next_offset - 1)

    # ----------------------------------------------------------- durability (``durability.Durability``)

    def on_durable(self, callback: Callable[[int], Any]) -> Callable[[], None]:
        """Call ``callback(durable_offset)`` on the loop each time it advances; returns an unregister."""
        return self._durability.on_durable(callback)

    def on_written(self, callback: Callable[[int], Any]) -> Callable[[], None]:
        """Call ``callback(written_offset)`` on the loop each time it advances (the records up to it
        survive a crash of this process, not of the machine); returns an unregister."""
        return self._durability.on_written(callback)

    def on_error(self, callback: Callable[[OSError | None], Any]) -> Callable[[], None]:
        """Call ``callback(error)`` on the loop when the log fails, ``callback(None)`` when it
        recovers; returns an unregister."""
        return self._durability.on_error(callback)

    async def wait_durable(self, offset: int, *, fail_on_error: bool = True) -> int:
        """Wait until ``offset`` is durable; return the durable offset then.

        With ``fail_on_error`` (default) raise LogUnavailable if the log is or becomes failed before
        that — the caller should then not acknowledge; the record stays pending and is written if
        the log recovers. Requires a loop.
        """
        return await self._durability.wait(offset, fail_on_error, self._refuse)

    def _failed(self, error: OSError) -> str:
        """A write failed (``Durability`` says so): refuse appends until a retry succeeds."""
        self._refuse = f"commit log {self._dir} unavailable: {error}"
        log.error("commit log %s: write failed (%s); refusing appends until a retry succeeds; "
                  "%d records are kept in memory, not durable", self._dir, error,
                  self._next_offset - 1 - self._durability.durable_offset)
        return self._refuse

    def _healthy(self) -> None:
        """Writes succeed again (``Durability`` says so): accept appends, unless closed."""
        if not self._closed:
            self._refuse = None
        log.warning("commit log %s: writes succeed again; accepting appends", self._dir)

    def _enter_failed(self, error: OSError) -> None:
        """What a report of a failed write does (tests stand in for the disk with it)."""
        self._durability.fail(error)

    def try_recover(self) -> bool:
        """Retry the writes that failed (the broker calls this periodically while ``error`` is set).

        Synchronous mode: retries now and returns whether the log is healthy. With a loop: queues the
        retry and returns False while failed (the outcome arrives through ``error``, ``on_error`` and
        ``on_durable``; ``await recover()`` waits for it). Returns True when not failed.
        """
        if self.error is None or self._closed:
            return self.error is None
        return self._handoff.recover() and self.error is None

    async def recover(self) -> bool:
        """Retry the failed writes and wait for the outcome: True when the log is healthy again."""
        if self.error is None or self._closed or self._thread is None:
            return self.try_recover()
        fut = self._durability.recover_waiter()
        self._handoff.recover()
        return await fut

    # ------------------------------------------------------------------- reads (``reads.LogReads``)

    def read(self, from_offset: int, max_records: int = 1000, max_bytes: int = 1 << 20) -> list[Record]:
        """Records from ``from_offset`` on (clamped to ``start_offset``), from disk with positional
        reads and, past ``written_offset``, from the batches still in memory. Never flushes.

        Returns at most ``max_records`` records and stops before exceeding ``max_bytes`` of encoded
        records (but returns at least one). A corrupt record ends the reading of its segment and
        reading goes on with the next one (logged once). Counted in ``read_records`` and
        ``read_bytes`` (session catch-up and recovery read here; never the hot path).
        """
        out = self._reads.read(max(from_offset, self.start_offset), max_records, max_bytes, self._next_offset,
                               self._durability.written_offset, self._buf, self._buf_first)
        if out:
            self.read_records += len(out)
            self.read_bytes += sum(len(r.payload) for r in out)
        return out

    # -------------------------------------------------------------- retention (``retention``)

    def enforce_retention(self, now_ms: int | None = None) -> list[DeletedSegment]:
        """Delete whole segments beyond ``retention_bytes`` (total size of the segment files) or
        whose newest record is older than ``retention_hours``; oldest first, never the active one,
        never one with unwritten data. Returns what was deleted. The unlinks run on the writer
        thread (with a loop), so this does no I/O on the loop. The broker calls it periodically."""
        if self.retention_bytes is None and self.retention_hours is None:
            return []
        now_ms = _time_ns() // 1_000_000 if now_ms is None else now_ms
        deleted = drop_past_retention(self._segments, self.retention_bytes, self.retention_hours, now_ms)
        if deleted:
            self._handoff.delete([d.base_offset for d in deleted])
            log.info("commit log %s: retention deleted %d segment(s), offsets %d..%s", self._dir,
                     len(deleted), deleted[0].base_offset, deleted[-1].last_offset)
        return deleted

    # ---------------------------------------------------------------- history (``history.HistoryJoin``)

    def join_history(self, directory: str, last: int) -> int:
        """Take the segments of a closed log in ``directory`` (on this log's file system) in as this
        log's oldest: its records below ``start_offset``, up to ``last``, fetched from a node that
        holds them (see ``history.HistoryJoin``). Returns how many segments joined. Blocking: a
        log with a loop joins with ``await join_history_async(...)``."""
        create = self._history.check(last, self.start_offset, self._buf_first)
        return self._history_joined(self._history.move_in(directory, create), create)

    async def join_history_async(self, directory: str, last: int) -> int:
        """``join_history`` with its disk work in a thread of the loop's executor: the loop never
        waits for the disk; appends, flushes and reads go on meanwhile."""
        create = self._history.check(last, self.start_offset, self._buf_first)
        loop = asyncio.get_running_loop()
        segs = await loop.run_in_executor(None, self._history.move_in, directory, create)
        return self._history_joined(segs, create)

    def _history_joined(self, segs: list[Seg] | None, create: int | None) -> int:
        """On the loop, the history on disk: its segments join (an empty first one may become active)."""
        if segs is None or self._closed:
            return 0
        active = self._history.take(segs, create)
        if active is not None:
            self._active.resume_empty(active.base)
        return len(segs)

    # -------------------------------------------------------------------------------------- segments

    def segments(self) -> list[SegmentState]:
        """The log's view of its segments, oldest first (no I/O)."""
        return self._segments.states(self._next_offset)

    def stats(self) -> dict[str, Any]:
        """Counters for the broker's stats snapshot."""
        error = self._durability.error
        return {
            "start_offset": self.start_offset,
            "next_offset": self._next_offset,
            "written_offset": self._durability.written_offset,
            "durable_offset": self._durability.durable_offset,
            "pending_records": self.pending_records,
            "segments": len(self._segments.all),
            "bytes": sum(s.size for s in self._segments.all),
            "error": None if error is None else str(error),
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
        self._handoff.join()
        self._end_close()

    async def aclose(self) -> None:
        """``close`` without blocking the loop while the writer finishes."""
        if self._closed:
            return
        self._begin_close()
        await self._handoff.ajoin()
        self._end_close()

    def _begin_close(self) -> None:
        """Flush what is pending, refuse appends from now on, tell the writer to finish."""
        if self._buf:
            try:
                self.flush()
            except LogUnavailable:
                pass
        self._closed = True
        self._refuse = f"commit log {self._dir} is closed"
        self._handoff.stop()

    def _end_close(self) -> None:
        """The writer is done (or, without a thread, does its last round now): its last report applies."""
        report = self._handoff.final_report()
        if report is not None:
            self._apply_report(report)
        lost = self._next_offset - 1 - self._durability.written_offset
        if lost > 0:
            log.error("commit log %s closed in the failed state: %d records were not written",
                      self._dir, lost)
        self._durability.close()
        self._segments.close()

    def __enter__(self) -> CommitLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"CommitLog({self._dir!r}, offsets {self.start_offset}..{self._next_offset - 1}, "
                f"fsync={self._policy.value}{', FAILED' if self._durability.error else ''})")


def _nothing() -> None:
    pass
