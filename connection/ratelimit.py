"""Rate limits at the connection layer: warnings in the log.

A client that breaks the protocol is closed with one warning line; a thousand such clients a
second (a scanner, a broken fleet) would make the log the bottleneck and bury everything else. So
these warnings go through ``WarnLimiter``: at most ``per_second`` lines a second per worker, then a
summary line "(N more ... suppressed)" when the next second's first warning is written.
"""

from __future__ import annotations

import logging
import time

PROTOCOL_WARNINGS_PER_SECOND = 10


class WarnLimiter:
    __slots__ = ("per_second", "what", "_second", "_written", "suppressed")

    def __init__(self, per_second: int, what: str) -> None:
        self.per_second = per_second
        self.what = what
        self._second = 0
        self._written = 0
        self.suppressed = 0  # in the current second, not yet summarised

    def warning(self, logger: logging.Logger, msg: str, *args: object) -> bool:
        """Log ``msg % args`` as a warning unless this second's quota is spent; True if written."""
        second = int(time.monotonic())
        if second != self._second:
            self._second = second
            self._written = 0
            if self.suppressed:
                logger.warning("(%d more %s suppressed)", self.suppressed, self.what)
                self.suppressed = 0
        if self._written >= self.per_second:
            self.suppressed += 1
            return False
        self._written += 1
        logger.warning(msg, *args)
        return True


# One per worker process (each worker is one process with one event loop).
VIOLATIONS = WarnLimiter(PROTOCOL_WARNINGS_PER_SECOND, "protocol violation warnings")
