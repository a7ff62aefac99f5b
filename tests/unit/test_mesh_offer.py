"""The takeover's choice among offers (cluster/mesh/offer.py): a live router's copy is the
session, the most recent of two; among replicas' copies the most recent; the replicas passed
over are named for fencing. Values in, a choice out."""

from __future__ import annotations

from brokerd.cluster.mesh import offer


def test_a_live_routers_copy_is_the_session_whatever_the_replicas_hold():
    offers = [("b/w0", 1, {"epoch": 5, "replica": "c/w0"}), ("a/w0", 2, {"epoch": 3})]
    assert offer.live(offers) == [offers[1]]
    assert offer.newest(offer.live(offers) or offers) is offers[1]


def test_of_two_live_copies_the_higher_epoch_then_the_later_arrival_is_taken():
    older, newer, later = ({"epoch": 3, "arrived": 9}, {"epoch": 4, "arrived": 1}, {"epoch": 4, "arrived": 2})
    offers = [("a/w0", 1, older), ("b/w0", 2, newer), ("c/w0", 3, later)]
    assert offer.newest(offers)[2] is later
    assert offer.newest(offers[:2])[2] is newer


def test_the_replicas_not_taken_and_those_they_knew_older_are_passed_over():
    taken = {"epoch": 4, "replica": "x/w0", "stale_replicas": ["z/w0"]}
    older = {"epoch": 2, "replica": "y/w0"}
    offers = [(None, 0, older), ("c/w0", 5, taken)]
    assert offer.live(offers) == []
    assert offer.newest(offers)[2] is taken
    assert offer.passed_over(offers, taken) == ["y/w0", "z/w0"]
    assert offer.passed_over([("a/w0", 1, {"epoch": 1})], {}) == [], "a live copy passes nobody over"


def test_the_agreed_owners_copy_is_taken_before_a_stale_live_one():
    """Partition seed 315: a live router that is not the agreed owner offers a stale copy beside
    a replica's copy of the owner's session (the owner silent): the owner's is taken."""
    stale = {"epoch": 3}
    owners = {"epoch": 4, "replica": "a/w0"}
    offers = [("b/w1", 1, stale), ("c/w0", 2, owners)]
    assert offer.source(offers[0]) == "b/w1" and offer.source(offers[1]) == "a/w0"
    assert offer.choose(offers, "a/w0") is offers[1]
    assert offer.passed_over(offers, owners) == [], "the live copy passed over is dropped, not fenced as a replica"
    assert offer.choose(offers, None) is offers[0], "the owner not known: a live router's copy wins, as before"
    assert offer.choose(offers, "x/w0") is offers[0], "the owner offered nothing: the rule without it"


def test_the_agreed_owners_own_copy_wins_over_a_more_recent_live_one_and_over_replicas():
    owner, other = {"epoch": 2, "arrived": 1}, {"epoch": 5, "arrived": 9}
    replica_old, replica_new = {"epoch": 1, "replica": "a/w0"}, {"epoch": 2, "replica": "a/w0", "arrived": 2}
    offers = [("b/w0", 1, other), ("a/w0", 2, owner), (None, 0, replica_old), ("c/w1", 3, replica_new)]
    assert offer.choose(offers, "a/w0") is offers[1], "the owner's own copy before the replicas' of it"
    assert offer.choose([offers[0], *offers[2:]], "a/w0") is offers[3], "of the replicas' copies, the most recent"
    assert offer.choose(offers, "b/w0") is offers[0]
    assert offer.choose(offers[2:], None) is offers[3], "replicas only: the most recent"
