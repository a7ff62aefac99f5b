"""How a ``CommitLog`` gives work to its writer: to the writer thread with a loop, to the writer
core itself without one.

Why one home: every request the loop makes (a batch, an fsync, a retry, deletions, the stop) is
the same in both modes but for where it runs; in synchronous mode (CLI tools, tests, batch jobs)
it is done, and its report applied, before the call returns. The log's state is not here: the
reports go to ``apply`` (``Durability.apply``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from .errors import LogUnavailable
from .messages import RECOVER, STOP, SYNC, Batch, Delete, Report
from .writer import WriterCore, WriterThread


class Handoff:
    """The log's requests to its writer (``thread`` None: synchronous mode, ``core`` runs inline)."""

    def __init__(self, directory: str, core: WriterCore, thread: WriterThread | None,
                 apply: Callable[[Report], None]) -> None:
        self._dir = directory
        self._core = core
        self._thread = thread
        self._apply = apply

    def hand(self, batch: Batch | None, fsync: bool, inline: bool = True) -> None:
        """Give a flushed batch (and an fsync request) to the writer, or write it now. A small
        batch the thread would only write is written by the loop itself while the thread is idle
        (``WriterThread.write_inline``; ``inline=False``: the caller tried that already).
        Synchronous mode: a failed write raises LogUnavailable."""
        thread = self._thread
        if thread is not None:
            if batch is not None:
                report = thread.write_inline(batch, batch.size) if inline and not fsync else None
                if report is None:
                    thread.put(batch)
                else:
                    self._apply(report)
            if fsync:
                thread.put(SYNC)
        else:
            report = self._core.process([batch] if batch is not None else [], force_sync=fsync)
            self._apply(report)
            if report.error is not None:
                raise LogUnavailable(f"commit log {self._dir}: write failed: {report.error}",
                                     report.error) from report.error

    def recover(self) -> bool:
        """Retry the writes that failed: True when done now (synchronous mode), False when queued."""
        if self._thread is None:
            self._apply(self._core.process([], recover=True))
            return True
        self._thread.put(RECOVER)
        return False

    def delete(self, bases: list[int]) -> None:
        """Unlink these segments' files (retention), on the writer thread with a loop."""
        if self._thread is not None:
            self._thread.put(Delete(bases))
        else:
            self._core.process([], deletes=bases)

    def start_at(self, offset: int) -> None:
        """An empty log begins at ``offset``: so does its writer."""
        if self._thread is None:
            self._core.written_offset = self._core.durable_offset = offset - 1
        else:
            self._thread.start_at(offset)

    def stop(self) -> None:
        """Ask the writer to write what is left, fsync (unless ``never``) and stop; ``join`` waits."""
        if self._thread is not None:
            self._thread.put(STOP)

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()

    async def ajoin(self) -> None:
        """``join`` in a thread of the loop's executor: the loop goes on meanwhile."""
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join)

    def final_report(self) -> Report | None:
        """After ``join``: the writer's last report (synchronous mode: its last round, run now)."""
        if self._thread is not None:
            return self._thread.last_report
        return self._core.process([], recover=True, stop=True)
