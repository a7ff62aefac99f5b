"""MQTT 3.1 (protocol name "MQIsdp", level 3) against a real `brokerd --workers 2`: raw packets and
paho's MQTTv31 client. 3.1 limits client ids to 1..23 characters (CONNACK 2, identifier rejected,
otherwise), and its clients talk with 3.1.1 and 5.0 clients through the same topics.

The raw MQTT client and its codec are tests/integration/test_mqtt5.py's (independent of brokerd's).
"""

from __future__ import annotations

from collections.abc import Iterator

import paho.mqtt.client as mqtt
import pytest

from tests.helpers import Broker, Client, cid
from tests.integration.test_mqtt5 import (
    CONNACK,
    PUBCOMP,
    PUBREC,
    SUBACK,
    Raw,
    paho_on,
    publish_bytes,
    publish_v5,
    raw_on,
    shared_broker,
    subscribe_bytes,
    uid,
)

V31, V311, V5 = mqtt.MQTTv31, mqtt.MQTTv311, mqtt.MQTTv5


@pytest.fixture(scope="module")
def b31(xprocess, tmp_path_factory) -> Iterator[Broker]:
    yield from shared_broker(xprocess, tmp_path_factory, "mqtt31")


def raw31(broker: Broker, **where: int) -> Raw:
    return raw_on(broker, level=3, **where)


def test_mqtt31_connect_is_accepted(b31):
    """CONNECT "MQIsdp" level 3: CONNACK 0, in 3.1's form (the first byte of its variable header is
    reserved: no session present flag)."""
    raw = raw31(b31)
    raw.send(b"\x10\x1a\x00\x06MQIsdp\x03\x02\x00\x3c\x00\x0cmqtt31-raw-1")
    connack = raw.recv()
    assert (connack.kind, connack.flags, connack.body) == (CONNACK, 0, b"\x00\x00")
    raw.disconnect()


@pytest.mark.parametrize("client_id", ["", "x" * 24])
def test_mqtt31_client_id_outside_1_to_23_characters_is_rejected(b31, client_id):
    """MQTT 3.1: a client id is 1 to 23 characters; empty or 24: CONNACK 2 (identifier rejected) and
    the connection is closed."""
    raw = raw31(b31)
    raw.connect(client_id, expect_rc=2)
    assert raw.until_closed() == []


def test_mqtt31_client_id_of_23_characters_is_accepted(b31):
    raw = raw31(b31)
    raw.connect(("i" + uid() * 4)[:23])
    raw.disconnect()


def test_mqtt31_subscriber_receives_from_311_and_50_publishers(b31):
    """A raw 3.1 subscriber gets, at the QoS granted, what 3.1.1 and 5.0 clients on the other worker
    publish, in 3.1's PUBLISH form (no properties, even from an MQTT 5 publisher with some)."""
    u = uid()
    sub = raw31(b31)
    sub.connect(cid("s31"))
    assert sub.subscribe([(f"{u}/#", 1)]).codes == [1]
    p4 = paho_on(b31, "p4", off=sub.worker)
    p5 = paho_on(b31, "p5", off=sub.worker, protocol=V5)
    p4.publish(f"{u}/from311", b"311", qos=2)
    p4.c.publish(f"{u}/from311q0", b"311-0", 0)
    publish_v5(p5, f"{u}/from5", b"5", 1, ContentType="text/plain", UserProperty=[("k", "v")])
    got = sub.messages(lambda g: len(g) == 3)
    assert sorted((m.topic, m.payload, m.qos) for m in got) == [
        (f"{u}/from311", b"311", 1), (f"{u}/from311q0", b"311-0", 0), (f"{u}/from5", b"5", 1)]
    for m in got:  # topic, packet id (QoS 1), then the payload: nothing else
        assert m.body == len(m.topic).to_bytes(2, "big") + m.topic.encode() + (
            m.pid.to_bytes(2, "big") if m.qos else b"") + m.payload  # type: ignore[union-attr]
    sub.disconnect()


def test_mqtt31_publisher_reaches_311_and_50_subscribers(b31):
    """QoS 0, 1 and 2 from a raw 3.1 client reach 3.1.1 and 5.0 subscribers on both workers."""
    u = uid()
    pub = raw31(b31)
    pub.connect(cid("p31"))
    subs = [paho_on(b31, "s4", on=pub.worker), paho_on(b31, "s4", off=pub.worker),
            paho_on(b31, "s5", on=pub.worker, protocol=V5), paho_on(b31, "s5", off=pub.worker, protocol=V5)]
    for s in subs:
        s.subscribe(f"{u}/#", 2)
    for qos in (0, 1, 2):
        pub.publish(f"{u}/q{qos}", f"m{qos}".encode(), qos)
    for s in subs:
        got = s.wait_messages(3)
        assert sorted((m.topic, m.payload, m.qos) for m in got) == [
            (f"{u}/q{q}", f"m{q}".encode(), q) for q in (0, 1, 2)]
    pub.disconnect()


def test_paho_mqttv31_client_publishes_subscribes_and_keeps_its_session(b31):
    """paho's MQTTv31 client: publish/subscribe, and a persistent session (clean session 0) gets what
    was published while it was away."""
    u = uid()
    name = cid("paho31")
    c = Client(b31.port, name, clean=False, protocol=V31).connect()
    assert c.subscribe(f"{u}/#", 1) == [1]
    c.publish(f"{u}/self", b"hello", qos=1)
    assert c.wait_topic(f"{u}/self").payload == b"hello"
    c.disconnect()
    Client(b31.port, cid("p"), protocol=V5).connect().publish(f"{u}/away", b"queued", qos=1)
    again = Client(b31.port, name, clean=False, protocol=V31).connect()
    assert again.wait_topic(f"{u}/away").payload == b"queued"
    again.disconnect()
    Client(b31.port, name, clean=True, protocol=V31).connect().disconnect()  # end the session


def test_mqtt31_will_reaches_an_mqtt5_subscriber(b31):
    """A 3.1 client's will, published when its connection drops, reaches an MQTT 5 subscriber."""
    u = uid()
    watcher = Client(b31.port, cid("w"), protocol=V5).connect()
    watcher.subscribe(f"{u}/will", 1)
    raw = raw31(b31)
    raw.connect(cid("d31"), will=(f"{u}/will", b"gone31", 1, False, []))
    raw.close()
    m = watcher.wait_messages(1)[0]
    assert (m.topic, m.payload) == (f"{u}/will", b"gone31")


def test_mqtt31_qos2_resent_after_a_reconnect_is_completed_with_its_dup_pubrel(b31):
    """A 3.1 client that lost its connection before PUBCOMP sends the PUBLISH again with DUP, then
    a PUBREL with DUP, as 3.1 marks every packet it sends again: it gets PUBREC and PUBCOMP, and the
    message is delivered once. 3.1.1 made those PUBREL flags reserved; 3.1 clients still set them."""
    u = uid()
    watcher = Client(b31.port, cid("w"), protocol=V5).connect()
    watcher.subscribe(f"{u}/q2", 2)
    name = cid("r31")
    raw = raw31(b31)
    raw.connect(name, clean=False)
    raw.send(publish_bytes(f"{u}/q2", b"once", 2, 7, level=3))
    assert raw.expect(PUBREC).pid == 7
    raw.close()  # no PUBREL: the exchange is cut short
    again = raw31(b31)
    again.connect(name, clean=False)
    again.send(publish_bytes(f"{u}/q2", b"once", 2, 7, dup=True, level=3))
    assert again.expect(PUBREC).pid == 7
    again.send(b"\x6a\x02\x00\x07")  # PUBREL, DUP set, QoS 1
    assert again.expect(PUBCOMP).pid == 7
    resub = subscribe_bytes(8, [(f"{u}/again", 1)], level=3)
    again.send(bytes([resub[0] | 0x08]) + resub[1:])  # SUBSCRIBE sent again: DUP set too
    assert again.expect(SUBACK).pid == 8
    again.send(publish_bytes(f"{u}/q2", b"marker", 0, level=3))
    got = watcher.wait_messages(2)
    assert [m.payload for m in got] == [b"once", b"marker"]
    again.disconnect()
