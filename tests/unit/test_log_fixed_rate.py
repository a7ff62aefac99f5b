"""The log at a fixed rate, where each loop wake-up carries a message or two: the loop's own
write taken at once.

A real loop and real files in tmp_path.
"""

from __future__ import annotations

import asyncio

from brokerd.router.log import CommitLog
from brokerd.router.log.messages import Report


def test_the_loops_own_write_is_taken_at_once_and_counts_as_the_newest_round(tmp_path):
    """A small batch the loop writes itself is not queued as in flight: the written offset moves
    and ``on_written`` hears it before ``flush`` returns. A report of an earlier round of the
    thread's that arrives after it (through the loop's queue: a failure since recovered) says
    nothing of now, and does not fail the log."""

    async def run() -> None:
        log_ = await CommitLog.open_async(tmp_path, router_id="r1", fsync="interval", fsync_interval_ms=1000)
        try:
            heard: list[int] = []
            log_.on_written(heard.append)
            log_.append("t", b"first")
            log_.flush()  # the core was clean: the thread wakes to wait for the interval's fsync
            for _ in range(100):
                await asyncio.sleep(0.01)
                if log_.written_offset == 0:
                    break
            await asyncio.sleep(0.05)  # its round is over: idle until the interval is up
            for _ in range(3):
                off = log_.append("t", b"quiet")
                log_.flush()
                assert heard[-1] == off == log_.written_offset and not log_._inflight
            stale = log_._core.rounds - 1
            log_._apply_report(Report(off, log_.durable_offset, OSError(5, "Input/output error"), False, round=stale))
            assert log_.error is None
            assert log_.append("t", b"still accepted") == off + 1
        finally:
            await log_.aclose()

    asyncio.run(run())
