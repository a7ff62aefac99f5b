"""MQTT 5 delivery rules in the router, with fake connections: subscription identifiers, message
expiry, the client's Maximum Packet Size, topic aliases towards the client, PUBREC errors."""

from __future__ import annotations

import time

import pytest

import brokerd.router.message as message_mod
from brokerd.connection.packets import Prop, Pubrel, Subscription
from brokerd.router.message import Message
from brokerd.router.outbound import Outbound
from brokerd.router.router import Router, RouterConfig
from brokerd.router.session import SessionLimits
from tests.unit.conftest import FakeConn, online


@pytest.fixture
def router():
    return Router(RouterConfig(session=SessionLimits(max_inflight=5, max_queued=10)))


def _v5(router: Router, cid: str, *subs: Subscription, outbound: Outbound | None = None):
    session = router.new_session(cid, False)
    conn = FakeConn(5)
    conn.outbound = outbound
    session.attach(conn)  # type: ignore[arg-type]
    for sub in subs:
        router.subscribe(session, sub)
    return session, conn


def test_overlapping_subscriptions_deliver_once_with_every_identifier(router):
    _, conn = _v5(router, "a", Subscription("s/#", 1, sub_id=7), Subscription("s/+", 0, sub_id=9))
    _, plain = _v5(router, "b", Subscription("s/#", 1))
    router.publish(Message("s/x", b"p", qos=1))
    [p] = conn.packets()
    assert p.qos == 1  # the highest granted QoS of the two
    assert sorted(p.properties[Prop.SUBSCRIPTION_IDENTIFIER]) == [7, 9]
    [q] = plain.packets()
    assert Prop.SUBSCRIPTION_IDENTIFIER not in q.properties


def test_identifiers_cost_nothing_to_subscribers_without_them(router):
    conns = [online(router, f"c{i}", ("t/#", 0))[1] for i in range(20)]
    _v5(router, "ided", Subscription("t/#", 0, sub_id=3))
    before = message_mod.encode_count
    router.publish(Message("t/x", b"p"))
    assert message_mod.encode_count - before == 2  # one shared MQTT 3.1.1 form, one for the ided copy
    assert len({id(c.chunks[0]) for c in conns}) == 1


def test_a_queued_message_past_its_expiry_is_not_delivered(router):
    session, conn = _v5(router, "slow", Subscription("e/#", 1))
    session.receive_max = 1
    router.publish(Message("e/1", b"first", qos=1))
    old = Message("e/2", b"expires", qos=1, properties={Prop.MESSAGE_EXPIRY_INTERVAL: 1},
                  timestamp_ms=int(time.time() * 1000) - 5000)  # published 5 s ago
    session.deliver(old, 1, False)  # queued behind the window
    router.publish(Message("e/3", b"lives", qos=1))
    [first] = conn.packets()
    session.puback(first.packet_id)
    pid3 = conn.packets()[-1]
    assert pid3.payload == b"lives"
    assert router.stats.drop_expired == 1


def test_the_forwarded_expiry_is_the_time_left(router):
    _, conn = _v5(router, "x", Subscription("e/#", 0))
    msg = Message("e/1", b"p", properties={Prop.MESSAGE_EXPIRY_INTERVAL: 60},
                  timestamp_ms=int(time.time() * 1000) - 10_500)
    router.publish(msg)
    [p] = conn.packets()
    assert 49 <= p.properties[Prop.MESSAGE_EXPIRY_INTERVAL] <= 50


def test_an_expired_retained_message_is_deleted(router):
    router.publish(Message("r/t", b"old", retain=True, properties={Prop.MESSAGE_EXPIRY_INTERVAL: 1},
                           timestamp_ms=int(time.time() * 1000) - 2000))
    router.publish(Message("r/u", b"new", retain=True))
    assert [m.topic for m in router.retained.match("r/#")] == ["r/u"]
    assert router.retained.get("r/t") is None
    assert router.stats.drop_expired == 1


def test_a_message_over_the_clients_maximum_packet_size_is_discarded_for_it(router):
    session, small = _v5(router, "small", Subscription("m/#", 1), outbound=Outbound(max_size=100))
    _, big = _v5(router, "big", Subscription("m/#", 1))
    router.publish(Message("m/x", b"z" * 500, qos=1))
    router.publish(Message("m/y", b"tiny", qos=1))
    assert [p.payload for p in small.packets()] == [b"tiny"]
    assert [p.payload for p in big.packets()] == [b"z" * 500, b"tiny"]
    assert len(session.inflight) == 1  # the discarded one took no packet id
    assert router.stats.drop_too_large == 1


def test_topic_aliases_towards_the_client(router):
    _, conn = _v5(router, "alias", Subscription("a/#", 0), outbound=Outbound(alias_max=1))
    for topic in ("a/one", "a/one", "a/two", "a/one"):
        router.publish(Message(topic, b"p"))
    raw = [p for p in conn.packets()]
    assert [(p.topic, p.properties.get(Prop.TOPIC_ALIAS)) for p in raw] == [
        ("a/one", 1), ("", 1), ("a/two", None), ("", 1)]


def test_an_alias_is_not_made_by_a_packet_that_was_not_sent(router):
    out = Outbound(max_size=60, alias_max=2)
    _, conn = _v5(router, "alias", Subscription("a/#", 0), outbound=out)
    router.publish(Message("a/one", b"z" * 100))  # too large: discarded
    router.publish(Message("a/one", b"p"))
    [p] = conn.packets()
    assert (p.topic, p.properties[Prop.TOPIC_ALIAS]) == ("a/one", 1)


def test_a_pubrec_error_ends_the_qos2_flow(router):
    session, conn = _v5(router, "q2", Subscription("q/#", 2))
    router.publish(Message("q/x", b"p", qos=2))
    [p] = conn.packets()
    conn.chunks.clear()
    assert session.pubrec(p.packet_id, 0x80)
    assert p.packet_id not in session.inflight
    assert not any(isinstance(x, Pubrel) for x in conn.packets())


def test_identifiers_travel_with_a_session_transfer(router):
    session, _ = _v5(router, "moving", Subscription("s/#", 1, sub_id=42))
    state = session.export_state()
    other = Router(RouterConfig(router_id="r1"))
    moved = other.import_session("moving", state)
    assert moved.subscriptions["s/#"].sub_id == 42


def test_a_delayed_will_and_the_identity_outlive_a_restart(tmp_path):
    """The Will Delay Interval is session state (MQTT 5 4.1): a snapshot keeps the will and when it
    is due; a restarted router publishes it then, to whoever subscribes."""
    import asyncio

    from brokerd.router.persistence import StateStore

    async def run() -> tuple[list, list, Router]:
        first = Router(RouterConfig())
        session = first.new_session("dev", True)
        session.expiry_s = 3600
        session.username = "alice"
        session.epoch, session.arrived_ms = 7, 1234  # ownership order survives a restart too
        first.delay_will(session, Message("wills/dev", b"gone", client_id="dev"), 0.3)
        StateStore(first, str(tmp_path)).write_now()
        first.cancel_will("dev")

        # A router where something verifies user names (a password file, say): where nothing
        # does, every owner is anonymous after a restart (test_session_identity.py).
        second = Router(RouterConfig(verifies_identities=True))
        _, watcher = _v5(second, "watcher", Subscription("wills/#", 0))
        StateStore(second, str(tmp_path)).load()
        assert second.sessions["dev"].username == "alice"
        assert (second.sessions["dev"].epoch, second.sessions["dev"].arrived_ms) == (7, 1234)
        early = watcher.packets()  # not before its delay
        for _ in range(100):
            if watcher.packets():
                break
            await asyncio.sleep(0.02)
        return early, watcher.packets(), second

    early, late, second = asyncio.run(run())
    assert early == []
    [p] = late
    assert (p.topic, p.payload) == ("wills/dev", b"gone")
    assert second.stats.wills_published == 1


def test_the_will_of_a_client_connected_at_a_crash_goes_out_after_the_restart(tmp_path):
    """A crash closes every connection without a DISCONNECT: the snapshot keeps the will of a
    persistent session's connected client (``live_will``, also what its followers hold), and a
    router restarted from it publishes that will; the will of a client that had said DISCONNECT
    (its handler dropped it) is not kept."""
    import asyncio
    from types import SimpleNamespace

    from brokerd.router.persistence import StateStore

    async def run() -> tuple[dict, list, Router]:
        first = Router(RouterConfig())
        for cid, will in (("dev", Message("wills/dev", b"gone", qos=1, client_id="dev")), ("polite", None)):
            session = first.new_session(cid, True)
            session.expiry_s = 3600
            session.attach(FakeConn(5))  # type: ignore[arg-type]
            first.clients[cid] = SimpleNamespace(client_id=cid, session=session, will=will)  # type: ignore[assignment]
        store = StateStore(first, str(tmp_path))
        store.write_now()
        import msgpack
        with open(store.path, "rb") as f:
            held = msgpack.unpackb(f.read(), strict_map_key=False)["sessions"]

        second = Router(RouterConfig())
        _, watcher = _v5(second, "watcher", Subscription("wills/#", 1))
        StateStore(second, str(tmp_path)).load()
        for _ in range(100):
            if watcher.packets():
                break
            await asyncio.sleep(0.02)
        return held, watcher.packets(), second

    held, published, second = asyncio.run(run())
    assert held["dev"]["live_will"][1] == 0 and held["polite"]["live_will"] is None
    [p] = published
    assert (p.topic, p.payload) == ("wills/dev", b"gone")
    assert second.stats.wills_published == 1
    assert second.sessions["dev"].will is None and second.sessions["polite"].will is None


def test_a_delayed_will_travels_with_a_moved_session_and_stays_when_the_move_breaks_off():
    """A takeover carries the delayed will to the new owner (which publishes it on a Clean Start
    and drops it on a resume); the old owner's timer stops, and starts again for the rest of the
    delay if the transfer fails and the session stays."""
    import asyncio

    async def run() -> tuple[dict, list, list, Router]:
        first = Router(RouterConfig())
        session = first.new_session("dev", True)
        session.expiry_s = 3600
        first.delay_will(session, Message("wills/dev", b"gone", client_id="dev"), 0.3)
        header, copies = first.release_session("dev", same_node=True)  # type: ignore[misc]
        list(copies)
        _, watcher = _v5(first, "watcher", Subscription("wills/#", 0))
        await asyncio.sleep(0.5)  # past the delay: the timer stopped with the move
        during = watcher.packets()
        first.moved("dev", ok=False)  # the session stays here: the will waits for the rest (none)
        for _ in range(100):
            if watcher.chunks:
                break
            await asyncio.sleep(0.02)
        return header, during, watcher.packets(), first

    header, during, after, first = asyncio.run(run())
    assert during == []
    assert [(p.topic, p.payload) for p in after] == [("wills/dev", b"gone")]
    second = Router(RouterConfig())
    moved = second.import_session("dev", header)
    assert moved.will is not None and moved.will.payload == b"gone"
