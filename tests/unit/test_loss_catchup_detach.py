"""A persistent session whose connection goes while its queue holds log records below its cursor:
a catch-up read ahead (``Session._refill`` moves the cursor past what it queued), or live
messages queued behind the window before a read-back's spool set the cursor
(``Session.add_range``). ``Session.detach`` dropped the queue and kept the cursor, so those
records were read by no later connection. Each must reach the next connection (at least once).
A chaos loss fits it: seed 335616717, 49 of one subscriber's acknowledged messages, half a
second of every publisher's, sent while its session, just moved to a worker of its node and
catching up on read-back copies, was moved again to the other one."""

from __future__ import annotations

import asyncio
from pathlib import Path

from brokerd.connection.packets import Publish, Subscription
from brokerd.router.log.commitlog import CommitLog
from brokerd.router.message import Message
from brokerd.router.router import Router, RouterConfig
from brokerd.router.session import Session, SessionLimits
from tests.unit.conftest import FakeConn

LIMITS = SessionLimits(max_inflight=2, max_queued=5)


def router(root: Path, router_id: str) -> tuple[Router, CommitLog]:
    log_ = CommitLog(root / router_id, router_id=router_id, loop=asyncio.get_running_loop())
    r = Router(RouterConfig(router_id=router_id, session=LIMITS))
    r.attach_log(log_, False)
    return r, log_


def publish(r: Router, *names: str) -> None:
    for name in names:
        r.publish(Message("q/x", name.encode(), 1, False, "p", r.router_id))


def sent(conn: FakeConn) -> list[bytes]:
    return [p.payload for p in conn.packets() if isinstance(p, Publish)]


async def drained(session: Session, conn: FakeConn) -> list[bytes]:
    """What ``conn`` gets while its client acknowledges everything, until nothing more comes
    (a range of another router's log is read as its files show it: a few turns)."""
    acked: set[int] = set()
    idle = 0
    while idle < 5:
        pids = [p.packet_id for p in conn.packets() if isinstance(p, Publish) and p.packet_id not in acked]
        for pid in pids:
            acked.add(pid)
            session.puback(pid)
        idle = 0 if pids else idle + 1
        await asyncio.sleep(0.06)
    return sent(conn)


def test_a_catch_up_cut_short_by_a_disconnect_goes_on_from_what_it_had_not_sent(tmp_path):
    """Ten messages logged while the session was offline; the next connection's window takes
    two and the catch-up queues the other eight, its cursor past them; that connection goes.
    The next one gets all ten, in order."""
    async def run() -> tuple[list[bytes], list[bytes]]:
        r, log_ = router(tmp_path, "b/w0")
        try:
            s = r.new_session("m", True)
            r.subscribe(s, Subscription("q/#", 1))
            s.attach(FakeConn())  # type: ignore[arg-type]
            s.detach()
            publish(r, *[f"off{i}" for i in range(10)])
            first = FakeConn()
            s.attach(first)  # type: ignore[arg-type]
            assert len(s.queue) == 8 and s.cursor == 10  # (the case: queued below the cursor)
            s.detach()
            second = FakeConn()
            s.attach(second)  # type: ignore[arg-type]
            return sent(first), await drained(s, second)
        finally:
            log_.close()

    first, second = asyncio.run(run())
    assert first == [b"off0", b"off1"]
    assert second == [b"off%d" % i for i in range(10)], "lost: what the catch-up had queued"


def test_live_messages_queued_before_a_read_back_spool_survive_a_move_on_the_node(tmp_path):
    """Connected with a full window, three live messages wait in the queue; a read-back's copies
    then go to a spool, which sets the cursor at the log's end (``add_range``), and a later
    message waits in the log. The session moves to another worker of the node (its backlog as
    positions: the spool and this log from the cursor): the new connection gets every one."""
    async def run() -> tuple[list[bytes], list[bytes]]:
        a, log_a = router(tmp_path, "b/w0")
        b, log_b = router(tmp_path, "b/w1")
        try:
            s = a.new_session("m", True)
            a.subscribe(s, Subscription("q/#", 1))
            old = FakeConn()
            s.attach(old)  # type: ignore[arg-type]
            publish(a, *[f"live{i}" for i in range(5)])
            copies = [[1, False, Message("q/x", b"copy%d" % i, 1, False, "p", "a/w0").to_list()] for i in range(10)]
            a.take_copies("m", copies, read_back=True)
            assert s.ranges and s.cursor == 5 and len(s.queue) == 3  # (the case)
            publish(a, "after")
            released = a.release_session("m", True, None)
            assert released is not None
            header, chunks = released
            state = {**header, "queue": [item for chunk in chunks for item in chunk]}
            moved = b.import_session("m", state)
            a.moved("m", True, "b/w1")
            new = FakeConn()
            moved.attach(new)  # type: ignore[arg-type]
            return sent(old), await drained(moved, new)
        finally:
            log_a.close()
            log_b.close()

    old, new = asyncio.run(run())
    assert old == [b"live0", b"live1"]
    names = {b"live%d" % i for i in range(5)} | {b"copy%d" % i for i in range(10)} | {b"after"}
    assert not names - set(new), f"lost: {sorted(names - set(new))}"
    live = [p for p in new if p.startswith(b"live")]
    assert live == sorted(live), "the live messages out of order"
