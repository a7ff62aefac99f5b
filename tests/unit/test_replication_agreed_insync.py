"""The agreed in-sync set (``LeaderState.agree``, ``propose``, ``wanted``; issue 41): with
``--agreement`` only the followers the agreement committed count, each one for every record, so
that every member it names holds every acknowledged record. A fake clock, no mesh, no Raft."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_replication import Clock, leader, tokens


def test_a_follower_not_agreed_in_sync_does_not_count():
    lead = leader()
    lead.agree([])  # committed: nobody in sync yet
    lead.written(5)
    assert lead.hold(5, "ack5")
    assert lead.acknowledged("b", 5) == []  # b holds it, but is not agreed in sync
    assert lead.high_water == -1
    assert tokens(lead.agree(["b"])) == ["ack5"]  # committed: b counts now


def test_every_agreed_member_must_hold_a_record_not_only_min_insync_of_them():
    lead = leader(min_insync=2)
    lead.agree(["b", "c"])
    lead.written(5)
    assert lead.hold(5, "ack5")
    assert lead.acknowledged("b", 5) == []  # leader + b are 2 nodes, but c is agreed in sync and lacks it
    assert tokens(lead.acknowledged("c", 5)) == ["ack5"]


def test_a_lagging_member_holds_the_mark_back_until_it_is_agreed_out():
    clock = Clock()
    lead = leader(clock=clock)
    lead.agree(["b", "c"])
    lead.written(3)
    lead.acknowledged("b", 3)
    lead.acknowledged("c", 3)
    assert lead.high_water == 3
    lead.written(8)
    assert lead.hold(8, "ack8")
    lead.acknowledged("b", 8)
    clock.t += 3  # c lags past max_lag_s (2 s), within the hold timeout (5 s)
    assert lead.tick() == ([], [])  # still agreed in sync: the mark waits for it
    assert lead.high_water == 3
    assert lead.wanted() == frozenset({"b"})  # what the leader proposes instead
    assert tokens(lead.agree(["b"])) == ["ack8"]


def test_a_proposed_member_counts_with_the_agreed_ones_until_the_outcome_is_known():
    lead = leader(min_insync=2)
    lead.agree(["b"])
    lead.written(5)
    lead.acknowledged("b", 5)
    assert lead.high_water == 5
    lead.acknowledged("c", 5)
    assert lead.wanted() == frozenset({"b", "c"})  # c holds the mark: it may join
    lead.propose(frozenset({"b", "c"}))
    lead.written(9)
    assert lead.hold(9, "ack9")
    assert lead.acknowledged("b", 9) == []  # c may end up agreed: it must hold 9 as well
    assert tokens(lead.acknowledged("c", 9)) == ["ack9"]
    lead.propose(frozenset({"b"}))  # the outcome stayed unknown; a later proposal
    assert lead.pending == frozenset({"b", "c"})  # the unknown one may still commit: still counted
    lead.agree(["b"])
    assert lead.pending == frozenset() and lead.agreed == frozenset({"b"})


def test_a_member_placed_elsewhere_holds_the_mark_back_until_agreed_out():
    lead = leader(followers=("b",), min_insync=2)
    lead.agree(["b"])
    lead.written(4)
    lead.acknowledged("b", 4)
    assert lead.high_water == 4
    lead.set_followers(["c"], 2)  # b's node died: c follows now, and holds nothing yet
    lead.written(6)
    lead.acknowledged("c", 6)
    assert lead.high_water == 4  # b is still agreed in sync: nothing past it
    assert lead.wanted() == frozenset({"c"})
    lead.agree(["c"])
    assert lead.high_water == 6


def test_a_follower_that_lacks_the_mark_is_not_wanted():
    lead = leader(min_insync=1)
    lead.agree([])
    lead.written(7)
    assert lead.high_water == 7  # the leader alone suffices with min_insync 1
    lead.acknowledged("b", 6)
    assert "b" not in lead.wanted()
    lead.acknowledged("b", 7)
    assert "b" in lead.wanted()


def test_too_few_agreed_members_acknowledge_nothing():
    lead = leader(min_insync=3)
    lead.agree(["b"])
    lead.written(2)
    lead.acknowledged("b", 2)
    lead.acknowledged("c", 2)
    assert lead.high_water == -1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["write", "ack-b", "ack-c", "agree", "propose", "lag"]),
                          st.integers(0, 3)), max_size=60))
def test_every_agreed_member_holds_every_record_below_the_mark(steps):
    """Whatever the order of writes, acknowledgements, proposals and commits: at every moment each
    member of the agreed set (and of a pending proposal) holds the high-water mark."""
    clock = Clock()
    lead = leader(clock=clock)
    lead.agree([])
    end = -1
    for what, n in steps:
        if what == "write":
            end += n + 1
            lead.written(end)
        elif what in ("ack-b", "ack-c"):
            f = what[-1]
            lead.acknowledged(f, min(end, lead.acked[f] + n + 1))
        elif what == "propose":
            lead.propose(lead.wanted())
        elif what == "agree" and lead.pending:
            lead.agree(lead.pending if n % 2 else lead.wanted() & lead.pending)
        elif what == "lag":
            clock.t += n
        lead.tick()
        for f in (lead.agreed or frozenset()) | lead.pending:
            assert lead.acked.get(f, -1) >= lead.high_water, (f, lead.high_water, lead.acked)
