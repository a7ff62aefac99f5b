"""Acknowledgements held while a node sees no majority (``cluster.replication.rules.CutOffHolds``),
driven with a fake clock: all go once the majority is back, each is refused at its deadline."""

from __future__ import annotations

from brokerd.cluster.replication.rules import CutOffHolds, Held


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_held_acknowledgement_is_refused_at_its_deadline_not_before():
    clock = Clock()
    holds = CutOffHolds(5.0, clock)
    holds.hold(7, "ack7")
    clock.t = 104.9
    assert holds.late() == [] and len(holds) == 1
    clock.t = 105.0
    assert holds.late() == [Held(7, "ack7", 105.0)] and len(holds) == 0 and not holds


def test_the_followers_releases_keep_their_own_deadlines():
    clock = Clock()
    holds = CutOffHolds(5.0, clock)
    holds.keep([Held(1, "a", 101.0), Held(2, "b", 110.0)])
    holds.hold(3, "c")
    clock.t = 102.0
    assert [h.token for h in holds.late()] == ["a"]
    assert [h.token for h in holds.held] == ["b", "c"]


def test_the_majority_back_releases_every_one_held_in_order():
    clock = Clock()
    holds = CutOffHolds(5.0, clock)
    for offset in range(3):
        holds.hold(offset, f"ack{offset}")
    assert [h.token for h in holds.release()] == ["ack0", "ack1", "ack2"]
    assert holds.release() == [] and holds.late() == []
