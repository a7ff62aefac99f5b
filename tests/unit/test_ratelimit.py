"""WarnLimiter: at most N warnings a second, then one summary line."""

from __future__ import annotations

import logging

from brokerd.connection import ratelimit
from brokerd.connection.ratelimit import WarnLimiter


def test_at_most_n_a_second_then_a_summary(monkeypatch, caplog):
    now = [100.2]
    monkeypatch.setattr(ratelimit.time, "monotonic", lambda: now[0])
    limiter = WarnLimiter(3, "protocol violation warnings")
    logger = logging.getLogger("t")
    with caplog.at_level(logging.WARNING):
        written = [limiter.warning(logger, "bad %d", i) for i in range(10)]
        assert written == [True] * 3 + [False] * 7
        now[0] = 101.5
        assert limiter.warning(logger, "bad %d", 10)
    assert [r.getMessage() for r in caplog.records] == [
        "bad 0", "bad 1", "bad 2", "(7 more protocol violation warnings suppressed)", "bad 10"]
