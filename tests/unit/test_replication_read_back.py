"""Whose replica a silent router's messages and history are read back from
(``cluster.replication.read_back.highest_holder``), from what the peers' HELLOs say they hold."""

from __future__ import annotations

from types import SimpleNamespace

from brokerd.cluster.replication.read_back import highest_holder


def test_the_replica_read_back_is_the_live_holders_with_the_highest_end():
    b = SimpleNamespace(alive=True, replicas={"a/w0": 40})
    c = SimpleNamespace(alive=True, replicas={"a/w0": 90, "x/w0": 5})
    d = SimpleNamespace(alive=False, replicas={"a/w0": 500})  # silent: not asked
    assert highest_holder("a/w0", [b, c, d]) == (c, 90)
    assert highest_holder("y/w0", [b, c, d]) == (None, -1)


def test_this_routers_own_replica_wins_a_tie():
    c = SimpleNamespace(alive=True, replicas={"a/w0": 90})
    here = object()
    assert highest_holder("a/w0", [c], here, 90) == (here, 90)
    assert highest_holder("a/w0", [c], here, 89) == (c, 90)
