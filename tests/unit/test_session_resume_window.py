"""A resumed session sends at most the new connection's Receive Maximum of unacknowledged PUBLISHes
(MQTT-4.9.0-2): what was in flight beyond it waits, in order, before the queue, and goes out with
its own packet id (DUP) as acknowledgements free the window. Fake connections, no sockets."""

from __future__ import annotations

import pytest

from brokerd.connection.packets import Publish, Pubrel, Subscription
from brokerd.router.message import Message
from brokerd.router.router import Router, RouterConfig
from brokerd.router.session import SessionLimits
from tests.unit.conftest import FakeConn


@pytest.fixture
def router():
    return Router(RouterConfig(session=SessionLimits(max_inflight=6, max_queued=10)))


def _left_with_six_in_flight(router: Router, qos: int = 1, keep: bool = False):
    """A persistent session that got m0..m5 (its window of 6) and two more queued, then lost its
    connection without acknowledging any (``keep``: still on it)."""
    s = router.new_session("dev", True)
    s.attach(FakeConn(5))  # type: ignore[arg-type]
    router.subscribe(s, Subscription("t", qos))
    for i in range(8):
        router.publish(Message("t", f"m{i}".encode(), qos=qos))
    assert len(s.inflight) == 6 and len(s.queue) == 2
    if not keep:
        s.detach()
    return s


def _publishes(conn: FakeConn) -> list[Publish]:
    return [p for p in conn.packets() if type(p) is Publish]


def test_a_resume_sends_no_more_than_the_new_receive_maximum(router):
    s = _left_with_six_in_flight(router)
    pids = list(s.inflight)
    conn = FakeConn(5)
    s.attach(conn, receive_max=2)  # type: ignore[arg-type]
    sent = _publishes(conn)
    assert [(p.payload, p.packet_id, p.dup) for p in sent] == [(b"m0", pids[0], True), (b"m1", pids[1], True)]
    assert len(s.inflight) == 6 and len(s.queue) == 2  # nothing lost, nothing sent twice


def test_the_held_back_go_first_with_their_ids_as_acknowledgements_free_the_window(router):
    s = _left_with_six_in_flight(router)
    pids = list(s.inflight)
    conn = FakeConn(5)
    s.attach(conn, receive_max=2)  # type: ignore[arg-type]
    router.publish(Message("t", b"live", qos=1))  # behind the held back and the queue
    got = [p.payload for p in _publishes(conn)]
    while len(got) < 9:
        sent_here = {p.packet_id for p in _publishes(conn)}
        assert s.puback(next(pid for pid in s.inflight if pid in sent_here))  # the oldest it got
        before, got = len(got), [p.payload for p in _publishes(conn)]
        assert len(got) == before + 1, "one acknowledgement, one PUBLISH"
        assert len(s.inflight) - len(s.unsent) <= 2
    assert got == [b"m0", b"m1", b"m2", b"m3", b"m4", b"m5", b"m6", b"m7", b"live"]
    sent = _publishes(conn)
    assert [p.packet_id for p in sent[:6]] == pids and all(p.dup for p in sent[:6])
    assert not any(p.dup for p in sent[6:])


def test_a_pubrel_is_always_resent_and_holds_its_place_in_the_window(router):
    """Two QoS 2 messages got to PUBREC: their PUBRELs go again, and they fill a window of 2 until
    PUBCOMP, so no PUBLISH goes with them."""
    s = _left_with_six_in_flight(router, qos=2, keep=True)
    first, second, third = list(s.inflight)[:3]
    assert s.pubrec(first) and s.pubrec(second)
    s.detach()
    conn = FakeConn(5)
    s.attach(conn, receive_max=2)  # type: ignore[arg-type]
    assert [(type(p), p.packet_id) for p in conn.packets()] == [(Pubrel, first), (Pubrel, second)]
    assert s.pubcomp(first)
    assert [(type(p), p.packet_id) for p in conn.packets()][2:] == [(Publish, third)]


def test_an_entry_acknowledged_from_before_is_not_resent_and_frees_its_place(router):
    s = _left_with_six_in_flight(router)
    pids = list(s.inflight)
    conn = FakeConn(5)
    s.attach(conn, receive_max=2)  # type: ignore[arg-type]
    assert s.puback(pids[4])  # the client had it: its PUBACK was lost with the old connection
    assert [p.packet_id for p in _publishes(conn)] == pids[:2]  # the window is still full
    assert s.puback(pids[0])
    assert s.puback(pids[1])
    assert [p.packet_id for p in _publishes(conn)] == [*pids[:4]]
    assert s.puback(pids[2])
    assert [p.packet_id for p in _publishes(conn)] == [*pids[:4], pids[5]]


def test_a_detach_with_some_held_back_resends_them_all_at_the_next_resume(router):
    s = _left_with_six_in_flight(router)
    pids = list(s.inflight)
    s.attach(FakeConn(5), receive_max=2)  # type: ignore[arg-type]
    s.detach()
    assert s.unsent == ()
    conn = FakeConn(5)
    s.attach(conn)  # type: ignore[arg-type]  # (no Receive Maximum: --max-inflight, 6)
    assert [p.packet_id for p in _publishes(conn)] == pids


def test_a_qos2_one_the_client_had_from_before_is_released_not_resent(router):
    """A PUBREC for one held back (the client got it before the connection broke): its PUBREL
    goes, it takes a place in the window until PUBCOMP, and it is never sent again (a second
    PUBLISH of it would be a second delivery to a QoS 2 subscriber)."""
    s = _left_with_six_in_flight(router, qos=2)
    pids = list(s.inflight)
    conn = FakeConn(5)
    s.attach(conn, receive_max=2)  # type: ignore[arg-type]
    assert s.pubrec(pids[4])
    assert s.pubrec(pids[0]) and s.pubcomp(pids[0])
    assert [p.packet_id for p in _publishes(conn)] == pids[:2]  # pids[1] and pids[4] fill it
    assert s.pubcomp(pids[4])
    assert s.pubrec(pids[1]) and s.pubcomp(pids[1])
    assert s.pubrec(pids[2]) and s.pubcomp(pids[2])
    assert [p.packet_id for p in _publishes(conn)] == [*pids[:4], pids[5]]
    assert [p.packet_id for p in conn.packets() if type(p) is Pubrel] == [pids[4], pids[0], pids[1], pids[2]]
