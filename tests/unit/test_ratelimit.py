"""LogLimiter: at most N lines a second, then one summary line for the rest of that second, on
its clock (a ``FakeClock`` here; by default the monotonic clock and the running loop's timer)."""

from __future__ import annotations

import asyncio
import logging
import time

from brokerd.connection import ratelimit
from brokerd.connection.ratelimit import LogLimiter
from brokerd.router.clock import FakeClock


def test_at_most_n_a_second_then_a_summary_at_the_seconds_end(caplog):
    """On a fake clock: three lines of ten in the second that began at 100, the summary of the
    other seven by its timer when that second ends (before any next line), a line at 101.5 again."""
    clock = FakeClock(now=100.2)
    limiter = LogLimiter(3, "protocol violation warnings", clock=clock)
    logger = logging.getLogger("t")
    with caplog.at_level(logging.WARNING):
        written = [limiter.log(logger, "bad %d", i) for i in range(10)]
        assert written == [True] * 3 + [False] * 7
        clock.advance(0.79)
        assert len(caplog.records) == 3
        clock.advance(0.02)
        assert caplog.records[-1].getMessage() == "(7 more protocol violation warnings suppressed)"
        clock.advance(0.5)
        assert limiter.log(logger, "bad %d", 10)
    assert [r.getMessage() for r in caplog.records] == [
        "bad 0", "bad 1", "bad 2", "(7 more protocol violation warnings suppressed)", "bad 10"]
    assert clock.pending == 0


def test_without_a_loop_the_summary_comes_with_the_next_line(monkeypatch, caplog):
    """The default clock outside a loop (a tool, a test): no timer; the next second's first line
    writes the summary of the last."""
    now = [100.2]
    monkeypatch.setattr(ratelimit.time, "monotonic", lambda: now[0])
    limiter = LogLimiter(1, "protocol violation warnings")
    logger = logging.getLogger("t.noloop")
    with caplog.at_level(logging.WARNING):
        assert [limiter.log(logger, "bad %d", i) for i in range(3)] == [True, False, False]
        now[0] = 101.5
        assert limiter.log(logger, "bad 3")
    assert [r.getMessage() for r in caplog.records] == [
        "bad 0", "(2 more protocol violation warnings suppressed)", "bad 3"]


def test_a_storms_summary_comes_at_the_end_of_its_second_without_a_next_line(caplog):
    """A reconnect storm that stops: its count is written by the loop once the second is over,
    not whenever the next client happens to connect (hours later, perhaps)."""
    limiter = LogLimiter(2, "client connect and disconnect lines", logging.INFO)
    logger = logging.getLogger("t.storm")

    async def storm() -> list[str]:
        while time.monotonic() % 1 > 0.5:  # the storm within one second (bounded: half a second)
            await asyncio.sleep(0.01)
        for i in range(7):
            limiter.log(logger, "client c%d connected", i)
        for _ in range(300):  # bounded: 3 s
            if limiter.suppressed == 0:
                break
            await asyncio.sleep(0.01)
        return [r.getMessage() for r in caplog.records]

    with caplog.at_level(logging.INFO):
        lines = asyncio.run(storm())
    assert "(5 more client connect and disconnect lines suppressed)" in lines
    assert sum(line.startswith("client c") for line in lines) == 2
    assert all(r.levelno == logging.INFO for r in caplog.records)


def test_debug_writes_every_line_and_an_off_level_writes_none(caplog):
    limiter = LogLimiter(1, "client connect and disconnect lines", logging.INFO)
    logger = logging.getLogger("t.levels")
    with caplog.at_level(logging.DEBUG):
        assert all(limiter.log(logger, "client c%d connected", i) for i in range(5))
    assert len(caplog.records) == 5 and limiter.suppressed == 0
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert not limiter.log(logger, "client x connected")
    assert caplog.records == [] and limiter.suppressed == 0
