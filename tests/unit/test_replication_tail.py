"""The leader's gap repair (``cluster.replication.rules.TailRepair``) with a fake clock: a follower
behind the log's end is sent the last record again once nothing new went out for a while, and
then at most once per interval."""

from __future__ import annotations

from brokerd.cluster.replication.rules import TailRepair


def test_nothing_is_due_while_the_log_moves_or_before_the_interval():
    tail = TailRepair(end=9, again_s=0.5)
    assert tail.due(10, {"b": 5}, ["b"], now=100.0) == []  # a live batch just went out
    assert tail.due(10, {"b": 5}, ["b"], now=100.4) == []
    assert tail.due(10, {"b": 5}, ["b"], now=100.5) == ["b"]


def test_a_follower_in_sync_is_never_sent_anything():
    tail = TailRepair(end=10, again_s=0.5)
    assert tail.due(10, {"b": 10, "c": 11}, ["b", "c"], now=100.0) == []
    assert tail.due(10, {}, ["b"], now=100.0) == []  # (not counted yet: as in sync)


def test_a_follower_told_is_told_again_only_an_interval_later():
    tail = TailRepair(end=10, again_s=0.5)
    assert tail.due(10, {"b": 3, "c": 4}, ["b", "c"], now=100.0) == ["b", "c"]
    tail.told("b", 100.0)
    tail.told("c", 100.3)  # a fetch answered
    assert tail.due(10, {"b": 3, "c": 4}, ["b", "c"], now=100.6) == ["b"]
    tail.told("b", 100.6)
    assert tail.due(10, {"b": 3, "c": 4}, ["b", "c"], now=100.8) == ["c"]
