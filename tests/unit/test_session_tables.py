"""An idle session's subscriptions, shared subscriptions and in-flight window are one shared empty
table (``router.session.NO_ENTRIES``) until their first entry: 192 bytes a connection less. What
could go wrong is a writer that adds to the shared table, so that every idle session sees the
entry: the table refuses entries, and a random mix of the router's writers keeps each session's
tables its own."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brokerd.connection.packets import Publish, Subscription
from brokerd.router.clock import FakeClock
from brokerd.router.inflight import Inflight
from brokerd.router.message import Message
from brokerd.router.router import Router, RouterConfig
from brokerd.router.session import NO_ENTRIES
from tests.unit.conftest import online

pytestmark = pytest.mark.unit

FILTERS = ("a", "a/+", "#", "b")
TOPICS = ("a", "a/x", "b")


def router() -> Router:
    return Router(RouterConfig(router_id="n/w0"), clock=FakeClock())


def test_an_idle_session_shares_one_empty_table_that_refuses_entries():
    r = router()
    one, other = r.new_session("one", False), r.new_session("other", True)
    for s in (one, other):
        assert s.subscriptions is NO_ENTRIES and s.shared is NO_ENTRIES and s.inflight is NO_ENTRIES
    with pytest.raises(TypeError):
        one.subscriptions["a"] = Subscription("a", 1)
    with pytest.raises(TypeError):
        one.inflight.setdefault(1, Inflight(None, 1, False))
    with pytest.raises(TypeError):
        one.shared.update({"$share/g/a": Subscription("$share/g/a", 1)})
    assert NO_ENTRIES == {}  # (refused: nothing got in)
    # Reading it, and removing what is not there, is what a dict does.
    assert one.subscriptions.pop("a", None) is None and one.inflight.get(1) is None and not list(one.shared)


def test_a_table_of_its_own_is_made_at_the_first_entry_and_kept():
    r = router()
    one, other = r.new_session("one", False), r.new_session("other", False)
    r.subscribe(one, Subscription("a", 1))
    assert one.subscriptions.keys() == {"a"} and other.subscriptions is NO_ENTRIES
    own = one.own_subscriptions()
    r.unsubscribe(one, "a")
    assert one.subscriptions is own and own == {}  # emptied, not given back
    r.subscribe_shared(other, Subscription("$share/g/a", 1))
    assert other.shared.keys() == {"$share/g/a"} and one.shared is NO_ENTRIES
    assert one.own_inflight() is one.own_inflight() is not other.own_inflight()


OPS = st.one_of(
    st.tuples(st.just("sub"), st.integers(0, 2), st.sampled_from(FILTERS), st.integers(0, 2)),
    st.tuples(st.just("unsub"), st.integers(0, 2), st.sampled_from(FILTERS)),
    st.tuples(st.just("share"), st.integers(0, 2), st.sampled_from(FILTERS)),
    st.tuples(st.just("unshare"), st.integers(0, 2), st.sampled_from(FILTERS)),
    st.tuples(st.just("pub"), st.sampled_from(TOPICS), st.integers(0, 2)),
    st.tuples(st.just("ack"), st.integers(0, 2)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(OPS, max_size=30))
def test_each_session_holds_what_was_written_to_it_alone(ops):
    """Subscribes, unsubscribes, group joins and leaves, publishes and acknowledgements in any
    order: each session's three tables hold exactly its own entries (a model kept beside it; its
    in-flight window is what its connection got at QoS 1 or 2 and did not acknowledge yet), and the
    shared empty table stays empty."""
    r = router()
    online_ = [online(r, f"c{i}") for i in range(3)]
    subs: list[dict[str, int]] = [{}, {}, {}]
    groups: list[set[str]] = [set(), set(), set()]
    acked: list[set[int]] = [set(), set(), set()]
    for op in ops:
        kind = op[0]
        if kind == "sub":
            _, i, f, q = op
            r.subscribe(online_[i][0], Subscription(f, q))
            subs[i][f] = q
        elif kind == "unsub":
            _, i, f = op
            r.unsubscribe(online_[i][0], f)
            subs[i].pop(f, None)
        elif kind == "share":
            _, i, f = op
            r.subscribe_shared(online_[i][0], Subscription(f"$share/g/{f}", 1))
            groups[i].add(f"$share/g/{f}")
        elif kind == "unshare":
            _, i, f = op
            r.unsubscribe_shared(online_[i][0], f"$share/g/{f}")
            groups[i].discard(f"$share/g/{f}")
        elif kind == "pub":
            _, topic, qos = op
            r.publish(Message(topic, b"x", qos=qos, client_id="pub"))
        else:
            _, i = op
            session, conn = online_[i]
            for pid, qos in sent_at_qos(conn).items():
                if pid not in acked[i]:  # QoS 1: PUBACK; QoS 2: PUBREC, then PUBCOMP
                    assert session.puback(pid) if qos == 1 else session.pubrec(pid) and session.pubcomp(pid)
                    acked[i].add(pid)
        assert NO_ENTRIES == {}
        for i, (session, conn) in enumerate(online_):
            assert {f: s.qos for f, s in session.subscriptions.items()} == subs[i]
            assert session.shared.keys() == groups[i]
            assert session.inflight.keys() == sent_at_qos(conn).keys() - acked[i]


def sent_at_qos(conn) -> dict[int, int]:
    """The packet ids of the QoS 1/2 PUBLISHes written to ``conn`` (acknowledged or not): their QoS."""
    return {p.packet_id: p.qos for p in conn.packets() if isinstance(p, Publish) and p.qos}

