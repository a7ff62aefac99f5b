"""The marks of a session moved here whose filters this router had already (another session's,
announced before): no lower than where each peer took those filters in.

Partition seed 363: sc0 and sa0 (same filters) moved from a/w1 to c/w0 3 ms apart. b/w1 had sent
pb1:218 (its offset 415) to a/w1 only: c/w0 wanted none of those filters then. sc0's import
announced them and waited; b/w1 took them in at its end 416, after 218. sa0's import found them
this router's already, waited for nothing, and its mark for b/w1 was how far c/w0 had seen b/w1's
log: 415. a/w1's copy of 218, handed on for sa0, was taken for one that had come directly and
dropped: an acknowledged message lost. The mesh keeps where each peer took the router's filters
in (``announcements.Floors``, from the acknowledgements' ends; ``Router.interest_taken``) and
``Connecting._import_announced`` passes it with the waits' results. Values, a loop that runs only
when told; no sockets."""

from __future__ import annotations

import asyncio
from typing import Any

from brokerd.cluster.mesh import Peer, marks
from brokerd.cluster.mesh.announcements import Floors
from brokerd.cluster.mesh.interest import Interest
from brokerd.cluster.mesh.waiter import Requests
from brokerd.connection.packets import Subscription
from brokerd.router.client import Client
from brokerd.router.connecting import Connecting
from brokerd.router.mesh_format import INTEREST
from brokerd.router.ports import NullMesh
from brokerd.router.router import Router, RouterConfig
from tests.unit.conftest import FakeConn

FILTER = "chaos/a1f420/#"
B = "b/w1"  # the publisher's router
SEEN_B = 415  # how far c/w0 had seen b/w1's log when sa0 moved in
TAKEN_B = 416  # b/w1's log end when it took c/w0's announcement (sc0's) in
COPY_218 = [1, False, ["chaos/a1f420/pb1/2", b"pb1:218", 1, False, 0, B, 415]]  # a/w1's, handed on


class AnnouncingMesh(NullMesh):
    """A mesh whose added filters wait for futures the test completes, and which records the
    results ``confirm_takeover`` is given."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.waits: list[asyncio.Future] = []
        self.confirmed: dict[str, list | None] = {}
        self.nobody = False  # no live peer: nothing to wait for

    def announce_interest(self, topic_filter: str, add: Any) -> Any:
        if not add or self.nobody:
            return None
        future = self.loop.create_future()
        self.waits.append(future)
        return future

    def confirm_takeover(self, client_id: str, acked: list | None = None) -> None:
        self.confirmed[client_id] = acked


def _router() -> tuple[Router, AnnouncingMesh, asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    router = Router(RouterConfig(router_id="c/w0", node_id="c"))
    mesh = AnnouncingMesh(loop)
    router.mesh = router.wiring.mesh = mesh
    return router, mesh, loop


def _moved_state(client_id: str) -> dict:
    """A persistent session subscribed to FILTER, as its old router exports it."""
    old = Router(RouterConfig(router_id="a/w1", node_id="a"))
    session = old.new_session(client_id, True)
    old.subscribe(session, Subscription(FILTER, 1))
    return session.export_state()


def _import(router: Router, loop: asyncio.AbstractEventLoop, client_id: str) -> asyncio.Task:
    client = Client(router, FakeConn())  # type: ignore[arg-type]  # (compiled, a Client is checked as one)
    client.client_id = client_id
    return loop.create_task(Connecting(client)._import_announced(_moved_state(client_id)))


def _settle(loop: asyncio.AbstractEventLoop) -> None:
    loop.run_until_complete(asyncio.sleep(0))
    loop.run_until_complete(asyncio.sleep(0))


def _kept(acked: list | None) -> list:
    """What of a/w1's hand-on reaches sa0 with the marks these results give."""
    return marks.not_direct([COPY_218], marks.directly_from([(B, SEEN_B)], acked, ("c/w0", 900)))


def test_with_only_how_far_the_publishers_log_is_seen_the_handed_on_copy_is_taken_for_a_direct_one():
    """The rule the loss came through, with the seed's values: nothing waited for (None), the
    mark is how far b/w1's log is seen here, 415, and the copy at 415 is dropped; with b/w1's
    end when it took the filters in (416) the copy is delivered."""
    assert _kept(None) == []
    assert _kept([{B: TAKEN_B}]) == [COPY_218]


def test_a_session_whose_filters_were_announced_for_another_gets_marks_from_where_the_peers_took_them_in():
    router, mesh, loop = _router()
    try:
        sc0 = _import(router, loop, "sc0")
        _settle(loop)
        assert FILTER in router.interest_pending and not sc0.done(), "sc0's import waits for its announcement"
        router.interest_taken.update({B: TAKEN_B, "b/w0": 300})  # (the mesh's, as the peers acknowledge)
        mesh.waits[0].set_result({B: TAKEN_B, "b/w0": 300})
        _settle(loop)
        assert sc0.done() and FILTER not in router.interest_pending
        assert _kept(mesh.confirmed["sc0"]) == [COPY_218]
        sa0 = _import(router, loop, "sa0")  # the filter is this router's already: nothing to wait for
        _settle(loop)
        assert sa0.done() and len(mesh.waits) == 1
        assert mesh.confirmed["sa0"] == [{B: TAKEN_B, "b/w0": 300}]
        assert _kept(mesh.confirmed["sa0"]) == [COPY_218], "pb1:218 handed on to sa0 is delivered"
    finally:
        loop.close()


def test_a_floor_comes_from_an_acknowledgement_no_older_than_the_last_added_filter_or_full_announcement():
    floors = Floors({})
    floors.acknowledged("x/w0", 1, 10)  # a barrier, nothing added yet
    floors.added(2, ["x/w0", "y/w0"], ["z/w0"])
    assert floors.floors == {}, "sent a filter: no floor until it acknowledges that request"
    floors.acknowledged("x/w0", 2, 15)
    floors.acknowledged("y/w0", 2, 20)
    floors.acknowledged("z/w0", 3, 30)  # silent when the filter was added: it has not taken it in
    assert floors.floors == {"x/w0": 15, "y/w0": 20}
    floors.acknowledged("x/w0", 4, 12)  # a later barrier: floors only rise
    assert floors.floors == {"x/w0": 15, "y/w0": 20}
    floors.added(5, ["x/w0"], ["y/w0", "z/w0"])
    floors.acknowledged("x/w0", 5, 40)
    floors.acknowledged("y/w0", 6, 45)  # silent at 5: only its next full announcement counts
    assert floors.floors == {"x/w0": 40}
    floors.full("y/w0", 7)
    floors.full("z/w0", 8)
    floors.acknowledged("y/w0", 7, 50)
    assert floors.floors == {"x/w0": 40, "y/w0": 50}
    floors.added(None, [], ["x/w0", "y/w0"])  # added with nobody alive
    assert floors.floors == {}


def test_a_full_announcement_is_numbered_and_its_acknowledgement_gives_the_peer_its_floor():
    """A full announcement (a peer met, or heard again) replaces what the peer knew of this
    router's filters: its floor goes, and comes back with the acknowledgement of its last frame;
    a flush that adds a filter takes every peer's floor until it acknowledges it."""
    router, _mesh, loop = _router()
    try:
        sent: list = []
        peers = {rid: Peer(rid, rid[0], None, None) for rid in ("x/w0", "y/w0")}
        interest = Interest(loop, router, peers, Requests(),
                            send=lambda p, kind, body: sent.append((p.router_id, kind, body)),
                            mark=lambda: None, flush_collected=lambda: None)
        interest.floors.floors.update({"x/w0": 10, "y/w0": 20})
        assert router.interest_taken is interest.floors.floors, "the router reads the mesh's floors"
        interest.announce_all(peers["x/w0"])
        [(rid, kind, body)] = sent
        seq = body[0]
        assert (rid, kind) == ("x/w0", INTEREST) and seq is not None and router.interest_taken == {"y/w0": 20}
        assert marks.directly_from([("x/w0", 15), ("y/w0", 5)], [dict(router.interest_taken)], None) == {"y/w0": 20}
        interest.on_interest_ack(peers["x/w0"], [seq, 33], 0)
        assert router.interest_taken == {"x/w0": 33, "y/w0": 20}
        interest.announce("a/#", True)  # neither peer alive: neither is sent it
        interest.flush()
        assert router.interest_taken == {}
    finally:
        loop.close()
