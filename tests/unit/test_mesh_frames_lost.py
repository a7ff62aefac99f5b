"""Frames other than PUBLISH lost with a connection (mesh version 23, cluster/mesh/delivery.py):
ZeroMQ drops what a TCP connection held when it breaks and a new one takes over, both routers
alive. A SESSION_HANDON lost so lost the copies it handed on; a TAKEOVER_CHUNK, the copies of a
session whose last chunk came (the transfer ended without them); an INTEREST, a filter. They are
numbered in the series of the sender's PUBLISH frames now: the receiver names the numbers it
missed in its HELLO, the sender sends those frames again from its ring, and the receiver acts on
them in their order.

Two meshes, not started (no sockets): their links are queues that ``pump`` delivers through the
receiving end (``dispatch.read``, ``Mesh._handle``) and ``cut`` empties, as a connection replaced
under them would. Each test runs a loss unnumbered (the frames as before version 23, ``NUMBERED``
empty) and numbered."""

from __future__ import annotations

import asyncio

import pytest

from brokerd.cluster.config import Config
from brokerd.cluster.mesh import Mesh, Peer, delivery, dispatch
from brokerd.connection.batching import EndOfTick
from brokerd.router.mesh_format import (
    INTEREST,
    NUMBERED,
    PUBLISH,
    SESSION_HANDON,
    SESSION_STATE,
    TAKEOVER_CHUNK,
    TAKEOVER_REQ,
    TAKEOVER_RESP,
)
from brokerd.router.message import Message
from brokerd.router.router import Router, RouterConfig

A, B = "a/w0", "b/w0"


class Wire:
    """One direction's link: frames queue until ``pump``; ``cut`` drops what it holds."""

    def __init__(self) -> None:
        self.pending: list[bytes] = []  # (the link's own list: nothing waits in it here)
        self.queue: list[bytes] = []
        self.sock = self  # (HELLO goes to the socket itself)

    def send(self, frame: bytes, sources: object = (), flags: int = 0) -> bool:
        self.queue.append(frame)
        return True

    def cut(self) -> int:
        lost = len(self.queue)
        self.queue.clear()
        return lost


class Pair:
    """Meshes A and B that know each other, and what B acted on, in order: (kind, body)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.meshes: dict[str, Mesh] = {}
        for rid in (A, B):
            config = Config(workers=1, node_id=rid[0], listen=("127.0.0.1", 1))
            router = Router(RouterConfig(router_id=rid, node_id=rid[0]))
            self.meshes[rid] = Mesh(config, 0, router, loop, EndOfTick(loop))
        self.wires: dict[str, Wire] = {}
        for rid, other in ((A, B), (B, A)):
            peer = Peer(other, other[0], None, "tcp://x")
            peer.incarnation = self.meshes[other].incarnation
            peer.alive = True
            peer.link = self.wires[other] = Wire()  # type: ignore[assignment]
            self.meshes[rid].peers[other] = peer
        self.acted: list[tuple[int, object]] = []
        b = self.b
        for kind in (SESSION_HANDON, TAKEOVER_REQ, TAKEOVER_RESP, TAKEOVER_CHUNK, SESSION_STATE, INTEREST):
            b._handlers[kind] = (lambda peer, body, size, kind=kind: self.acted.append((kind, body)), dispatch.MET)
        on_publish = b._handlers[PUBLISH][0]

        def publish(peer: Peer, body: list, size: int) -> None:
            self.acted.append((PUBLISH, body[0]))
            on_publish(peer, body, size)

        b._handlers[PUBLISH] = (publish, dispatch.MET)

    @property
    def a(self) -> Mesh:
        return self.meshes[A]

    @property
    def b(self) -> Mesh:
        return self.meshes[B]

    def to(self, rid: str) -> Peer:
        """The other router, as router ``rid``'s peer."""
        return self.meshes[B if rid == A else A].peers[rid]

    def pump(self) -> None:
        """Deliver what the links hold, both ways, until they are empty."""
        while any(w.queue for w in self.wires.values()):
            for rid, wire in self.wires.items():
                frames, wire.queue = wire.queue, []
                for data in frames:
                    got = dispatch.read(data)
                    assert not isinstance(got, dispatch.Refused), got
                    kind, sender, inc, body, seq, to = got
                    self.meshes[rid]._handle(kind, sender, inc, body, len(data), seq, to)

    def hellos(self) -> None:
        """A heartbeat's HELLO each way, and what it makes each side send."""
        for rid, other in ((B, A), (A, B)):
            mesh = self.meshes[rid]
            mesh._handle(dispatch.HELLO, other, self.meshes[other].incarnation,
                         self.meshes[other].members._hello_body(), 0)
            self.pump()


@pytest.fixture(params=["unnumbered", "numbered"])
def pair(request, monkeypatch):
    """The pair, its frames numbered as since version 23 or sent as before it."""
    if request.param == "unnumbered":
        monkeypatch.setattr("brokerd.cluster.mesh.framing.NUMBERED", frozenset())
    loop = asyncio.new_event_loop()
    yield Pair(loop), request.param == "numbered"
    loop.close()


@pytest.fixture
def numbered():
    """The pair, numbering as since version 23 (what only numbered frames have)."""
    loop = asyncio.new_event_loop()
    yield Pair(loop)
    loop.close()


def handon(n: int, last: bool = False) -> list:
    return ["c", [[1, False, ["t", b"%d" % n, 1, False, 0, A, n]]], last]


def test_a_hand_on_frame_lost_with_its_connection_is_sent_again_and_acted_on_in_order(pair):
    p, numbered = pair
    peer = p.to(B)
    p.a._send(peer, SESSION_HANDON, handon(1))
    p.pump()
    p.a._send(peer, SESSION_HANDON, handon(2))
    assert p.wires[B].cut() == 1, "the connection broke holding the second frame"
    p.a._send(peer, SESSION_HANDON, handon(3, last=True))  # on the new connection
    p.pump()
    p.hellos()
    got = [body for kind, body in p.acted if kind == SESSION_HANDON]
    if not numbered:
        assert got == [handon(1), handon(3, last=True)], "(as before: the copy handed on in it is lost)"
        return
    assert got == [handon(1), handon(2), handon(3, last=True)], "lost, or acted on out of order"
    p.hellos()
    assert not peer.ring and not p.to(A).held and not p.to(A).missing, "confirmed, nothing waits"


def test_a_lost_last_hand_on_with_nothing_after_it_is_found_by_the_senders_hello(pair):
    """The tail: no later frame shows the gap; the sender's HELLO says what it sent."""
    p, numbered = pair
    p.a._send(p.to(B), SESSION_HANDON, handon(1, last=True))
    p.wires[B].cut()
    p.hellos()
    p.hellos()
    assert [body for _kind, body in p.acted] == ([handon(1, last=True)] if numbered else [])


def test_a_sessions_chunks_and_the_frames_around_them_are_acted_on_once_in_the_order_sent(pair):
    """The middle chunk lost and the last one come: the transfer must not end without it; a
    session state after an earlier one; an interest change after it."""
    p, numbered = pair
    peer = p.to(B)
    sent = [(TAKEOVER_RESP, [5, {"client_id": "c", "persistent": True, "subs": [], "inflight": [], "queue": []},
                             True]),
            (TAKEOVER_CHUNK, [5, [[1, False, ["t", b"1", 1, False, 0, A, 1]]], False]),
            (SESSION_STATE, [A, False, {"c": None}]),
            (TAKEOVER_CHUNK, [5, [[1, False, ["t", b"2", 1, False, 0, A, 2]]], True]),
            (INTEREST, [None, [["t/#", True]]])]
    for i, (kind, body) in enumerate(sent):
        p.a._send(peer, kind, body)
        if i in (0, 3):
            p.pump()
        elif i == 2:
            assert p.wires[B].cut() == 2, "the first chunk and the session state lost"
    p.pump()
    p.hellos()
    p.hellos()
    if not numbered:
        assert p.acted == [sent[0], sent[3], sent[4]], "(as before: the chunk's copy and the state lost)"
        return
    assert p.acted == sent, "lost, twice, or out of order"


def test_a_frame_after_a_missed_publish_waits_for_it(pair):
    """A takeover request follows the publishes sent before it (``Takeovers._send_asks``): one
    lost and sent again after the request would reach the session after it left."""
    p, numbered = pair
    peer = p.to(B)
    p.a.forward_to((B,), Message("t", b"x", qos=1, client_id="pub"))
    p.a._flush()
    p.wires[B].cut()
    p.a._send(peer, TAKEOVER_REQ, [1, "c", False])
    p.pump()
    p.hellos()
    kinds = [kind for kind, _body in p.acted]
    if not numbered:
        assert kinds == [TAKEOVER_REQ, PUBLISH], "(as before: the request acted on first)"
        return
    assert kinds == [PUBLISH, TAKEOVER_REQ]


def test_a_held_frame_goes_once_the_sender_lets_go_of_the_number_it_waits_for(numbered):
    """A sender whose ring let the missed frame go (a bound, ``--mesh-backlog``) says so in its
    HELLO (``sent``: its lowest number): what waited behind it is acted on, not held for ever."""
    p = numbered
    peer = p.to(B)
    p.a._send(peer, SESSION_HANDON, handon(1))
    p.wires[B].cut()
    p.a._send(peer, SESSION_HANDON, handon(2, last=True))
    p.pump()
    assert p.acted == [] and p.to(A).held, "not held behind the missed number"
    delivery.confirmed(peer, 1)  # (as if its ring had let frame 1 go)
    p.hellos()
    assert p.acted == [(SESSION_HANDON, handon(2, last=True))] and not p.to(A).missing


def test_the_frames_held_of_a_sender_that_restarted_are_acted_on_then(numbered):
    p = numbered
    p.a._send(p.to(B), SESSION_HANDON, handon(1))
    p.wires[B].cut()
    p.a._send(p.to(B), SESSION_HANDON, handon(2, last=True))
    p.pump()
    assert p.acted == []
    p.b._peer_restarted(A)  # (``Hooks.restarted``: before its new incarnation's numbers)
    assert p.acted == [(SESSION_HANDON, handon(2, last=True))] and not p.to(A).held


def test_a_frame_meant_for_an_earlier_incarnation_counts_but_only_state_is_acted_on(numbered):
    """Frames sent again to a receiver that restarted (its old incarnation never confirmed them):
    an answer names the old incarnation's request numbers, which start again; a hand-on's copies
    are the new incarnation's too."""
    p = numbered
    b = p.b
    peer = b.peers[A]
    old = b.incarnation - 1
    answer = [1, None, False]
    b._handle(TAKEOVER_RESP, A, peer.incarnation, answer, 10, 1, old)
    b._handle(SESSION_HANDON, A, peer.incarnation, handon(1, last=True), 10, 2, old)
    b._handle(TAKEOVER_RESP, A, peer.incarnation, answer, 10, 3, b.incarnation)
    assert p.acted == [(SESSION_HANDON, handon(1, last=True)), (TAKEOVER_RESP, answer)]
    assert delivery.contiguous(peer) == 3, "the number of a frame not acted on not counted"


def test_every_kind_whose_loss_nothing_else_repairs_is_numbered():
    """docs/design.md's table: these, and not HELLO, ECHO, GOODBYE, PUBLISH (numbered in its
    body) or the replication's log stream (REPLICATE, REPLICA_ACK, REPLICA_FETCH, HISTORY_FETCH,
    HISTORY), which repairs its own gaps."""
    from brokerd.router import mesh_format as f

    assert {f.KIND_NAMES[k] for k in set(f.KIND_NAMES) - NUMBERED} == {
        "hello", "echo", "goodbye", "publish", "replicate", "replica-ack", "replica-fetch", "history-fetch",
        "history"}
    assert f.SURVIVE <= NUMBERED
