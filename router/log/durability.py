"""Durability, the failed state and closing of a ``CommitLog``: the writer's reports applied on the loop.

Why apart from the appender: this is what the broker's acknowledgements wait on (``on_written``,
``on_durable``, ``wait_durable``) and what refuses publishes when the disk fails (``error``,
``on_error``, ``try_recover``/``recover``); it runs once per report from the writer, never per
append. The state is the log's own (a mixin), so the append path reads ``_refuse`` with no hop.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from .errors import LogUnavailable
from .loader import Seg
from .writer import RECOVER, STOP, Batch, Report, WriterCore, WriterThread

# The log's messages keep the logger they always had: operators filter on it.
log = logging.getLogger("brokerd.router.log.commitlog")


class Durability:
    """``CommitLog``'s written/durable offsets, their callbacks and waiters, and the failed state."""

    _dir: str
    _loop: asyncio.AbstractEventLoop | None
    _core: WriterCore
    _thread: WriterThread | None
    _inflight: deque[Batch]
    _by_base: dict[int, Seg]
    _round: int
    _next_offset: int
    _written_offset: int
    _durable_offset: int
    _error: OSError | None
    _refuse: str | None
    _closed: bool
    _durable_cbs: list[Callable[[int], Any]]
    _written_cbs: list[Callable[[int], Any]]
    _error_cbs: list[Callable[[OSError | None], Any]]
    _waiters: list[tuple[int, int, asyncio.Future[int], bool]]
    _recover_futs: list[asyncio.Future[bool]]
    _seq: itertools.count[int]
    _segs: list[Seg]
    _buf: list[Any]
    flush: Callable[..., None]

    @property
    def written_offset(self) -> int:
        """Last offset handed to the OS (readable by other processes); -1 when none."""
        return self._written_offset

    @property
    def durable_offset(self) -> int:
        """Last offset known fsynced (for ``never``: what was synced at open or by flush(fsync=True))."""
        return self._durable_offset

    @property
    def error(self) -> OSError | None:
        """The OSError that put the log in the failed state, None when healthy."""
        return self._error

    @property
    def pending_records(self) -> int:
        """Records appended but not yet reported written."""
        return self._next_offset - 1 - self._written_offset

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


def _remove(lst: list[Any], item: Any) -> None:
    try:
        lst.remove(item)
    except ValueError:
        pass
