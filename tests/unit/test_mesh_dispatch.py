"""The mesh's receiving end (cluster/mesh/dispatch.py): bytes become a checked frame or a
refusal, every kind of the wire format has one handler in the table, and a kind without one is
refused as a bad frame (counted) without reaching any handler. No sockets."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import msgpack
import pytest

from brokerd.cluster.config import Config
from brokerd.cluster.mesh import Mesh, Peer, dispatch
from brokerd.cluster.replication.frames import FramesPart
from brokerd.connection.batching import EndOfTick
from brokerd.router.mesh_format import (
    ECHO,
    GOODBYE,
    HELLO,
    KIND_NAMES,
    MESH_VERSION,
    PUBLISH,
    REPLICATE,
    SESSION_GONE,
)
from brokerd.router.router import Router, RouterConfig


def frame(kind: int, body, version: int = MESH_VERSION, sender: str = "x/w0", inc: int = 7) -> bytes:
    return msgpack.packb([version, kind, sender, inc, body], use_bin_type=True)


def test_the_table_has_one_handler_for_each_kind_of_the_wire_format(mesh):
    assert set(dispatch.FRAMES) == set(KIND_NAMES)
    mesh.replication = replication_standin()
    assert set(mesh._handlers) == set(KIND_NAMES)
    for kind, (handler, _who) in mesh._handlers.items():
        assert handler.__name__ == dispatch.FRAMES[kind][0]


def replication_standin() -> SimpleNamespace:
    """What the mesh reads of a ``Replication`` to bind its frames: its receiving part."""
    return SimpleNamespace(frames=FramesPart.__new__(FramesPart))


def test_the_replications_frames_reach_its_own_part_and_are_ignored_without_one(mesh):
    replicating = [kind for kind, (_name, who, _part) in dispatch.FRAMES.items() if who == dispatch.REPLICATING]
    assert REPLICATE in replicating and SESSION_GONE not in replicating
    assert all(mesh._handlers[kind][0] is dispatch.ignored for kind in replicating)
    standin = replication_standin()
    mesh.replication = standin
    for kind in replicating:
        handler = mesh._handlers[kind][0]
        assert handler.__self__ is standin.frames and handler.__func__ is getattr(FramesPart, dispatch.FRAMES[kind][0])
    mesh.replication = None
    assert all(mesh._handlers[kind][0] is dispatch.ignored for kind in replicating)


def test_a_replication_frame_without_a_replication_still_tells_that_its_sender_is_heard(mesh):
    """(R = 1 here: the frame is acted on by nobody, but its sender is not silent.)"""
    peer = Peer("x/w0", "x", None, None)
    peer.incarnation, peer.alive, peer.last_seen = 7, True, 0.0
    mesh.peers["x/w0"] = peer
    mesh._handle(REPLICATE, "x/w0", 7, ["x/w0", 0, 0, b"", -1], 10)
    assert peer.last_seen > 0.0 and mesh.router.stats.mesh_bad_frames == 0


def test_bytes_become_a_checked_frame_or_say_why_they_are_refused():
    assert dispatch.read(frame(ECHO, [1, 2, 3])) == (ECHO, "x/w0", 7, [1, 2, 3], 0, 0)
    numbered = msgpack.packb([MESH_VERSION, SESSION_GONE, "x/w0", 7, ["u/w0", []], 4, 9])
    assert dispatch.read(numbered) == (SESSION_GONE, "x/w0", 7, ["u/w0", []], 4, 9), "a frame's number, and for whom"
    assert dispatch.read(b"\xc1") == dispatch.Refused("?", "undecodable frame of 1 bytes")
    assert dispatch.read(msgpack.packb([1, 2])).problem == "not a 5- or 7-element list"
    assert dispatch.read(msgpack.packb([MESH_VERSION, SESSION_GONE, "x/w0", 7, ["u/w0", []], 0, 9])).problem \
        == "bad frame number"
    other = dispatch.read(frame(ECHO, [1, 2, 3], version=MESH_VERSION + 1))
    assert other.sender == "x/w0" and other.version == MESH_VERSION + 1
    assert dispatch.read(frame(999, None)) == dispatch.Refused("x/w0", "unknown kind 999")
    assert dispatch.read(frame(PUBLISH, "nonsense")) == dispatch.Refused("x/w0", f"malformed {KIND_NAMES[PUBLISH]} body")


@pytest.fixture
def mesh():
    """A mesh not started: no socket is opened, the loop never runs."""
    loop = asyncio.new_event_loop()
    config = Config(workers=1, node_id="u", listen=("127.0.0.1", 1))
    yield Mesh(config, 0, Router(RouterConfig(router_id="u/w0", node_id="u")), loop, EndOfTick(loop))
    loop.close()


def test_a_kind_without_a_handler_is_refused_as_a_bad_frame_and_reaches_no_handler(mesh):
    called = []
    mesh._handlers = {HELLO: (lambda *a: called.append(a), dispatch.ANYONE)}
    mesh._handle(GOODBYE, "x/w0", 7, None, 10)
    assert called == [] and mesh.router.stats.mesh_bad_frames == 1
    mesh._handle(HELLO, "x/w0", 7, {"node": "x"}, 10)
    assert called == [("x/w0", 7, {"node": "x"})]


def test_a_frame_from_an_incarnation_not_met_is_ignored_not_counted(mesh):
    called = []
    mesh._handlers = {ECHO: (lambda *a: called.append(a), dispatch.MET)}
    mesh._handle(ECHO, "x/w0", 7, [1, 2, 3], 10)
    assert called == [] and mesh.router.stats.mesh_bad_frames == 0
