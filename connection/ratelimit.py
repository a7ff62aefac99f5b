"""Rate limits on what clients make a worker write to its log.

A client that breaks the protocol is closed with one warning line, and each client's connect and
disconnect is one INFO line, as Mosquitto writes them. A thousand such events a second (a
scanner, a broken fleet, a fleet reconnecting after a failover) would make the log the
bottleneck and bury everything else: a log line costs about as much CPU as the connect it
reports (a connect storm of one worker: 10-11k connects per CPU-second with a line for each,
16-17k without). So these lines go through a ``LogLimiter``: at most ``per_second`` lines a
second per worker, then one summary line "(N more ... suppressed)" for the rest of that second,
written when the second is over (by the event loop, or with the next line where none runs). With
``--log-level debug`` every line is written.

The seconds are its clock's (``LineClock``): by default the process's monotonic clock and the
running loop's timer (``RUNNING``: the limiters are the process's, made before any loop); a unit
test gives a ``router.clock.FakeClock`` and counts the lines of each second with ``advance``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from .loop import Timer

PROTOCOL_WARNINGS_PER_SECOND = 10
CONNECTION_LINES_PER_SECOND = 50
# A SUBSCRIBE's filters refused (invalid, over the quota, not authorized): one line each, and one
# packet may carry 150,000 of them (16 MiB of log, 2 s of its worker, before they were limited).
REFUSED_FILTER_LINES_PER_SECOND = 20


class LineClock(Protocol):
    """What a ``LogLimiter`` asks of its clock: monotonic seconds, and a timer for a second's
    summary (None: no loop runs, and the summary comes with the next line)."""

    def time(self) -> float: ...

    def call_later(self, delay: float, callback: Callable[[], object], /) -> Timer | None: ...


class RunningLoop:
    """The default ``LineClock``: ``time.monotonic`` (the clock an event loop's ``time()`` reads),
    and the timers of the loop running at the call, if any."""

    __slots__ = ()

    def time(self) -> float:
        return time.monotonic()

    def call_later(self, delay: float, callback: Callable[[], object], /) -> Timer | None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return None
        return loop.call_later(delay, callback)


RUNNING = RunningLoop()


class LogLimiter:
    __slots__ = ("per_second", "what", "level", "clock", "_second", "_written", "suppressed", "_logger",
                 "_summary")

    def __init__(self, per_second: int, what: str, level: int = logging.WARNING,
                 clock: LineClock = RUNNING) -> None:
        self.per_second = per_second
        self.what = what
        self.level = level
        self.clock = clock
        self._second = 0
        self._written = 0
        self.suppressed = 0  # in the current second, not yet summarised
        self._logger: logging.Logger | None = None
        self._summary: Timer | None = None

    def log(self, logger: logging.Logger, msg: str, *args: object) -> bool:
        """Log ``msg % args`` at the limiter's level unless this second's quota is spent (or the
        level is off); True if written."""
        if not logger.isEnabledFor(self.level):
            return False
        second = int(self.clock.time())
        if second != self._second:
            self._summarise()
            self._second = second
            self._written = 0
        if self._written >= self.per_second and not logger.isEnabledFor(logging.DEBUG):
            self.suppressed += 1
            if self.suppressed == 1:
                self._logger = logger
                self._schedule(second + 1)
            return False
        self._written += 1
        logger.log(self.level, msg, *args)
        return True

    def _schedule(self, at: float) -> None:
        """The summary of this second at its end, by its clock's timer (none: the next line)."""
        clock = self.clock
        self._summary = clock.call_later(max(0.0, at - clock.time()), self._summarise)

    def _summarise(self) -> None:
        if self._summary is not None:
            self._summary.cancel()
            self._summary = None
        if self.suppressed and self._logger is not None:
            self._logger.log(self.level, "(%d more %s suppressed)", self.suppressed, self.what)
        self.suppressed = 0


# One of each per worker process (each worker is one process with one event loop).
VIOLATIONS = LogLimiter(PROTOCOL_WARNINGS_PER_SECOND, "protocol violation warnings")
CONNECTIONS = LogLimiter(CONNECTION_LINES_PER_SECOND, "client connect and disconnect lines", logging.INFO)
REFUSED_FILTERS = LogLimiter(REFUSED_FILTER_LINES_PER_SECOND, "refused topic filter lines", logging.INFO)
