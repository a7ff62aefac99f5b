"""The leader's placement (``cluster.replication.placement``) driven by hand: peer routers as the
leader sees them at each heartbeat in, its followers and what to do about a change out. No mesh,
no clock."""

from __future__ import annotations

from brokerd.cluster.replication.placement import PeerSeen, Placement
from brokerd.cluster.replication.rules import follower_nodes, follower_router

LEADER = "a/w0"


def peers(*specs: tuple[str, bool, int], holds: tuple[str, ...] = ()) -> list[PeerSeen]:
    """Routers ``node/w0`` from (router id, alive, incarnation)."""
    return [PeerSeen(rid, rid.split("/")[0], alive, inc, rid in holds) for rid, alive, inc in specs]


def placement(factor: int = 2, min_insync: int = 2) -> Placement:
    return Placement(LEADER, "a", factor, min_insync)


def test_the_followers_are_the_rendezvous_choice_among_the_live_nodes_of_other_nodes():
    seen = peers(("a/w1", True, 1), ("b/w0", True, 1), ("b/w1", True, 1), ("c/w0", True, 1), ("d/w0", False, 1))
    placed = placement(factor=3).place(seen, starting=False, has_majority=True, sessions_on=False)
    nodes = follower_nodes(LEADER, "a", ["b", "c"], 2)
    routers = {"b": ["b/w0", "b/w1"], "c": ["c/w0"]}
    assert placed.followers == [follower_router(LEADER, routers[n]) for n in nodes]
    assert placed.needed == 2 and placed.changed and placed.moved
    assert sorted(placed.added) == sorted(placed.followers) and placed.dropped == []


def test_an_unchanged_view_changes_nothing_and_sends_nothing():
    p = placement()
    seen = peers(("b/w0", True, 1), ("c/w0", True, 1))
    p.place(seen, False, True, True)
    again = p.place(seen, False, True, True)
    assert not again.changed and not again.moved
    assert again.added == again.dropped == again.full_to == again.clear == []


def test_a_follower_whose_node_falls_silent_is_replaced_and_told_to_drop_the_sessions():
    p = placement()
    first = p.place(peers(("b/w0", True, 1), ("c/w0", True, 1)), False, True, True)
    old = first.followers[0]
    other = "c/w0" if old == "b/w0" else "b/w0"
    second = p.place(peers((old, False, 1), (other, True, 1)), False, True, True)
    assert second.followers == [other] and second.added == [other] and second.dropped == [old]
    assert second.full_to == [other]  # the new follower gets every session
    assert p.cleared[old] == 1 and old not in p.follower_incs


def test_every_session_goes_once_per_follower_incarnation_and_only_once_sessions_are_on():
    p = placement()
    off = p.place(peers(("b/w0", True, 1)), False, True, sessions_on=False)
    assert off.followers == ["b/w0"] and off.full_to == []
    assert p.place(peers(("b/w0", True, 1)), False, True, True).full_to == ["b/w0"]
    assert p.place(peers(("b/w0", True, 1)), False, True, True).full_to == []
    restarted = p.place(peers(("b/w0", True, 2)), False, True, True)
    assert restarted.full_to == ["b/w0"] and not restarted.changed


def test_a_holder_of_a_stale_replica_is_cleared_once_per_incarnation():
    p = placement(factor=2)
    seen = peers(("b/w0", True, 1), ("c/w0", True, 1), holds=("b/w0", "c/w0"))
    placed = p.place(seen, False, True, True)
    stale = [rid for rid in ("b/w0", "c/w0") if rid not in placed.followers]
    assert placed.clear == stale
    assert p.place(seen, False, True, True).clear == []
    seen = [s._replace(incarnation=2) if s.router_id in stale else s for s in seen]
    assert p.place(seen, False, True, True).clear == stale


def test_routers_of_the_leaders_own_node_never_follow_nor_are_cleared():
    placed = placement().place(peers(("a/w1", True, 1), holds=("a/w1",)), False, True, True)
    assert placed.followers == [] and placed.clear == [] and placed.needed == 1


def test_a_shortfall_below_min_insync_is_said_once_and_again_after_recovery():
    p = placement(factor=3, min_insync=3)
    one = peers(("b/w0", True, 1))
    assert not p.place(one, starting=True, has_majority=True, sessions_on=False).warn_short  # peers joining
    assert not p.place(one, starting=False, has_majority=False, sessions_on=False).warn_short  # cut off
    short = p.place(one, False, True, False)
    assert short.warn_short and short.needed == 2
    assert not p.place(one, False, True, False).warn_short
    full = peers(("b/w0", True, 1), ("c/w0", True, 1))
    assert p.place(full, False, True, False).needed == 3
    assert p.place(peers(("b/w0", True, 1), ("c/w0", False, 1)), False, True, False).warn_short


def test_a_change_of_the_nodes_required_alone_is_a_change():
    p = placement(factor=2, min_insync=2)
    assert p.place([], False, True, False).needed == 1
    assert not p.place([], False, True, False).changed
    back = p.place(peers(("b/w0", True, 1)), False, True, False)
    assert back.changed and back.needed == 2 and p.required == 2
