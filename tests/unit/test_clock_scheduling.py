"""Work split across turns of the loop, driven by a fake clock (``router.clock``): a session's long
catch-up (and a log range that stalls), a SUBSCRIBE of many filters, its retained messages, and
the snapshot's write timer. Each
rule runs here without an event loop (the snapshot's write, which is a thread's, with one), one
turn at a time (``FakeClock.run_ready``)."""

from __future__ import annotations

import asyncio
import os
from types import SimpleNamespace

from brokerd.connection.packets import Suback, Subscribe, Subscription
from brokerd.router.client import FILTERS_PER_TURN, Client
from brokerd.router.clock import FakeClock
from brokerd.router.limits import ClientLimits
from brokerd.router.log import CommitLog
from brokerd.router.message import Message
from brokerd.router.persistence import StateStore
from brokerd.router.ports import NullMesh
from brokerd.router.ranges import STALL_LIMIT_S, LogRange
from brokerd.router.retained_out import SLICE, RetainedOut
from brokerd.router.router import Router, RouterConfig
from brokerd.router.session import SessionLimits
from tests.unit.conftest import FakeConn


def test_a_callback_set_soon_runs_at_the_next_turn_and_what_it_sets_soon_at_the_turn_after():
    clock = FakeClock()
    ran: list[str] = []
    clock.call_soon(lambda: (ran.append("first"), clock.call_soon(ran.append, "second")))
    clock.call_soon(ran.append, "beside").cancel()
    assert ran == []
    assert clock.run_ready() == 1 and ran == ["first"]
    assert clock.run_ready() == 1 and ran == ["first", "second"]
    assert clock.run_ready() == 0 and clock.pending == 0


def test_advance_runs_every_turn_due_and_no_later_timer():
    clock = FakeClock()
    ran: list[str] = []
    clock.call_later(1.0, ran.append, "later")
    clock.call_soon(lambda: clock.call_soon(ran.append, "chained"))
    clock.advance(0)
    assert ran == ["chained"] and clock.pending == 1


def test_a_turn_cut_short_by_an_error_keeps_what_it_did_not_reach():
    clock = FakeClock()
    ran: list[int] = []

    def fail() -> None:
        raise ValueError("boom")

    clock.call_soon(fail)
    clock.call_soon(ran.append, 1)
    try:
        clock.run_ready()
    except ValueError:
        pass
    assert ran == [] and clock.pending == 1
    clock.run_ready()
    assert ran == [1]


class _Range(LogRange):
    """A log range on this node whose records none of the session's subscriptions match: every
    read is a refill that queues nothing. (A LogRange: compiled, the session's ranges are.)"""

    copies = False

    def __init__(self, reads: int, ready: bool = True) -> None:
        self.left = reads
        self.reads = 0
        self.ready = ready

    def read(self, batch: int, now: float | None = None) -> list | None:
        if not self.ready:
            return []  # the other router's writer has not written them yet
        if not self.left:
            return None
        self.left -= 1
        self.reads += 1
        return [SimpleNamespace(qos=0, offset=self.reads)]

    def discard(self) -> None:
        pass


def _catching_up(clock: FakeClock, rng: _Range):
    r = Router(RouterConfig(), clock=clock)
    s = r.new_session("behind", True)
    s.attach(FakeConn())  # type: ignore[arg-type]
    s.ranges = [rng]  # type: ignore[list-item]
    return s


def test_a_long_catch_up_reads_16_batches_a_turn_and_goes_on_at_the_next():
    """A session catching up on a long range lets the other connections run every 16 reads."""
    clock = FakeClock()
    rng = _Range(reads=40)
    s = _catching_up(clock, rng)
    s.pump()
    assert rng.reads == 16 and clock.pending == 1
    clock.run_ready()
    assert rng.reads == 32
    clock.run_ready()
    assert rng.reads == 40 and not s.ranges and clock.pending == 0


def test_records_not_written_yet_are_read_again_50_ms_later():
    clock = FakeClock()
    rng = _Range(reads=1, ready=False)
    s = _catching_up(clock, rng)
    s.pump()
    clock.run_ready()
    assert rng.reads == 0 and clock.pending == 1  # a timer, not a turn
    rng.ready = True
    clock.advance(0.049)
    assert rng.reads == 0
    clock.advance(0.002)
    assert rng.reads == 1 and not s.ranges


def test_a_log_range_whose_records_stay_missing_is_given_up_after_the_stall_limit(tmp_path):
    """Another router's log range on this node, 3 of its 10 records on disk: the session reads
    them, then polls; once its clock says STALL_LIMIT_S passed without more, the range goes."""
    async def write() -> None:
        writer = Router(RouterConfig(router_id="n/w1"))
        with CommitLog(tmp_path, router_id="n/w1") as log:
            writer.attach_log(log, ack_when_durable=False)
            for i in range(3):
                writer.publish(Message(f"t/{i}", b"v", 1))
            log.flush()

    asyncio.run(write())
    clock = FakeClock()
    r = Router(RouterConfig(), clock=clock)
    s = r.new_session("behind", True)
    s.attach(FakeConn())  # type: ignore[arg-type]
    rng = LogRange(str(tmp_path), 0, 10)
    s.ranges = [rng]
    s.pump()
    assert rng.start == 3 and s.ranges  # read what is there, waiting for the rest
    clock.advance(STALL_LIMIT_S - 0.1)
    assert s.ranges == [rng]
    clock.advance(0.2)
    assert not s.ranges and clock.pending == 0


def test_retained_messages_go_out_a_slice_per_turn():
    clock = FakeClock()
    r = Router(RouterConfig(session=SessionLimits(max_inflight=10 * SLICE, max_queued=10 * SLICE)), clock=clock)
    for i in range(2 * SLICE + 1):
        r.publish(Message(f"r/{i}", b"v", 0, True, "p", "t/w0"))
    s = r.new_session("sub", False)
    conn = FakeConn()
    s.attach(conn)  # type: ignore[arg-type]
    sub = Subscription("r/#", 0)
    r.subscribe(s, sub)
    RetainedOut(s, [(sub, r.retained.iter_match("r/#"))]).start()
    sent = [len(conn.packets())]
    while clock.run_ready():
        sent.append(len(conn.packets()))
    assert sent == [SLICE, 2 * SLICE, 2 * SLICE + 1]


class _Conn(FakeConn):
    """What a ``Client`` asks of its connection besides writing: held reads and the topic depth."""

    max_topic_levels = 32
    listener = None

    def __init__(self) -> None:
        super().__init__()
        self.held: list[object] = []

    def hold(self, by: object) -> None:
        self.held.append(by)

    def resume_reading(self, by: object) -> None:
        self.held.remove(by)


def test_a_subscribe_of_many_filters_is_taken_a_slice_per_turn_and_answered_after_the_last():
    clock = FakeClock()
    r = Router(RouterConfig(limits=ClientLimits(max_subscriptions=3 * FILTERS_PER_TURN)), NullMesh(), clock=clock)
    conn = _Conn()
    client = Client(r, conn)  # type: ignore[arg-type]
    s = r.new_session("many", False)
    s.attach(conn)  # type: ignore[arg-type]
    client.session, client.client_id = s, "many"
    n = 2 * FILTERS_PER_TURN + 3
    client.packet_received(Subscribe(7, [Subscription(f"f/{i}", 1) for i in range(n)]))
    taken, answered, held = [len(s.subscriptions)], [len(conn.packets())], [bool(conn.held)]
    for _ in range(2):
        clock.run_ready()
        taken.append(len(s.subscriptions))
        answered.append(len(conn.packets()))
        held.append(bool(conn.held))
    assert taken == [FILTERS_PER_TURN, 2 * FILTERS_PER_TURN, n]
    assert answered == [0, 0, 1] and held == [True, True, False]
    (suback,) = conn.packets()
    assert isinstance(suback, Suback) and suback.packet_id == 7 and suback.reason_codes == [1] * n


def test_a_change_is_written_once_the_interval_has_passed_on_the_routers_clock(tmp_path):
    """The snapshot's timer is the router's clock's; the write itself is a thread's."""
    async def run() -> tuple[bool, bool]:
        clock = FakeClock()
        r = Router(RouterConfig(), clock=clock)
        store = StateStore(r, str(tmp_path), interval_s=5.0)
        r.attach_state(store)
        r.new_session("kept", True)
        store.mark()
        clock.advance(4.9)
        await asyncio.sleep(0.05)
        early = os.path.exists(store.path)
        clock.advance(0.2)
        for _ in range(500):  # bounded: 5 s for the thread's write
            if os.path.exists(store.path):
                break
            await asyncio.sleep(0.01)
        return early, os.path.exists(store.path)

    assert asyncio.run(run()) == (False, True)


def test_a_router_alone_is_answered_at_once_when_it_asks_for_a_session():
    async def run() -> dict | None:
        return await NullMesh().takeover("c")

    assert asyncio.run(run()) is None
