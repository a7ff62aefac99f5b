"""The majority rule of a node cut off by a partition (cluster.quorum.Members), and a router's
lease from a majority of the nodes (cluster.quorum.Lease)."""

from __future__ import annotations

from brokerd.cluster.quorum import Lease, Members


def test_a_node_that_sees_half_or_fewer_of_three_or_more_members_has_no_majority(tmp_path):
    m = Members(str(tmp_path / "members"), "a")
    assert m.update({"b", "c"}, set()) is None and m.has_majority  # met the others
    assert m.update({"b"}, set()) is None  # 2 of 3: still a majority
    assert m.update(set(), set()) is False and not m.has_majority  # 1 of 3
    assert m.update({"c"}, set()) is True and m.has_majority
    m.update({"b", "c", "d"}, set())
    assert m.update({"b"}, set()) is False  # 2 of 4 is not more than half


def test_two_members_cannot_tell_a_death_from_a_partition_so_the_rule_is_off(tmp_path):
    m = Members(str(tmp_path / "members"), "a")
    m.update({"b"}, set())
    assert m.update(set(), set()) is None and m.has_majority


def test_members_survive_a_restart_so_a_node_restarted_alone_knows_it_is_a_minority(tmp_path):
    path = str(tmp_path / "members")
    Members(path, "a").update({"b", "c"}, set())
    again = Members(path, "a")
    assert again.nodes == {"a", "b", "c"}
    assert again.update(set(), set()) is False


def test_only_a_majority_forgets_a_member(tmp_path):
    m = Members(str(tmp_path / "members"), "a")
    m.update({"b", "c", "d", "e"}, set())
    m.update({"b", "c"}, set())  # 3 of 5
    m.update({"b", "c"}, {"d", "e"})  # d and e forgotten by the mesh: the majority drops them
    assert m.nodes == {"a", "b", "c"}
    minority = Members(str(tmp_path / "other"), "x")
    minority.update({"y", "z"}, set())
    assert minority.update(set(), {"y", "z"}) is False  # alone: it never shrinks the set
    assert minority.nodes == {"x", "y", "z"} and not minority.has_majority


def test_nodes_met_while_starting_are_members_when_they_are_gone_by_its_end(tmp_path):
    """Peers heard only in the first seconds (before the majority is judged) still count: a
    node whose two peers left by then is one of three, not a cluster of one."""
    path = str(tmp_path / "members")
    m = Members(path, "a")
    m.met({"b", "c"})
    assert Members(path, "a").nodes == {"a", "b", "c"}  # on disk at once
    assert m.update(set(), set()) is False and not m.has_majority


def _lease(tmp_path, nodes=("a", "b", "c"), period=0.9):
    m = Members(str(tmp_path / "members"), "a")
    m.update(set(nodes) - {"a"}, set())
    return Lease(m, period)


def test_a_lease_holds_while_a_majority_echoes_beats_and_ends_a_period_after_the_beat_echoed_last(tmp_path):
    lease = _lease(tmp_path)
    epoch, n = lease.beat(10.0)
    assert lease.beat(10.01) == [epoch, n]  # the HELLOs of one heartbeat carry one beat, timed from the first
    assert not lease.valid(10.0)  # nobody echoed yet: this node alone is not a majority of three
    lease.echoed("b", epoch, n, 10.01)
    assert lease.valid(10.5) and lease.until == 10.9  # from when the beat was sent, by this clock
    assert lease.backers(10.5) == {"a", "b"}
    assert not lease.valid(10.9)  # b echoed nothing newer: it ended


def test_an_ended_lease_is_not_revived_by_its_epochs_echoes_only_by_the_next_epochs(tmp_path):
    lease = _lease(tmp_path)
    epoch, n = lease.beat(10.0)
    lease.echoed("b", epoch, n, 10.01)
    late_epoch, late = lease.beat(10.8)  # sent before the end, its echo arrives after it
    lease.echoed("c", late_epoch, late, 11.0)
    assert not lease.valid(11.0) and lease.epoch == epoch + 1
    lease.echoed("b", late_epoch, late, 11.0)  # the old epoch backs nothing any more
    assert not lease.valid(11.0)
    epoch2, n2 = lease.beat(11.1)
    assert epoch2 == epoch + 1
    lease.echoed("c", epoch2, n2, 11.1)
    assert lease.valid(11.2) and lease.until == 11.1 + 0.9


def test_a_lease_needs_half_the_other_members_and_an_echo_too_late_to_back_anything_starts_nothing(tmp_path):
    lease = _lease(tmp_path, ("a", "b", "c", "d", "e"))
    e, n1 = lease.beat(0.0)
    lease.echoed("b", e, n1, 0.01)
    assert not lease.valid(0.1)  # a and b: 2 of 5
    _, n2 = lease.beat(0.5)
    lease.echoed("c", e, n2, 0.51)
    assert lease.valid(0.6) and lease.until == 0.9  # a, b and c: the lease ends with b's backing
    lease.echoed("d", e, n2, 0.6)
    assert lease.until == 1.4
    (tmp_path / "x").mkdir()
    fresh = _lease(tmp_path / "x")
    e, n = fresh.beat(0.0)
    fresh.echoed("b", e, n, 2.0)  # backs until 0.9: already over when it came
    assert not fresh.held and not fresh.valid(2.0) and fresh.epoch == e


def test_with_fewer_than_three_members_the_lease_always_holds(tmp_path):
    lease = _lease(tmp_path, ("a", "b"))
    assert lease.valid(100.0)
