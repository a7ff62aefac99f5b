"""A worker at its open-files limit still publishes its stats.

A worker holding as many clients as its open files allow (refused ones reconnecting fill the
rest) cannot open ``/proc/self/statm`` for its RSS: psutil raises EMFILE, an ``OSError`` and not a
``psutil.Error``. The snapshot must still go out, with the process figures last read: before,
the whole snapshot failed and the node's counts went missing exactly while it was full
(seen with ``scripts/measure_fleet.py --count 19990 --workers 1``).
"""

from __future__ import annotations

import errno
import os
import resource

import pytest

from tests.unit.test_stats import add_client, publisher


def test_snapshot_at_the_open_files_limit_keeps_the_last_process_figures():
    pub, router, conns = publisher()
    add_client(router, conns, "device")
    before = pub.snapshot()["process"]
    assert before["rss_bytes"] > 0 and before["cpu_seconds"] > 0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held: list[int] = []
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8, hard))
        with pytest.raises(OSError) as full:  # every descriptor this process may have is taken
            for _ in range(64):
                held.append(os.open(os.devnull, os.O_RDONLY))
        assert full.value.errno == errno.EMFILE
        snap = pub.snapshot()
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert snap["process"]["rss_bytes"] == before["rss_bytes"]  # the last read, not 0
    assert snap["process"]["cpu_seconds"] == before["cpu_seconds"]
    assert snap["seq"] == 2 and snap["clients"]["connected"] == 1  # and the snapshot's counts with them
