"""PUBLISH / SUBSCRIBE against a real brokerd: QoS flows, wildcards, $ topics, overlap, order."""

from __future__ import annotations

import pytest

from tests.helpers import Broker, Client, RawClient, cid, connect_packet, subscribe_packet


@pytest.fixture
def broker(on_file_broker: Broker) -> Broker:
    """One broker for the whole file (tests/conftest.py's ``file_broker``): each test here uses
    its own client ids and topics, nothing retained."""
    return on_file_broker


@pytest.mark.parametrize("pub_qos", [0, 1, 2])
@pytest.mark.parametrize("sub_qos", [0, 1, 2])
def test_qos_flows_deliver_min_of_publish_and_granted(broker, pub_qos, sub_qos):
    sub = Client(broker.port, cid("sub")).connect()
    assert sub.subscribe("q/t", sub_qos) == [sub_qos]
    pub = Client(broker.port, cid("pub")).connect()
    for i in range(20):
        pub.publish("q/t", f"m{i}", qos=pub_qos)
    msgs = sub.wait_messages(20)
    assert [m.payload.decode() for m in msgs] == [f"m{i}" for i in range(20)]
    assert {m.qos for m in msgs} == {min(pub_qos, sub_qos)}
    assert not any(m.retain for m in msgs)


def test_wildcards_match_as_the_spec_says(broker):
    sub = Client(broker.port, cid("wild")).connect()
    sub.subscribe([("sport/tennis/+", 0), ("sport/#", 0), ("+/+/player1", 0), ("finance", 0)])
    counts = {}
    pub = Client(broker.port, cid("p")).connect()
    topics = ["sport/tennis/player1", "sport", "sport/", "finance", "finance/x", "/finance", "a/b/player1"]
    for t in topics:
        pub.publish(t, b"x", qos=1)
    pub.publish("sport/end", b"end", qos=1)
    msgs = sub.wait_messages(1)
    sub.wait_topic("sport/end")
    for m in sub.messages:
        counts[m.topic] = counts.get(m.topic, 0) + 1
    # Each matching topic delivered exactly once although several filters may match it.
    assert counts == {"sport/tennis/player1": 1, "sport": 1, "sport/": 1, "finance": 1, "a/b/player1": 1,
                      "sport/end": 1}
    assert msgs


def test_dollar_topics_not_matched_by_leading_wildcards(broker):
    sub = Client(broker.port, cid("dollar")).connect()
    sub.subscribe([("#", 0), ("+/x", 0)])
    dsub = Client(broker.port, cid("dollar2")).connect()
    dsub.subscribe("$app/#", 0)
    pub = Client(broker.port, cid("p")).connect()
    pub.publish("$app/x", b"1", qos=1)
    pub.publish("done/x", b"2", qos=1)
    sub.wait_topic("done/x")
    dsub.wait_topic("$app/x")
    assert [m.topic for m in sub.messages] == ["done/x"]


def test_overlapping_subscriptions_deliver_once_at_highest_qos(broker):
    sub = Client(broker.port, cid("overlap")).connect()
    assert sub.subscribe([("o/#", 0), ("o/+", 2), ("o/a", 1)]) == [0, 2, 1]
    pub = Client(broker.port, cid("p")).connect()
    pub.publish("o/a", b"x", qos=2)
    pub.publish("o/b", b"end", qos=2)
    sub.wait_topic("o/b")
    assert [(m.topic, m.qos) for m in sub.messages] == [("o/a", 2), ("o/b", 2)]



def test_invalid_filters_get_0x80_and_valid_ones_in_the_same_subscribe_work(broker):
    # paho refuses to send invalid filters, so this client speaks raw bytes.
    raw = RawClient(broker.port)
    raw.send(connect_packet(cid("bad")))
    assert raw.recv_exact(4) == b"\x20\x02\x00\x00"
    raw.send(subscribe_packet(3, [("a/#/b", 1), ("ok/+", 1), ("a+", 0), ("#x", 0), ("s/#", 2)]))
    assert raw.recv_exact(9) == b"\x90\x07\x00\x03" + bytes([0x80, 1, 0x80, 0x80, 2])
    pub = Client(broker.port, cid("p")).connect()
    pub.publish("ok/1", b"y", qos=0)
    data = raw.recv_exact(2)
    assert data[0] == 0x30  # the valid filter of the same SUBSCRIBE delivers
    assert raw.recv_exact(data[1]).endswith(b"ok/1y")
    raw.close()


def test_unsubscribe_stops_delivery(broker):
    sub = Client(broker.port, cid("unsub")).connect()
    sub.subscribe([("u/1", 1), ("u/2", 1)])
    sub.unsubscribe("u/1")
    pub = Client(broker.port, cid("p")).connect()
    pub.publish("u/1", b"no", qos=1)
    pub.publish("u/2", b"yes", qos=1)
    sub.wait_topic("u/2")
    assert [m.topic for m in sub.messages] == ["u/2"]


def test_order_preserved_per_topic_per_publisher(broker):
    sub = Client(broker.port, cid("order")).connect()
    sub.subscribe("ord/#", 1)
    pubs = [Client(broker.port, cid(f"p{i}")).connect() for i in range(3)]
    n = 300
    for i in range(n):
        for j, p in enumerate(pubs):
            p.c.publish(f"ord/{j}", str(i).encode(), qos=[0, 1, 2][j])
    msgs = sub.wait_messages(3 * n, timeout=30)
    for j in range(3):
        seq = [int(m.payload) for m in msgs if m.topic == f"ord/{j}"]
        assert seq == list(range(n))


def _publish_qos2(pid: int, topic: str, payload: bytes, dup: bool = False) -> bytes:
    t = topic.encode()
    body = len(t).to_bytes(2, "big") + t + pid.to_bytes(2, "big") + payload
    return bytes([0x34 | (0x08 if dup else 0), len(body)]) + body


def test_qos2_inbound_is_exactly_once_even_when_the_publish_is_resent(broker):
    sub = Client(broker.port, cid("once")).connect()
    sub.subscribe("x2/#", 2)
    raw = RawClient(broker.port)
    raw.send(connect_packet(cid("raw2")))
    assert raw.recv_exact(4) == b"\x20\x02\x00\x00"
    raw.send(b"\x62\x02\x00\x09")  # a PUBREL for nothing received: PUBCOMP all the same
    assert raw.recv_exact(4) == b"\x70\x02\x00\x09"
    raw.send(_publish_qos2(7, "x2/a", b"one"))
    assert raw.recv_exact(4) == b"\x50\x02\x00\x07"  # PUBREC
    raw.send(_publish_qos2(7, "x2/a", b"one", dup=True))  # resent before PUBREL: not published again
    assert raw.recv_exact(4) == b"\x50\x02\x00\x07"
    raw.send(b"\x62\x02\x00\x07")  # PUBREL
    assert raw.recv_exact(4) == b"\x70\x02\x00\x07"  # PUBCOMP
    raw.send(_publish_qos2(8, "x2/end", b"end"))
    assert raw.recv_exact(4) == b"\x50\x02\x00\x08"
    sub.wait_topic("x2/end")
    assert [m.payload for m in sub.messages] == [b"one", b"end"]
    raw.close()


def test_encode_once_shared_bytes_many_subscribers(broker):
    """Fan-out to many subscribers: every one gets identical bytes for the same variant."""
    subs = [Client(broker.port, cid(f"fan{i}")).connect() for i in range(20)]
    for s in subs:
        s.subscribe("fan/t", 1)
    pub = Client(broker.port, cid("p")).connect()
    pub.publish("fan/t", b"z" * 1000, qos=1)
    for s in subs:
        m = s.wait_messages(1)[0]
        assert m.payload == b"z" * 1000 and m.qos == 1
