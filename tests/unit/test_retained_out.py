"""A SUBSCRIBE's retained messages, a slice per loop turn (``router.retained_out``): what bounds a
slice, and where what is owed goes when the connection is gone or the session moves."""

from __future__ import annotations

import asyncio

from brokerd.connection.packets import Subscription
from brokerd.router.log import CommitLog
from brokerd.router.message import Message
from brokerd.router.retained_out import SLICE, RetainedOut
from brokerd.router.router import Router, RouterConfig
from brokerd.router.session import SessionLimits
from tests.unit.conftest import FakeConn


def _retain(router: Router, n: int) -> None:
    for i in range(n):
        router.publish(Message(f"r/{i}", b"v", 1, True, "p", "t/w0"))


def test_walks_that_match_nothing_count_against_a_slice():
    """100,000 filters of one SUBSCRIBE that match no retained message each started a walk, all
    in the SUBACK's turn (300 ms): only messages counted. A walk counts too now."""
    async def run() -> int:
        router = Router(RouterConfig())
        session = router.new_session("many", False)
        session.attach(FakeConn(4))  # type: ignore[arg-type]
        walks = []
        for i in range(3 * SLICE):
            sub = Subscription(f"none/{i}", 1)
            router.subscribe(session, sub)
            walks.append((sub, router.retained.iter_match(sub.topic_filter)))
        out = RetainedOut(session, walks)
        out.start()
        left = len(out.walks)
        await asyncio.sleep(0.05)
        assert not out.walks
        return left

    assert asyncio.run(run()) == 2 * SLICE


def test_what_a_moving_session_is_still_owed_is_queued_before_it_is_exported():
    """A persistent session whose connection went right after its SUBACK goes on taking its
    retained messages offline; one handed to another router meanwhile (``release_session``) has
    its walk finished first, so the export holds every one (within --max-queued)."""
    n = 4 * SLICE

    async def run() -> tuple[int, int]:
        router = Router(RouterConfig(session=SessionLimits(max_inflight=5, max_queued=10 * SLICE)))
        _retain(router, n)
        session = router.new_session("mover", True)
        session.attach(FakeConn(4))  # type: ignore[arg-type]
        sub = Subscription("#", 1)
        router.subscribe(session, sub)
        RetainedOut(session, [(sub, router.retained.iter_match("#", before=router.retained.seq))]).start()
        session.detach()  # its connection is gone: the walk goes on offline, a slice a turn
        await asyncio.sleep(0)
        offline = len(session.queue) + len(session.inflight)
        assert router.release_session("mover", same_node=False) is not None
        return offline, len(session.queue) + len(session.inflight)

    offline, exported = asyncio.run(run())
    assert SLICE < offline < n, "the walk is not a slice a turn"
    assert exported == n


def test_a_session_catching_up_on_its_log_gets_retained_messages_logged_before_its_position(tmp_path):
    """A session that reads what it missed from the log (``cursor``) dropped every logged message
    handed to it, as the catch-up brings those: a retained message logged before its position
    is no part of the catch-up, and its '#' got none of them. Those are queued as copies now."""
    n = SLICE // 2

    async def run() -> tuple[list[str], list[int]]:
        router = Router(RouterConfig(session=SessionLimits(max_inflight=5, max_queued=10 * SLICE)))
        with CommitLog(tmp_path, router_id="r1") as log:
            router.attach_log(log, ack_when_durable=False)
            _retain(router, n)
            session = router.new_session("behind", True)
            conn = FakeConn(4)
            session.attach(conn)  # type: ignore[arg-type]
            session.cursor = log.next_offset  # reading its backlog (none here) before live delivery
            sub = Subscription("#", 1)
            router.subscribe(session, sub)
            RetainedOut(session, [(sub, router.retained.iter_match("#", before=router.retained.seq))]).start()
            queued = [m.topic for m, _, _ in session.queue]
            return [p.topic for p in conn.packets()] + queued, [m.log_offset for m, _, _ in session.queue]

    topics, offsets = asyncio.run(run())
    assert sorted(topics) == sorted(f"r/{i}" for i in range(n))
    assert set(offsets) == {-1}  # copies: the session's position stays where the log says
