"""The mesh's rules with a time in them, on a ``FakeClock`` given to the ``Mesh`` (or to the one
part under test): a peer counts as silent a mesh timeout after its last frame and not before, and
is forgotten ``--mesh-forget`` after it was parked; a CONNECT waits for a router of this node that
is down for ``LOCAL_DOWN_WAIT_S`` from its start, not afresh after each time it comes and goes; a
takeover confirmation is said again to a peer back from a silence for ``--mesh-forget``; an
incarnation restarted on its log is young for ``HANDON_YOUNG_S``. No sockets, no sleeping: each
check sits at the boundary, so a changed comparison fails it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from brokerd.cluster.config import Config
from brokerd.cluster.mesh import LOCAL_DOWN_WAIT_S, Mesh, Peer
from brokerd.cluster.mesh.handon import Handons
from brokerd.cluster.mesh.limits import HANDON_YOUNG_S, HELLO_INTERVAL_S
from brokerd.cluster.mesh.takeover import Roster, Takeovers
from brokerd.cluster.mesh.transfer import Transfers
from brokerd.cluster.mesh.waiter import Requests
from brokerd.connection.batching import EndOfTick
from brokerd.router.clock import FakeClock
from brokerd.router.mesh_format import ECHO, SESSION_HANDON, TAKEOVER_DONE, TAKEOVER_REQ
from brokerd.router.ports import TAKEOVER_UNAVAILABLE
from brokerd.router.router import Router, RouterConfig

TIMEOUT = 3.0
FORGET = 60.0


class FakeLink:
    """A link that keeps what is sent on it, through the link or its socket."""

    def __init__(self) -> None:
        self.endpoint = "ipc://fake"
        self.pending: list[bytes] = []
        self.sent: list[bytes] = []
        self.sock = SimpleNamespace(send=lambda data, flags=0: self.sent.append(data))

    def send(self, frame: bytes, sources=()) -> bool:
        self.sent.append(frame)
        return True

    def park(self) -> list[bytes]:
        return []

    def reset(self) -> None:
        self.pending = []


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def mesh_on(clock: FakeClock, loop: asyncio.AbstractEventLoop, workers: int = 1) -> Mesh:
    """Router u/w0's mesh, not started (no socket is opened), on ``clock``."""
    config = Config(workers=workers, node_id="u", listen=("127.0.0.1", 1), mesh_timeout=TIMEOUT,
                    mesh_forget=FORGET)
    return Mesh(config, 0, Router(RouterConfig(router_id="u/w0", node_id="u")), loop, EndOfTick(loop),
                clock=clock.now, wall=clock.unix)


def beats(mesh: Mesh, clock: FakeClock, seconds: float) -> None:
    """``seconds`` pass with a heartbeat every ``HELLO_INTERVAL_S``, as the loop runs them (a
    longer gap would be this router's own pause, which gives every peer a fresh timeout)."""
    for _ in range(round(seconds / HELLO_INTERVAL_S)):
        clock.advance(HELLO_INTERVAL_S)
        mesh.members.heartbeat()


def test_a_peer_is_silent_a_mesh_timeout_after_its_last_frame_and_forgotten_mesh_forget_after(clock, loop):
    mesh = mesh_on(clock, loop)
    peer = Peer("x/w0", "x", None, "tcp://x:1")
    peer.incarnation, peer.alive = 7, True
    mesh.peers["x/w0"] = peer
    mesh._handle(ECHO, "x/w0", 7, [0, 0, 0], 10)  # any frame of its incarnation (an echo for another)
    assert peer.last_seen == clock.now(), "a frame's arrival not read on the mesh's clock"
    beats(mesh, clock, 2.0)
    mesh._handle(ECHO, "x/w0", 7, [0, 0, 0], 10)
    last = clock.now()
    beats(mesh, clock, TIMEOUT)
    assert clock.now() - last == TIMEOUT and mesh.hears("x/w0"), "parked at a mesh timeout, not after it"
    beats(mesh, clock, HELLO_INTERVAL_S)
    assert not mesh.hears("x/w0") and peer.parked and peer.parked_at == clock.now()
    assert mesh.silent_since(peer) == clock.unix() - TIMEOUT, "not a mesh timeout before it was parked, on the wall clock"
    parked = clock.now()
    beats(mesh, clock, FORGET)
    assert clock.now() - parked == FORGET and peer.parked, "forgotten at --mesh-forget, not after it"
    beats(mesh, clock, HELLO_INTERVAL_S)
    assert not peer.parked and not peer.alive
    mesh.members.stop()


def _flap(mesh: Mesh, peer: Peer) -> None:
    """``peer`` is heard again, then falls silent again, before the loop runs anything else."""
    mesh.members.rejoin(peer, "heard again")
    assert peer.alive
    mesh.members.park(peer, "silent again")


async def _turns(n: int = 10) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_a_connect_waits_local_down_wait_s_from_its_start_for_a_router_of_this_node_that_is_down(clock, loop):
    mesh = mesh_on(clock, loop, workers=2)
    down = Peer("u/w1", "u", "ipc://fake", None)
    down.incarnation, down.parked, down.parked_at = 3, True, clock.now()
    down.link = FakeLink()  # type: ignore[assignment]
    mesh.peers["u/w1"] = down

    async def main() -> None:
        asking = asyncio.ensure_future(mesh.takeover("c"))
        await _turns()
        assert not asking.done(), "gave up without waiting for u/w1"
        clock.advance(LOCAL_DOWN_WAIT_S - 0.5)
        _flap(mesh, down)  # back and gone: what is left of the wait goes on
        await _turns()
        assert not asking.done(), "gave up before LOCAL_DOWN_WAIT_S"
        clock.advance(0.5)
        _flap(mesh, down)  # at the deadline: no wait is left
        await _turns()
        assert asking.done(), "waited on past LOCAL_DOWN_WAIT_S (a fresh wait after u/w1 came and went?)"
        assert asking.result() == TAKEOVER_UNAVAILABLE

    loop.run_until_complete(main())
    mesh.members.stop()


def test_a_takeover_confirmation_is_said_again_to_a_peer_back_within_mesh_forget_not_later(clock, loop):
    old = Peer("x/w0", "x", None, None)
    old.alive = True
    sent: list[tuple] = []

    def send(peer: Peer, kind: int, body) -> None:
        sent.append((kind, body))

    config = Config(workers=1, node_id="u", listen=("127.0.0.1", 1), mesh_forget=FORGET)
    router = SimpleNamespace(router_id="u/w0", commit_log=None, owners=None, sessions={})
    peers, requests, tick = {"x/w0": old}, Requests(), EndOfTick(loop)
    transfers = Transfers(config, loop, router, peers, requests, send, lambda: None,  # type: ignore[arg-type]
                          lambda peer: 0.0, tick, clock.now, clock.unix)
    handons = Handons(config, router, peers, send, lambda *kept: None, clock.now)  # type: ignore[arg-type]
    roster = Roster(local_down=set, local_back=None, just_parked=list, gone=None)  # type: ignore[arg-type]
    takeovers = Takeovers(config, loop, router, peers, requests, roster, transfers, handons,  # type: ignore[arg-type]
                          send, lambda: None, tick, clock.now)

    async def take() -> None:
        asking = asyncio.ensure_future(takeovers.takeover("c"))
        await asyncio.sleep(0)
        [(kind, [req, _, _])] = sent
        assert kind == TAKEOVER_REQ
        transfers.on_takeover_resp(old, [req, {"client_id": "c", "queue": []}, False], 0)
        assert await asyncio.wait_for(asking, 5) is not None
        router.sessions["c"] = object()
        takeovers.confirm("c")

    loop.run_until_complete(take())
    done = [s for s in sent if s[0] == TAKEOVER_DONE]
    assert len(done) == 1 and done[0][1][1] is True
    del sent[:]
    clock.advance(FORGET)
    takeovers.confirm_again(old)
    assert sent == done, "a confirmation --mesh-forget old was not said again"
    del sent[:]
    clock.advance(0.25)
    takeovers.confirm_again(old)
    assert sent == [], "a confirmation older than --mesh-forget was said again"


def _handons(clock: FakeClock, log_end: int) -> tuple[Handons, list]:
    """Router u/w0's hand-on, made now on ``clock`` with its log ending at ``log_end`` (0: a first
    start), which session "c" left for u/w1; x/w0, whose log it has seen, answered the barrier."""
    config = Config(workers=2, node_id="u", listen=("127.0.0.1", 1))
    router = SimpleNamespace(router_id="u/w0", commit_log=SimpleNamespace(next_offset=log_end), sessions={})
    new, other = Peer("u/w1", "u", None, None), Peer("x/w0", "x", None, None)
    new.alive = other.alive = True
    other.origin_mark = 5
    sent: list = []
    part = Handons(config, router, {"u/w1": new, "x/w0": other},  # type: ignore[arg-type]
                   lambda peer, kind, body: sent.append((kind, body)), lambda *kept: None, clock.now)
    return part, sent


def _named(part: Handons, sent: list) -> dict:
    """What the last SESSION_HANDON of session "c" names: the routers its new owner reads back."""
    part.hand_on("u/w1", "c", [], answered={"x/w0": True})
    kind, (_, _, last, unheard) = sent.pop()
    assert kind == SESSION_HANDON and last
    return unheard


def test_an_incarnation_restarted_on_its_log_is_young_for_handon_young_s(clock):
    part, sent = _handons(clock, log_end=12)
    clock.advance(HANDON_YOUNG_S - 0.25)
    assert _named(part, sent) == {"x/w0": -1}, "not young within HANDON_YOUNG_S of a restart"
    clock.advance(0.25)
    assert _named(part, sent) == {"x/w0": None}, "still young HANDON_YOUNG_S after a restart"
    first, sent = _handons(clock, log_end=0)
    assert _named(first, sent) == {"x/w0": None}, "a first start (an empty log) counted as young"


def _hello_times(mesh: Mesh, clock: FakeClock) -> list[float]:
    """A link on ``mesh`` whose sends are timed: the list of their times."""
    times: list[float] = []
    link = FakeLink()
    link.sock = SimpleNamespace(send=lambda data, flags=0: times.append(clock.now()))
    mesh.transport.links[link.endpoint] = link  # type: ignore[assignment]
    return times


def test_an_idle_link_hears_a_hello_each_second_and_a_changed_hello_at_the_next_beat(clock, loop):
    """The routers of a node HELLO each other all to all: on an idle node, a HELLO that says the
    same as the last goes out once a second (a third of the mesh timeout), not every beat; one
    that says something new (a peer heard, here) goes at the next beat."""
    mesh = mesh_on(clock, loop, workers=2)
    times = _hello_times(mesh, clock)
    start = clock.now()
    beats(mesh, clock, 4.0)
    assert [t - start for t in times] == [0.5, 1.5, 2.5, 3.5], "an idle link's HELLO not once a second"
    peer = Peer("u/w1", "u", "ipc://fake", None)
    peer.incarnation, peer.alive = 3, True
    mesh.peers["u/w1"] = peer  # the next HELLO names it
    beats(mesh, clock, HELLO_INTERVAL_S)
    assert times[-1] == clock.now(), "a HELLO with news waited for the quiet gap"
    mesh.members.stop()


def test_with_a_short_mesh_timeout_every_beat_says_hello(clock, loop):
    """A mesh timeout under 3 s leaves no room for a second's gap: every beat goes out, idle or not."""
    config = Config(workers=2, node_id="u", listen=("127.0.0.1", 1), mesh_timeout=1.0, mesh_forget=FORGET)
    mesh = Mesh(config, 0, Router(RouterConfig(router_id="u/w0", node_id="u")), loop, EndOfTick(loop),
                clock=clock.now, wall=clock.unix)
    times = _hello_times(mesh, clock)
    beats(mesh, clock, 2.0)
    assert len(times) == 4, "a beat's HELLO skipped under a 1 s mesh timeout"
    mesh.members.stop()
