"""The replication state machines (cluster/replication/rules.py) driven by hand, with a fake clock: the
high-water mark, the in-sync set, held acknowledgements released or refused, and a follower's
answer to each batch. No mesh, no disk: these are the rules the transport will follow."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brokerd.cluster.replication.rules import (
    FollowerState,
    HistoryState,
    LeaderState,
    follower_nodes,
    follower_router,
)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def leader(followers=("b", "c"), min_insync=2, clock=None) -> LeaderState:
    return LeaderState(followers, min_insync, max_lag_s=2.0, hold_timeout_s=5.0, clock=clock or Clock())


def tokens(held) -> list:
    return [h.token for h in held]


def test_an_acknowledgement_waits_until_min_insync_nodes_hold_the_record():
    lead = leader()
    assert lead.written(9) == [] and lead.high_water == -1
    assert lead.hold(4, "ack4") and lead.hold(9, "ack9")
    assert tokens(lead.acknowledged("b", 4)) == ["ack4"]  # leader + b: 2 nodes hold 0..4
    assert lead.high_water == 4
    assert tokens(lead.acknowledged("c", 9)) == ["ack9"]  # leader + c hold 9
    assert lead.high_water == 9
    assert not lead.hold(9, "again")  # at or below the high-water mark: sent at once


def test_the_released_acknowledgements_come_back_in_offset_order():
    lead = leader()
    lead.written(5)
    for i in range(6):
        assert lead.hold(i, f"a{i}")
    assert tokens(lead.acknowledged("b", 3)) == ["a0", "a1", "a2", "a3"]
    assert tokens(lead.acknowledged("c", 5)) == ["a4", "a5"]


def test_a_follower_that_stops_falls_out_of_sync_and_stops_holding_the_mark_back():
    clock = Clock()
    lead = leader(followers=("b", "c"), min_insync=2, clock=clock)
    lead.written(0)
    lead.acknowledged("b", 0)
    lead.acknowledged("c", 0)
    clock.t += 1
    lead.written(10)
    lead.hold(10, "ack10")
    assert lead.acknowledged("b", 10) != [] and lead.high_water == 10  # b alone is enough (M = 2)
    lead.written(20)
    lead.hold(20, "ack20")
    clock.t += 3  # c has not acknowledged 10 for 3 s: out of sync; b has not acked 20 either
    assert lead.in_sync() == []
    released, refused = lead.tick()
    assert released == [] and refused == [] and lead.high_water == 10
    assert tokens(lead.acknowledged("b", 20)) == ["ack20"]  # b is back in sync by catching up
    assert lead.in_sync() == ["b"]


def test_with_fewer_than_min_insync_nodes_nothing_is_acknowledged_and_held_ones_are_refused():
    clock = Clock()
    lead = leader(followers=("b",), min_insync=2, clock=clock)
    lead.written(3)
    assert lead.hold(3, "ack3")
    clock.t += 4
    assert lead.tick() == ([], [])
    clock.t += 1.5  # the hold timeout (5 s) passes: refused, never sent unreplicated
    released, refused = lead.tick()
    assert released == [] and tokens(refused) == ["ack3"]
    assert lead.high_water == -1


def test_a_leader_alone_with_min_insync_1_acknowledges_what_it_wrote():
    lead = leader(followers=(), min_insync=1)
    lead.hold(0, "a0")
    assert tokens(lead.written(0)) == ["a0"] and lead.high_water == 0


def test_acknowledgements_never_move_backwards_and_may_run_ahead_of_the_leaders_write():
    lead = leader()
    lead.written(5)
    lead.acknowledged("b", 5)
    assert lead.acknowledged("b", 2) == [] and lead.acked["b"] == 5
    assert lead.hold(9, "ack9")
    # c wrote 6..9 before the leader's own write finished: held by c alone so far.
    assert lead.acknowledged("c", 9) == [] and lead.acked["c"] == 9 and lead.high_water == 5
    assert tokens(lead.written(9)) == ["ack9"]  # the leader's write: leader and c hold 9
    assert lead.acknowledged("unknown", 5) == []


def test_lag_is_measured_from_the_oldest_batch_a_follower_does_not_hold():
    clock = Clock()
    lead = leader(clock=clock)
    lead.written(1)
    clock.t += 1
    lead.written(2)
    clock.t += 1
    lead.acknowledged("b", 1)
    assert lead.lag_s("b") == pytest.approx(1.0) and lead.lag_s("c") == pytest.approx(2.0)
    assert lead.lag_records("b") == 1 and lead.lag_records("c") == 3


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["w", "b", "c", "d"]), st.integers(0, 40)), max_size=60),
       st.integers(1, 4))
def test_the_high_water_mark_is_what_min_insync_nodes_hold(events, m):
    """Whatever the order of writes and acknowledgements (no time passes: all in sync), the mark
    is the m-th highest of the leader's end and the followers' offsets, and never goes down."""
    lead = leader(followers=("b", "c", "d"), min_insync=m)
    last = -1
    for who, off in events:
        if who == "w":
            lead.written(off)
        else:
            lead.acknowledged(who, off)
        holders = sorted([lead.end, *lead.acked.values()], reverse=True)
        assert lead.high_water >= last
        assert lead.high_water == max(last, holders[m - 1])
        last = lead.high_water


def test_a_follower_appends_in_order_repeats_what_it_has_and_fetches_a_gap():
    f = FollowerState()
    assert f.arrived(0, 4) == FollowerState.APPEND and f.appended(4) == 4
    assert f.arrived(0, 4) == FollowerState.REPEAT  # the leader sent it again (a reconnect)
    assert f.arrived(9, 12) == FollowerState.FETCH  # 5..8 were lost: fetch from 5
    assert f.next_offset == 5
    assert f.arrived(5, 8) == FollowerState.APPEND and f.appended(8) == 8
    # A fetched range read back beside a live batch: appended from the replica's end on.
    assert f.arrived(7, 10) == FollowerState.APPEND and f.next_offset == 9 and f.appended(10) == 10
    with pytest.raises(ValueError):
        f.arrived(12, 11)


def test_a_new_replica_starts_after_the_leaders_high_water_mark():
    f = FollowerState()
    assert f.arrived(100, 110, high_water=89) == FollowerState.FETCH and f.next_offset == 90
    g = FollowerState()
    assert g.arrived(100, 110, high_water=104) == FollowerState.APPEND and g.next_offset == 100
    assert FollowerState(next_offset=7).arrived(7, 9, high_water=100) == FollowerState.APPEND


def test_followers_by_rendezvous_hashing_move_only_where_a_node_left():
    nodes = [f"n{i}" for i in range(6)]
    parts = [f"n{i % 6}/w{i % 4}x{i}" for i in range(300)]
    before = {p: follower_nodes(p, p.split("/")[0], nodes, 2) for p in parts}
    assert all(len(f) == 2 and p.split("/")[0] not in f for p, f in before.items())
    after = {p: follower_nodes(p, p.split("/")[0], [n for n in nodes if n != "n5"], 2) for p in parts}
    for p in parts:
        if "n5" not in before[p]:
            assert after[p] == before[p]  # untouched where the node that left did not follow
    assert follower_nodes("a/w0", "a", ["a"], 2) == []
    assert follower_router("a/w0", ["b/w1", "b/w0"]) in ("b/w0", "b/w1")
    assert follower_router("a/w0", ["b/w1", "b/w0"]) == follower_router("a/w0", ["b/w0", "b/w1"])


def test_set_followers_keeps_what_remaining_followers_hold_and_caps_min_insync():
    lead = leader(followers=("b", "c"), min_insync=2)
    lead.written(10)
    lead.acknowledged("b", 10)
    assert lead.high_water == 10
    lead.written(20)
    assert lead.hold(20, "ack20")
    assert lead.set_followers(["b", "d"], 2) == [] and lead.acked == {"b": 10, "d": -1}
    assert tokens(lead.set_followers([], 1)) == ["ack20"]  # alone: the leader's own copy counts


def test_a_history_is_fetched_forwards_to_where_the_log_starts():
    """The records below a log's start come in answers of ``first..last``: appended in order
    (an answer that overlaps what is held is appended from where the history ends), a repeat
    asked again, a jump (the source no longer holds what lies between) begins the history anew,
    and it is done when it reaches the log or the source has no more."""
    h = HistoryState(before=100)
    assert h.ask() == 0
    assert h.arrived(10, 39) == HistoryState.BEGIN and h.next_offset == 10  # the source starts at 10
    assert not h.appended(39) and h.ask() == 40
    assert h.arrived(30, 39) == HistoryState.REPEAT
    assert h.arrived(35, 59) == HistoryState.APPEND and h.ask() == 40  # appended from 40 on
    assert not h.appended(59)
    assert h.arrived(70, 80) == HistoryState.BEGIN and h.ask() == 70  # retention moved the source on
    assert h.appended(99) and h.ask() == 100  # reached the log
    with pytest.raises(ValueError):
        HistoryState(before=100).arrived(90, 100)  # a source that answers beyond what was asked
    assert HistoryState(before=100, next_offset=40).arrived(-1, -1) == HistoryState.DONE
