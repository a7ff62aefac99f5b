"""The write side of the log: batches, the I/O core and the single background writer thread.

The event loop only encodes records into a buffer and decides where each byte goes (segment, file
position, index entries) — so reads of pending data and the segment layout are known without asking
the thread. The thread only executes: ``pwrite`` at the given positions, fsync per policy, report.
Because every write is positional, re-doing a batch after a failure is idempotent: a partial write or
a lost page (a failed fsync) is simply written again at the same place, which is what makes
``try_recover`` safe.

A small batch that need not wait for an fsync (``interval`` and ``never``) is written by the loop
itself when the thread is idle (``WriterThread.write_inline``): a ``pwritev`` into the page cache
costs a few microseconds, while handing it over costs a thread wake-up, a GIL hand-off and a report
back through the loop's self-pipe. At a quiet broker's rate every message is a batch of its own, and
that hand-off was most of what the log cost (36 ms of CPU a second at 500 msg/s). The thread then
wakes only to fsync; big batches still go to it, where the copy runs beside the loop.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from .format import (
    FORMAT_VERSION,
    MAGIC_INDEX,
    MAGIC_LOG,
    index_name,
    pack_file_header,
    segment_name,
)
from .messages import WAKE, Batch, Command, Item, Report

log = logging.getLogger(__name__)

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_FADVISE = getattr(os, "posix_fadvise", None)  # Linux; elsewhere the page cache is left alone
_PAGE_MASK = ~4095
# The page cache behind the writer is released in steps of at least this many bytes: one
# ``posix_fadvise`` per MiB written keeps the syscall out of the per-batch cost.
DROP_STEP = 1 << 20


class FsyncPolicy(StrEnum):
    """When written data is fsynced (and so reported durable)."""

    ALWAYS = "always"      # every batch fsynced before it is reported durable (QoS 1/2 acked after)
    INTERVAL = "interval"  # every fsync_interval_ms, sooner once max_unsynced_bytes are waiting
    NEVER = "never"        # left to the OS; durable_offset only moves on an explicit flush(fsync=True)


@dataclass(slots=True)
class _SegFds:
    fd: int
    ifd: int
    closed: bool = False  # no longer the active segment: fsync once more, then close
    end: int = 0          # end of the bytes written through these descriptors
    released: int = 0     # page cache given back (or its writeback started) below this position
    released_prev: int = 0  # where the previous release started: each range is asked for twice


_MAX_IOV = 512  # pieces per write group: each run's pwritev stays under IOV_MAX (1024 on Linux)


@dataclass(slots=True)
class _Run:
    """Chunks of consecutive batches that continue each other in one segment: one ``pwritev``."""

    base: int
    new_segment: bool
    file_pos: int
    end: int
    data: list[memoryview | bytes]
    index_pos: int
    index_end: int
    index: list[bytes]


@dataclass(slots=True)
class WriterCore:
    """Performs batches; used directly in synchronous mode and by ``WriterThread`` otherwise.

    State lives here only, so the loop and the thread never share mutable state: the loop hands over
    batches (which it no longer mutates) and reads back ``Report`` tuples.

    ``page_cache_bytes`` (None: leave the page cache to the kernel) is how much of the newest written
    data of the active segment stays in the page cache; older pages are handed back with
    ``posix_fadvise(DONTNEED)`` once written back (the first call on a range starts its writeback,
    the next one drops it). Why: a log only ever appends, so without this every write lands on a
    page the kernel has to allocate, and allocating a never-used (or long-freed) page dominated the
    cost of writing (2.3 ms of system time per MiB measured on the benchmark VM, 0.3 ms per MiB
    when the writer recycles the pages it released a moment ago); it also keeps a busy log from
    pushing everything else out of memory. Readers of older records read them from the disk.

    ``max_unsynced_bytes``: with ``interval``, fsync as soon as this much is written but not yet
    fsynced, not only when the interval is up. Batches are kept until they are durable (to re-write
    them after a failed fsync), so this bounds that memory, and it makes the written pages clean
    soon enough to be released; under light load the interval still decides.
    """

    directory: str
    policy: FsyncPolicy
    interval_s: float
    written_offset: int
    durable_offset: int
    page_cache_bytes: int | None = None
    max_unsynced_bytes: int = 4 << 20
    version: int = FORMAT_VERSION  # of the segments (and indexes) this core creates
    error: OSError | None = None
    # Monotonic seconds, for the ``interval`` fsync's period: a test's own moves it. The host's in
    # a broker: the thread waits for the period on it (``sync_deadline``), and no loop runs there.
    clock: Callable[[], float] = time.monotonic
    _backlog: deque[Batch] = field(default_factory=deque)   # not yet written (or to rewrite)
    _unsynced: list[Batch] = field(default_factory=list)     # written, not yet fsynced
    _fds: dict[int, _SegFds] = field(default_factory=dict)
    _created: set[int] = field(default_factory=set)          # new segments whose headers are written
    _active: int | None = None
    _dir_dirty: bool = False
    _dirty: bool = False                                      # data written since the last fsync
    _last_sync: float = 0.0                                   # when last fsynced (made: ``__post_init__``)
    _unsynced_bytes: int = 0                                  # size of the batches in _unsynced
    rounds: int = 0                                           # process() calls so far

    def __post_init__(self) -> None:
        self._last_sync = self.clock()  # the first period runs from the core's making, as each from an fsync

    def process(self, batches: list[Batch], *, force_sync: bool = False, recover: bool = False,
                deletes: list[int] | None = None, stop: bool = False, may_sync: bool = True) -> Report:
        """Write ``batches`` (and whatever a failure held back, with ``recover``), fsync per the
        policy, delete segments. ``may_sync=False``: write only, never fsync (the loop's own
        writes: the thread fsyncs once ``sync_due`` says so)."""
        self.rounds += 1
        self._backlog.extend(batches)
        if self.error is None or recover:
            try:
                self._write_backlog(may_sync)
                if may_sync and self._dirty and (force_sync or (stop and self.policy is not FsyncPolicy.NEVER)
                                                 or self._sync_due()):
                    self._sync()
                elif self.policy is FsyncPolicy.NEVER:
                    self._unsynced.clear()  # nothing will be re-done for a never-fsynced batch
                    self._unsynced_bytes = 0
                    self._close_retired(sync=False)
                    if self.page_cache_bytes is not None:
                        self._release_behind(self.page_cache_bytes)
                self.error = None
            except OSError as exc:
                self._fail(exc)
        for base in deletes or ():
            self._delete(base)
        if stop:
            self._close_all()
        return Report(self.written_offset, self.durable_offset, self.error, recover, stop, self.rounds)

    def write_one(self, batch: Batch) -> Report:
        """``process([batch], may_sync=False)``, shorter for the commonest write from the loop: a
        batch of one chunk continuing the active segment with nothing queued before it. At a
        fixed rate the loop writes about one such batch per message, after an idle gap, where
        every Python call runs from cold caches; the general path's bookkeeping for runs of
        chunks cost as much as the write. Anything else, and any failure (writing the same
        bytes at the same place again is harmless), goes the general way."""
        chunks = batch.chunks
        if self._backlog or self.error is not None or self.policy is FsyncPolicy.NEVER or len(chunks) != 1:
            return self.process([batch], may_sync=False)
        c = chunks[0]
        fds = self._fds.get(c.base)
        if fds is None or c.base != self._active or c.new_segment:
            return self.process([batch], may_sync=False)
        try:
            _pwritev_all(fds.fd, c.data, c.file_pos)
            if c.index:
                _pwrite_all(fds.ifd, c.index, c.index_pos)
        except OSError:
            return self.process([batch], may_sync=False)
        self.rounds += 1
        size = c.buf_end - c.buf_start
        if c.file_pos + size > fds.end:
            fds.end = c.file_pos + size
        self._written(batch, size)
        return Report(self.written_offset, self.durable_offset, None, False, False, self.rounds)

    def sync_due(self) -> bool:
        """Whether what is written must be fsynced now: always, or with ``interval`` once the
        period is up or ``max_unsynced_bytes`` wait."""
        return self._dirty and self.error is None and self._sync_due()

    def _sync_due(self) -> bool:
        if self.policy is FsyncPolicy.ALWAYS:
            return True
        return self.policy is FsyncPolicy.INTERVAL and (
            self._unsynced_bytes >= self.max_unsynced_bytes
            or self.clock() - self._last_sync >= self.interval_s)

    def sync_deadline(self) -> float | None:
        """Seconds until an ``interval`` fsync is due (None: nothing to wait for)."""
        if self.policy is not FsyncPolicy.INTERVAL or not self._dirty or self.error is not None:
            return None
        return max(0.0, self._last_sync + self.interval_s - self.clock())

    # -- internals

    def _open(self, base: int, create: bool) -> _SegFds:
        fds = self._fds.get(base)
        if fds is not None:
            return fds
        flags = os.O_RDWR | _O_CLOEXEC
        log_path = os.path.join(self.directory, segment_name(base))
        fd = os.open(log_path, flags | (os.O_CREAT if create else 0), 0o600)  # messages: the broker's alone
        try:
            ifd = os.open(os.path.join(self.directory, index_name(base)), flags | os.O_CREAT, 0o600)
        except OSError:
            os.close(fd)
            raise
        fds = self._fds[base] = _SegFds(fd, ifd)
        return fds

    def _write_backlog(self, may_sync: bool = True) -> None:
        """Write every queued batch; with ``interval``, fsync in between each time
        ``max_unsynced_bytes`` have been written (see the class docstring)."""
        backlog = self._backlog
        while backlog:
            group = self._write_group()
            for batch in group:
                backlog.popleft()
                self._written(batch, batch.size)
            if may_sync and self.policy is FsyncPolicy.INTERVAL and self._unsynced_bytes >= self.max_unsynced_bytes:
                self._sync()

    def _written(self, batch: Batch, size: int) -> None:
        """``batch`` (``size`` bytes) is in the kernel now: kept until fsynced (to write it again
        after a failed fsync), and the log counts it written. The one home of that rule for the
        general path and ``write_one``."""
        self._unsynced.append(batch)
        self._unsynced_bytes += size
        if batch.last_offset > self.written_offset:
            self.written_offset = batch.last_offset
        self._dirty = True

    def _write_group(self) -> list[Batch]:
        """Write batches from the head of the backlog (not removing them) and return them.

        The loop hands over one batch per loop iteration, so a busy writer finds many queued, each
        continuing the previous one in the same segment: they go out as one ``pwritev`` per segment
        (and one for their index entries) rather than a ``pwrite`` per batch, because every
        syscall also releases and re-takes the GIL, which the busy event loop holds.
        """
        group: list[Batch] = []
        runs: list[_Run] = []
        nchunks = nbytes = 0
        for batch in self._backlog:
            pieces = sum(len(c.data) for c in batch.chunks)
            if group and (nchunks + pieces > _MAX_IOV or nbytes >= self.max_unsynced_bytes):
                break
            group.append(batch)
            nchunks += pieces
            nbytes += batch.size
            for c in batch.chunks:
                run = runs[-1] if runs else None
                if (run is None or run.base != c.base or run.end != c.file_pos
                        or (c.index and run.index and run.index_end != c.index_pos)):
                    run = _Run(c.base, c.new_segment, c.file_pos, c.file_pos, [], c.index_pos, c.index_pos, [])
                    runs.append(run)
                run.data += c.data
                run.end += c.buf_end - c.buf_start
                if c.index:
                    if not run.index:
                        run.index_pos = run.index_end = c.index_pos
                    run.index.append(c.index)
                    run.index_end += len(c.index)
        for run in runs:
            self._write_run(run)
        return group

    def _write_run(self, run: _Run) -> None:
        base = run.base
        if base != self._active:
            if self._active is not None and self._active in self._fds:
                self._fds[self._active].closed = True
            self._active = base
        create = run.new_segment and base not in self._created
        fds = self._open(base, create)
        try:
            if create:
                _pwrite_all(fds.fd, pack_file_header(MAGIC_LOG, base, self.version), 0)
                _pwrite_all(fds.ifd, pack_file_header(MAGIC_INDEX, base, self.version), 0)
                self._created.add(base)
                self._dir_dirty = True
            _pwritev_all(fds.fd, run.data, run.file_pos)
            if run.end > fds.end:
                fds.end = run.end
            if run.index:
                _pwritev_all(fds.ifd, run.index, run.index_pos)
        except OSError:
            if create:
                # Forget a half-created segment's descriptors so a retry opens the path again.
                self._drop(base)
            raise

    def _sync(self) -> None:
        for fds in list(self._fds.values()):
            if fds.closed:
                os.fsync(fds.fd)
                os.fsync(fds.ifd)
            else:
                os.fdatasync(fds.fd)
        if self._dir_dirty:
            dfd = os.open(self.directory, os.O_RDONLY | _O_CLOEXEC)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
            self._dir_dirty = False
        self._close_retired(sync=False)
        self._unsynced.clear()
        self._unsynced_bytes = 0
        self._dirty = False
        if self.page_cache_bytes is not None:
            self._release_behind(self.page_cache_bytes)  # everything written is clean now
        self._last_sync = self.clock()
        self.durable_offset = self.written_offset

    def _close_retired(self, sync: bool) -> None:
        for base, fds in list(self._fds.items()):
            if fds.closed:
                if sync:
                    os.fsync(fds.fd)
                if self.page_cache_bytes is not None:
                    _release(fds.fd, fds.released_prev, 0)  # 0: to the end of the file
                self._drop(base)

    def _release_behind(self, keep: int) -> None:
        """Give the page cache of the active segment back, except its newest ``keep`` bytes."""
        for fds in self._fds.values():
            limit = (fds.end - keep) & _PAGE_MASK
            if limit - fds.released >= DROP_STEP:
                _release(fds.fd, fds.released_prev, limit - fds.released_prev)
                fds.released_prev = fds.released
                fds.released = limit

    def _fail(self, exc: OSError) -> None:
        # Everything not known durable is written again on recovery: after a failed write or fsync
        # the page cache may have dropped those pages (Linux marks them clean after a writeback error).
        if self.policy is not FsyncPolicy.NEVER:
            self._backlog.extendleft(reversed(self._unsynced))
            self._unsynced.clear()
            self._unsynced_bytes = 0
        self.error = exc
        for base in list(self._fds):
            self._drop(base)
        self._dir_dirty = True
        self._dirty = bool(self._backlog)

    def _drop(self, base: int) -> None:
        fds = self._fds.pop(base, None)
        if fds is not None:
            for fd in (fds.fd, fds.ifd):
                try:
                    os.close(fd)
                except OSError:
                    pass

    def _delete(self, base: int) -> None:
        self._drop(base)
        self._created.discard(base)
        # A batch held for rewriting after a failed fsync may still name this segment: it is gone
        # now, so that part must not be rewritten (the open would fail forever without O_CREAT).
        for batch in (*self._backlog, *self._unsynced):
            if any(c.base == base for c in batch.chunks):
                batch.chunks = [c for c in batch.chunks if c.base != base]
        # The .log first: a reader lists segments by their .log, so the segment disappears at once;
        # an index left behind by a crash here is an orphan that the next open removes.
        for name in (segment_name(base), index_name(base)):
            try:
                os.unlink(os.path.join(self.directory, name))
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("retention: could not delete %s: %s", name, exc)

    def _close_all(self) -> None:
        for base in list(self._fds):
            self._drop(base)


def _release(fd: int, start: int, length: int) -> None:
    """Drop clean cached pages of ``fd`` (and start the writeback of dirty ones); advisory only, so
    a failure is not the log's failure."""
    if _FADVISE is None:  # pragma: no cover - not Linux
        return
    try:
        _FADVISE(fd, start, length, os.POSIX_FADV_DONTNEED)
    except OSError as exc:  # pragma: no cover - Linux accepts it on every regular file
        log.debug("posix_fadvise(DONTNEED) failed: %s", exc)


def _pwritev_all(fd: int, views: Sequence[memoryview | bytes], pos: int) -> None:
    """``pwritev`` all of ``views`` at ``pos``; a short write is finished piece by piece."""
    if len(views) == 1:
        _pwrite_all(fd, views[0], pos)
        return
    done = os.pwritev(fd, views, pos)
    for v in views:
        size = len(v)
        if done < size:
            _pwrite_all(fd, memoryview(v)[done:], pos + done)
            done = size
        done -= size
        pos += size


def _pwrite_all(fd: int, data: bytes | memoryview, pos: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, pos)
        if n <= 0:  # pragma: no cover - pwrite raises rather than returning 0 on Linux
            raise OSError(0, "pwrite wrote nothing")
        view = view[n:]
        pos += n


# The largest batch the loop writes itself (``WriterThread.write_inline``); a bigger one is a busy
# loop's, and its copy into the page cache is better done beside the loop than on it.
INLINE_MAX_BYTES = 64 << 10


class WriterThread:
    """The one background thread that fsyncs a log and does the writes the loop hands it.

    The loop puts batches and commands on a queue; the thread drains everything that is queued, so
    batches that arrive while an fsync is in progress share the next fsync (group commit), then calls
    ``report`` (which the log turns into ``loop.call_soon_threadsafe``). Small batches that need no
    fsync before they count the loop writes itself while the thread is idle (``write_inline``); the
    core is shared under ``_lock``, which the thread holds for each round of work.
    """

    def __init__(self, core: WriterCore, report: Callable[[Report], None], name: str) -> None:
        self.core = core
        self._report = report
        self._queue: queue.SimpleQueue[Item] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._handed = core.written_offset  # the last offset of a batch put on the queue
        # Not ``_inline``, ``_thread``: mypyc names a C field after the attribute with one more
        # underscore, and ``__inline``, ``__thread`` are C keywords to gcc.
        self._inline_writes = core.policy is not FsyncPolicy.ALWAYS
        self._os_thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.last_report: Report | None = None
        self._last_durable = core.durable_offset
        self._os_thread.start()

    def put(self, item: Item) -> None:
        if type(item) is Batch:
            self._handed = item.last_offset
        self._queue.put(item)

    def write_inline(self, batch: Batch, size: int) -> Report | None:
        """Write ``batch`` on the calling thread (the loop), without fsync, and return the report;
        None when it must go through the queue instead: the policy fsyncs every batch, it is big,
        the thread is busy, a batch handed to it earlier is not written yet (batches are written in
        order: ``written_offset`` says how far the log is contiguous), or the log is failed. Wakes
        the thread when the write makes an fsync due later (the core was clean) or now by size;
        one due by time needs no wake-up (a thread with something to fsync waits with a timeout,
        ``sync_deadline``), so no clock is read on every write."""
        if not self._inline_writes or size > INLINE_MAX_BYTES or not self._lock.acquire(blocking=False):
            return None
        try:
            core = self.core
            if core.error is not None or core.written_offset < self._handed:
                return None
            was_dirty = core._dirty
            report = core.write_one(batch)
            wake = not was_dirty or core._unsynced_bytes >= core.max_unsynced_bytes
        finally:
            self._lock.release()
        if wake:
            self._queue.put(WAKE)
        return report

    def join(self, timeout: float | None = None) -> None:
        self._os_thread.join(timeout)

    def start_at(self, offset: int) -> None:
        """An empty log begins at ``offset`` (``CommitLog.start_at``): nothing was handed over yet,
        so the thread is idle, but the core is changed under the lock all the same."""
        with self._lock:
            self.core.written_offset = self.core.durable_offset = offset - 1
            self._handed = self._last_durable = offset - 1

    def _run(self) -> None:
        q = self._queue
        core = self.core
        while True:
            timeout = core.sync_deadline()
            try:
                item = q.get(timeout=timeout) if timeout is not None else q.get()
            except queue.Empty:
                items: list[Item] = []
            else:
                items = [item]
                while True:
                    try:
                        items.append(q.get_nowait())
                    except queue.Empty:
                        break
            batches: list[Batch] = []
            deletes: list[int] = []
            force = recover = stop = False
            for it in items:
                if isinstance(it, Batch):
                    batches.append(it)
                elif isinstance(it, Command):
                    force = force or it.force_sync
                    recover = recover or it.recover
                    stop = stop or it.stop
                else:
                    deletes.extend(it.bases)
            wake_only = not (batches or deletes or force or recover)
            try:
                with self._lock:
                    report = core.process(batches, force_sync=force, recover=recover, deletes=deletes,
                                          stop=stop)
            except Exception:  # pragma: no cover - a bug; keep the thread alive and say so
                log.exception("commit log writer: unexpected error")
                continue
            self.last_report = report
            if (items and not wake_only) or report.durable_offset != self._last_durable:
                self._last_durable = report.durable_offset
                self._report(report)
            if stop:
                return
