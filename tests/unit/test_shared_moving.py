"""A shared group's copies around a member's move to another router, without processes: what
reaches the old router after it let the member go goes on to another router of the group, and a
move that fails leaves the member in its groups (a fake mesh records what the router sends)."""

from __future__ import annotations

import asyncio

from brokerd.connection.packets import Subscription
from brokerd.router.message import Message
from brokerd.router.router import Router, RouterConfig
from tests.unit.conftest import FakeConn, FakeMesh

KEY = "$share/g/jobs/#"


def old_router(persistent: bool) -> tuple[Router, FakeMesh]:
    """n/w0 with one connected member, ``m``; n/w1 has a connected member of the group too."""
    mesh = FakeMesh()
    r = Router(RouterConfig(router_id="n/w0"), mesh)  # type: ignore[arg-type]
    s = r.new_session("m", persistent)
    s.attach(FakeConn())  # type: ignore[arg-type]
    r.subscribe_shared(s, Subscription(KEY, 1))
    r.peer_interest("n/w1", KEY, 1)
    return r, mesh


def test_a_copy_reaching_the_old_router_of_a_member_taken_over_goes_to_another_router():
    """Partition seed 1224: member g0's client connected (clean) on the publisher's router, which
    took g0's session over from its old router; copies the publisher's router had chosen for
    the old router before it heard that g0 left there arrived after the export. They waited in
    the leaving session, picked as an offline member, and went with it when the move was
    confirmed: two acknowledged messages reached no member. Now the session leaves its groups
    here when it is exported (the presence announced), and such a copy goes on to the group's
    other router, for the group alone, once."""
    async def run() -> tuple[Router, FakeMesh, object]:
        r, mesh = old_router(persistent=False)
        assert r.release_session("m", same_node=True) is not None  # n/w1 takes it over
        at_export = mesh.announced[-1]
        r.deliver_remote_shared(Message("jobs/1", b"after the export", qos=1), [KEY], sender="n/w1")
        r.moved("m", ok=True, to="n/w1")
        return r, mesh, at_export

    r, mesh, at_export = asyncio.run(run())
    assert mesh.only == [("n/w1", b"after the export", [KEY])]
    assert r.stats.shared_no_member == 0 and "m" not in r.sessions and KEY not in r.shared_local
    assert at_export == (KEY, 0), "the leaving member still counted here"


def test_a_persistent_member_moving_away_leaves_its_group_copies_to_the_other_members():
    """The same for a persistent member resumed elsewhere: its log is handed on after the move,
    but group copies are in no log, and its queue was emptied; the copy goes on instead, and is
    not in what is handed on (not twice)."""
    handed: list[list] = []

    class Mesh(FakeMesh):
        def hand_on(self, router_id: str, client_id: str, items: list, answered: object = None,
                    stale: bool = False) -> None:
            handed.append(items)

    async def run() -> tuple[Router, FakeMesh]:
        mesh = Mesh()
        r = Router(RouterConfig(router_id="n/w0"), mesh)  # type: ignore[arg-type]
        s = r.new_session("m", True)
        s.attach(FakeConn())  # type: ignore[arg-type]
        r.subscribe_shared(s, Subscription(KEY, 1))
        r.subscribe(s, Subscription("plain/#", 1))  # (a persistent session's hand-on needs one)
        r.peer_interest("n/w1", KEY, 1)
        assert r.release_session("m", same_node=False) is not None
        r.deliver_remote_shared(Message("jobs/2", b"during the move", qos=1), [KEY], sender="n/w1")
        r.moved("m", ok=True, to="n/w1")
        return r, mesh

    r, mesh = asyncio.run(run())
    assert mesh.only == [("n/w1", b"during the move", [KEY])]
    assert [item for items in handed for item in items] == []
    assert r.stats.shared_no_member == 0


def test_a_member_whose_move_failed_is_in_its_groups_again():
    """A transfer that fails leaves the session here: a member of its groups again (the presence
    announced), so a copy chosen for this router reaches it; a clean session ends then, and
    hands on what it held as usual."""
    async def run() -> tuple[Router, FakeMesh, list[bytes]]:
        r, mesh = old_router(persistent=True)
        assert r.release_session("m", same_node=True) is not None
        r.moved("m", ok=False, to="n/w1")
        assert mesh.announced[-1] == (KEY, -1)  # here again, offline
        r.deliver_remote_shared(Message("jobs/3", b"after the failure", qos=1), [KEY], sender="n/w1")
        queued = [m.payload for m, _, _ in r.sessions["m"].queue]
        return r, mesh, queued

    r, mesh, queued = asyncio.run(run())
    assert queued == [b"after the failure"] and mesh.only == []
    assert [s.client_id for s, _ in r.shared_local[KEY].members] == ["m"]
