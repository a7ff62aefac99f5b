"""A subscription as plain values (session transfer, snapshots, catch-up) and back: what peers
and older snapshots write must come back as the typed fields, for the compiled build checks
them (a None identifier once failed every takeover that carried one, compiled only)."""

from brokerd.connection.packets import Subscription


def test_a_subscription_comes_back_from_its_values():
    s = Subscription("a/#", 1, True, False, 2, 7)
    assert Subscription.from_values(list(s.to_values())) == s


def test_five_values_written_before_identifiers_mean_no_identifier():
    assert Subscription.from_values(["a/#", 1, False, False, 0]).sub_id == 0


def test_a_none_identifier_means_none():
    s = Subscription.from_values(["a/#", 1, 0, 1, 0, None])
    assert (s.sub_id, s.no_local, s.retain_as_published) == (0, False, True)
