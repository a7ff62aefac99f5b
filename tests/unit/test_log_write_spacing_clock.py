"""The log's writes for acknowledgements, spaced (router/acks.py's ``_WriteSoon``) on a fake
loop that is also the router's clock: within ``SPACING_S`` of the last such write, the next
waits for the first iteration's end past the spacing in which another acknowledgement begins
to wait, or for ``BACKSTOP_S``; a lone message is written in its own iteration; an
acknowledgement never leaves before its record is written. A real log in tmp_path (written
synchronously), no sleeping. Run compiled and with ``BROKERD_PURE=1``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from brokerd.connection.batching import EndOfTick
from brokerd.connection.codec import PUBACK, success_ack
from brokerd.router.acks import BACKSTOP_S, SPACING_S
from brokerd.router.client import Client
from brokerd.router.clock import FakeClock
from brokerd.router.log.commitlog import CommitLog
from brokerd.router.message import Message
from brokerd.router.router import Router, RouterConfig
from tests.unit.conftest import FakeConn

ITERATION_S = SPACING_S / 10  # what one loop iteration's reads take at a fixed rate


class _Loop:
    """A ``FakeClock`` whose time also moves while a loop turn's reads are handled (``reads``),
    with nothing run meanwhile: what ``call_soon`` set waits for the next turn (``turn``), as
    in an event loop, where a turn's callbacks run after its poll's reads."""

    def __init__(self) -> None:
        self.fake = FakeClock()
        self.moved = 0.0

    def now(self) -> float:
        return self.fake.now() + self.moved

    def unix(self) -> float:
        return self.fake.unix() + self.moved

    def call_soon(self, callback, *args):
        return self.fake.call_soon(callback, *args)

    def call_later(self, delay, callback, *args):
        return self.fake.call_later(delay, callback, *args)

    def call_at(self, when, callback, *args):
        return self.fake.call_at(when - self.moved, callback, *args)

    def reads(self, seconds: float) -> None:
        self.moved += seconds

    def turn(self) -> None:
        self.fake.run_ready()


class _Worker:
    """A router with the log attached as a worker has it, a publisher, and a counter of the
    log's writes."""

    def __init__(self, clock: _Loop, log_: CommitLog) -> None:
        self.clock = clock
        self.log = log_
        self.router = Router(RouterConfig(router_id="t/w0"), clock=clock)
        self.router.attach_log(log_, False, EndOfTick(clock))
        self.publisher = Client(self.router, FakeConn())  # (compiled, a Client is checked as one)
        self.writes = 0
        self.next_id = 1
        flush = log_.flush

        def counted(**kwargs: bool) -> None:
            before = log_.written_offset
            flush(**kwargs)
            self.writes += log_.written_offset > before

        log_.flush = counted  # type: ignore[method-assign]

    def publish(self) -> tuple[int, bytes]:
        """One QoS 1 PUBLISH read: appended, its PUBACK deferred. Returns (offset, the PUBACK)."""
        msg = Message("e/x", b"m", 1, False, "p", "t/w0")
        self.router.publish(msg)
        ack = success_ack(PUBACK, self.next_id)
        self.next_id += 1
        self.router.defer_ack(msg.log_offset, self.publisher, ack)
        return msg.log_offset, ack

    def iteration(self) -> None:
        """The end of a loop iteration (its pass), then the next one's reads."""
        self.clock.turn()
        self.clock.reads(ITERATION_S)

    @property
    def acked(self) -> list[bytes]:
        return self.publisher.conn.chunks


@pytest.fixture
def worker(tmp_path) -> Iterator[_Worker]:
    clock = _Loop()
    log_ = CommitLog(tmp_path, router_id="t/w0")  # no loop: each flush writes before it returns
    try:
        yield _Worker(clock, log_)
    finally:
        log_.close()


def test_a_lone_message_is_written_and_acknowledged_in_its_own_iteration(worker):
    offset, ack = worker.publish()
    assert worker.acked == []  # gated until written
    worker.iteration()
    assert worker.log.written_offset == offset and worker.acked == [ack] and worker.writes == 1
    worker.clock.reads(SPACING_S)  # a quiet spell: the next lone message goes at once too
    offset, ack2 = worker.publish()
    worker.iteration()
    assert worker.acked == [ack, ack2] and worker.writes == 2


def test_a_message_soon_after_a_write_waits_for_a_pass_past_the_spacing(worker):
    worker.publish()
    worker.iteration()  # written: the spacing starts
    offset, ack = worker.publish()
    worker.clock.turn()  # this iteration's end: within the spacing, so it waits
    assert worker.log.written_offset < offset and ack not in worker.acked, "written within the spacing"
    worker.clock.reads(SPACING_S)
    offset2, ack2 = worker.publish()  # the next acknowledgement past the spacing: both go
    worker.clock.turn()
    assert worker.log.written_offset == offset2 and worker.acked[-2:] == [ack, ack2]
    assert worker.writes == 2


def test_a_wait_no_pass_ends_is_ended_by_the_backstop(worker):
    worker.publish()
    worker.iteration()
    offset, ack = worker.publish()
    worker.clock.turn()
    worker.clock.turn()  # iterations with nothing to write: no pass for the log, no spinning
    assert worker.log.written_offset < offset
    worker.clock.fake.advance(BACKSTOP_S)
    assert worker.log.written_offset == offset and worker.acked[-1] == ack and worker.writes == 2


def test_back_to_back_iterations_share_one_write_per_spacing(worker):
    """A fixed rate's burst: a message in each of many iterations a tenth of the spacing apart.
    Unspaced, each iteration wrote the log; spaced, one write per spacing. An acknowledgement
    waits the spacing and an iteration at most, the burst's last ones the backstop."""
    sent: dict[bytes, float] = {}
    acked_at: dict[bytes, float] = {}

    def note() -> None:
        for a in worker.acked:
            acked_at.setdefault(a, worker.clock.now())

    for _ in range(40):
        _, ack = worker.publish()
        sent[ack] = worker.clock.now()
        worker.iteration()
        note()
    last = worker.clock.now()
    worker.clock.fake.advance(BACKSTOP_S)  # the burst over: the last wait ends
    note()
    assert worker.log.written_offset == worker.log.next_offset - 1
    assert set(acked_at) == set(sent) and worker.acked == list(sent)  # all, in order
    spacings = 40 * ITERATION_S / SPACING_S
    assert worker.writes <= spacings + 2, f"{worker.writes} writes for {spacings:.0f} spacings"
    waits = [acked_at[a] - t for a, t in sent.items() if t < last - SPACING_S]
    assert max(waits) <= SPACING_S + 2 * ITERATION_S + 1e-9
    assert max(acked_at[a] - t for a, t in sent.items()) <= BACKSTOP_S + SPACING_S


def test_an_acknowledgement_never_leaves_before_its_record_is_written(worker):
    worker.publish()
    worker.iteration()
    for _ in range(20):
        offset, ack = worker.publish()
        worker.clock.turn()
        if ack in worker.acked:
            assert worker.log.written_offset >= offset, "acknowledged before its record was written"
        worker.clock.reads(ITERATION_S / 3)
