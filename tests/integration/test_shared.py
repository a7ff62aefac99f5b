"""Shared subscriptions ($share/<group>/<filter>) on one router, with real paho and Mosquitto clients."""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterator

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from tests.helpers import WAIT, Broker, Client, RawClient, cid, connect_packet, read_packet, subscribe_packet

V5 = mqtt.MQTTv5


@pytest.fixture
def broker(on_file_broker: Broker) -> Broker:
    """One broker for the whole file (tests/conftest.py's ``file_broker``): each test here uses
    its own client ids and topics (the one retained message is on a topic no other subscribes to)."""
    return on_file_broker


@pytest.fixture(autouse=True)
def closes_clients(monkeypatch, start_broker) -> Iterator[None]:
    """Close every client a test connected, before its broker stops: paho waits in select(), which
    fails once a process holds 1024 descriptors, and a whole suite's worth of leaked clients gets
    there (later tests then never see their CONNACK). It asks for ``start_broker`` so that it is
    torn down first, while the brokers still answer the DISCONNECT."""
    opened: list[Client] = []
    connect = Client.connect

    def tracked(self: Client, *args: object, **kwargs: object) -> Client:
        opened.append(self)
        return connect(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Client, "connect", tracked)
    yield
    for c in opened:
        c.c.disconnect()
        c.c.loop_stop()
        sock = c.c.socket()
        if sock is not None:
            sock.close()


def payloads(clients: list[Client]) -> Counter:
    return Counter(m.payload for c in clients for m in c.messages)


def publish_numbered(port: int, topic: str, n: int, prefix: str = "") -> Counter:
    """Publish ``prefix0`` .. ``prefix<n-1>`` at QoS 1 from a new client; returns what was sent."""
    pub = Client(port, cid("p")).connect()
    for i in range(n):
        pub.publish(topic, f"{prefix}{i}", qos=1)
    return Counter(f"{prefix}{i}".encode() for i in range(n))


def wait_total(clients: list[Client], n: int) -> None:
    """Until the clients together hold ``n`` messages (each client's own wait is bounded)."""
    deadline = time.monotonic() + WAIT
    while sum(len(c.messages) for c in clients) < n:
        left = deadline - time.monotonic()
        assert left > 0, f"timed out: {sum(len(c.messages) for c in clients)} of {n} messages"
        for c in clients:
            with c.cond:
                c.cond.wait(min(0.05, left))


@pytest.mark.parametrize("protocol", [mqtt.MQTTv311, V5])
def test_each_message_reaches_exactly_one_member_and_all_members_get_some(broker, protocol):
    members = [Client(broker.port, cid("m"), protocol=protocol).connect() for _ in range(3)]
    for m in members:
        assert m.subscribe("$share/grp/sh/+", 1) == [1]
    pub = Client(broker.port, cid("p")).connect()
    n = 60
    for i in range(n):
        pub.publish(f"sh/{i % 3}", f"m{i}", qos=1)
    wait_total(members, n)
    got = payloads(members)
    assert got == Counter(f"m{i}".encode() for i in range(n))  # every one, once
    assert all(len(m.messages) >= n // 6 for m in members), [len(m.messages) for m in members]


def test_connack_says_shared_subscriptions_are_available(broker):
    c = Client(broker.port, cid("v5"), protocol=V5).connect()
    props = c.connack_properties
    assert getattr(props, "SharedSubscriptionAvailable", 1) == 1


def test_invalid_share_names_are_refused_v5(broker):
    c = Client(broker.port, cid("v5"), protocol=V5).connect()
    codes = c.subscribe([("$share//t", 0), ("$share/g/", 0), ("$share/g", 0), ("$share/ok/t", 1)])  # paho refuses g+
    assert codes == [0x8F, 0x8F, 0x8F, 1]


def test_invalid_share_names_are_refused_v311(broker):
    raw = RawClient(broker.port)
    raw.send(connect_packet(cid("raw")))
    assert read_packet(raw)[:2] == b"\x20\x02"
    raw.send(subscribe_packet(7, [("$share/#/t", 0), ("$share/g/", 0), ("$share/g/a/#/b", 0), ("$share/g/t", 2)]))
    suback = read_packet(raw)
    assert suback == b"\x90\x06\x00\x07\x80\x80\x80\x02"
    raw.close()


def test_no_local_on_a_shared_subscription_is_a_protocol_error(broker):
    c = Client(broker.port, cid("nl"), protocol=V5).connect()
    c.c.subscribe("$share/g/t", options=SubscribeOptions(qos=0, noLocal=True))
    assert c.disconnected.wait(WAIT)
    assert c.disconnect_reason == 0x82


def test_no_retained_message_on_a_shared_subscribe(broker):
    pub = Client(broker.port, cid("p")).connect()
    pub.publish("ret/t", "old", qos=1, retain=True)
    normal = Client(broker.port, cid("n")).connect()
    normal.subscribe("ret/t", 1)
    normal.wait_topic("ret/t")  # the retained message exists and is served to a normal subscriber
    member = Client(broker.port, cid("m")).connect()
    member.subscribe("$share/g/ret/t", 1)
    pub.publish("ret/t", "new", qos=1)
    member.wait_messages(1)
    normal.wait_messages(2)
    assert [m.payload for m in member.messages] == [b"new"]
    assert not member.messages[0].retain


def test_normal_and_shared_subscribers_of_one_topic(broker):
    normal = Client(broker.port, cid("n")).connect()
    normal.subscribe("mix/t", 1)
    both = Client(broker.port, cid("b")).connect()
    both.subscribe([("mix/t", 1), ("$share/g/mix/t", 1)])
    other = Client(broker.port, cid("o")).connect()
    other.subscribe("$share/g/mix/t", 1)
    n = 20
    sent = publish_numbered(broker.port, "mix/t", n, "x")
    normal.wait_messages(n)
    wait_total([both, other], 2 * n)  # both: n normal copies + its share of the group's n
    assert payloads([normal]) == sent
    group = payloads([both, other]) - payloads([normal])  # what the group got beyond both's normal copies
    assert group == sent
    assert len(other.messages) > 0 and len(both.messages) > n


def test_unsubscribe_leaves_the_group(broker):
    a = Client(broker.port, cid("a"), protocol=V5).connect()
    b = Client(broker.port, cid("b"), protocol=V5).connect()
    for c in (a, b):
        c.subscribe("$share/g/u/t", 1)
    a.unsubscribe("$share/g/u/t")
    pub = Client(broker.port, cid("p")).connect()
    for i in range(10):
        pub.publish("u/t", f"{i}", qos=1)
    b.wait_messages(10)
    assert not a.messages


def test_groups_are_independent(broker):
    g1 = [Client(broker.port, cid("g1")).connect() for _ in range(2)]
    g2 = [Client(broker.port, cid("g2")).connect() for _ in range(2)]
    for c in g1:
        c.subscribe("$share/one/ind/#", 1)
    for c in g2:
        c.subscribe("$share/two/ind/#", 1)
    pub = Client(broker.port, cid("p")).connect()
    for i in range(10):
        pub.publish("ind/x", f"{i}", qos=1)
    wait_total(g1, 10)
    wait_total(g2, 10)
    want = Counter(f"{i}".encode() for i in range(10))
    assert payloads(g1) == want and payloads(g2) == want


def test_a_persistent_member_keeps_its_membership_offline(broker):
    """Offline and alone in its group: it is chosen, its queue holds the messages, and catching up
    from the log on reconnect does not deliver them a second time."""
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 300
    client_id = cid("pm")
    m = Client(broker.port, client_id, protocol=V5, clean=False, properties=props).connect()
    m.subscribe("$share/g/per/t", 1)
    m.disconnect()
    pub = Client(broker.port, cid("p")).connect()
    for i in range(5):
        pub.publish("per/t", f"{i}", qos=1)
    again = Client(broker.port, client_id, protocol=V5, clean=False, properties=props).connect()
    assert again.session_present
    again.wait_messages(5)
    pub.publish("per/t", "last", qos=1)
    again.wait_messages(6)
    assert payloads([again]) == Counter([b"0", b"1", b"2", b"3", b"4", b"last"])


@pytest.mark.skipif(shutil.which("mosquitto_sub") is None, reason="mosquitto-clients not installed")
def test_mosquitto_sub_as_a_group_member(broker):
    sub = subprocess.Popen(["mosquitto_sub", "-h", "127.0.0.1", "-p", str(broker.port), "-t", "$share/g/mq/s",
                            "-q", "1", "-v", "-W", "30"], stdout=subprocess.PIPE)
    fd = sub.stdout.fileno()  # type: ignore[union-attr]
    try:
        pub = Client(broker.port, cid("p")).connect()
        # No retained probe for a shared subscription: publish probes until the first arrives.
        deadline = time.monotonic() + WAIT
        while not select.select([fd], [], [], 0.05)[0]:
            assert time.monotonic() < deadline, "mosquitto_sub never received a probe"
            pub.publish("mq/s", "probe", qos=1)
        for i in range(3):
            pub.publish("mq/s", f"m{i}", qos=1)
        out = b""
        while b"mq/s m2\n" not in out:
            assert select.select([fd], [], [], max(0.0, deadline + WAIT - time.monotonic()))[0], out
            out += os.read(fd, 4096)
        lines = out.decode().splitlines()
        assert [x for x in lines if x != "mq/s probe"] == ["mq/s m0", "mq/s m1", "mq/s m2"]
    finally:
        sub.kill()
        sub.wait(5)


def silent_member(port: int, key: str) -> RawClient:
    """A member that subscribes at QoS 1 and never acknowledges anything it is sent."""
    raw = RawClient(port)
    raw.send(connect_packet(cid("silent")))
    assert read_packet(raw)[:2] == b"\x20\x02"
    raw.send(subscribe_packet(1, [(key, 1)]))
    assert read_packet(raw)[0] == 0x90
    return raw


def test_what_a_vanished_member_left_unacknowledged_goes_to_another(broker):
    silent = silent_member(broker.port, "$share/g/ho/t")
    other = Client(broker.port, cid("o")).connect()
    other.subscribe("$share/g/ho/t", 1)
    sent = publish_numbered(broker.port, "ho/t", 30)
    silent.close()  # its clean session ends with its share unacknowledged: handed to the other
    other.wait_messages(30)
    assert payloads([other]) == sent
