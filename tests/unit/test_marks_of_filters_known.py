"""The marks of a session moved here whose filters this router had already (another session's,
announced before): no lower than where each peer took those filters in.

Partition seed 363: sc0 and sa0 (same filters) moved from a/w1 to c/w0 3 ms apart. b/w1 had sent
pb1:218 (its offset 415) to a/w1 only: c/w0 wanted none of those filters then. sc0's import
announced them and waited; b/w1 took them in at its end 416, after 218. sa0's import found them
this router's already, waited for nothing, and its mark for b/w1 was how far c/w0 had seen b/w1's
log: 415. a/w1's copy of 218, handed on for sa0, was taken for one that had come directly and
dropped: an acknowledged message lost. The router keeps where each peer took its filters in
(``Router.interest_taken``, from the acknowledgements' ends) and ``Connecting._import_announced``
passes it with the waits' results. Values, a loop that runs only when told; no sockets."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from brokerd.cluster.mesh import Peer, marks
from brokerd.cluster.mesh.interest import Interest
from brokerd.cluster.mesh.waiter import Requests
from brokerd.connection.packets import Subscription
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
    client = SimpleNamespace(client_id=client_id, router=router, conn=FakeConn())
    return loop.create_task(Connecting(client)._import_announced(_moved_state(client_id)))  # type: ignore[arg-type]


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


def test_where_each_peer_took_the_filters_in_is_its_highest_end_and_a_peer_that_missed_one_has_none():
    router, mesh, loop = _router()
    try:
        session = router.new_session("s", True)
        router.subscribe(session, Subscription("a/#", 1))
        mesh.waits[-1].set_result({"x/w0": 10, "y/w0": 20})
        _settle(loop)
        assert router.interest_taken == {"x/w0": 10, "y/w0": 20}
        router.subscribe(session, Subscription("b/#", 1))
        mesh.waits[-1].set_result({"x/w0": 15})  # y/w0 silent or too slow: it takes b/# in unseen
        _settle(loop)
        assert router.interest_taken == {"x/w0": 15}
        router.subscribe(session, Subscription("a/#", 0))  # a filter here already: no announcement
        router.subscribe(session, Subscription("c/#", 1))
        mesh.waits[-1].set_result({"x/w0": 12, "y/w0": 30})  # ends only raise
        _settle(loop)
        assert router.interest_taken == {"x/w0": 15, "y/w0": 30}
        mesh.nobody = True
        router.subscribe(session, Subscription("d/#", 1))  # nobody to wait for: nobody's end known
        assert router.interest_taken == {}
        mesh.nobody = False
        router.subscribe(session, Subscription("e/#", 1))
        mesh.waits[-1].cancel()  # a wait that did not complete: nobody's end known either
        router.interest_taken["x/w0"] = 40
        _settle(loop)
        assert router.interest_taken == {} and not router.interest_pending
    finally:
        loop.close()


def test_a_peer_sent_every_filter_at_once_has_no_end_until_it_acknowledges_a_later_announcement():
    """A full announcement (a peer met, or heard again) is not acknowledged: the peer takes this
    router's filters in at an end of its log nobody knows, so it has no floor, and a session
    moved here gets no mark for it (every copy from it counts) until its next acknowledgement."""
    router, _mesh, loop = _router()
    try:
        sent: list = []
        peer = Peer("x/w0", "x", None, None)
        interest = Interest(loop, router, {"x/w0": peer}, Requests(), frame=lambda kind, body: b"",
                            send=lambda p, kind, body: sent.append((p.router_id, kind)),
                            mark=lambda: None, flush_collected=lambda: None)
        router.interest_taken.update({"x/w0": 10, "y/w0": 20})
        interest.announce_all(peer)
        assert sent == [("x/w0", INTEREST)] and router.interest_taken == {"y/w0": 20}
        assert marks.directly_from([("x/w0", 15), ("y/w0", 5)], [dict(router.interest_taken)], None) == {"y/w0": 20}
    finally:
        loop.close()
