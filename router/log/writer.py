"""The write side of the log: batches, the I/O core and the single background writer thread.

The event loop only encodes records into a buffer and decides where each byte goes (segment, file
position, index entries) — so reads of pending data and the segment layout are known without asking
the thread. The thread only executes: ``pwrite`` at the given positions, fsync per policy, report.
Because every write is positional, re-doing a batch after a failure is idempotent: a partial write or
a lost page (a failed fsync) is simply written again at the same place, which is what makes
``try_recover`` safe.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from router.log.format import MAGIC_INDEX, MAGIC_LOG, index_name, pack_file_header, segment_name

log = logging.getLogger(__name__)

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class FsyncPolicy(StrEnum):
    """When written data is fsynced (and so reported durable)."""

    ALWAYS = "always"      # every batch fsynced before it is reported durable (QoS 1/2 acked after)
    INTERVAL = "interval"  # at most every fsync_interval_ms
    NEVER = "never"        # left to the OS; durable_offset only moves on an explicit flush(fsync=True)


@dataclass(slots=True)
class Chunk:
    """The part of a batch that goes into one segment: ``batch.buf[buf_start:buf_end]`` at
    ``file_pos`` of segment ``base``, plus the index entries for it at ``index_pos``."""

    base: int
    file_pos: int
    buf_start: int
    buf_end: int
    index: bytes
    index_pos: int
    new_segment: bool  # the segment file does not exist yet: create it and write the headers


@dataclass(slots=True, eq=False)
class Batch:
    buf: bytearray
    chunks: list[Chunk]
    first_offset: int
    last_offset: int


class Report(NamedTuple):
    """What the writer tells the loop after each round."""

    written_offset: int       # last offset handed to the OS
    durable_offset: int       # last offset known fsynced
    error: OSError | None     # the failed state, None when healthy
    recover_attempted: bool   # this round included a try_recover request
    final: bool = False       # the writer stopped


@dataclass(slots=True)
class _SegFds:
    fd: int
    ifd: int
    closed: bool = False  # no longer the active segment: fsync once more, then close


@dataclass(slots=True)
class WriterCore:
    """Performs batches; used directly in synchronous mode and by ``WriterThread`` otherwise.

    State lives here only, so the loop and the thread never share mutable state: the loop hands over
    batches (which it no longer mutates) and reads back ``Report`` tuples.
    """

    directory: str
    policy: FsyncPolicy
    interval_s: float
    written_offset: int
    durable_offset: int
    error: OSError | None = None
    _backlog: deque[Batch] = field(default_factory=deque)   # not yet written (or to rewrite)
    _unsynced: list[Batch] = field(default_factory=list)     # written, not yet fsynced
    _fds: dict[int, _SegFds] = field(default_factory=dict)
    _created: set[int] = field(default_factory=set)          # new segments whose headers are written
    _active: int | None = None
    _dir_dirty: bool = False
    _dirty: bool = False                                      # data written since the last fsync
    _last_sync: float = field(default_factory=time.monotonic)

    def process(self, batches: list[Batch], *, force_sync: bool = False, recover: bool = False,
                deletes: list[int] | None = None, stop: bool = False) -> Report:
        self._backlog.extend(batches)
        if self.error is None or recover:
            try:
                self._write_backlog()
                if self._dirty and (force_sync or self.policy is FsyncPolicy.ALWAYS
                                    or (stop and self.policy is not FsyncPolicy.NEVER)
                                    or (self.policy is FsyncPolicy.INTERVAL
                                        and time.monotonic() - self._last_sync >= self.interval_s)):
                    self._sync()
                elif self.policy is FsyncPolicy.NEVER:
                    self._unsynced.clear()  # nothing will be re-done for a never-fsynced batch
                    self._close_retired(sync=False)
                self.error = None
            except OSError as exc:
                self._fail(exc)
        for base in deletes or ():
            self._delete(base)
        if stop:
            self._close_all()
        return Report(self.written_offset, self.durable_offset, self.error, recover, stop)

    def sync_deadline(self) -> float | None:
        """Seconds until an ``interval`` fsync is due (None: nothing to wait for)."""
        if self.policy is not FsyncPolicy.INTERVAL or not self._dirty or self.error is not None:
            return None
        return max(0.0, self._last_sync + self.interval_s - time.monotonic())

    @property
    def backlog_records(self) -> int:
        return sum(b.last_offset - b.first_offset + 1 for b in self._backlog)

    # -- internals

    def _open(self, base: int, create: bool) -> _SegFds:
        fds = self._fds.get(base)
        if fds is not None:
            return fds
        flags = os.O_RDWR | _O_CLOEXEC
        log_path = os.path.join(self.directory, segment_name(base))
        fd = os.open(log_path, flags | (os.O_CREAT if create else 0), 0o644)
        try:
            ifd = os.open(os.path.join(self.directory, index_name(base)), flags | os.O_CREAT, 0o644)
        except OSError:
            os.close(fd)
            raise
        fds = self._fds[base] = _SegFds(fd, ifd)
        return fds

    def _write_backlog(self) -> None:
        backlog = self._backlog
        while backlog:
            batch = backlog[0]
            for chunk in batch.chunks:
                self._write_chunk(batch, chunk)
            backlog.popleft()
            self._unsynced.append(batch)
            if batch.last_offset > self.written_offset:
                self.written_offset = batch.last_offset
            self._dirty = True

    def _write_chunk(self, batch: Batch, chunk: Chunk) -> None:
        base = chunk.base
        if base != self._active:
            if self._active is not None and self._active in self._fds:
                self._fds[self._active].closed = True
            self._active = base
        create = chunk.new_segment and base not in self._created
        fds = self._open(base, create)
        try:
            if create:
                _pwrite_all(fds.fd, pack_file_header(MAGIC_LOG, base), 0)
                _pwrite_all(fds.ifd, pack_file_header(MAGIC_INDEX, base), 0)
                self._created.add(base)
                self._dir_dirty = True
            _pwrite_all(fds.fd, memoryview(batch.buf)[chunk.buf_start:chunk.buf_end], chunk.file_pos)
            if chunk.index:
                _pwrite_all(fds.ifd, chunk.index, chunk.index_pos)
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
        self._dirty = False
        self._last_sync = time.monotonic()
        self.durable_offset = self.written_offset

    def _close_retired(self, sync: bool) -> None:
        for base, fds in list(self._fds.items()):
            if fds.closed:
                if sync:
                    os.fsync(fds.fd)
                self._drop(base)

    def _fail(self, exc: OSError) -> None:
        # Everything not known durable is written again on recovery: after a failed write or fsync
        # the page cache may have dropped those pages (Linux marks them clean after a writeback error).
        if self.policy is not FsyncPolicy.NEVER:
            self._backlog.extendleft(reversed(self._unsynced))
            self._unsynced.clear()
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


def _pwrite_all(fd: int, data: bytes | memoryview, pos: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, pos)
        if n <= 0:  # pragma: no cover - pwrite raises rather than returning 0 on Linux
            raise OSError(0, "pwrite wrote nothing")
        view = view[n:]
        pos += n


class _Sync:
    pass


class _Recover:
    pass


class _Stop:
    pass


@dataclass(slots=True)
class _Delete:
    bases: list[int]


SYNC = _Sync()
RECOVER = _Recover()
STOP = _Stop()


class WriterThread:
    """The one background thread that owns all writes and fsyncs for a log.

    The loop puts batches and commands on a queue; the thread drains everything that is queued, so
    batches that arrive while an fsync is in progress share the next fsync (group commit), then calls
    ``report`` (which the log turns into ``loop.call_soon_threadsafe``).
    """

    def __init__(self, core: WriterCore, report: Callable[[Report], None], name: str) -> None:
        self.core = core
        self._report = report
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.last_report: Report | None = None
        self._last_durable = core.durable_offset
        self._thread.start()

    def put(self, item: object) -> None:
        self._queue.put(item)

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        q = self._queue
        core = self.core
        while True:
            timeout = core.sync_deadline()
            try:
                item = q.get(timeout=timeout) if timeout is not None else q.get()
            except queue.Empty:
                items: list[object] = []
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
                elif it is SYNC:
                    force = True
                elif it is RECOVER:
                    recover = True
                elif it is STOP:
                    stop = recover = True  # one last attempt to write what a failure held back
                elif isinstance(it, _Delete):
                    deletes.extend(it.bases)
            try:
                report = core.process(batches, force_sync=force, recover=recover, deletes=deletes,
                                      stop=stop)
            except Exception:  # pragma: no cover - a bug; keep the thread alive and say so
                log.exception("commit log writer: unexpected error")
                continue
            self.last_report = report
            if items or report.durable_offset != self._last_durable:
                self._last_durable = report.durable_offset
                self._report(report)
            if stop:
                return


def delete_item(bases: list[int]) -> _Delete:
    return _Delete(bases)
