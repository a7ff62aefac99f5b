"""The agreement service's pure parts: a round's proposals grouped into entries and their results
split back per request; the majority as "a probe sent lately has committed" (a fake clock)."""

from __future__ import annotations

from brokerd.cluster.agreement.service import Majority, Request, entries, split


def _req(n: int, tag: str = "") -> Request:
    return Request(b"w", tag, [[tag, i] for i in range(n)], 0.0)


def test_a_rounds_proposals_are_one_entry_in_arrival_order():
    reqs = [_req(2, "a"), _req(1, "b"), _req(3, "c")]
    assert entries(reqs, most=100) == [reqs]
    assert entries([], most=100) == []


def test_an_entry_holds_at_most_so_many_commands_and_no_request_is_split():
    a, b, c, big, d = _req(2, "a"), _req(2, "b"), _req(1, "c"), _req(7, "big"), _req(1, "d")
    assert entries([a, b, c, big, d], most=4) == [[a, b], [c], [big], [d]]


def test_results_go_back_to_each_request_in_order():
    reqs = [_req(2, "a"), _req(0, "none"), _req(1, "b")]
    assert split([1, 2, 3], reqs) == [[1, 2], [], [3]]


def test_the_majority_holds_while_a_probe_sent_within_the_window_has_committed():
    m = Majority(window=1.5)
    assert not m.holds(0.0)  # nothing committed yet
    m.committed(10.0)
    assert m.holds(10.2) and m.holds(11.5) and not m.holds(11.6)
    m.committed(9.0)  # an older probe committing late changes nothing
    assert not m.holds(11.6)
    m.committed(11.0)
    assert m.holds(12.4)
