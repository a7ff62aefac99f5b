"""How far a ``CommitLog`` is written and durable, who waits on that, and whether writes fail.

Why apart from the appender: this is what the broker's acknowledgements wait on (``on_written``,
``on_durable``, ``wait_durable``) and what turns a failed write into refused publishes
(``on_error``); it runs once per report from the writer, never per append. It owns its state
(the offsets, the callbacks, the waiters, the error) and shares two things with the log: the
segments (a report moves their written ends) and the queue of batches handed to the writer (a
report retires them). The log's appends are refused or accepted again through the two hooks the
log passes in (``failed``, ``healthy``): the append path reads its own ``_refuse``, with no hop.
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
from .messages import Batch, Report
from .segments import LogSegments

# The log's messages keep the logger they always had: operators filter on it.
log = logging.getLogger("brokerd.router.log.commitlog")


class Durability:
    """A log's written and durable offsets, their callbacks and waiters, and the failed state.

    ``failed(error)`` is the log's own reaction to a failed write (it refuses appends) and returns
    why appends are refused; ``healthy()`` its reaction to writes that succeed again.
    """

    def __init__(self, directory: str, loop: asyncio.AbstractEventLoop | None, segments: LogSegments,
                 inflight: deque[Batch], last_offset: int, failed: Callable[[OSError], str],
                 healthy: Callable[[], None]) -> None:
        self._dir = directory
        self._loop = loop
        self._segments = segments
        self._inflight = inflight  # flushed, not yet reported written (the log appends, a report retires)
        self._failed = failed
        self._healthy = healthy
        self.written_offset = last_offset  # last offset handed to the OS; -1 when none
        self.durable_offset = last_offset  # last offset known fsynced
        self.error: OSError | None = None  # what put the log in the failed state; None when healthy
        self._round = 0  # the writer core's round of the newest report applied
        self._durable_cbs: list[Callable[[int], Any]] = []
        self._written_cbs: list[Callable[[int], Any]] = []
        self._error_cbs: list[Callable[[OSError | None], Any]] = []
        self._waiters: list[tuple[int, int, asyncio.Future[int], bool]] = []
        self._recover_futs: list[asyncio.Future[bool]] = []
        self._seq = itertools.count()

    def start_at(self, offset: int) -> None:
        """An empty log begins at ``offset``: everything before it counts as written and durable."""
        self.written_offset = self.durable_offset = offset - 1

    # -------------------------------------------------------------------------- who waits on what

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

    async def wait(self, offset: int, fail_on_error: bool, refused: str | None) -> int:
        """``CommitLog.wait_durable``: the durable offset once ``offset`` is durable. With
        ``fail_on_error``, LogUnavailable if the log refuses appends now (``refused`` says why:
        failed or closed) or fails first. Requires a loop."""
        if self.durable_offset >= offset:
            return self.durable_offset
        if fail_on_error and refused is not None:
            raise LogUnavailable(refused, self.error)
        if self._loop is None:
            raise RuntimeError("wait_durable needs a CommitLog opened with a loop")
        fut: asyncio.Future[int] = self._loop.create_future()
        heapq.heappush(self._waiters, (offset, next(self._seq), fut, fail_on_error))
        return await fut

    def recover_waiter(self) -> asyncio.Future[bool]:
        """A future set to whether the log is healthy once the writer has tried to recover."""
        fut: asyncio.Future[bool] = self._loop.create_future()  # type: ignore[union-attr]  # a thread: a loop
        self._recover_futs.append(fut)
        return fut

    # ---------------------------------------------------------------------------- the writer's reports

    def report_threadsafe(self, report: Report) -> None:
        """Called on the writer thread: move the report onto the loop."""
        try:
            self._loop.call_soon_threadsafe(self.apply, report)  # type: ignore[union-attr]  # a thread: a loop
        except RuntimeError:  # loop closed: close() applies the final report itself
            pass

    def apply(self, report: Report) -> None:
        """Runs on the loop (or inline in synchronous mode). Idempotent: offsets only move forward.
        Reports come from the thread and from the loop's own writes: one from an older round than
        the last applied may arrive later (through ``call_soon_threadsafe``), and says nothing
        about whether the log is failed now."""
        if report.round >= self._round:
            self._round = report.round
        elif report.error is not self.error:
            report = report._replace(error=self.error)  # stale: the newer round said it
        written = report.written_offset
        if written > self.written_offset:
            inflight = self._inflight
            while inflight and inflight[0].last_offset <= written:
                self._written_ends(inflight.popleft())
            self._written(written)
        if report.error is not None and self.error is None:
            self.fail(report.error)
        elif report.error is not None:
            log.debug("commit log %s: retry failed: %s", self._dir, report.error)
        elif self.error is not None:
            self.error = None
            self._healthy()
            self._call_error_cbs(None)
        durable = report.durable_offset
        if durable > self.durable_offset:
            self.durable_offset = durable
            _call_each(self._durable_cbs, durable, "on_durable")
            waiters = self._waiters
            while waiters and waiters[0][0] <= durable:
                fut = heapq.heappop(waiters)[2]
                if not fut.done():
                    fut.set_result(durable)
        if report.recover_attempted:
            futs, self._recover_futs = self._recover_futs, []
            for f in futs:
                if not f.done():
                    f.set_result(self.error is None)

    def wrote(self, report: Report, batch: Batch) -> None:
        """``apply`` for a batch the loop wrote itself (``WriterThread.write_inline``) with no
        batch in flight before it, so never queued: its segment's written end and the written
        offset move, and the ``on_written`` callbacks run. Anything more in the report (an
        error, a newer durable offset, a log that was failed) goes the general way."""
        if (report.error is not None or self.error is not None or report.round < self._round
                or report.durable_offset > self.durable_offset):
            self._inflight.append(batch)
            self.apply(report)
            return
        self._round = report.round
        self._written_ends(batch)
        self._written(report.written_offset)

    def _written_ends(self, batch: Batch) -> None:
        """``batch`` is written: its segments' written ends (where reads stop) move past it."""
        by_base = self._segments.by_base
        for c in batch.chunks:
            seg = by_base.get(c.base)
            if seg is not None:
                end = c.file_pos + c.buf_end - c.buf_start
                if end > seg.written_end:
                    seg.written_end = end

    def _written(self, written: int) -> None:
        """The log is written up to ``written``: the ``on_written`` callbacks hear it."""
        self.written_offset = written
        _call_each(self._written_cbs, written, "on_written")

    def fail(self, error: OSError) -> None:
        """A write failed: the log refuses appends, waiters that asked to fail do, callbacks hear it."""
        self.error = error
        refuse = self._failed(error)
        self._fail_waiters(LogUnavailable(refuse, error), only_fail_on_error=True)
        self._call_error_cbs(error)

    def close(self) -> None:
        """The log is closed: every waiter fails, every recovery waited for did not happen."""
        self._fail_waiters(LogUnavailable(f"commit log {self._dir} is closed"), only_fail_on_error=False)
        for f in self._recover_futs:
            if not f.done():
                f.set_result(False)

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
        _call_each(self._error_cbs, error, "on_error")


def _call_each(callbacks: list[Callable[[Any], Any]], value: Any, kind: str) -> None:
    """Each of ``callbacks`` with ``value`` (a copy of the list: one may remove itself); one that
    raises is logged and the others still run."""
    for cb in list(callbacks):
        try:
            cb(value)
        except Exception:
            log.exception("commit log %s callback failed", kind)


def _remove(lst: list[Any], item: Any) -> None:
    try:
        lst.remove(item)
    except ValueError:
        pass
