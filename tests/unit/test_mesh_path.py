"""The mesh's compiled receiving turn (cluster/mesh/path.py ``Inbound``): a live peer's PUBLISH
frame is delivered there, every other frame (another kind, a peer parked, unknown, of another
incarnation, or with frames held behind a missed number) goes to the dispatch as before, and a
frame whose handling fails is dropped without ending the turn. A fake socket, a real router."""

from __future__ import annotations

import msgpack
import zmq

from brokerd.cluster.mesh import Peer
from brokerd.cluster.mesh.limits import RECV_MSGS
from brokerd.cluster.mesh.path import Inbound, Refused
from brokerd.connection.packets import Publish
from brokerd.router.mesh_format import ECHO, MESH_VERSION, PUBLISH, to_mesh
from brokerd.router.message import Message
from brokerd.router.router import Router, RouterConfig
from tests.unit.conftest import online


class FakeSocket:
    """A PULL socket's ``recv``: the frames given, then ``zmq.Again``."""

    def __init__(self, frames: list[bytes]) -> None:
        self.frames = frames

    def recv(self, flags: int = 0) -> bytes:
        assert flags == zmq.NOBLOCK
        if not self.frames:
            raise zmq.Again()
        return self.frames.pop(0)


class FakeLoop:
    def __init__(self) -> None:
        self.soon: list[tuple] = []

    def call_soon(self, *args) -> None:
        self.soon.append(args)


def frame(kind: int, body, sender: str = "x/w0", inc: int = 7) -> bytes:
    return msgpack.packb([MESH_VERSION, kind, sender, inc, body], use_bin_type=True)


def publish(seq: int, topics: list[str]) -> bytes:
    return frame(PUBLISH, [seq, [to_mesh(Message(t, b"p", client_id="c")) for t in topics], -1])


def setup() -> tuple[Inbound, Router, Peer, dict[str, list]]:
    router = Router(RouterConfig(router_id="u/w0", node_id="u"))
    peer = Peer("x/w0", "x", None, None)
    peer.incarnation, peer.alive = 7, True
    calls: dict[str, list] = {"handle": [], "refused": [], "bad": [], "paused": []}

    def handle(*args) -> None:
        if args[0] == ECHO and args[3] == [0, 0, 0]:
            raise ValueError("this one fails")
        calls["handle"].append(args)

    inbound = Inbound(router, {"x/w0": peer}, FakeLoop(), lambda: 5.0, handle,  # type: ignore[arg-type]
                      calls["refused"].append, lambda *a: calls["bad"].append(a), calls["paused"].append)
    return inbound, router, peer, calls


def received(conn) -> list[str]:
    return [p.topic for p in conn.packets() if isinstance(p, Publish)]


def test_a_live_peers_publish_frame_is_delivered_in_the_turn_and_the_rest_go_to_the_dispatch():
    inbound, router, peer, calls = setup()
    _session, conn = online(router, "s", ("m/#", 0))
    sock = FakeSocket([publish(1, ["m/a", "m/b"]), frame(ECHO, [1, 2, 3]), b"\xc1", publish(2, ["m/c"])])
    inbound.on_readable(sock)
    assert received(conn) == ["m/a", "m/b", "m/c"]
    assert peer.seq_in == 2 and peer.last_seen == 5.0 and peer.stats[2] == 3
    assert router.stats.mesh_frames_in == 2 and router.stats.mesh_msgs_in == 3
    assert calls["handle"] == [(ECHO, "x/w0", 7, [1, 2, 3], len(frame(ECHO, [1, 2, 3])), 0, 0)]
    assert calls["refused"] == [Refused("?", "undecodable frame of 1 bytes")]
    assert calls["paused"] == [5.0], "the pause check once per turn"
    assert inbound.loop.soon == [], "the socket was drained: no turn more"  # type: ignore[attr-defined]


def test_a_publish_frame_of_a_peer_not_plainly_live_is_the_dispatchs_and_not_delivered_here():
    """Parked (the dispatch takes it back first), of another incarnation or unknown (ignored
    there), with frames held behind a missed number (acted on after it, in order), or with a
    number in its envelope, which no sender gives a PUBLISH frame (the dispatch's rules)."""
    inbound, router, peer, calls = setup()
    _session, conn = online(router, "s", ("m/#", 0))
    peer.alive = False
    data = publish(1, ["m/a"])
    inbound.on_readable(FakeSocket([data]))
    peer.alive, peer.held = True, [(9, (ECHO, [1], 1))]
    inbound.on_readable(FakeSocket([data]))
    peer.held = []
    numbered = msgpack.packb([MESH_VERSION, PUBLISH, "x/w0", 7, [1, [], -1], 3, 9])
    inbound.on_readable(FakeSocket([frame(PUBLISH, [1, [], -1], inc=8), frame(PUBLISH, [1, [], -1], sender="y/w0"),
                                    numbered]))
    assert [(c[0], c[1], c[2]) for c in calls["handle"]] == [
        (PUBLISH, "x/w0", 7), (PUBLISH, "x/w0", 7), (PUBLISH, "x/w0", 8), (PUBLISH, "y/w0", 7), (PUBLISH, "x/w0", 7)]
    assert calls["handle"][-1][-2:] == (3, 9)
    assert received(conn) == [] and peer.seq_in == 0 and router.stats.mesh_frames_in == 0


def test_a_frame_whose_handling_fails_is_dropped_and_the_turn_goes_on():
    inbound, router, _peer, calls = setup()
    _session, conn = online(router, "s", ("m/#", 0))
    inbound.on_readable(FakeSocket([frame(ECHO, [0, 0, 0]), publish(1, ["m/a"])]))
    assert calls["bad"] == [("x/w0", "echo frame could not be handled: ValueError('this one fails')")]
    assert received(conn) == ["m/a"]


def test_a_turn_ends_after_its_share_of_messages_and_comes_back_for_the_rest():
    inbound, router, _peer, _calls = setup()
    _session, conn = online(router, "s", ("m/#", 0))
    sock = FakeSocket([publish(1, ["m/a"] * RECV_MSGS), publish(2, ["m/b"])])
    inbound.on_readable(sock)
    assert received(conn) == ["m/a"] * RECV_MSGS and len(sock.frames) == 1
    assert inbound.loop.soon == [(inbound.on_readable, sock)]  # type: ignore[attr-defined]
