"""When the agreement service says that its member's port is not bound (``Unbound``, a fake clock):
PySyncObj retries a failed bind every second without a word, and an unbound member reaches no peer."""

from __future__ import annotations

from brokerd.cluster.agreement.service import Unbound


def test_a_member_not_bound_after_the_grace_is_said_to_be_once():
    u = Unbound(started=100.0, grace=2.0)
    assert [u.news(False, t) for t in (100.0, 101.9)] == [None, None]
    assert u.news(False, 102.0) == "unbound"
    assert [u.news(False, t) for t in (103.0, 150.0)] == [None, None]


def test_a_member_bound_after_it_was_said_unbound_is_said_bound_once():
    u = Unbound(started=0.0, grace=2.0)
    assert u.news(False, 5.0) == "unbound"
    assert u.news(True, 6.0) == "bound"
    assert u.news(True, 7.0) is None


def test_a_member_bound_within_the_grace_says_nothing():
    u = Unbound(started=0.0, grace=2.0)
    assert [u.news(False, 1.0), u.news(True, 1.5), u.news(True, 60.0)] == [None, None, None]
