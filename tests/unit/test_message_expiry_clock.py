"""MQTT 5 Message Expiry Interval (3.3.2.3.3) against a fake clock: a message is delivered while
its interval runs and dropped, counted, once it has run out, wherever it waits."""

from __future__ import annotations

import pytest

from brokerd.connection.packets import Prop, Publish, Subscription
from brokerd.router.clock import FakeClock
from brokerd.router.message import Message
from brokerd.router.router import Router, RouterConfig
from tests.unit.conftest import FakeConn, online

pytestmark = pytest.mark.unit


def expiring(clock: FakeClock, topic: str, seconds: int, qos: int = 1, retain: bool = False) -> Message:
    return Message(topic, b"x", qos=qos, retain=retain, properties={Prop.MESSAGE_EXPIRY_INTERVAL: seconds},
                   timestamp_ms=int(clock.unix() * 1000))


def offline_subscriber(router: Router, cid: str, topic_filter: str):
    s = router.new_session(cid, True)
    router.subscribe(s, Subscription(topic_filter, 1))
    return s


@pytest.mark.parametrize("wait,delivered", [(9.9, True), (10.0, False), (60.0, False)])
def test_a_queued_message_reaches_a_returning_client_only_within_its_interval(wait, delivered):
    clock = FakeClock()
    r = Router(RouterConfig(), clock=clock)
    s = offline_subscriber(r, "late", "e/#")
    r.publish(expiring(clock, "e/1", 10))
    clock.advance(wait)
    conn = FakeConn(5)
    s.attach(conn)  # type: ignore[arg-type]
    got = [p for p in conn.packets() if isinstance(p, Publish)]
    assert [p.topic for p in got] == (["e/1"] if delivered else [])
    assert r.stats.drop_expired == (0 if delivered else 1)


def test_a_delivered_message_carries_the_rest_of_its_interval_not_the_whole():
    clock = FakeClock()
    r = Router(RouterConfig(), clock=clock)
    s = offline_subscriber(r, "rest", "e/#")
    r.publish(expiring(clock, "e/2", 10))
    clock.advance(4)
    conn = FakeConn(5)
    s.attach(conn)  # type: ignore[arg-type]
    [p] = conn.packets()
    assert p.properties[Prop.MESSAGE_EXPIRY_INTERVAL] == 6  # 10 s less the 4 s it waited, by the router's clock


def test_a_message_that_expired_on_its_way_reaches_no_subscriber():
    clock = FakeClock()
    r = Router(RouterConfig(), clock=clock)
    _, conn = online(r, "on", ("e/#", 1), level=5)
    msg = expiring(clock, "e/3", 5)
    clock.advance(5)  # it waited in a mesh backlog, say
    r.deliver_remote(msg)
    assert conn.packets() == [] and r.stats.drop_expired == 1


def test_an_expired_retained_message_is_not_sent_and_goes():
    clock = FakeClock()
    r = Router(RouterConfig(), clock=clock)
    r.publish(expiring(clock, "keep/1", 30, retain=True))
    r.publish(expiring(clock, "keep/2", 90, retain=True))
    assert sorted(m.topic for m in r.retained.match("keep/#")) == ["keep/1", "keep/2"]
    clock.advance(31)
    assert [m.topic for m in r.retained.match("keep/#")] == ["keep/2"]
    assert r.retained.get("keep/1") is None and r.stats.drop_expired == 1


def test_copies_handed_on_from_another_router_that_expired_meanwhile_are_dropped():
    clock = FakeClock()
    r = Router(RouterConfig(), clock=clock)
    s = offline_subscriber(r, "moved", "e/#")
    old, fresh = expiring(clock, "e/old", 5), expiring(clock, "e/new", 50)
    clock.advance(6)
    r.take_copies("moved", [(1, False, old.to_list()), (1, False, fresh.to_list())])
    conn = FakeConn(5)
    s.attach(conn)  # type: ignore[arg-type]
    assert [p.topic for p in conn.packets()] == ["e/new"]
