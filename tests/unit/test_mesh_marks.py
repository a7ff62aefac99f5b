"""The hand-on's rules (cluster/mesh/marks.py): from which offset of each router's log a moved
session's messages come to its new owner directly, and which handed-on copies that lets
through. Values in, marks and copies out."""

from __future__ import annotations

from brokerd.cluster.mesh import marks

SEEN = [("a/w0", 10), ("b/w0", 20), ("c/w0", -1)]


def copy(origin: str | None, offset: int | None) -> list:
    """A handed-on copy, [qos, retain, mesh values]: only the origin and its offset matter."""
    return [1, False, ["t", b"p", 1, False, 0, origin, offset]]


def test_where_nothing_was_announced_the_marks_are_how_far_each_log_is_seen_and_our_own_end():
    assert marks.directly_from(SEEN, None, ("me/w0", 7)) == {"a/w0": 10, "b/w0": 20, "me/w0": 7}
    assert marks.directly_from(SEEN, [], None) == {"a/w0": 10, "b/w0": 20}, "a log never seen has no mark"


def test_a_router_that_acknowledged_every_announcement_is_marked_at_its_end_then_or_as_seen_if_further():
    acked = [{"a/w0": 15, "b/w0": 5, "c/w0": 3}, {"a/w0": 12, "b/w0": 6, "c/w0": 4}]
    assert marks.directly_from(SEEN, acked, None) == {"a/w0": 15, "b/w0": 20, "c/w0": 4}


def test_a_router_missing_from_one_acknowledgement_gets_no_mark_so_every_copy_from_it_counts():
    acked = [{"a/w0": 15, "b/w0": 25}, {"a/w0": 12}]
    assert marks.directly_from(SEEN, acked, ("me/w0", 7)) == {"a/w0": 15, "me/w0": 7}


def test_a_wait_that_timed_out_leaves_only_our_own_mark():
    acked = [{"a/w0": 15, "b/w0": 25}, None]
    assert marks.directly_from(SEEN, acked, ("me/w0", 7)) == {"me/w0": 7}
    assert marks.directly_from(SEEN, [None], None) == {}


def test_a_copy_from_before_its_origins_mark_or_without_one_is_delivered_the_rest_dropped():
    items = [copy("a/w0", 9), copy("a/w0", 10), copy("b/w0", 99), copy("a/w0", None), copy("a/w0", 11)]
    assert marks.not_direct(items, {"a/w0": 10}) == [items[0], items[2], items[3]]
    assert marks.not_direct(items, {}) == items


# -- what a session's old router names in its last hand-on (``named_unheard``) ------------------

PEERS = [("new/w0", 40, False), ("a/w0", 10, False), ("b/w0", 20, False), ("c/w0", -1, False)]


def test_the_routers_that_answered_are_named_with_none_the_others_with_how_far_their_log_is_seen():
    assert marks.named_unheard(["new/w0", "a/w0"], PEERS, "new/w0", False) == {"a/w0": None, "b/w0": 20}


def test_a_router_that_answered_but_whose_frames_are_missed_here_is_named_with_its_mark():
    """Partition seeds 331 and 341: frames lost with a replaced connection were sent again after
    the sender's answer to the barrier, reached the old router after the hand-on and matched
    nothing there. Named with its (held) mark, the new owner reads them back from its log."""
    peers = [("new/w0", 40, False), ("a/w0", 10, True), ("b/w0", 20, False), ("c/w0", -1, True)]
    assert marks.named_unheard(["new/w0", "a/w0", "b/w0", "c/w0"], peers, "new/w0", False) == {
        "a/w0": 10, "b/w0": None, "c/w0": -1}


def test_the_new_owner_is_named_only_where_its_own_frames_are_missed_here():
    peers = [("new/w0", 40, True), ("a/w0", 10, False)]
    assert marks.named_unheard(["new/w0", "a/w0"], peers, "new/w0", False) == {"new/w0": 40, "a/w0": None}
    assert marks.named_unheard(["new/w0", "a/w0"], PEERS[:2], "new/w0", False) == {"a/w0": None}


def test_a_young_incarnation_names_every_router_from_a_time_and_the_new_owner_where_its_frames_are_missed():
    assert marks.named_unheard(["a/w0"], PEERS, "new/w0", True) == {"a/w0": -1, "b/w0": -1}
    peers = [("new/w0", 40, True), *PEERS[1:]]
    assert marks.named_unheard(["a/w0"], peers, "new/w0", True) == {"new/w0": -1, "a/w0": -1, "b/w0": -1}
