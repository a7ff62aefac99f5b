"""Shared subscriptions without processes: share names, the choice of router and of member, and
what a router sends its peers (a fake mesh records it)."""

from __future__ import annotations

from collections import Counter

import msgpack
import pytest

from brokerd.connection.codec import Decoder
from brokerd.connection.packets import Publish, Subscription
from brokerd.router.access import install_auth
from brokerd.router.auth import Acl, Auth
from brokerd.router.mesh_format import from_mesh_shared, to_mesh, to_mesh_shared
from brokerd.router.message import Message
from brokerd.router.router import Router, RouterConfig
from brokerd.router.session import SessionLimits
from brokerd.router.shared import NONE, SharedRoute, parse_share, smooth_schedule
from tests.unit.conftest import FakeConn, FakeMesh


@pytest.fixture
def router() -> Router:
    return Router(RouterConfig(router_id="n/w0", session=SessionLimits(max_inflight=5, max_queued=3)))


def member(router: Router, cid: str, key: str, qos: int = 0, online: bool = True, persistent: bool = False):
    s = router.new_session(cid, persistent)
    conn = FakeConn()
    if online:
        s.attach(conn)  # type: ignore[arg-type]
    router.subscribe_shared(s, Subscription(key, qos))
    return s, conn


def received(conn: FakeConn) -> list[bytes]:
    return [p.payload for p in conn.packets() if isinstance(p, Publish)]


@pytest.mark.parametrize("text,expected", [
    ("$share/g/t", ("g", "t")),
    ("$share/g/a/+/#", ("g", "a/+/#")),
    ("$share/g//", ("g", "/")),
    ("$share//t", None),  # empty ShareName
    ("$share/g+/t", None),
    ("$share/#/t", None),
    ("$share/g", None),  # no filter
    ("$share/g/", None),  # empty filter
    ("$share/g/a/#/b", None),
])
def test_share_names_and_filters(text, expected):
    assert parse_share(text) == expected


def test_router_choice_is_weighted_by_connected_members():
    route = SharedRoute("$share/g/t", "g", "t")
    assert route.choose() is None
    route.set_presence("b", -2)  # two members, both offline
    assert [route.choose() for _ in range(2)] == ["b", "b"]  # nobody connected: still chosen
    route.set_presence("a", 3)
    route.set_presence("c", 1)
    picks = [route.choose() for _ in range(40)]
    assert Counter(picks) == {"a": 30, "c": 10}  # b only has offline members
    assert max(len(run) for run in "".join(picks).replace("c", " ").split()) <= 3  # spread, not a block
    route.set_presence("a", NONE)
    route.set_presence("c", -1)
    assert Counter(route.choose() for _ in range(30)) == {"b": 20, "c": 10}


def test_a_long_schedule_is_scaled_down_but_keeps_every_router():
    schedule = smooth_schedule({"big": 10_000, "small": 1})
    assert len(schedule) <= 257 and "small" in schedule


def test_each_message_goes_to_exactly_one_member_in_turn(router):
    conns = [member(router, f"m{i}", "$share/g/s/#")[1] for i in range(3)]
    for i in range(30):
        router.publish(Message(f"s/{i % 2}", str(i).encode()))
    got = [received(c) for c in conns]
    assert sorted(p for g in got for p in g) == sorted(str(i).encode() for i in range(30))
    assert [len(g) for g in got] == [10, 10, 10]


def test_members_whose_socket_is_backed_up_are_skipped(router):
    (_, c0), (_, c1) = member(router, "a", "$share/g/t"), member(router, "b", "$share/g/t")
    c0.write_paused = True
    for i in range(4):
        router.publish(Message("t", b"%d" % i))
    assert received(c0) == [] and len(received(c1)) == 4
    assert router.stats.drop_slow_consumer == 0


def test_an_offline_member_is_chosen_only_when_no_member_is_online(router):
    off, _ = member(router, "off", "$share/g/t", qos=1, online=False, persistent=True)
    _, on = member(router, "on", "$share/g/t", qos=1)
    for i in range(3):
        router.publish(Message("t", b"%d" % i, qos=1))
    assert len(received(on)) == 3 and not off.queue
    router.sessions["on"].detach()
    router.shared_presence(router.sessions["on"])
    router.publish(Message("t", b"x", qos=1))
    assert len(off.queue) + len(router.sessions["on"].queue) == 1  # queued for one offline member


def test_normal_and_shared_subscriptions_both_deliver(router):
    s, conn = member(router, "both", "$share/g/t")
    router.subscribe(s, Subscription("t", 0))
    _, other = member(router, "other", "$share/h/t")
    router.publish(Message("t", b"x"))
    assert received(conn) == [b"x", b"x"]  # its normal copy and group g's copy
    assert received(other) == [b"x"]  # group h's copy


def test_unsubscribe_and_drop_withdraw_presence():
    r = Router(RouterConfig(router_id="n/w0"), FakeMesh())  # type: ignore[arg-type]
    mesh: FakeMesh = r.mesh  # type: ignore[assignment]
    a, _ = member(r, "a", "$share/g/t")
    b, _ = member(r, "b", "$share/g/t")
    assert mesh.announced == [("$share/g/t", 1), ("$share/g/t", 2)]  # connected members here
    assert r.unsubscribe_shared(a, "$share/g/t") and not r.unsubscribe_shared(a, "$share/g/t")
    r.drop_session(b)
    assert mesh.announced[-1] == ("$share/g/t", NONE)
    assert not r.has_shared and not r.shared_local and not r.shared_routes


def test_the_origin_sends_one_copy_per_router_naming_its_groups():
    r = Router(RouterConfig(router_id="n/w0"), FakeMesh())  # type: ignore[arg-type]
    mesh: FakeMesh = r.mesh  # type: ignore[assignment]
    r.peer_interest("n/w1", "$share/g/t/#", 1)
    r.peer_interest("n/w2", "$share/g/t/#", 1)
    r.peer_interest("n/w1", "t/x", True)  # a normal subscriber on w1 too
    for _ in range(4):
        r.publish(Message("t/x", b"p"))
    assert len(mesh.forwards) == 6  # 4 copies to w1 (normal subscriber), 2 to w2
    per_router = {rid: [g for x, _, g in mesh.forwards if x == rid] for rid in ("n/w1", "n/w2")}
    assert len(per_router["n/w1"]) == 4  # every message (normal subscriber), group named in 2
    assert sum(1 for g in per_router["n/w1"] if g) == 2
    assert per_router["n/w2"] == [["$share/g/t/#"]] * 2  # only the messages it was chosen for
    mesh.forwards.clear()
    r.peer_left("n/w2")
    r.publish(Message("t/x", b"p"))
    assert mesh.forwards == [("n/w1", "t/x", ["$share/g/t/#"])]


def test_no_shared_subscription_keeps_the_plain_path():
    r = Router(RouterConfig(router_id="n/w0"), FakeMesh())  # type: ignore[arg-type]
    r.peer_interest("n/w1", "t/#", True)
    r.publish(Message("t/x", b"p"))
    assert not r.has_shared and r.mesh.forwards == [("n/w1", "t/x", None)]  # type: ignore[union-attr]


def test_the_chosen_router_delivers_to_one_local_member(router):
    conns = [member(router, f"m{i}", "$share/g/t")[1] for i in range(2)]
    msg = Message("t", b"q", 0, False, "pub", "n/w1")
    wire = msgpack.unpackb(msgpack.packb(to_mesh_shared(msg, ["$share/g/t"])), raw=False)
    back, groups, only = from_mesh_shared(wire, "n/w1")
    assert not only
    router.deliver_remote_shared(back, groups)
    router.deliver_remote(Message("t", b"not-for-the-group"))
    assert sorted(p for c in conns for p in received(c)) == [b"q"]
    router.deliver_remote_shared(Message("t", b"gone"), ["$share/other/t"])
    assert router.stats.shared_no_member == 1


def test_the_compact_form_gains_a_sixth_element_only_with_groups():
    raw = bytes([0x30, 2 + 1 + 1]) + b"\x00\x01tp"
    [p] = Decoder(protocol_level=4).feed(raw)
    msg = Message.published(p.topic, p.payload, 0, False, "c", "n/w0", None, p.raw, 4)
    msg.origin_offset, msg.timestamp_ms = 5, 7
    assert len(to_mesh(msg)) == 5
    assert to_mesh_shared(msg, ["$share/g/t"]) == [raw, "t", "c", 5, 7, ["$share/g/t"]]
    back, groups, only = from_mesh_shared(to_mesh_shared(msg, ["$share/g/t"], only=True), "n/w0")
    assert (back.topic, back.payload, groups, only) == ("t", b"p", ["$share/g/t"], True)
    full = Message("t", b"p", 1, False, "c", "n/w0", 5, None, 7)
    assert len(to_mesh_shared(full, ["$share/g/t"])) == 10


def test_catch_up_never_replays_a_group_message():
    """A persistent member reads its log for its normal subscriptions only."""

    class Log:
        error = None
        next_offset = 0

        def read(self, offset: int, max_records: int) -> list:
            return [Rec(offset)] if offset == 0 else []

    class Rec:
        topic, qos, retain, client_id, origin_router, origin_offset, properties = "t", 1, False, "p", "n", 0, b""
        payload, timestamp_ms = b"logged", 1

        def __init__(self, offset: int) -> None:
            self.offset = offset

    r = Router(RouterConfig(router_id="n/w0"))
    s, _ = member(r, "p", "$share/g/t", qos=1, online=False, persistent=True)
    s.log, s.cursor = Log(), 0
    r.publish(Message("t", b"live", qos=1))  # chosen while offline and reading the log: kept
    conn = FakeConn()
    s.attach(conn)  # type: ignore[arg-type]
    assert received(conn) == [b"live"]  # the logged record matches only the group: not replayed


def test_the_origin_shares_by_connected_members_itself_included():
    r = Router(RouterConfig(router_id="n/w0"), FakeMesh())  # type: ignore[arg-type]
    mesh: FakeMesh = r.mesh  # type: ignore[assignment]
    _, here = member(r, "local", "$share/g/w")  # one connected member on the publisher's router
    r.peer_interest("n/w1", "$share/g/w", 2)
    r.peer_interest("n/w2", "$share/g/w", -5)  # offline members only: not while others are connected
    for _ in range(30):
        r.publish(Message("w", b"p"))
    assert len(received(here)) == 10
    assert Counter(rid for rid, _, _ in mesh.forwards) == {"n/w1": 20}


def test_an_ended_members_unacknowledged_messages_go_to_another_member(router):
    a, _ = member(router, "a", "$share/g/h", qos=1)
    b, conn_b = member(router, "b", "$share/g/h", qos=1)
    for i in range(6):
        router.publish(Message("h", b"%d" % i, qos=1))
    assert len(a.inflight) == 3  # never acknowledged
    router.end_session(a)
    queued = [m.payload for m, _, _ in b.queue]  # b's window is 5
    assert sorted(received(conn_b) + queued) == [b"%d" % i for i in range(6)]


def test_a_normal_copy_is_not_handed_to_the_group(router):
    a, _ = member(router, "a", "$share/g/n", qos=1)
    router.subscribe(a, Subscription("n", 1))  # a normal subscriber of the same topic too
    _, conn_b = member(router, "b", "$share/g/n", qos=1)
    router.publish(Message("n", b"x", qos=1))
    router.end_session(a)  # a held its normal copy (and maybe the group's): nothing is handed on
    assert len(received(conn_b)) <= 1


def test_handing_on_to_another_router_is_for_the_group_alone():
    r = Router(RouterConfig(router_id="n/w0"), FakeMesh())  # type: ignore[arg-type]
    mesh: FakeMesh = r.mesh  # type: ignore[assignment]
    a, _ = member(r, "a", "$share/g/o", qos=1)
    r.publish(Message("o", b"m", qos=1))  # chosen here: the only member
    r.peer_interest("n/w1", "$share/g/o", 1)
    r.end_session(a)
    assert mesh.only == [("n/w1", b"m", ["$share/g/o"])]
    wire = msgpack.unpackb(msgpack.packb(to_mesh_shared(Message("o", b"m", 1), ["$share/g/o"], True)), raw=False)
    back, groups, only = from_mesh_shared(wire, "n/w0")
    assert (back.payload, groups, only) == (b"m", ["$share/g/o"], True)
    r2 = Router(RouterConfig(router_id="n/w1"))
    _, normal = online_normal(r2, "o")
    _, conn = member(r2, "m", "$share/g/o", qos=1)
    r2.deliver_remote_shared(back, groups, only)
    assert received(conn) == [b"m"] and received(normal) == []  # the normal subscriber had its copy


def test_a_message_that_arrives_after_the_last_local_member_left_goes_on_to_another_router():
    """n/w1 chose n/w0 for a group message while n/w0's last member was leaving: the message
    arrives with no member here. It goes on to n/w1 (the group's other router), for the group
    alone; one already handed on is not handed back (counted instead). Before, it was dropped:
    the CI saw a QoS 1 message acknowledged to its publisher reach no member."""
    r = Router(RouterConfig(router_id="n/w0"), FakeMesh())  # type: ignore[arg-type]
    mesh: FakeMesh = r.mesh  # type: ignore[assignment]
    a, _ = member(r, "a", "$share/g/late", qos=1)
    r.peer_interest("n/w1", "$share/g/late", 1)
    r.end_session(a)
    r.deliver_remote_shared(Message("late", b"on-its-way", qos=1), ["$share/g/late"])
    assert mesh.only == [("n/w1", b"on-its-way", ["$share/g/late"])]
    assert r.stats.shared_no_member == 0
    r.deliver_remote_shared(Message("late", b"handed-on", qos=1), ["$share/g/late"], True)
    assert len(mesh.only) == 1 and r.stats.shared_no_member == 1


def test_a_message_read_back_for_the_groups_reaches_one_member_per_group_and_nobody_else():
    """``Router.to_groups``: a dead router's message read back from its replica goes to one
    router per matching group (here or, as a group-only copy, elsewhere), not to the plain
    subscribers (they get theirs through their routers' own catch-up)."""
    r = Router(RouterConfig(router_id="n/w0"), FakeMesh())  # type: ignore[arg-type]
    mesh: FakeMesh = r.mesh  # type: ignore[assignment]
    _, plain = online_normal(r, "rb/#")
    _, conn = member(r, "m", "$share/g/rb/#", qos=1)
    r.peer_interest("n/w1", "$share/g/rb/#", 1)
    assert r.to_groups(Message("rb/x", b"one", qos=1)) == 1
    assert r.to_groups(Message("rb/x", b"two", qos=1)) == 1
    assert sorted(received(conn) + [p for _, p, _ in mesh.only]) == [b"one", b"two"]
    assert [g for _, _, g in mesh.only] == [["$share/g/rb/#"]]
    assert received(plain) == [] and len(mesh.forwards) == 1
    assert r.to_groups(Message("elsewhere", b"x", qos=1)) == 0


def online_normal(router: Router, topic_filter: str):
    s = router.new_session(f"n-{topic_filter}", False)
    conn = FakeConn()
    s.attach(conn)  # type: ignore[arg-type]
    router.subscribe(s, Subscription(topic_filter, 1))
    return s, conn


def test_a_silent_routers_members_are_the_last_resort_not_dropped(router):
    """peer_silent: the group's messages go to members that can take them now; when every
    connected member sits behind silent routers, to those (the mesh keeps the copies until they
    return) rather than to nobody; a full announcement (peer_left, then presence) ends it."""
    key = "$share/g/t"
    router.attach_mesh(FakeMesh())
    router.peer_interest("n/w1", key, 2)
    router.peer_interest("n/w2", key, 1)
    route = router.shared_routes[key]
    router.peer_silent("n/w1")
    assert {route.choose() for _ in range(20)} == {"n/w2"}
    router.peer_silent("n/w2")
    assert {route.choose() for _ in range(30)} == {"n/w1", "n/w2"}  # silent, but not nobody
    router.peer_left("n/w1")  # n/w1 returns and announces everything anew
    router.peer_interest("n/w1", key, 2)
    assert {route.choose() for _ in range(20)} == {"n/w1"}  # n/w2 is still silent



class MetMesh(FakeMesh):
    """A FakeMesh that has met its peers' incarnations but knows the interest only of ``known``."""

    def __init__(self) -> None:
        super().__init__()
        self.known: set[str] = set()

    def interest_known(self, router_id: str) -> bool:
        return router_id in self.known


def test_a_group_copy_reaching_a_router_that_knows_no_member_waits_for_the_groups_presence():
    """Partition seed 307: a restarted router is sent again the frames its old incarnation never
    confirmed before the sender's interest reaches it; the group copies in them, chosen for a
    member that died with the old process, found no route and were dropped (five acknowledged
    messages lost). Now they wait for a router of the group to be announced, then go to it, for
    the group alone; nobody announced within ``HELD_S``: dropped and counted. From a router whose
    interest is known, such a copy is counted at once, as before."""
    from brokerd.router.clock import FakeClock
    from brokerd.router.shared_routing import HELD_S

    clock = FakeClock()
    r = Router(RouterConfig(router_id="n/w0"), MetMesh(), clock=clock)  # type: ignore[arg-type]
    mesh: MetMesh = r.mesh  # type: ignore[assignment]
    key = "$share/g/seed"
    r.deliver_forwarded([to_mesh_shared(Message("seed", b"sent-again", qos=1), [key])], "n/w1")
    assert mesh.only == [] and r.stats.shared_no_member == 0
    clock.advance(HELD_S / 2)
    mesh.known.add("n/w1")
    r.peer_interest("n/w1", key, 1)  # the sender's full announcement, after its frames
    assert mesh.only == [("n/w1", b"sent-again", [key])]
    clock.advance(HELD_S)
    assert r.stats.shared_no_member == 0 and len(mesh.only) == 1  # delivered once, not dropped too
    r.peer_interest("n/w1", key, NONE)
    r.deliver_forwarded([to_mesh_shared(Message("seed", b"nobody-yet", qos=1), [key])], "n/w2")
    clock.advance(HELD_S + 0.1)
    r.peer_interest("n/w1", key, 1)
    assert r.stats.shared_no_member == 1 and len(mesh.only) == 1
    r.peer_interest("n/w1", key, NONE)
    r.deliver_forwarded([to_mesh_shared(Message("seed", b"known", qos=1), [key])], "n/w1")
    assert r.stats.shared_no_member == 2


def test_a_copy_picked_here_that_no_member_here_may_read_goes_to_another_router_of_the_group():
    """The publisher's router picks itself for a group, but its only member's read grant was
    revoked (a reload): the copy goes to another router of the group, whose members' grants may
    differ, rather than to nobody (MQTT 4.8.2: one member is owed it); a topic the member may
    read stays here."""
    r = Router(RouterConfig(router_id="n/w0"), FakeMesh())  # type: ignore[arg-type]
    mesh: FakeMesh = r.mesh  # type: ignore[assignment]
    install_auth(r, Auth(acl=Acl.parse("user bob\ntopic read a/public\n")))
    bob, here = member(r, "bob", "$share/g/a/#", qos=1)
    bob.username = "bob"
    r.peer_interest("n/w1", "$share/g/a/#", 1)  # alice's router: one connected member
    for _ in range(6):
        r.publish(Message("a/secret", b"s", qos=1))
    assert received(here) == []
    assert mesh.forwards == [("n/w1", "a/secret", ["$share/g/a/#"])] * 6
    assert r.stats.shared_no_member == 0
    mesh.forwards.clear()
    for _ in range(6):
        r.publish(Message("a/public", b"p", qos=1))
    assert len(received(here)) == 3 and len(mesh.forwards) == 3  # shared by connected members
    r.peer_left("n/w1")
    r.publish(Message("a/secret", b"s", qos=1))
    assert r.stats.shared_no_member == 1  # no other router of the group: nobody may read it
