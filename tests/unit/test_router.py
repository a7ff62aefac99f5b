"""The router with fake connections: delivery rules and the encode-once promise."""

from __future__ import annotations

import asyncio

import pytest

import brokerd.router.message as message_mod
from brokerd.connection.codec import Decoder
from brokerd.connection.packets import Publish, Subscription
from brokerd.router.client import Client
from brokerd.router.clock import FakeClock
from brokerd.router.mesh_format import from_mesh, to_mesh
from brokerd.router.message import Message
from brokerd.router.ports import NullMesh
from brokerd.router.router import Router, RouterConfig
from brokerd.router.session import SessionLimits, recency
from tests.unit.conftest import FakeConn, online


@pytest.fixture
def router():
    return Router(RouterConfig(session=SessionLimits(max_inflight=5, max_queued=3)))


def test_fanout_encodes_once_per_variant(router):
    conns = [online(router, f"c{i}", ("t/#", 1))[1] for i in range(50)]
    conns += [online(router, f"z{i}", ("t/x", 0))[1] for i in range(50)]
    before = message_mod.encode_count
    router.publish(Message("t/x", b"p" * 100, qos=1))
    assert message_mod.encode_count - before == 2  # (v4, qos1) and (v4, qos0)
    tails = {id(c.chunks[-1]) for c in conns[:50]}
    assert len(tails) == 1  # the same tail bytes object for every QoS 1 subscriber
    pids = set()
    for c in conns[:50]:
        [p] = c.packets()
        assert isinstance(p, Publish) and p.qos == 1 and p.payload == b"p" * 100
        pids.add(p.packet_id)
    for c in conns[50:]:
        [p] = c.packets()
        assert p.qos == 0


def test_a_qos0_publish_reaches_same_level_subscribers_as_it_came(router):
    v4 = [online(router, f"r4{i}", ("r/#", 0))[1] for i in range(3)]
    v5 = online(router, "r5", ("r/#", 0), level=5)[1]
    raw = bytes([0x30, 2 + 3 + 5]) + b"\x00\x03r/x" + b"hello"
    [p] = Decoder(protocol_level=4).feed(raw)
    assert p.raw == raw  # QoS 0, no flags: the decoder hands the packet bytes over
    msg = Message.published(p.topic, p.payload, 0, False, "pub", "n/w0", None, p.raw, 4)
    before = message_mod.encode_count
    router.publish(msg)
    assert message_mod.encode_count - before == 1  # only the MQTT 5 subscriber's form is encoded
    assert all(c.chunks == [raw] for c in v4)
    [q] = v5.packets()
    assert (q.topic, q.payload, q.qos) == ("r/x", b"hello", 0)


@pytest.mark.parametrize("first", [0x31, 0x33, 0x3A, 0x3B, 0x35])
def test_publishes_with_flags_carry_no_raw_bytes(first):
    body = b"\x00\x01t" + (b"\x00\x07" if first & 6 else b"") + b"p"
    [p] = Decoder(protocol_level=4).feed(bytes([first, len(body)]) + body)
    assert p.raw is None


@pytest.mark.parametrize("qos,payload", [(1, b"p" * 10), (2, b"q" * 300)])
def test_a_plain_qos_publish_hands_its_head_to_subscribers_at_that_qos(router, qos, payload):
    """MQTT 3.1.1 QoS 1/2 without flags: the packet up to its id is the subscribers' head."""
    from brokerd.connection.codec import encode

    conns = [online(router, f"h{i}", ("h/#", qos))[1] for i in range(3)]
    packet = encode(Publish("h/x", payload, qos, packet_id=0x1234), 4)
    [p] = Decoder(protocol_level=4).feed(packet)
    assert p.raw == packet[: packet.index(b"\x12\x34")]
    [p5] = Decoder(protocol_level=5).feed(encode(Publish("h/x", payload, qos, packet_id=9), 5))
    assert p5.raw is None  # MQTT 5 puts properties between the id and the payload
    msg = Message.published(p.topic, p.payload, qos, False, "pub", "n/w0", None, p.raw, 4)
    before = message_mod.encode_count
    router.publish(msg)
    assert message_mod.encode_count == before  # nothing encoded for three 3.1.1 subscribers
    for c in conns:
        [q] = c.packets()
        assert (q.topic, q.payload, q.qos, q.retain, q.dup) == ("h/x", payload, qos, False, False)


def test_overlap_once_at_highest_qos(router):
    _, conn = online(router, "o", ("a/#", 0), ("a/+", 2), ("a/b", 1))
    router.publish(Message("a/b", b"x", qos=2))
    [p] = conn.packets()
    assert p.qos == 2


def test_window_then_queue_then_drop(router):
    s, conn = online(router, "w", ("q", 1))
    for i in range(10):
        router.publish(Message("q", str(i).encode(), qos=1))
    assert len(s.inflight) == 5 and len(s.queue) == 3
    assert router.stats.drop_queue_full == 2
    first = min(s.inflight)
    assert s.puback(first)
    assert len(s.inflight) == 5 and len(s.queue) == 2


def test_qos0_to_a_slow_consumer_is_dropped_and_counted(router):
    s, conn = online(router, "slow", ("s", 0))
    conn.write_paused = True
    router.publish(Message("s", b"x"))
    assert conn.chunks == [] and router.stats.drop_slow_consumer == 1


def test_no_local(router):
    s = router.new_session("me", False)
    conn = FakeConn(5)
    s.attach(conn)  # type: ignore[arg-type]
    router.subscribe(s, Subscription("nl", 1, no_local=True))
    router.publish(Message("nl", b"mine", qos=1, client_id="me"))
    router.publish(Message("nl", b"theirs", qos=1, client_id="other"))
    assert [p.payload for p in conn.packets()] == [b"theirs"]


def test_interest_announced_on_first_and_withdrawn_on_last(router):
    class Mesh(NullMesh):
        def __init__(self):
            self.calls = []

        def announce_interest(self, f, add):
            self.calls.append((f, add))

        def forward(self, *a):
            pass

        def retained_update(self, m):
            pass

    mesh = Mesh()
    router.attach_mesh(mesh)  # type: ignore[arg-type]
    a, _ = online(router, "a", ("x/#", 0))
    b, _ = online(router, "b", ("x/#", 1))
    assert mesh.calls == [("x/#", True)]
    router.unsubscribe(a, "x/#")
    assert mesh.calls == [("x/#", True)]
    router.drop_session(b)
    assert mesh.calls == [("x/#", True), ("x/#", False)] and router.local_filters == {}


def test_forward_once_per_peer_router(router):
    sent = []

    class Mesh(NullMesh):
        def forward(self, rid, msg, source=None):
            sent.append(rid)

        def announce_interest(self, f, add):
            return None

        def retained_update(self, m):
            pass

    router.attach_mesh(Mesh())  # type: ignore[arg-type]
    router.peer_interest("r2", "x/#", True)
    router.peer_interest("r2", "x/+", True)
    router.peer_interest("r3", "y", True)
    router.publish(Message("x/1", b""))
    assert sent == ["r2"]
    router.peer_left("r2")
    router.publish(Message("x/1", b""))
    assert sent == ["r2"] and len(router.interest) == 1


def test_session_export_import_round_trip(router):
    s, conn = online(router, "m", ("e/#", 2))
    for i in range(8):
        router.publish(Message("e/x", bytes([i]), qos=2))
    state = s.export_state()
    other = Router(RouterConfig(router_id="r9"))
    moved = other.import_session("m", state)
    assert list(moved.subscriptions) == ["e/#"]
    assert list(moved.inflight) == list(s.inflight)
    assert [m.payload for m, _, _ in moved.queue] == [m.payload for m, _, _ in s.queue]
    # Each move raises the ownership epoch: a copy left behind is older than any moved on from it.
    assert moved.epoch == s.epoch + 1
    again = Router(RouterConfig(router_id="r8")).import_session("m", moved.export_state())
    assert again.epoch == s.epoch + 2
    assert recency(again.export_header(False)) > recency(state) > (-1, 0)


def test_expiry_drops_offline_session():
    clock = FakeClock()
    r = Router(RouterConfig(), clock=clock)
    s = r.new_session("exp", True)
    s.expiry_s = 1
    r.subscribe(s, Subscription("a", 1))
    r.schedule_expiry(s)
    clock.advance(0.9)
    assert "exp" in r.sessions
    clock.advance(0.2)  # the expiry interval has passed
    assert "exp" not in r.sessions and len(r.subs) == 0


@pytest.mark.parametrize("payload", [b"", b"x" * 10, b"y" * 300])  # 1- and 2-byte remaining lengths
def test_a_forwarded_message_carries_its_packet_and_comes_back_whole(payload):
    import msgpack

    [p] = Decoder(protocol_level=4).feed(_plain_publish(b"m/a", payload))
    msg = Message.published(p.topic, p.payload, 0, False, "c1", "n/w0", None, p.raw, 4)
    msg.origin_offset, msg.timestamp_ms = 7, 1234
    wire = msgpack.unpackb(msgpack.packb(to_mesh(msg)), raw=False)
    assert wire == [p.raw, "m/a", "c1", 7, 1234]  # the packet stands in for payload and flags
    back = from_mesh(wire, "n/w0")  # the origin router is the frame's sender
    assert (back.topic, back.payload, back.client_id, back.origin_router, back.origin_offset, back.timestamp_ms) == (
        "m/a", payload, "c1", "n/w0", 7, 1234)  # the payload is cut out of the packet when asked
    assert back.topic_bytes == b"m/a" and back.to_list() == msg.to_list()[:5] + ["n/w0", 7, None, 1234]
    before = message_mod.encode_count
    assert back.encoded(4, 0, False)[0] == p.raw
    assert message_mod.encode_count == before  # the receiver encodes nothing for 3.1.1 QoS 0


@pytest.mark.parametrize("qos", [1, 2])
def test_a_forwarded_qos_message_carries_its_head(qos):
    import msgpack

    from brokerd.connection.codec import encode

    [p] = Decoder(protocol_level=4).feed(encode(Publish("m/q", b"v" * 200, qos, packet_id=5), 4))
    msg = Message.published(p.topic, p.payload, qos, False, "c1", "n/w0", None, p.raw, 4)
    msg.origin_offset, msg.timestamp_ms = 7, 1234
    wire = msgpack.unpackb(msgpack.packb(to_mesh(msg)), raw=False)
    assert wire == [[p.raw, b"v" * 200], "m/q", "c1", 7, 1234]
    back = from_mesh(wire, "n/w0")
    assert back.to_list() == [msg.topic, msg.payload, qos, False, "c1", "n/w0", 7, None, 1234]
    before = message_mod.encode_count
    assert back.encoded(4, qos, False) == (p.raw, b"v" * 200)
    assert message_mod.encode_count == before  # the receiver encodes nothing for 3.1.1 QoS 1/2
    assert back.encoded(4, 0, False)[0] == encode(Publish("m/q", b"v" * 200), 4)


@pytest.mark.parametrize("qos,retain,props", [(1, False, None), (0, True, None), (0, False, {3: "text/plain"})])
def test_other_messages_are_forwarded_as_values(qos, retain, props):
    msg = Message("m/b", b"v", qos, retain, "c", "n/w0", 3, props, 99)
    msg.encoded(4, 0, False)  # even with the 3.1.1 QoS 0 packet at hand
    assert to_mesh(msg) == msg.to_list()
    back = from_mesh(to_mesh(msg), "n/w9")
    assert (back.topic, back.payload, back.qos, back.retain, back.properties, back.origin_router) == (
        "m/b", b"v", qos, retain, props, "n/w0")


@pytest.mark.parametrize("packet,topic", [(b"\x32\x05\x00\x01tpp", "t"), (b"\x30\x05\x00\x03tpp", b"tpp"),
                                          (b"", "t"), (b"\x30\x05\x00\x03tpp", 7),
                                          ([b"\x30\x03\x00\x01t", b"p"], "t"), ([b"\x32\x05\x00\x01t", 5], "t"),
                                          ([b"\x32\x05\x00\x01t"], "t"), ([b"", b"p"], "t")])
def test_a_malformed_forwarded_message_is_refused(packet, topic):
    """Not a QoS 0 PUBLISH or a QoS 1/2 head and payload, or no topic string: the mesh drops it
    (the errors ``Router.deliver_forwarded`` counts as malformed)."""
    from brokerd.connection.reasons import ProtocolError

    with pytest.raises((ProtocolError, IndexError, TypeError, ValueError)):
        from_mesh([packet, topic, "c", 1, 1], "n/w0")


def _plain_publish(topic: bytes, payload: bytes) -> bytes:
    from brokerd.connection.codec import encode

    return encode(Publish(topic.decode(), payload), 4)


def test_a_forwarded_frame_is_delivered_in_order_and_a_malformed_message_dropped(router):
    _, conn = online(router, "sub", ("f/#", 0))
    packets = [_plain_publish(f"f/{i}".encode(), b"p%d" % i) for i in range(3)]
    body = [[packets[0], "f/0", "c", 1, 1], [b"\x32\x00", "f/x", "c", 2, 1],  # not a QoS 0 PUBLISH
            Message("f/q", b"one", 1, False, "c", "n/w0", 3, None, 1).to_list(), [packets[2], "f/2", "c", 4, 1]]
    assert router.deliver_forwarded(body, "n/w0") == 1
    assert [(p.topic, p.payload) for p in conn.packets()] == [("f/0", b"p0"), ("f/q", b"one"), ("f/2", b"p2")]


def test_a_forwarded_qos0_packet_reaches_each_kind_of_subscriber(router):
    """The receiving router's fast path hands the packet itself to MQTT 3.1/3.1.1 subscribers and
    builds one Message only for MQTT 5 ones; slow consumers, offline sessions and No Local
    subscribers are treated as ``deliver`` treats them."""
    _, v4 = online(router, "v4", ("q/#", 0))
    _, v3 = online(router, "v3", ("q/+", 1), level=3)
    _, v5a = online(router, "v5a", ("q/a", 0), level=5)
    _, v5b = online(router, "v5b", ("q/#", 2), level=5)
    _, slow = online(router, "slow", ("q/a", 0))
    slow.write_paused = True
    router.subscribe(router.new_session("away", True), Subscription("q/a", 1))  # no connection
    me = router.new_session("pub", False)
    mine = FakeConn(4)
    me.attach(mine)  # type: ignore[arg-type]
    router.subscribe(me, Subscription("q/a", 0, no_local=True))
    packet = _plain_publish(b"q/a", b"hello")
    before = message_mod.encode_count
    assert router.deliver_forwarded([[packet, "q/a", "pub", 1, 1]], "n/w1") == 0
    assert v4.chunks == [packet] and v3.chunks == [packet]  # the very bytes, not a copy
    assert message_mod.encode_count == before + 1  # one MQTT 5 encoding, shared by both
    assert [(p.topic, p.payload, p.qos) for p in v5a.packets() + v5b.packets()] == [("q/a", b"hello", 0)] * 2
    assert slow.chunks == [] and mine.chunks == []
    assert router.stats.drop_slow_consumer == 1
    assert sum(c.counters.msgs_out for c in (v3, v4, v5a, v5b, slow, mine)) == 4
    assert v4.counters.msgs_out == 1 and v5b.counters.msgs_out == 1


@pytest.mark.parametrize("packet,topic", [(b"\x32\x05\x00\x01tpp", "t"), (b"\x30\x05\x00\x03tpp", b"tpp"),
                                          (b"", "t"), (b"\x30\x05\x00\x03tpp", 7),
                                          ([b"\x30\x03\x00\x01t", b"p"], "t"), ([b"\x32\x05\x00\x01t", 5], "t"),
                                          ([b"\x32\x05\x00\x01t"], "t"), ([b"", b"p"], "t")])
def test_a_malformed_forwarded_message_is_counted_and_delivered_to_nobody(router, packet, topic):
    _, conn = online(router, "sub", ("#", 0))
    assert router.deliver_forwarded([[packet, topic, "c", 1, 1]], "n/w0") == 1
    assert conn.chunks == []


@pytest.mark.parametrize("level,qos,raw", [(4, 0, b"\x30\x04\x00\x01tp"), (5, 0, b"\x30\x05\x00\x01t\x00p"),
                                           (4, 1, b"\x32\x06\x00\x01t"), (4, 2, b"\x34\x06\x00\x01t"),
                                           (5, 1, None)])
def test_published_is_the_constructor_plus_the_encoding_it_came_in(level, qos, raw):
    """``Message.published`` fills the slots itself: it must agree with ``Message(...)``."""
    props = {3: "text/plain"} if raw is None else {}
    msg = Message.published("t", b"p", qos, False, "c", "n/w0", props, raw, level)
    ref = Message("t", b"p", qos, False, "c", "n/w0", properties=props)
    assert msg.to_list()[:8] == ref.to_list()[:8] and abs(msg.timestamp_ms - ref.timestamp_ms) < 1000
    assert msg.log_offset == -1 and msg.topic_bytes == b"t"
    before = message_mod.encode_count
    parts = msg.encoded(level, qos, False)
    if raw is None:
        assert message_mod.encode_count == before + 1
    else:
        assert message_mod.encode_count == before
        assert parts == ((raw, b"") if qos == 0 else (raw, b"p"))
    assert parts == ref.encoded(level, qos, False)  # byte for byte what encoding would give


def _retained(router: Router, topic: str) -> bytes | None:
    msg = router.retained.get(topic)
    return None if msg is None else msg.payload


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 1, 0), (1, 2, 0), (2, 0, 1)])
def test_every_router_keeps_the_same_retained_version_whatever_order_updates_arrive_in(order):
    """Two routers set a topic in the same millisecond, a third clears it later: in any order of
    arrival the clear wins, and without it the tie goes to the higher router id (before, each
    router kept the one that arrived last, and a set arriving after a clear came back)."""
    updates = [Message("rt/x", b"from-a", 0, True, "ca", "a/w0", 1, None, 1000),
               Message("rt/x", b"from-b", 0, True, "cb", "b/w0", 1, None, 1000),
               Message("rt/x", b"", 0, True, "cc", "c/w0", 1, None, 1001)]
    router = Router(RouterConfig())
    for i in order:
        router.peer_retained(updates[i])
    assert _retained(router, "rt/x") is None
    tie = Router(RouterConfig())
    for i in [j for j in order if j != 2]:
        tie.peer_retained(updates[i])
    assert _retained(tie, "rt/x") == b"from-b"


def test_a_local_retained_publish_is_stamped_past_what_it_replaces():
    """This router's clock is behind the router that set the topic's current value: its own
    publish is stamped one past it, so it is the newest on every router, as it is here."""
    router = Router(RouterConfig())
    router.router_id = "a/w0"
    router.peer_retained(Message("rs/x", b"ahead", 0, True, "cb", "b/w0", 1, None, 5000))
    mine = Message("rs/x", b"mine", 0, True, "ca", "a/w0", -1, None, 4000)
    router.publish(mine)
    assert mine.timestamp_ms == 5001 and _retained(router, "rs/x") == b"mine"
    other = Router(RouterConfig())
    other.peer_retained(Message("rs/x", b"ahead", 0, True, "cb", "b/w0", 1, None, 5000))
    other.peer_retained(mine)
    assert _retained(other, "rs/x") == b"mine"


def test_the_brokers_own_sys_topics_take_no_clients_room_in_the_retained_limits():
    """--max-retained 2: the router's $SYS values (retained, published at its first stats tick,
    which a slow start put among a client's first publishes) neither take one of the two places
    nor are refused when clients fill them. A CI run failed so (a client's second retained topic
    refused because $SYS/.../version had taken its place)."""
    from brokerd.router.limits import ClientLimits, retained_size

    room = 2 * retained_size(Message("r/1", b"one")) + 100  # two messages, not one 60 bytes bigger
    router = Router(RouterConfig(limits=ClientLimits(max_retained=2, max_retained_bytes=room)))
    router.publish(Message("$SYS/brokerd/t/w0/version", b"brokerd 0.1.0", 0, True, "$SYS", "t/w0"))
    router.publish(Message("$SYS/brokerd/t/w0/uptime", b"1" * 40, 0, True, "$SYS", "t/w0"))
    router.publish(Message("r/1", b"one", 1, True, "c", "t/w0"))
    router.publish(Message("r/2", b"two", 1, True, "c", "t/w0"))
    assert _retained(router, "r/1") == b"one" and _retained(router, "r/2") == b"two"
    router.publish(Message("r/3", b"three", 1, True, "c", "t/w0"))  # the clients' two places are taken
    assert _retained(router, "r/3") is None and router.stats.limit_retained == 1
    router.publish(Message("r/1", b"x" * 60, 1, True, "c", "t/w0"))  # beyond the clients' bytes
    assert _retained(router, "r/1") == b"one" and router.stats.limit_retained == 2
    router.publish(Message("$SYS/brokerd/t/w0/clients", b"7", 0, True, "$SYS", "t/w0"))
    assert _retained(router, "$SYS/brokerd/t/w0/clients") == b"7"  # $SYS stays readable when full
    router.publish(Message("$SYS/brokerd/t/w0/uptime", b"", 0, True, "$SYS", "t/w0"))
    assert router.retained.sys_count == 2 and router.retained.count == 4


def test_routers_at_the_retained_limit_take_each_others_updates_as_their_origin_did():
    """--max-retained 1 on two routers, each taking a new topic from its own client at once: the
    limit is checked where a message is published, so each takes the other's update too and both
    hold the same two; then both are full, and refuse a third topic from their own clients."""
    from brokerd.router.limits import ClientLimits

    a, b = (Router(RouterConfig(router_id=rid, limits=ClientLimits(max_retained=1))) for rid in ("a/w0", "b/w0"))
    from_a, from_b = Message("r/a", b"A", 0, True, "ca", "a/w0"), Message("r/b", b"B", 0, True, "cb", "b/w0")
    a.publish(from_a)
    b.publish(from_b)
    a.peer_retained(from_b)
    b.peer_retained(from_a)
    assert [_retained(r, t) for r in (a, b) for t in ("r/a", "r/b")] == [b"A", b"B"] * 2
    assert a.stats.retained_count == b.stats.retained_count == 2
    a.publish(Message("r/c", b"C", 0, True, "ca", "a/w0"))
    assert _retained(a, "r/c") is None and a.stats.limit_retained == 1


def test_a_stale_session_being_handed_over_is_dropped_when_the_transfer_fails():
    """A router back from the dead restores a session that was taken over elsewhere meanwhile; a
    takeover request that was on its way to its previous incarnation starts handing it over just
    as the fence saying it is stale arrives. Before, the fence skipped a session being moved and
    the failed transfer kept it: a stale session (and its subscriptions) stayed for good (the
    chaos suite with partitions, seed 40). Now the failed transfer drops it; one that is not stale
    still stays, and one handed over successfully goes as before."""
    async def run() -> Router:
        r = Router(RouterConfig())
        for cid in ("stale", "kept"):
            s = r.new_session(cid, True)
            r.subscribe(s, Subscription(f"{cid}/#", 1))
            assert r.release_session(cid, same_node=False) is not None  # being handed over
        r.drop_stale_sessions(["stale"])
        assert "stale" in r.sessions, "dropped while its transfer was under way"
        r.moved("stale", ok=False)
        r.moved("kept", ok=False)
        return r

    r = asyncio.run(run())
    assert "stale" not in r.sessions and "kept" in r.sessions
    assert not r.stale_moving
    assert len(r.subs) == 1


def test_a_move_in_doubt_is_settled_by_a_late_confirmation_unless_resumed_here():
    """A transfer given up because the new owner fell silent before confirming (``doubt``)
    keeps the session here; a confirmation from that router later drops it and hands on what it
    got meanwhile (its log is off here: its queue). One from another router, or after a client
    resumed the session here, changes nothing: the copy here is the client's."""
    from tests.unit.conftest import HandOnMesh as Mesh

    async def run() -> tuple[Router, Mesh]:
        mesh = Mesh()
        r = Router(RouterConfig(), mesh)
        for cid in ("moved", "resumed", "ended"):
            s = r.new_session(cid, True)
            r.subscribe(s, Subscription(f"{cid}/#", 1))
            assert r.release_session(cid, same_node=False) is not None
            r.moved(cid, ok=False, to="b/w0", doubt=True)
            assert r.sessions.get(cid) is s, "not kept while in doubt"
        r.publish(Message("moved/x", b"meanwhile", 1, False, "p", "t/w0"))
        r.moved_after_all("moved", "c/w0")  # not the router it went to
        assert "moved" in r.sessions and not mesh.handed
        r.sessions["resumed"].attach(FakeConn(4))  # type: ignore[arg-type]
        r.end_session(r.sessions["ended"])  # (expired, say): its move in doubt ends with it
        assert "ended" not in r.in_doubt
        r.moved_after_all("moved", "b/w0")
        r.moved_after_all("resumed", "b/w0")
        return r, mesh

    r, mesh = asyncio.run(run())
    assert "moved" not in r.sessions and "resumed" in r.sessions
    assert [(to, cid, [item[2][1] for item in items]) for to, cid, items in mesh.handed] == \
        [("b/w0", "moved", [b"meanwhile"])]
    assert not r.in_doubt


def test_without_a_log_a_hand_on_leaves_out_the_copies_that_reached_the_new_owner_directly():
    """A session moved to ``b/w0`` stays subscribed here until a barrier is answered, and what
    reaches it meanwhile is handed on. Without a log the new owner has no offsets to tell the
    copies that also came to it directly; those published here or on the new owner after the
    move did (its interest was taken in here before it confirmed; it held the session): handed
    on, they arrived twice (a QoS 1 duplicate, seen in the suite). Those from a third router,
    which may have sent them here before it knew of the move, still go."""
    from brokerd.router.ports import NullMesh

    class Mesh(NullMesh):
        def __init__(self) -> None:
            self.handed: list[tuple[str, str, list]] = []
            self.barriers: list[asyncio.Future] = []

        def barrier(self) -> asyncio.Future:  # type: ignore[override]
            self.barriers.append(asyncio.get_running_loop().create_future())
            return self.barriers[-1]

        def hand_on(self, router_id: str, client_id: str, items: list, answered: object = None,
                    stale: bool = False) -> None:
            self.handed.append((router_id, client_id, items))

    async def run() -> Mesh:
        mesh = Mesh()
        r = Router(RouterConfig(router_id="a/w0"), mesh)
        s = r.new_session("moved", True)
        r.subscribe(s, Subscription("moved/#", 1))
        assert r.release_session("moved", same_node=True) is not None
        r.moved("moved", ok=True, to="b/w0")
        for origin in ("a/w0", "b/w0", "c/w0"):
            r.publish(Message("moved/x", origin.encode(), 1, False, "p", origin))
        assert not mesh.handed and len(mesh.barriers) == 1
        mesh.barriers[0].set_result({})
        await asyncio.sleep(0)
        return mesh

    mesh = asyncio.run(run())
    assert [(to, cid, [item[2][1] for item in items]) for to, cid, items in mesh.handed] == \
        [("b/w0", "moved", [b"c/w0"])]


def test_a_fence_naming_a_router_whose_takeover_was_undone_waits_for_the_claim_to_be_withdrawn():
    """Partition seed 15: router n2/w0 took a session over from here, its claim timed out, it
    undid the takeover (the session stayed here), and the claim committed later. Fenced at once,
    the session was handed to a router that had none and the client got an empty one. Now the
    fence waits: a record moved back here (the claimant withdraws: ``SessionOwners.on_owned``)
    keeps the session; one that stays elsewhere fences it as before, what it held handed on."""
    from brokerd.router.clock import FakeClock

    class Mesh(NullMesh):
        def __init__(self) -> None:
            self.handed: list[tuple[str, str, list]] = []

        def hears(self, router_id: str) -> bool:
            return True

        def hand_on(self, router_id: str, client_id: str, items: list, answered: object = None,
                    stale: bool = False) -> None:
            self.handed.append((router_id, client_id, items))

    class Owners:
        def __init__(self) -> None:
            self.owned: set[str] = set()

        def owns(self, client_id: str) -> bool:
            return client_id in self.owned

        def ended(self, client_id: str) -> None:
            pass

    async def run() -> tuple[Router, Mesh]:
        mesh, clock, owners = Mesh(), FakeClock(), Owners()
        r = Router(RouterConfig(router_id="n1/w0"), mesh, clock=clock)
        r.owners = owners  # type: ignore[assignment]  # (a stand-in: owns is what a fence reads)
        for cid in ("kept", "fenced"):
            s = r.new_session(cid, True)
            r.subscribe(s, Subscription(f"{cid}/#", 1))
            assert r.release_session(cid, same_node=False) is not None
            r.moved(cid, ok=False, to="n2/w0")  # the claimant undid its takeover
            r.publish(Message(f"{cid}/x", b"meanwhile", 1, False, "p", "n3/w0"))
            r.fence_stale(cid, "n2/w0")
            assert r.sessions.get(cid) is s, "fenced at once"
        r.fence_stale("fenced", "n3/w0")  # another router named: no wait
        assert "fenced" not in r.sessions
        assert [(to, cid, [item[2][1] for item in items]) for to, cid, items in mesh.handed] == \
            [("n3/w0", "fenced", [b"meanwhile"])]
        s = r.new_session("fenced", True)
        r.subscribe(s, Subscription("fenced/#", 1))
        assert r.release_session("fenced", same_node=False) is not None
        r.moved("fenced", ok=False, to="n2/w0")
        r.fence_stale("fenced", "n2/w0")
        mesh.handed.clear()
        owners.owned.add("kept")  # its record came back here
        clock.advance(4.9)
        assert "fenced" in r.sessions and not mesh.handed
        clock.advance(0.2)
        return r, mesh

    r, mesh = asyncio.run(run())
    assert "kept" in r.sessions and "fenced" not in r.sessions
    assert [(to, cid) for to, cid, _ in mesh.handed] == [("n2/w0", "fenced")]


def test_an_offline_backlog_exported_to_another_node_includes_records_not_written_yet(tmp_path):
    """The chaos suite (seed 491128138) lost the last few messages an offline session's router
    logged before the session moved to another node: the export read the backlog from the log's
    files up to the log's end, while the last records were still with the writer thread (handed
    to it, not written: it was busy with an fsync), so the reading stopped short of them; and the
    hand-on after the move starts at that end. Now the export reads through the log, which serves
    such records from memory. Here they are not flushed at all."""
    from brokerd.router.log.commitlog import CommitLog

    async def run() -> list:
        log_ = CommitLog(tmp_path, router_id="t/w0", loop=asyncio.get_running_loop())
        try:
            r = Router(RouterConfig(router_id="t/w0"))
            r.attach_log(log_, False)
            s = r.new_session("d", True)
            r.subscribe(s, Subscription("e/#", 1))
            s.cursor = log_.next_offset  # offline: its backlog is a position in the log
            for i in range(3):
                r.publish(Message("e/x", f"m{i}".encode(), 1, False, "p", "t/w0"))
            log_.flush()  # handed to the writer thread
            for i in range(3, 5):
                r.publish(Message("e/x", f"m{i}".encode(), 1, False, "p", "t/w0"))  # in memory still
            return [item[2][1] for chunk in s.export_copies(same_node=False) for item in chunk]
        finally:
            log_.close()

    assert asyncio.run(run()) == [b"m0", b"m1", b"m2", b"m3", b"m4"]


def test_a_snapshot_names_no_position_a_crash_can_take_back(tmp_path):
    """A session caught up with the log has the log's end as its position. The snapshot took
    that end as the log had assigned it, though the last records were not written yet (with the
    writer thread, busy with an fsync): after a SIGKILL the log came back shorter, went on at a
    lower offset, and the restored session started beyond the records written after the restart
    and never read them (chaos suite, seed 1375755681: 22 acknowledged messages, offsets 293 to 314
    of a log that came back at 287 under a position of 315). A snapshot now names at most the
    written end. Here the crash is the files as they are, copied aside."""
    import shutil

    from brokerd.router.log.commitlog import CommitLog
    from brokerd.router.persistence import StateStore

    live, after = tmp_path / "live", tmp_path / "after"

    async def crash() -> None:
        log_ = CommitLog(live, router_id="t/w0", loop=asyncio.get_running_loop())
        r = Router(RouterConfig(router_id="t/w0"))
        r.attach_log(log_, False)
        r.attach_state(StateStore(r, str(live)))
        r.subscribe(r.new_session("d", True), Subscription("e/#", 1))
        for i in range(3):  # (for others: "d" has nothing pending, its position is the log's end)
            r.publish(Message("z/x", f"m{i}".encode(), 1, False, "p", "t/w0"))
        log_.flush()  # written (the writer thread was idle)
        for i in range(3, 5):
            r.publish(Message("z/x", f"m{i}".encode(), 1, False, "p", "t/w0"))  # not written yet
        r.state.write_now()
        shutil.copytree(live, after)  # what a SIGKILL leaves
        log_.close()

    async def restart() -> list[bytes]:
        log_ = CommitLog(after, router_id="t/w0", loop=asyncio.get_running_loop())
        try:
            r = Router(RouterConfig(router_id="t/w0"))
            r.attach_log(log_, False)
            r.attach_state(StateStore(r, str(after)))
            assert log_.next_offset == 3  # the two unwritten records are gone
            r.state.load()
            r.publish(Message("e/x", b"after", 1, False, "p", "t/w0"))  # offset 3 again
            log_.flush()
            return [item[2][1] for chunk in r.sessions["d"].export_copies(same_node=False) for item in chunk]
        finally:
            log_.close()

    asyncio.run(crash())
    assert asyncio.run(restart()) == [b"after"]


def test_arrivals_of_moved_sessions_are_kept_for_a_while_only(router):
    """A session taken over from another router is remembered with its arrival time (a silent
    router's catch-up asks for what it published since), for ``moved_in_keep_s`` only: a fleet
    moving between routers all day must not grow this. Sessions from a replica are not kept
    (their catch-up is asked at once)."""
    s, _ = online(router, "m", ("e/#", 1))
    state = s.export_state()
    router.config.moved_in_keep_s = 0.5
    router.moved_in["old"] = 0.0  # long ago
    router.import_session("n1", state)
    assert list(router.moved_in) == ["n1"], router.moved_in
    router.import_session("n2", {**state, "replica": "a/w0"})
    assert "n2" not in router.moved_in


def test_a_durable_wait_ends_once_the_state_as_it_was_is_on_disk(tmp_path):
    """A session taken over from another router of the node must be in this router's snapshot
    before the old router drops it from its own (a crash of the node in between lost it: the
    chaos suite, seed 1964786392). ``StateStore.durable`` is that wait: done once a snapshot taken
    after the call is written, also when a write was under way at the call (that one does not
    count), and at once rather than at the next interval."""
    import msgpack

    from brokerd.router.persistence import StateStore

    async def run() -> tuple[bool, bool, dict]:
        r = Router(RouterConfig())
        store = StateStore(r, str(tmp_path), interval_s=60.0)  # the timer alone would wait a minute
        r.attach_state(store)
        r.subscribe(r.new_session("d", True), Subscription("a/#", 1))
        first = store.durable()
        await asyncio.sleep(0)  # the write of "d" starts
        r.subscribe(r.new_session("e", True), Subscription("b/#", 1))
        second = store.durable()  # asked while the first write is under way
        ok1 = await asyncio.wait_for(first, 5)
        ok2 = await asyncio.wait_for(second, 5)
        with open(store.path, "rb") as f:
            data = msgpack.unpackb(f.read(), strict_map_key=False)
        return ok1, ok2, data

    ok1, ok2, data = asyncio.run(run())
    assert ok1 and ok2
    assert {"d", "e"} <= set(data["sessions"])


def test_copies_read_back_for_a_session_are_not_cut_at_max_queued(router):
    """A catch-up (or a hand-on) brings copies of acknowledged messages, bounded where they are
    read; several routers' read-backs meeting in one session's queue must not drop the last
    router's at --max-queued (3 here), as live deliveries to a full queue are dropped."""
    s = router.new_session("dev", True)
    router.subscribe(s, Subscription("m/#", 1))
    items = [[1, False, Message(f"m/{i}", b"%d" % i, 1, origin_router="x/w0", origin_offset=i).to_list()]
             for i in range(10)]
    router.take_copies("dev", items[:6])
    router.take_copies("dev", items[6:])
    assert [m.payload for m, _, _ in s.queue] == [b"%d" % i for i in range(10)]
    router.publish(Message("m/live", b"live", 1))  # a live one to the full queue: dropped, counted
    assert len(s.queue) == 10 and router.stats.drop_queue_full == 1


def test_copies_held_in_memory_only_come_back_after_a_restart(tmp_path):
    """Copies a session holds in memory only (here two hand-ons sent and not acknowledged, one
    queued behind a window of 2; a move's in-flight window is held the same way) are in no log
    and no spool: the snapshot keeps them whole (``held``), and a restart delivers them again.
    Before, a crash of the router lost them."""
    from brokerd.router.log.commitlog import CommitLog
    from brokerd.router.persistence import StateStore

    async def run() -> list[bytes]:
        config = RouterConfig(router_id="t/w0", session=SessionLimits(max_inflight=2))
        log_ = CommitLog(tmp_path / "w0", router_id="t/w0", loop=asyncio.get_running_loop())
        r = Router(config)
        r.attach_log(log_, False)
        r.attach_state(StateStore(r, str(tmp_path / "w0")))
        s = r.new_session("dev", True)
        r.subscribe(s, Subscription("m/#", 1))
        conn = FakeConn()
        s.attach(conn)  # type: ignore[arg-type]
        r.take_copies("dev", [[1, False, Message(f"m/{i}", b"%d" % i, 1, origin_router="x/w0",
                                                 origin_offset=i).to_list()] for i in range(3)])
        assert len(s.inflight) == 2 and len(s.queue) == 1
        r.state.write_now()
        log_.close()
        log_ = CommitLog(tmp_path / "w0", router_id="t/w0", loop=asyncio.get_running_loop())
        again = Router(config)
        again.attach_log(log_, False)
        again.attach_state(StateStore(again, str(tmp_path / "w0")))
        again.state.load()
        back = again.sessions["dev"]
        log_.close()
        return [m.payload for m, _, _ in back.queue]

    assert asyncio.run(run()) == [b"0", b"1", b"2"]


@pytest.mark.parametrize("tick", [True, False])
def test_an_acknowledgement_waits_until_its_record_is_written(tmp_path, tick):
    """With ``--fsync interval`` (the default) a PUBACK went out with the loop iteration's writes
    while its record still sat in the log's batch, written only at the 2 ms linger: a SIGKILL of
    the worker in between lost acknowledged messages (a QoS 1 stream, the worker killed five
    times: 20 to 268 acknowledged messages missing from the log in three of the five). Now the
    acknowledgement is queued in its place and the connection's output gated until the record is
    written: marked on the worker's end-of-iteration flush, the batch is written in the same
    iteration; without one, at the linger."""

    from brokerd.connection.batching import EndOfTick
    from brokerd.connection.codec import PUBACK, success_ack
    from brokerd.router.log.commitlog import CommitLog

    async def run() -> None:
        loop = asyncio.get_running_loop()
        log_ = CommitLog(tmp_path, router_id="t/w0", loop=loop)
        try:
            r = Router(RouterConfig(router_id="t/w0"))
            r.attach_log(log_, False, EndOfTick(loop) if tick else None)
            publisher = Client(r, FakeConn())  # (compiled, a Client is checked as one)
            msg = Message("e/x", b"m", 1, False, "p", "t/w0")
            r.publish(msg)
            r.defer_ack(msg.log_offset, publisher, success_ack(PUBACK, 7))
            publisher.conn.send(b"\xd0\x00")  # a later packet keeps its place after the ack
            assert log_.written_offset < msg.log_offset
            assert publisher.conn.chunks == [] and publisher.held_acks == 1  # Receive Maximum
            await asyncio.sleep(0)  # the end of this iteration
            if not tick:
                assert publisher.conn.chunks == [], "acknowledged before its record was written"
                for _ in range(100):  # the linger (2 ms) writes it
                    if publisher.conn.chunks:
                        break
                    await asyncio.sleep(0.005)
            assert log_.written_offset >= msg.log_offset
            assert publisher.conn.chunks == [success_ack(PUBACK, 7), b"\xd0\x00"]
            assert publisher.held_acks == 0
        finally:
            log_.close()

    asyncio.run(run())


def test_a_log_that_cannot_write_refuses_the_acknowledgements_waiting_for_it(tmp_path):
    """A failed write: the gated acknowledgements are never written, their connection closes
    (the client resends after reconnecting), as with --fsync always."""

    from brokerd.connection.codec import PUBACK, success_ack
    from brokerd.router.log.commitlog import CommitLog

    async def run() -> tuple[FakeConn, int]:
        log_ = CommitLog(tmp_path, router_id="t/w0", loop=asyncio.get_running_loop())
        try:
            r = Router(RouterConfig(router_id="t/w0"))
            r.attach_log(log_, False)
            publisher = Client(r, FakeConn())  # (compiled, a Client is checked as one)
            msg = Message("e/x", b"m", 1, False, "p", "t/w0")
            r.publish(msg)
            r.defer_ack(msg.log_offset, publisher, success_ack(PUBACK, 3))
            log_._enter_failed(OSError(28, "No space left on device"))  # what a failed write reports
            return publisher.conn, publisher.held_acks
        finally:
            log_.close()

    conn, held = asyncio.run(run())
    assert conn.chunks == [] and conn.refused is not None and conn.closing and held == 0
