"""A shared group's copies around a member's move to another router, without processes: what
reaches the old router after it let the member go goes on to another router of the group, or is
kept for the member where the group has no other router; a move that fails leaves the member in
its groups; a move in doubt, confirmed late, sends on the group copies the member got meanwhile
(a fake mesh records what the router sends)."""

from __future__ import annotations

import asyncio

import pytest

from brokerd.connection.packets import Subscription
from brokerd.router.log.commitlog import CommitLog
from brokerd.router.message import Message
from brokerd.router.router import Router, RouterConfig
from brokerd.router.session import SessionLimits
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
    assert at_export == (KEY, -1), "the leaving member not counted as an offline one while it moves"
    assert mesh.announced[-1] == (KEY, 0), "still counted here once it moved"


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


class HandOnMesh(FakeMesh):
    """A fake mesh that also records what a moved session's old router hands on."""

    def __init__(self) -> None:
        super().__init__()
        self.handed: list[bytes] = []

    def hand_on(self, router_id: str, client_id: str, items: list, answered: object = None,
                stale: bool = False) -> None:
        self.handed += [item[2][1] for item in items]


@pytest.mark.parametrize("plain", [True, False], ids=["with-a-plain-subscription", "groups-alone"])
def test_a_move_in_doubt_confirmed_late_sends_on_the_group_copies_its_member_got_meanwhile(tmp_path, plain):
    """A move given up without an answer (the new owner fell silent) leaves the session here,
    offline, a member of its groups again: copies chosen for this router wait in its queue. The
    new owner's confirmation comes later: the copy here goes, and what reached it since the
    export is handed on from the log, where group copies are not (a session of groups alone was
    just dropped). Those copies were lost; now they go to the new owner for their group, once."""
    async def run() -> tuple[Router, HandOnMesh, list[bytes]]:
        mesh = HandOnMesh()
        r = Router(RouterConfig(router_id="n/w0"), mesh)  # type: ignore[arg-type]
        r.commit_log = r.wiring.commit_log = CommitLog(tmp_path, router_id="n/w0")
        try:
            s = r.new_session("m", True)
            s.attach(FakeConn())  # type: ignore[arg-type]
            r.subscribe_shared(s, Subscription(KEY, 1))
            if plain:
                r.subscribe(s, Subscription("plain/#", 1))
            assert r.release_session("m", same_node=False) is not None
            r.moved("m", ok=False, to="n/w1", doubt=True)
            r.deliver_remote_shared(Message("jobs/4", b"while in doubt", qos=1), [KEY], sender="n/w2")
            r.publish(Message("plain/1", b"plain, logged", 1, False, "p", "n/w0"))
            queued = [m.payload for m, _, _ in s.queue]
            r.moved_after_all("m", "n/w1")
        finally:
            r.commit_log.close()
        return r, mesh, queued

    r, mesh, queued = asyncio.run(run())
    assert b"while in doubt" in queued, "not a member of its group while in doubt"
    assert mesh.only == [("n/w1", b"while in doubt", [KEY])]
    assert mesh.handed == ([b"plain, logged"] if plain else [])
    assert "m" not in r.sessions and r.stats.shared_no_member == 0


@pytest.mark.parametrize("outcome", ["confirmed", "failed", "in-doubt-then-confirmed"])
def test_the_only_member_moving_keeps_its_groups_copies(outcome):
    """The group's only member (a persistent session, subscribed) is exported to n/w1. Until n/w1
    announces the member, the group has no other router: a copy that reached this router then
    (chosen by a router that had not heard, or published here) found no member anywhere and was
    dropped, though the session and its subscription exist throughout. Now the moving member
    counts here as an offline one, and such copies are kept for it: sent to its new router for
    the group once the move is confirmed, queued in it if the move fails (or is in doubt, and
    sent on when confirmed late)."""
    async def run() -> tuple[Router, FakeMesh, list, object]:
        mesh = FakeMesh()
        r = Router(RouterConfig(router_id="n/w0"), mesh)  # type: ignore[arg-type]
        s = r.new_session("m", True)
        s.attach(FakeConn())  # type: ignore[arg-type]
        r.subscribe_shared(s, Subscription(KEY, 1))
        assert r.release_session("m", same_node=False) is not None
        at_export = mesh.announced[-1]
        r.deliver_remote_shared(Message("jobs/5", b"from another router", qos=1), [KEY], sender="n/w2")
        r.publish(Message("jobs/6", b"published here", 1, False, "p", "n/w0"))
        r.moved("m", ok=outcome == "confirmed", to="n/w1", doubt=outcome != "failed")
        queued = [m.payload for m, _, _ in s.queue]
        if outcome == "in-doubt-then-confirmed":
            r.moved_after_all("m", "n/w1")
        return r, mesh, queued, at_export

    r, mesh, queued, at_export = asyncio.run(run())
    both = [b"from another router", b"published here"]
    assert r.stats.shared_no_member == 0, "dropped: no member anywhere"
    assert at_export == (KEY, -1), "the group left without a router while its member moves"
    if outcome == "failed":
        assert queued == both and mesh.only == []
        assert mesh.announced[-1] == (KEY, -1)
    else:
        assert [(to, payload, groups) for to, payload, groups in mesh.only] == [("n/w1", p, [KEY]) for p in both]
        assert "m" not in r.sessions and mesh.announced[-1] == (KEY, 0)


def test_the_copies_kept_for_a_moving_member_are_bounded_by_its_queue():
    """What is kept for a moving member is bounded as its queue is (``max_queued``): beyond,
    dropped and counted as from a full queue."""
    async def run() -> tuple[Router, FakeMesh]:
        mesh = FakeMesh()
        r = Router(RouterConfig(router_id="n/w0", session=SessionLimits(max_queued=3)), mesh)  # type: ignore[arg-type]
        s = r.new_session("m", True)
        r.subscribe_shared(s, Subscription(KEY, 1))
        assert r.release_session("m", same_node=False) is not None
        for i in range(5):
            r.deliver_remote_shared(Message("jobs/7", b"%d" % i, qos=1), [KEY], sender="n/w2")
        r.moved("m", ok=True, to="n/w1")
        return r, mesh

    r, mesh = asyncio.run(run())
    assert [payload for _, payload, _ in mesh.only] == [b"0", b"1", b"2"]
    assert r.stats.drop_queue_full == 2 and r.stats.shared_no_member == 0
