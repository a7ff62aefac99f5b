"""Whether a majority of the member nodes takes a silent router for gone
(``cluster.replication.majority.majority_says_gone``), from what the live peers' HELLOs say."""

from __future__ import annotations

from brokerd.cluster.replication.majority import majority_says_gone

MEMBERS = {"a", "b", "c"}


def test_with_fewer_than_three_members_the_rule_is_off():
    assert majority_says_gone("a", {"a", "b"}, "b", [("b", True)])


def test_this_node_and_one_more_that_does_not_hear_it_are_a_majority_of_three():
    assert majority_says_gone("a", MEMBERS, "b", [("c", False)])


def test_a_node_that_still_hears_it_says_it_is_alive():
    # A partition that cut only a-b: c still hears a, so b must not serve a's sessions.
    assert not majority_says_gone("a", MEMBERS, "b", [("c", True)])


def test_a_node_votes_gone_only_if_every_router_of_it_heard_here_says_so():
    assert not majority_says_gone("a", MEMBERS, "b", [("c", False), ("c", True)])
    assert majority_says_gone("a", MEMBERS, "b", [("c", False), ("c", False)])


def test_the_silent_routers_own_node_and_non_members_do_not_vote():
    # Another router of node a says a/w1 is gone, x is not a member: b alone is not a majority.
    assert not majority_says_gone("a", MEMBERS, "b", [("a", False), ("x", False)])
    five = {"a", "b", "c", "d", "e"}
    assert not majority_says_gone("a", five, "b", [("c", False)])
    assert majority_says_gone("a", five, "b", [("c", False), ("d", False)])
