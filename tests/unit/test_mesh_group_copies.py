"""A shared group's copies chosen for a router that does not get them (issue 41): forgotten after
``--mesh-forget`` with frames it never confirmed, or beyond its backlog while parked. Each QoS 1/2
group copy goes to another router of its group, for that group alone, once; plain copies and
QoS 0 ones keep today's rule. Values and fakes: frames as bytes, a fake clock, a fake mesh."""

from __future__ import annotations

from types import SimpleNamespace

import msgpack
import pytest

from brokerd.cluster.mesh import delivery
from brokerd.cluster.mesh.forwarding import ForwardingMixin, to_other_members
from brokerd.cluster.mesh.peer import Peer
from brokerd.router.mesh_format import MESH_VERSION, PUBLISH, RETAINED, to_mesh, to_mesh_shared
from brokerd.router.message import Message
from brokerd.router.router import Router, RouterConfig
from brokerd.router.shared import NONE
from tests.unit.conftest import FakeMesh
from tests.unit.test_mesh_members import FORGET, PEER, TIMEOUT, Part

ME = "u/w0"
OTHER = "y/w0"
KEY = "$share/g/t"


def frame(kind: int, body: object) -> bytes:
    """A frame of ours as ``framing._frame`` packs it."""
    return msgpack.packb([MESH_VERSION, kind, ME, 1, body])


def publish(seq: int, batch: list, mark: int = -1) -> bytes:
    return frame(PUBLISH, [seq, batch, mark])


def body(data: bytes) -> list:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)[4]


def msg(payload: bytes, qos: int = 1) -> Message:
    return Message("t", payload, qos, False, "pub", ME, 0, None, 1)


def peer_with(ring: list[tuple[int, bytes]], acked: int = 0) -> Peer:
    peer = Peer(PEER, "x", None, "tcp://x:1")
    for seq, data in ring:
        delivery.unconfirmed(peer, seq, data, 1 << 20)
    peer.acked = acked
    return peer


def payloads(copies: list[delivery.GroupCopy]) -> list[tuple[bytes, list[str]]]:
    return [(m.payload, groups) for m, groups in copies]


def test_unconfirmed_group_copies_are_taken_once_and_the_ring_keeps_the_rest():
    plain = to_mesh(msg(b"plain"))
    confirmed = publish(1, [to_mesh_shared(msg(b"confirmed"), [KEY], True)])
    mixed = publish(2, [to_mesh_shared(msg(b"only"), [KEY], True),  # for the group alone
                        to_mesh_shared(msg(b"both"), [KEY]),  # also for the peer's plain subscribers
                        to_mesh_shared(msg(b"qos0", 0), [KEY]),  # at most once: stays
                        plain], 17)
    peer = peer_with([(1, confirmed), (2, mixed)], acked=1)
    kept = [(0, mixed),  # what its link held when it was parked: in the ring already
            (3, publish(3, [to_mesh_shared(msg(b"kept", 2), [KEY, "$share/h/t"], True)])),
            (0, frame(RETAINED, [msg(b"r").to_list()]))]
    copies = delivery.group_copies(peer, kept, ME, frame)
    assert payloads(copies) == [(b"only", [KEY]), (b"both", [KEY]), (b"kept", [KEY, "$share/h/t"])]
    assert all(m.origin_router == ME for m, _ in copies)
    # The ring: the confirmed frame as it was; the other made again, same number and mark,
    # without the copies taken (the plain part of one for both stays).
    assert [seq for seq, _ in peer.ring] == [1, 2]
    assert peer.ring[0][1] == confirmed
    seq, batch, mark = body(peer.ring[1][1])
    assert (seq, mark) == (2, 17)
    assert batch == [to_mesh(msg(b"both")), to_mesh_shared(msg(b"qos0", 0), [KEY]), plain]
    assert peer.ring_bytes == sum(len(f) for _, f in peer.ring)
    # Taken once: asked again (the peer forgotten again after a return), nothing more.
    assert delivery.group_copies(peer, [], ME, frame) == []


def test_a_frame_beyond_the_backlog_gives_its_group_copies_and_no_other_frame_is_unpacked():
    data = publish(5, [to_mesh_shared(msg(b"a"), [KEY], True), to_mesh(msg(b"plain"))])
    assert payloads(delivery.dropped_group_copies(data, ME)) == [(b"a", [KEY])]
    assert delivery.dropped_group_copies(publish(6, [to_mesh(msg(b"plain"))]), ME) == []
    assert delivery.dropped_group_copies(frame(RETAINED, [msg(b"r").to_list()]), ME) == []


@pytest.fixture
def router() -> Router:
    r = Router(RouterConfig(router_id=ME, node_id="u"), FakeMesh())  # type: ignore[arg-type]
    r.shared.route_presence(KEY, PEER, 1)
    r.shared.route_presence(KEY, OTHER, 1)
    return r


def test_a_copy_handed_on_never_goes_back_to_the_router_that_will_not_get_it(router):
    mesh: FakeMesh = router.mesh  # type: ignore[assignment]
    to_other_members(router, [(msg(b"m%d" % i), [KEY]) for i in range(4)], PEER)
    assert mesh.only == [(OTHER, b"m%d" % i, [KEY]) for i in range(4)]
    router.shared.route_presence(KEY, OTHER, NONE)  # the router left alone in its group: nobody
    before = router.stats.shared_no_member
    to_other_members(router, [(msg(b"x"), [KEY])], PEER)
    assert len(mesh.only) == 4 and router.stats.shared_no_member == before + 1


class Forwarding(ForwardingMixin):
    """The mesh's forwarding part alone: a router without a log, a backlog of ``cap`` bytes."""

    def __init__(self, router: Router, cap: int) -> None:
        self.router = router
        self.router_id = ME
        self.config = SimpleNamespace(mesh_backlog=cap)  # type: ignore[assignment]


def test_the_group_copies_of_a_frame_beyond_a_parked_peers_backlog_go_to_another_router(router):
    mesh: FakeMesh = router.mesh  # type: ignore[assignment]
    router.shared.peer_silent(PEER)
    first = publish(1, [to_mesh_shared(msg(b"in"), [KEY], True)])
    forwarding = Forwarding(router, len(first))
    peer = peer_with([])
    peer.parked = True
    forwarding._keep(peer, first, 1, 1)  # kept: it goes to the peer when it returns
    forwarding._keep(peer, publish(2, [to_mesh_shared(msg(b"beyond"), [KEY], True)]), 1, 2)
    forwarding._keep(peer, publish(1, [to_mesh_shared(msg(b"in ring"), [KEY], True)]), 1)  # numbered 0 here
    assert [seq for seq, _ in peer.backlog] == [1]
    assert mesh.only == [(OTHER, b"beyond", [KEY])]


def test_a_forgotten_peers_unconfirmed_group_copies_go_to_another_router_of_the_group():
    part = Part()
    try:
        mesh = FakeMesh()
        part.router.attach_mesh(mesh)  # type: ignore[arg-type]
        part.members._frame = frame  # (the real frame layout: the part reads its frames back)
        part.members.heartbeat()
        part.hello()
        shared = part.router.shared
        shared.route_presence(KEY, PEER, 1)
        shared.route_presence(KEY, OTHER, 1)
        peer = part.members.peers[PEER]
        delivery.unconfirmed(peer, 1, publish(1, [to_mesh_shared(msg(b"lost"), [KEY], True)]), 1 << 20)
        part.tick(TIMEOUT + 1.0)
        assert peer.parked
        delivery.keep(peer, publish(2, [to_mesh_shared(msg(b"kept"), [KEY])]), 1, 1 << 20, None, False, 2)
        assert mesh.only == []
        part.tick(FORGET + 1.0)
        assert not peer.parked
        assert mesh.only == [(OTHER, b"lost", [KEY]), (OTHER, b"kept", [KEY])]
        assert KEY not in shared.routes or PEER not in shared.routes[KEY].routers
    finally:
        part.members.stop()
        part.loop.close()
