"""Malformed MQTT 5 packets against a real two-worker broker (issue #16): each gets a DISCONNECT
with the reason code the standard gives (0x81 Malformed Packet, 0x82 Protocol Error, 0x94 Topic
Alias invalid, 0x99 Payload format invalid), then the connection is closed, and a client connected
meanwhile is not disturbed. The rules themselves are tested with bytes in tests/unit/test_codec_mqtt5.

One broker serves every case of a test (each case opens its own connection): starting one per case
would cost far more than the cases.
"""

from __future__ import annotations

import paho.mqtt.client as mqtt

from brokerd.connection.codec import Decoder, encode
from brokerd.connection.packets import Connack, Connect, Disconnect, Packet, Pingresp, Suback
from brokerd.connection.reasons import Reason
from tests.helpers import Client, RawClient, cid

MALFORMED = Reason.MALFORMED_PACKET
PROTOCOL = Reason.PROTOCOL_ERROR


def _s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return len(raw).to_bytes(2, "big") + raw


def _raw(b0: int, body: bytes) -> bytes:
    assert len(body) < 128
    return bytes((b0, len(body))) + body


def _props(*pairs: bytes) -> bytes:
    body = b"".join(pairs)
    return bytes((len(body),)) + body


def _publish(props: bytes, payload: bytes = b"p", topic: str = "mal/t") -> bytes:
    return _raw(0x30, _s(topic) + props + payload)


def _subscribe(props: bytes, *subs: tuple[str, int]) -> bytes:
    return _raw(0x82, b"\x00\x01" + props + b"".join(_s(f) + bytes((o,)) for f, o in subs))


# (what, packet sent after a successful MQTT 5 CONNECT, the DISCONNECT reason code expected)
CASES = [
    ("SUBSCRIBE, empty filter", _subscribe(b"\x00", ("", 0)), MALFORMED),
    ("SUBSCRIBE, empty filter with properties", _subscribe(_props(b"\x0b\x05"), ("", 1)), MALFORMED),
    ("SUBSCRIBE, an empty filter after a good one", _subscribe(b"\x00", ("mal/a", 0), ("", 0)), MALFORMED),
    ("UNSUBSCRIBE, empty filter", _raw(0xA2, b"\x00\x01\x00" + _s("")), MALFORMED),
    ("SUBSCRIBE, no filter", _subscribe(b"\x00"), PROTOCOL),
    ("UNSUBSCRIBE, no filter", _raw(0xA2, b"\x00\x01\x00"), PROTOCOL),
    ("SUBSCRIBE, Topic Alias property", _subscribe(_props(b"\x23\x00\x01"), ("mal/a", 0)), MALFORMED),
    ("SUBSCRIBE, Subscription Identifier 0", _subscribe(_props(b"\x0b\x00"), ("mal/a", 0)), PROTOCOL),
    ("SUBSCRIBE, two Subscription Identifiers", _subscribe(_props(b"\x0b\x01", b"\x0b\x02"), ("mal/a", 0)),
     PROTOCOL),
    ("SUBSCRIBE, Retain Handling 3", _subscribe(b"\x00", ("mal/a", 0x30)), PROTOCOL),
    ("SUBSCRIBE, reserved option bits", _subscribe(b"\x00", ("mal/a", 0xC0)), MALFORMED),
    ("PUBLISH, Payload Format Indicator 2", _publish(_props(b"\x01\x02")), PROTOCOL),
    ("PUBLISH, Payload Format Indicator 1, payload not UTF-8", _publish(_props(b"\x01\x01"), b"\xff\xfe"),
     Reason.PAYLOAD_FORMAT_INVALID),
    ("PUBLISH, Payload Format Indicator twice", _publish(_props(b"\x01\x00", b"\x01\x00")), PROTOCOL),
    ("PUBLISH, Session Expiry Interval", _publish(_props(b"\x11\x00\x00\x00\x05")), MALFORMED),
    ("PUBLISH, Will Delay Interval", _publish(_props(b"\x18\x00\x00\x00\x05")), MALFORMED),
    ("PUBLISH, Subscription Identifier", _publish(_props(b"\x0b\x07")), PROTOCOL),
    ("PUBLISH, Topic Alias 0", _publish(_props(b"\x23\x00\x00")), Reason.TOPIC_ALIAS_INVALID),
    ("PUBLISH, wildcard Response Topic", _publish(_props(b"\x08" + _s("r/#"))), PROTOCOL),
    ("PUBACK, reason code 0x01", _raw(0x40, b"\x00\x01\x01"), PROTOCOL),
    ("DISCONNECT, a code only a server sends", _raw(0xE0, b"\x8b\x00"), PROTOCOL),
    ("PUBLISH, remaining length not in its shortest form", b"\x30\x8a\x00" + _s("mal/t") + b"\x00p", MALFORMED),
]


def _read(raw: RawClient, decoder: Decoder, n: int) -> list[Packet]:
    """The next ``n`` packets from the broker (each recv bounded by the socket's timeout)."""
    got: list[Packet] = []
    while len(got) < n:
        data = raw.sock.recv(65536)
        assert data, f"connection closed after {got}"
        got += decoder.feed(data)
    return got


def _connected(port: int) -> tuple[RawClient, Decoder]:
    raw = RawClient(port)
    raw.send(encode(Connect(cid("mal"), protocol_level=5)))
    decoder = Decoder(protocol_level=5)
    [connack] = _read(raw, decoder, 1)
    assert type(connack) is Connack and connack.reason_code == 0, connack
    return raw, decoder


def _bystander(port: int) -> Client:
    """An MQTT 5 client subscribed to mal/#, there through every case."""
    c = Client(port, cid("bystander"), protocol=mqtt.MQTTv5).connect()
    assert c.subscribe("mal/#", 1) == [1]
    return c


def _still_served(port: int, bystander: Client, topic: str) -> None:
    assert not bystander.disconnected.is_set(), bystander.disconnect_reason
    pub = Client(port, cid("pub"), protocol=mqtt.MQTTv5).connect()
    pub.publish(topic, b"still fine", qos=1)
    assert bystander.wait_topic(topic).payload == b"still fine"


def test_each_malformed_packet_gets_its_disconnect_reason(start_broker):
    broker = start_broker(workers=2)
    bystander = _bystander(broker.port)
    for what, packet, reason in CASES:
        raw, decoder = _connected(broker.port)
        raw.send(packet)
        rest = raw.recv_until_closed()
        assert rest[:1] == b"\xe0" and len(rest) >= 3 and rest[2] == reason, (what, rest)
        assert decoder.feed(rest) == [Disconnect(reason)], what
        raw.close()
    _still_served(broker.port, bystander, "mal/after")
    assert "Traceback" not in broker.log_text()


def test_good_packets_next_to_the_bad_are_served(start_broker):
    """The valid neighbours of the refused cases: a UTF-8 payload declared so, a Topic Alias,
    one Subscription Identifier, a PUBACK with a reason code of its table."""
    broker = start_broker(workers=2)
    bystander = _bystander(broker.port)
    raw, decoder = _connected(broker.port)
    raw.send(_subscribe(_props(b"\x0b\x05"), ("own/#", 1)))
    assert _read(raw, decoder, 1) == [Suback(1, [1])]
    raw.send(_publish(_props(b"\x01\x01"), "héllo".encode(), topic="mal/utf8"))
    raw.send(_publish(_props(b"\x23\x00\x01"), b"aliased", topic="mal/alias"))
    raw.send(_publish(_props(b"\x23\x00\x01"), b"by alias", topic=""))
    raw.send(_raw(0xC0, b""))  # PINGREQ: its PINGRESP says the publishes before it were taken
    assert _read(raw, decoder, 1) == [Pingresp()]
    assert bystander.wait_topic("mal/utf8").payload == "héllo".encode()
    bystander.wait_messages(3)
    assert [m.payload for m in bystander.messages if m.topic == "mal/alias"] == [b"aliased", b"by alias"]
    raw.send(encode(Disconnect(), 5))
    assert raw.recv_until_closed() == b""


def test_refused_connect_is_closed_without_a_connack(start_broker):
    """A CONNECT that breaks a property rule gets no CONNACK of success: the connection is closed
    (MQTT-3.1.4-1), and the others go on."""
    broker = start_broker(workers=2)
    bystander = _bystander(broker.port)
    connects = [
        ("Receive Maximum 0", _props(b"\x21\x00\x00"), 0x02, b""),
        ("Request Problem Information 2", _props(b"\x17\x02"), 0x02, b""),
        ("Authentication Data without a method", _props(b"\x16" + _s("d")), 0x02, b""),
        ("Will Payload Format Indicator 1, payload not UTF-8", b"\x00", 0x06,
         _props(b"\x01\x01") + _s("mal/will") + _s(b"\xff")),
    ]
    for what, props, flags, will in connects:
        raw = RawClient(broker.port)
        body = _s("MQTT") + bytes((5, flags)) + b"\x00\x3c" + props + _s(cid("bad")) + will
        raw.send(_raw(0x10, body))
        rest = raw.recv_until_closed()
        assert not rest.startswith(b"\x20") or rest[3] >= 0x80, (what, rest)  # none, or a refusal
        raw.close()
    _still_served(broker.port, bystander, "mal/after-connect")
