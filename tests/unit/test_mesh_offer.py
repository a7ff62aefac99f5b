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
