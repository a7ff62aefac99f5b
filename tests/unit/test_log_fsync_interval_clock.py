"""The log writer's ``interval`` fsync (router/log/writer.py's ``WriterCore``) on a ``FakeClock``:
what is written is fsynced once ``interval_s`` have passed since the last fsync (or since the
core was made), not before; ``sync_deadline``, which the writer thread waits on, says how long
is left. Real files in tmp_path, no sleeping. Run compiled and with ``BROKERD_PURE=1``."""

from __future__ import annotations

from brokerd.router.clock import FakeClock
from brokerd.router.log.format import FILE_HEADER_SIZE
from brokerd.router.log.messages import Batch, Chunk
from brokerd.router.log.writer import FsyncPolicy, WriterCore

INTERVAL_S = 0.5
SIZE = 100


def batch(offset: int) -> Batch:
    """Record ``offset`` as the writer sees it: ``SIZE`` bytes, after the ones before, in segment 0."""
    pos = FILE_HEADER_SIZE + offset * SIZE
    return Batch([Chunk(0, pos, 0, SIZE, b"", FILE_HEADER_SIZE, offset == 0, (b"x" * SIZE,))], offset, offset)


def test_what_is_written_is_fsynced_once_the_interval_is_up_and_not_before(tmp_path):
    clock = FakeClock()
    core = WriterCore(str(tmp_path), FsyncPolicy.INTERVAL, INTERVAL_S, -1, -1, clock=clock.now)
    clock.advance(0.25)
    core.process([batch(0)])
    assert (core.written_offset, core.durable_offset) == (0, -1), "fsynced before the interval was up"
    assert core.sync_deadline() == INTERVAL_S - 0.25 and not core.sync_due()
    clock.advance(0.25)  # the interval, from the core's making
    assert core.sync_deadline() == 0.0 and core.sync_due(), "not due once the interval is up"
    core.process([])
    assert core.durable_offset == 0
    assert core.sync_deadline() is None  # nothing written since: nothing to wait for
    clock.advance(0.25)
    core.process([batch(1)])
    assert core.durable_offset == 0 and core.sync_deadline() == INTERVAL_S - 0.25, "the interval not from the fsync"
    clock.advance(0.25)
    core.process([batch(2)])
    assert core.durable_offset == 2, "not fsynced with the interval up"
    core.process([], stop=True)
