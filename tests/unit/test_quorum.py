"""The majority rule of a node cut off by a partition (cluster.quorum.Members)."""

from __future__ import annotations

from brokerd.cluster.quorum import Members


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
