"""The log at a fixed rate, where each loop wake-up carries a message or two: one write of the log
per loop iteration (not one per quiet client), and the loop's own write taken at once.

A real loop and real files in tmp_path; the router's clients are ``FakeConn``s.
"""

from __future__ import annotations

import asyncio
import time

from brokerd.connection.batching import EndOfTick
from brokerd.connection.codec import PUBACK, success_ack
from brokerd.router.client import Client
from brokerd.router.log import CommitLog
from brokerd.router.log.messages import Report
from brokerd.router.message import Message
from brokerd.router.router import Router, RouterConfig
from tests.unit.conftest import FakeConn


def test_quiet_clients_acknowledgements_share_one_write_of_the_log_at_the_iterations_end(tmp_path):
    """Three devices' QoS 1 PUBLISHes, each read alone, in one loop iteration: what each caused is
    written early (``EndOfTick.flush_since``) but the log, which their acknowledgements wait
    for, is written once, at the iteration's end, and then every acknowledgement goes out.
    Written early, each device's record was a write of its own: a flush's whole fixed cost."""

    async def run() -> None:
        loop = asyncio.get_running_loop()
        # (no fsync due within the test: the writer thread's fsync is a round of its own, which a
        # loaded machine's slow setup let come in between)
        log_ = CommitLog(tmp_path, router_id="t/w0", loop=loop, fsync_interval_ms=600_000)
        tick = EndOfTick(loop)
        try:
            r = Router(RouterConfig(router_id="t/w0"))
            r.attach_log(log_, False, tick)
            devices = [Client(r, FakeConn()) for _ in range(3)]
            # Batches written, not yet fsynced (none is within the test): one per write of the log. (Not
            # the core's rounds: a write that finds the core clean wakes the writer thread, whose
            # round with nothing to write may come before the check or after it.)
            written = log_._core._unsynced
            before = len(written)
            offsets = []
            for i, device in enumerate(devices):
                mark = tick.pending()  # as a connection does for a read of one packet
                msg = Message(f"fleet/{i}", b"m", 1, False, f"d{i}", "t/w0")
                r.publish(msg)
                r.defer_ack(msg.log_offset, device, success_ack(PUBACK, i + 1))
                tick.flush_since(mark)
                offsets.append(msg.log_offset)
            assert log_.written_offset < offsets[0] and len(written) == before
            assert all(d.conn.chunks == [] for d in devices), "acknowledged before the record was written"
            await asyncio.sleep(0)  # the end of this iteration
            assert log_.written_offset == offsets[-1] and len(written) == before + 1, "one write for the three"
            assert [d.conn.chunks for d in devices] == [[success_ack(PUBACK, i + 1)] for i in range(3)]
            assert all(d.held_acks == 0 for d in devices)
        finally:
            log_.close()

    asyncio.run(run())


def test_a_batch_the_iterations_pass_writes_arms_no_linger_timer_and_one_nothing_waits_for_does(tmp_path):
    """With the worker's end-of-iteration pass (``CommitLog.use_iteration_end``, set by the
    router's acknowledgement waits) a batch is looked at in the pass of the iteration it began
    in: a QoS 1 message's, written there, arms no linger timer (at a fixed rate every wait of the
    loop was a timed one for it); a QoS 0 message's, which nothing waits for, is written at the
    linger, as before."""

    async def run() -> None:
        loop = asyncio.get_running_loop()
        log_ = CommitLog(tmp_path, router_id="t/w0", loop=loop, linger_ms=20)
        try:
            r = Router(RouterConfig(router_id="t/w0"))
            r.attach_log(log_, False, EndOfTick(loop))
            device = Client(r, FakeConn())
            for i in range(3):
                msg = Message("fleet/1", b"m", 1, False, "d1", "t/w0")
                r.publish(msg)
                r.defer_ack(msg.log_offset, device, success_ack(PUBACK, i + 1))
                await asyncio.sleep(0)  # the iteration's end
                assert log_.written_offset == msg.log_offset and log_._timer is None
            quiet = Message("telemetry/1", b"q", 0, False, "d2", "t/w0")
            r.publish(quiet)
            await asyncio.sleep(0)
            assert log_.written_offset < quiet.log_offset and log_._timer is not None
            for _ in range(100):  # the linger (20 ms) writes it
                if log_.written_offset >= quiet.log_offset:
                    break
                await asyncio.sleep(0.005)
            assert log_.written_offset == quiet.log_offset and log_._timer is None
            msg = Message("fleet/1", b"m", 1, False, "d1", "t/w0")  # and the next batch is seen to again
            r.publish(msg)
            r.defer_ack(msg.log_offset, device, success_ack(PUBACK, 9))
            await asyncio.sleep(0)
            assert log_.written_offset == msg.log_offset and device.conn.chunks[-1] == success_ack(PUBACK, 9)
        finally:
            log_.close()

    asyncio.run(run())


async def _writer_idle(log_: CommitLog, timeout: float = 5.0) -> None:
    """Until the writer thread has nothing queued and holds no lock, twice 20 ms apart (a loaded
    machine may run its wake-up round late), within ``timeout``."""
    thread = log_._thread
    assert thread is not None
    deadline = time.monotonic() + timeout
    quiet = 0
    while quiet < 2:
        assert time.monotonic() < deadline, "the writer thread stayed busy"
        await asyncio.sleep(0.02)
        quiet = quiet + 1 if thread._queue.empty() and not thread._lock.locked() else 0


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
            await _writer_idle(log_)  # its round is over: idle until the interval is up
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
