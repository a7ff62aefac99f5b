"""The mesh's membership part (cluster/mesh/members.py) on its own, with a fake clock, a fake
transport and the hooks recorded: a silent peer is parked and the other parts are told once, a
peer heard again is taken back, one back as a new incarnation counts as restarted, and a late
heartbeat of this router's own gives every peer a fresh timeout. No sockets."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import msgpack
import pytest

from brokerd.cluster.config import Config
from brokerd.cluster.mesh.limits import HELLO_INTERVAL_S
from brokerd.cluster.mesh.members import Hooks, Members
from brokerd.router.mesh_format import HELLO, RESYNC
from brokerd.router.router import Router, RouterConfig

TIMEOUT = 3.0
FORGET = 60.0
PEER = "x/w0"


class FakeLink:
    """A link that keeps what is sent on it."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.pending: list[bytes] = []
        self.sent: list = []
        self.sock = SimpleNamespace(send=lambda data, flags=0: self.sent.append(msgpack.unpackb(data)))

    def park(self) -> list[bytes]:
        return []

    def reset(self) -> None:
        self.pending = []


class FakeTransport:
    ipc = None
    tcp = "tcp://u:1"
    stats_tcp = None
    monitors = None

    def __init__(self) -> None:
        self.links: dict[str, FakeLink] = {}

    def link(self, endpoint: str) -> FakeLink:
        return self.links.setdefault(endpoint, FakeLink(endpoint))

    def unblock(self, link: FakeLink) -> None:
        pass

    def blocked(self, link: FakeLink) -> None:
        pass


class Part:
    """A ``Members`` on a fake clock (``now``), with what it tells the others (``told``) and
    the frames it sends (``sent``: (router, kind, body))."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.told: list[tuple] = []
        self.sent: list[tuple] = []
        self.loop = asyncio.new_event_loop()
        config = Config(workers=1, node_id="u", listen=("127.0.0.1", 1), mesh_timeout=TIMEOUT, mesh_forget=FORGET)
        hooks = Hooks(joined=lambda peer: self.told.append(("joined", peer.router_id)),
                      gone=lambda rid, why: self.told.append(("gone", rid, why)),
                      restarted=lambda rid: self.told.append(("restarted", rid)),
                      back=lambda peer, restarted: self.told.append(("back", peer.router_id, restarted)))
        self.router = Router(RouterConfig(router_id="u/w0", node_id="u"))
        self.members = Members(
            config, 0, self.loop, self.router, 1, {}, FakeTransport(), hooks,  # type: ignore[arg-type]
            frame=lambda kind, body: msgpack.packb([kind, body]),
            send=lambda peer, kind, body: self.sent.append((peer.router_id, kind, body)),
            flush=lambda: None, keep=lambda peer, frame, n: None, unconfirmed=lambda peer, seq, frame: None,
            start_replay=lambda peer, offset, why: None, clock=lambda: self.now)

    def tick(self, seconds: float) -> None:
        """``seconds`` pass, with a heartbeat every ``HELLO_INTERVAL_S`` as the loop runs them."""
        for _ in range(round(seconds / HELLO_INTERVAL_S)):
            self.now += HELLO_INTERVAL_S
            self.members.heartbeat()

    def hello(self, inc: int = 7) -> None:
        self.members.on_hello(PEER, inc, {"node": "x", "tcp": "tcp://x:1", "log": -1})


@pytest.fixture
def part():
    p = Part()
    p.members.heartbeat()
    yield p
    p.members.stop()
    p.loop.close()


def test_a_peer_met_is_greeted_and_the_others_are_told_it_joined(part):
    part.hello()
    peer = part.members.peers[PEER]
    assert peer.alive and part.members.hears(PEER)
    assert part.told == [("joined", PEER)]
    assert [f[0] for f in peer.link.sent] == [HELLO]  # greeted on its new link


def test_a_peer_silent_for_a_mesh_timeout_is_parked_once_and_taken_back_when_heard_again(part):
    part.hello()
    part.tick(TIMEOUT)
    assert part.members.hears(PEER), "parked before a mesh timeout of silence"
    part.tick(2.0)
    peer = part.members.peers[PEER]
    assert not peer.alive and peer.parked
    assert part.told[1:] == [("gone", PEER, f"silent for {TIMEOUT:g} s")], "told other than once"
    part.hello()
    assert peer.alive and not peer.parked
    assert part.told[2:] == [("joined", PEER), ("back", PEER, False)]
    assert (PEER, RESYNC, None) in part.sent


def test_a_peer_parked_for_mesh_forget_is_forgotten(part):
    part.hello()
    part.tick(TIMEOUT + 1.0)
    peer = part.members.peers[PEER]
    assert peer.parked
    part.tick(FORGET + 1.0)
    assert not peer.alive and not peer.parked


def test_a_peer_back_as_a_new_incarnation_counts_as_restarted(part):
    part.hello(7)
    part.hello(8)
    assert part.told == [("joined", PEER), ("gone", PEER, "restarted"), ("restarted", PEER),
                         ("joined", PEER), ("back", PEER, True)]
    assert part.members.peers[PEER].incarnation == 8


def test_a_late_heartbeat_of_this_routers_own_gives_every_peer_a_fresh_timeout(part):
    part.hello()
    part.now += TIMEOUT + 1.0  # this process did not run: the silence was ours
    part.members.heartbeat()
    assert part.members.hears(PEER) and part.told == [("joined", PEER)]
    part.tick(TIMEOUT + 1.0)  # now the peer's
    assert not part.members.hears(PEER)
