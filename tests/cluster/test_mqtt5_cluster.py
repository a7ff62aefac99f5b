"""MQTT 5.0 (issue #16) across nodes: two nodes (127.0.0.1 and 127.0.0.2, 2 workers each) joined by
the mesh. Subscription identifiers, message expiry, will delay, properties and No Local must hold
when a message crosses to another node and when a session is taken over by another node.

The raw MQTT client and its codec are tests/integration/test_mqtt5.py's (independent of brokerd's).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import paho.mqtt.client as mqtt
import pytest

from tests.cluster.test_multihost import two_nodes
from tests.helpers import Broker, Client, cid
from tests.integration.test_mqtt5 import (
    MESSAGE_EXPIRY,
    NO_LOCAL,
    SESSION_EXPIRY,
    SUBSCRIPTION_ID,
    Raw,
    assert_rich,
    assert_rich_raw,
    dying,
    no_message,
    publish_v5,
    raw_on,
    rich_props,
    rich_raw_props,
    sub_ids,
    subscribe_v5,
    uid,
    will_watcher,
)

V5 = mqtt.MQTTv5
PERSIST = [(SESSION_EXPIRY, 300)]


@pytest.fixture(scope="module")
def nodes(xprocess, tmp_path_factory) -> Iterator[tuple[Broker, Broker]]:
    """Nodes a and b, each the other's --peer, shared by this module's tests."""
    with two_nodes(xprocess, lambda name: tmp_path_factory.mktemp(f"node-{name}"), "mqtt5") as ab:
        yield ab


def v5(node: Broker, prefix: str) -> Client:
    return Client(node.port, cid(prefix), host=node.host, protocol=V5).connect()


def offline_session(node: Broker, topic: str, sub_id: int | None = None, options: int = 1) -> tuple[str, Raw]:
    """A persistent session on ``node`` subscribed to ``topic``, now offline (DISCONNECT)."""
    name = cid("off")
    raw = raw_on(node)
    raw.connect(name, clean=False, props=PERSIST)
    assert raw.subscribe([(topic, options)], [(SUBSCRIPTION_ID, sub_id)] if sub_id else []).codes == [options & 3]
    raw.disconnect()
    return name, raw


def test_subscription_identifiers_across_nodes(nodes):
    """A subscriber on node b with identifiers 7 ("#") and 9 ("+") gets what node a's client
    publishes once, with both [MQTT-3.3.4-3] [MQTT-3.3.4-4]; a retained message of node a comes on
    subscribe with the identifier of that SUBSCRIBE."""
    a, b = nodes
    u = uid()
    pub = v5(a, "p")
    pub.publish(f"{u}/ret", b"kept", qos=1, retain=True)
    sub = v5(b, "s")
    subscribe_v5(sub, f"{u}/#", 1, sub_id=7)
    assert sub_ids(sub.wait_messages(1)[0]) == [7]
    subscribe_v5(sub, f"{u}/+", 1, sub_id=9)
    sub.wait_messages(2)  # the retained message again, for the new subscription
    n = len(sub.messages)
    pub.publish(f"{u}/x", b"live", qos=1)
    pub.publish(f"{u}/x/end", b"end", qos=1)
    sub.wait_messages(n + 2)
    live = sub.messages[n:]
    assert [(m.payload, sub_ids(m)) for m in live] == [(b"live", [7, 9]), (b"end", [7])]
    pub.publish(f"{u}/ret", b"", qos=1, retain=True)


def test_subscription_identifier_kept_after_a_takeover_by_another_node(nodes):
    """A persistent session with identifier 42, offline on node a, is taken over on node b: the
    message queued on a and the live ones carry 42."""
    a, b = nodes
    u = uid()
    name, _ = offline_session(a, f"{u}/#", sub_id=42)
    v5(a, "p").publish(f"{u}/q", b"queued", qos=1)
    back = raw_on(b)
    assert back.connect(name, clean=False, props=PERSIST).session_present
    v5(a, "p2").publish(f"{u}/l", b"live", qos=1)
    got = back.until_payload(b"live")
    assert [(m.payload, m.all(SUBSCRIPTION_ID)) for m in got] == [(b"queued", [42]), (b"live", [42])]
    back.disconnect(0, [(SESSION_EXPIRY, 0)])


@pytest.mark.parametrize("reconnect", ["home node", "other node"])
def test_message_expiry_across_nodes(nodes, reconnect):
    """Published on node b for a session offline on node a, 2 s before it reconnects (on a, or
    taking it over on b): expiry 1 s is not delivered [MQTT-3.3.2-5], expiry 10 s is, with less
    than 10 left [MQTT-3.3.2-6], no expiry is, without one."""
    a, b = nodes
    u = uid()
    name, _ = offline_session(a, f"{u}/t")
    pub = raw_on(b)
    pub.connect(cid("p"))
    pub.publish(f"{u}/t", b"short", 1, [(MESSAGE_EXPIRY, 1)])
    pub.publish(f"{u}/t", b"ten", 1, [(MESSAGE_EXPIRY, 10)])
    pub.publish(f"{u}/t", b"forever", 1)
    time.sleep(2.2)  # the 1 s interval under test, with room for whole-second rounding
    back = raw_on(a if reconnect == "home node" else b)
    assert back.connect(name, clean=False, props=PERSIST).session_present
    got = back.until_payload(b"forever")
    assert [m.payload for m in got] == [b"ten", b"forever"], got
    assert 1 <= got[0].prop(MESSAGE_EXPIRY) <= 9 and got[1].prop(MESSAGE_EXPIRY) is None
    back.disconnect(0, [(SESSION_EXPIRY, 0)])


def test_a_delayed_will_reaches_the_other_node_after_its_delay(nodes):
    """A client on node a with Will Delay Interval 2 drops: a watcher on node b gets the will, not
    before 2 s [MQTT-3.1.2-8]."""
    a, b = nodes
    u = uid()
    watcher = will_watcher(b, f"{u}/will")
    raw = dying(a, cid("wd"), f"{u}/will", 2, 60)
    t0 = time.monotonic()  # before the close: the delay runs from the broker's sight of it, not later
    raw.close()
    watcher.wait_messages(1, timeout=6)
    assert time.monotonic() - t0 >= 1.9


def test_reconnecting_on_another_node_within_the_will_delay_cancels_the_will(nodes):
    """The session of a client that dropped on node a (Will Delay Interval 2) is taken over on node b
    before the delay passed: the will is never sent, on either node [MQTT-3.1.3-9]."""
    a, b = nodes
    u = uid()
    name = cid("wr")
    watchers = [will_watcher(a, f"{u}/will"), will_watcher(b, f"{u}/will")]
    raw = dying(a, name, f"{u}/will", 2, 60)
    back = raw_on(b)  # first: finding its worker (a scan of sockets) is no part of what is timed
    t0 = time.monotonic()
    raw.close()
    assert back.connect(name, clean=False, props=[(SESSION_EXPIRY, 60)]).session_present
    assert time.monotonic() - t0 < 1.5, "the takeover took too long to prove anything"
    time.sleep(max(0.0, t0 + 3.0 - time.monotonic()))  # past the 2 s delay
    marker = v5(a, "m")
    for w in watchers:
        no_message(w, marker, f"{u}/will")
        assert b"gone" not in [m.payload for m in w.messages]
    back.disconnect(0, [(SESSION_EXPIRY, 0)])


def test_a_clean_start_reconnect_on_another_node_sends_the_delayed_will_at_once(nodes):
    """The session of a client on node a (Will Delay Interval 10, connection still open) is ended
    by a Clean Start CONNECT on node b: the will travels with the session and goes out then, not
    after the delay [MQTT-3.1.2-4]; watchers on both nodes get it once."""
    a, b = nodes
    u = uid()
    name = cid("wc")
    watchers = [will_watcher(a, f"{u}/will"), will_watcher(b, f"{u}/will")]
    raw = dying(a, name, f"{u}/will", 10, 60)
    back = raw_on(b)  # first: finding its worker (a scan of sockets) is no part of what is timed
    t0 = time.monotonic()
    assert not back.connect(name, clean=True).session_present
    for w in watchers:
        w.wait_messages(1, timeout=8)
    assert time.monotonic() - t0 < 9.0, "the will held for its 10 s delay"  # (a loaded box: seconds, not 10)
    marker = v5(a, "m")
    for w in watchers:
        no_message(w, marker, f"{u}/will")
        assert [m.payload for m in w.messages].count(b"gone") == 1
    back.disconnect()
    raw.close()


def test_properties_pass_through_across_nodes(nodes):
    """Published on node a at QoS 0, 1 and 2, received on node b with every property unchanged."""
    a, b = nodes
    u = uid()
    sub = v5(b, "s")
    sub.subscribe(f"{u}/#", 2)
    pub = v5(a, "p")
    for qos in (0, 1, 2):
        publish_v5(pub, f"{u}/q{qos}", b'{"q": %d}' % qos, qos, **rich_props(u))
    got = sub.wait_messages(3)
    assert sorted(m.topic for m in got) == [f"{u}/q0", f"{u}/q1", f"{u}/q2"]
    for m in got:
        assert_rich(m, u)


def test_properties_kept_after_a_takeover_by_another_node(nodes):
    """A message queued on node a for an offline session keeps its properties, in order, when node b
    takes the session over."""
    a, b = nodes
    u = uid()
    name, _ = offline_session(a, f"{u}/t")
    pub = raw_on(a)
    pub.connect(cid("p"))
    pub.publish(f"{u}/t", b'{"t": 1}', 1, rich_raw_props(u))
    back = raw_on(b)
    assert back.connect(name, clean=False, props=PERSIST).session_present
    [m] = back.messages(lambda g: len(g) == 1)
    assert_rich_raw(m, u)
    back.disconnect(0, [(SESSION_EXPIRY, 0)])


def test_no_local_across_nodes(nodes):
    """A No Local subscriber on node a gets, right after each SUBACK, what a client on node b
    publishes (20 times), and never its own messages [MQTT-3.8.3-3], which do reach node b."""
    a, b = nodes
    u = uid()
    me = v5(a, "nl")
    other = v5(b, "np")
    there = v5(b, "nt")
    there.subscribe(f"{u}/#", 1)
    for i in range(20):
        assert subscribe_v5(me, f"{u}/{i}", 1, no_local=True) == [1]
        me.publish(f"{u}/{i}", f"own{i}", qos=1)
        other.publish(f"{u}/{i}", f"other{i}", qos=1)
        me._wait(lambda i=i: any(m.payload == f"other{i}".encode() for m in me.messages), f"other{i}")
    there.wait_messages(40)
    assert [m.payload for m in me.messages] == [f"other{i}".encode() for i in range(20)]


def test_no_local_holds_for_a_session_taken_over_by_another_node(nodes):
    """A No Local persistent subscriber publishes on node a, drops, and takes its session over on
    node b: it catches up on another client's message only [MQTT-3.8.3-3]."""
    a, b = nodes
    u = uid()
    name = cid("nlm")
    me = raw_on(a)
    me.connect(name, clean=False, props=PERSIST)
    me.subscribe([(f"{u}/t", 1 | NO_LOCAL)])
    me.publish(f"{u}/t", b"own", 1)
    me.close()
    pub = v5(a, "p")
    pub.publish(f"{u}/t", b"other", qos=1)
    back = raw_on(b)
    assert back.connect(name, clean=False, props=PERSIST).session_present
    back.publish(f"{u}/t", b"own-again", 1)
    pub.publish(f"{u}/t", b"marker", qos=1)
    got = back.until_payload(b"marker")
    assert [m.payload for m in got] == [b"other", b"marker"], got
    back.disconnect(0, [(SESSION_EXPIRY, 0)])
