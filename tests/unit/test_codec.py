"""The MQTT codec with bytes alone: round trips for every packet type and level, stream handling
(many packets per feed, any chunking), and each rule the decoder enforces with its reason code."""

from __future__ import annotations

import ssl

import pytest

from brokerd.connection.codec import Decoder, encode, is_tls_client_hello, publish_parts, with_dup
from brokerd.connection.packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Pingreq,
    Pingresp,
    Prop,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
    Will,
)
from brokerd.connection.reasons import ProtocolError, Reason

USER = [("k", "v"), ("k", "v2"), ("ключ", "значение")]

# --------------------------------------------------------------------------------------------------
# Round trips
# --------------------------------------------------------------------------------------------------

CONNECTS = [
    Connect("c1"),
    Connect("", clean_start=False, keepalive=0),
    Connect("c2", keepalive=65535, username="u", password=b"p\x00w"),
    Connect("c3", username="only-user"),
    Connect("c4", will=Will("last/will", b"gone", qos=1, retain=True)),
    Connect("c5", will=Will("w", b"", qos=2), username="u", password=b""),
    Connect("old", protocol_level=3, protocol_name="MQIsdp", will=Will("w", b"x")),
    Connect("v5", protocol_level=5),
    Connect("v5-pw-only", protocol_level=5, password=b"secret"),
    Connect(
        "v5-full",
        protocol_level=5,
        clean_start=False,
        username="user",
        password=b"pw",
        will=Will(
            "will/topic",
            b"\x00\x01",
            qos=1,
            retain=True,
            properties={
                Prop.WILL_DELAY_INTERVAL: 30,
                Prop.PAYLOAD_FORMAT_INDICATOR: 1,
                Prop.MESSAGE_EXPIRY_INTERVAL: 3600,
                Prop.CONTENT_TYPE: "text/plain",
                Prop.RESPONSE_TOPIC: "reply/here",
                Prop.CORRELATION_DATA: b"corr",
                Prop.USER_PROPERTY: USER,
            },
        ),
        properties={
            Prop.SESSION_EXPIRY_INTERVAL: 0xFFFFFFFF,
            Prop.RECEIVE_MAXIMUM: 100,
            Prop.MAXIMUM_PACKET_SIZE: 1 << 20,
            Prop.TOPIC_ALIAS_MAXIMUM: 10,
            Prop.REQUEST_RESPONSE_INFORMATION: 1,
            Prop.REQUEST_PROBLEM_INFORMATION: 0,
            Prop.AUTHENTICATION_METHOD: "SCRAM-SHA-1",
            Prop.AUTHENTICATION_DATA: b"\x01\x02",
            Prop.USER_PROPERTY: USER,
        },
    ),
]


@pytest.mark.parametrize("packet", CONNECTS, ids=lambda c: f"{c.client_id or 'empty'}-L{c.protocol_level}")
def test_connect_round_trip(packet: Connect) -> None:
    decoder = Decoder()
    assert decoder.protocol_level is None
    assert decoder.feed(encode(packet)) == [packet]
    assert decoder.protocol_level == packet.protocol_level


def test_connect_known_bytes() -> None:
    # A 3.1.1 CONNECT as paho sends it: clean session, keepalive 60, client id "abc".
    raw = b"\x10\x0f\x00\x04MQTT\x04\x02\x00\x3c\x00\x03abc"
    assert encode(Connect("abc")) == raw
    assert Decoder().feed(raw) == [Connect("abc")]


PUBLISH_PROPS = {
    Prop.PAYLOAD_FORMAT_INDICATOR: 1,
    Prop.MESSAGE_EXPIRY_INTERVAL: 60,
    Prop.CONTENT_TYPE: "application/json",
    Prop.RESPONSE_TOPIC: "resp/1",
    Prop.CORRELATION_DATA: b"\xff\x00",
    Prop.SUBSCRIPTION_IDENTIFIER: [1, 268_435_455],
    Prop.TOPIC_ALIAS: 7,
    Prop.USER_PROPERTY: USER,
}

ACK_PROPS = {Prop.REASON_STRING: "why", Prop.USER_PROPERTY: USER}

BOTH_LEVELS = [
    Connack(),
    Connack(session_present=True),
    Connack(reason_code=5),
    Publish("a/b"),
    Publish("a/b", b"payload", qos=1, packet_id=1),
    Publish("a/b", b"x" * 300, qos=2, retain=True, dup=True, packet_id=65535),
    Publish("/", b"", retain=True),
    Publish("ü/€/𝄞", b"\x00" * 20000, qos=1, packet_id=9),
    Puback(1),
    Pubrec(2),
    Pubrel(3),
    Pubcomp(65535),
    Subscribe(1, [Subscription("a/+/c", 0)]),
    Subscribe(2, [Subscription("#", 1), Subscription("a/b", 2), Subscription("$share/g/x", 0)]),
    Suback(1, [0, 1, 2, 0x80]),
    Unsubscribe(5, ["a/b", "c/#"]),
    Unsuback(5),
    Pingreq(),
    Pingresp(),
    Disconnect(),
]

# Values only a server may send (MQTT-3.3.4-6; Table 3-10's "Sent by"): a decoder that has read a
# CONNECT reads a client and refuses them.
SERVER_PUBLISH = Publish("t", b"p", qos=1, packet_id=3, properties=PUBLISH_PROPS)
SERVER_DISCONNECT = Disconnect(Reason.SERVER_SHUTTING_DOWN, {
    Prop.REASON_STRING: "bye", Prop.SERVER_REFERENCE: "b:1883", Prop.SESSION_EXPIRY_INTERVAL: 0,
    Prop.USER_PROPERTY: USER,
})
SERVER_ONLY = [SERVER_PUBLISH, SERVER_DISCONNECT]

V5_ONLY = [
    Connack(True, 0, {
        Prop.SESSION_EXPIRY_INTERVAL: 10,
        Prop.ASSIGNED_CLIENT_IDENTIFIER: "auto-1",
        Prop.SERVER_KEEP_ALIVE: 30,
        Prop.RECEIVE_MAXIMUM: 20,
        Prop.TOPIC_ALIAS_MAXIMUM: 5,
        Prop.MAXIMUM_QOS: 1,
        Prop.RETAIN_AVAILABLE: 0,
        Prop.MAXIMUM_PACKET_SIZE: 65536,
        Prop.WILDCARD_SUBSCRIPTION_AVAILABLE: 1,
        Prop.SUBSCRIPTION_IDENTIFIER_AVAILABLE: 1,
        Prop.SHARED_SUBSCRIPTION_AVAILABLE: 0,
        Prop.RESPONSE_INFORMATION: "resp",
        Prop.SERVER_REFERENCE: "other:1883",
        Prop.AUTHENTICATION_METHOD: "m",
        Prop.AUTHENTICATION_DATA: b"d",
        Prop.REASON_STRING: "ok",
        Prop.USER_PROPERTY: USER,
    }),
    Connack(reason_code=Reason.NOT_AUTHORIZED),
    SERVER_PUBLISH,
    Publish("", b"aliased", properties={Prop.TOPIC_ALIAS: 3}),
    Puback(1, Reason.NO_MATCHING_SUBSCRIBERS),
    Puback(1, Reason.UNSPECIFIED_ERROR, ACK_PROPS),
    Puback(1, 0, ACK_PROPS),
    Pubrec(2, Reason.QUOTA_EXCEEDED, ACK_PROPS),
    Pubrel(3, Reason.PACKET_IDENTIFIER_NOT_FOUND),
    Pubcomp(4, 0, ACK_PROPS),
    Subscribe(7, [
        Subscription("a", 1, no_local=True),
        Subscription("b", 2, retain_as_published=True, retain_handling=2),
        Subscription("c", 0, True, True, 1),
    ], {Prop.SUBSCRIPTION_IDENTIFIER: [42], Prop.USER_PROPERTY: USER}),
    Suback(7, [Reason.GRANTED_QOS_1, Reason.TOPIC_FILTER_INVALID], ACK_PROPS),
    Unsubscribe(8, ["x"], {Prop.USER_PROPERTY: USER}),
    Unsuback(8, [0, Reason.NO_SUBSCRIPTION_EXISTED], ACK_PROPS),
    Unsuback(9, [0]),
    Disconnect(Reason.DISCONNECT_WITH_WILL),
    SERVER_DISCONNECT,
    Auth(),
    Auth(Reason.CONTINUE_AUTHENTICATION, {
        Prop.AUTHENTICATION_METHOD: "SCRAM", Prop.AUTHENTICATION_DATA: b"\x00" * 10, Prop.REASON_STRING: "r",
    }),
]


@pytest.mark.parametrize("level", [4, 5])
@pytest.mark.parametrize("packet", BOTH_LEVELS, ids=repr)
def test_round_trip(packet: object, level: int) -> None:
    assert Decoder(protocol_level=level).feed(encode(packet, level)) == [packet]  # type: ignore[arg-type]


@pytest.mark.parametrize("packet", V5_ONLY, ids=repr)
def test_round_trip_v5(packet: object) -> None:
    assert Decoder(protocol_level=5).feed(encode(packet, 5)) == [packet]  # type: ignore[arg-type]


def test_v3_drops_v5_only_fields() -> None:
    """Unsuback reason codes and properties exist only on the MQTT 5 wire."""
    assert encode(Unsuback(3, [0, 17]), 4) == b"\xb0\x02\x00\x03"
    assert Decoder(protocol_level=4).feed(encode(Unsuback(3, [0, 17]), 4)) == [Unsuback(3)]
    assert encode(Puback(1, 0x10, ACK_PROPS), 4) == b"\x40\x02\x00\x01"
    assert encode(Disconnect(0x04), 4) == b"\xe0\x00"


def test_v5_short_forms() -> None:
    """MQTT 5 omits a success reason code and empty properties (3.4.2.1, 3.14.2.1, 3.15.2.1)."""
    assert encode(Puback(1), 5) == b"\x40\x02\x00\x01"
    assert encode(Puback(1, 0x10), 5) == b"\x40\x03\x00\x01\x10"
    assert encode(Disconnect(), 5) == b"\xe0\x00"
    assert encode(Disconnect(0x04), 5) == b"\xe0\x01\x04"
    assert encode(Auth(), 5) == b"\xf0\x00"
    # ... and the decoder takes the explicit forms of the same values.
    decoder = Decoder(protocol_level=5)
    assert decoder.feed(b"\x40\x04\x00\x01\x00\x00" + b"\xe0\x02\x00\x00" + b"\xf0\x01\x18") == [
        Puback(1), Disconnect(), Auth(0x18),
    ]


def test_property_keys_decode_as_ints() -> None:
    [pkt] = Decoder(protocol_level=5).feed(encode(Publish("t", properties={Prop.TOPIC_ALIAS: 1}), 5))
    assert isinstance(pkt, Publish)
    assert pkt.properties == {0x23: 1}
    assert pkt.properties[Prop.TOPIC_ALIAS] == 1


def test_single_subscription_identifier_may_be_an_int_when_encoding() -> None:
    raw = encode(Subscribe(1, [Subscription("a")], {Prop.SUBSCRIPTION_IDENTIFIER: 300}), 5)
    [pkt] = Decoder(protocol_level=5).feed(raw)
    assert isinstance(pkt, Subscribe)
    assert pkt.properties == {Prop.SUBSCRIPTION_IDENTIFIER: [300]}


def test_encode_rejects_what_the_wire_cannot_carry() -> None:
    with pytest.raises(ValueError):
        encode(Publish("t", qos=1))  # no packet id
    with pytest.raises(ValueError):
        encode(Auth(), 4)
    with pytest.raises(ValueError):
        encode(Publish("t" * 70000))
    with pytest.raises(ValueError):
        encode(Publish("t", properties={0x7F: 1}), 5)


# --------------------------------------------------------------------------------------------------
# Streams
# --------------------------------------------------------------------------------------------------


def _stream(level: int) -> tuple[bytes, list[object]]:
    """A CONNECT, then packets of every type (the direction of each type is the router's to check),
    but none of the values that only a server sends."""
    connect = Connect("stream", protocol_level=level, will=Will("w", b"x" * 200))
    packets: list[object] = [connect]
    packets += BOTH_LEVELS
    if level == 5:
        packets += [p for p in V5_ONLY if p not in SERVER_ONLY]
    packets.append(Publish("big", bytes(range(256)) * 700, qos=1, packet_id=77))  # 3-byte length
    data = b"".join(encode(p, level) for p in packets)  # type: ignore[arg-type]
    return data, packets


@pytest.mark.parametrize("level", [4, 5])
def test_many_packets_in_one_feed(level: int) -> None:
    data, packets = _stream(level)
    decoder = Decoder()
    assert decoder.feed(data) == packets
    assert decoder.buffered == 0
    assert decoder.protocol_level == level


@pytest.mark.parametrize("level", [4, 5])
def test_byte_at_a_time(level: int) -> None:
    data, packets = _stream(level)
    decoder = Decoder()
    got = []
    for i in range(len(data)):
        got += decoder.feed(data[i : i + 1])
    assert got == packets
    assert decoder.buffered == 0


@pytest.mark.parametrize("level", [4, 5])
def test_every_split_point(level: int) -> None:
    """Two reads split anywhere (header, body, between packets) give the same packets."""
    packets = [Connect("s", protocol_level=level), Publish("a/b", b"x" * 130, 1, packet_id=1),
               Puback(1), Publish("c", b"", 0), Pingreq(), Subscribe(3, [Subscription("a/#", 1)])]
    data = b"".join(encode(p, level) for p in packets)  # type: ignore[arg-type]
    for cut in range(len(data) + 1):
        decoder = Decoder()
        first = decoder.feed(data[:cut])
        assert decoder.buffered == cut - sum(len(encode(p, level)) for p in first)  # type: ignore[arg-type]
        assert first + decoder.feed(data[cut:]) == packets, cut


def test_large_packet_in_chunks_is_buffered_until_complete() -> None:
    pkt = Publish("big/one", b"z" * 1_000_000, qos=2, packet_id=5)
    raw = encode(pkt)
    decoder = Decoder(protocol_level=4)
    got = []
    for i in range(0, len(raw), 4096):
        got += decoder.feed(raw[i : i + 4096])
        if i + 4096 < len(raw):
            assert decoder.buffered == i + 4096
    assert got == [pkt]
    assert decoder.buffered == 0


def test_memoryview_and_bytearray_input() -> None:
    raw = encode(Publish("t", b"p"))
    assert Decoder().feed(bytearray(raw)) == [Publish("t", b"p")]
    assert Decoder().feed(memoryview(raw)) == [Publish("t", b"p")]
    [pkt] = Decoder().feed(bytearray(raw))
    assert type(pkt.payload) is bytes  # type: ignore[union-attr]


def test_connect_switches_level_within_one_feed() -> None:
    """A v5 client pipelines CONNECT and SUBSCRIBE; the SUBSCRIBE must be read in the v5 form."""
    sub = Subscribe(1, [Subscription("a", 1, no_local=True)], {Prop.SUBSCRIPTION_IDENTIFIER: [3]})
    data = encode(Connect("x", protocol_level=5)) + encode(sub, 5) + encode(Publish("a", b"1"), 5)
    assert Decoder().feed(data) == [Connect("x", protocol_level=5), sub, Publish("a", b"1")]


def test_error_carries_packets_decoded_before_it() -> None:
    data = encode(Publish("a", b"1")) + encode(Pingreq()) + b"\x00\x00"
    with pytest.raises(ProtocolError) as info:
        Decoder(protocol_level=4).feed(data)
    assert info.value.packets == [Publish("a", b"1"), Pingreq()]  # type: ignore[attr-defined]


# --------------------------------------------------------------------------------------------------
# Rules
# --------------------------------------------------------------------------------------------------

MALFORMED = Reason.MALFORMED_PACKET
PROTOCOL = Reason.PROTOCOL_ERROR


def _raw(b0: int, body: bytes) -> bytes:
    assert len(body) < 128
    return bytes((b0, len(body))) + body


def _s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return len(raw).to_bytes(2, "big") + raw


def _connect_body(name: bytes = b"MQTT", level: int = 4, flags: int = 0x02, rest: bytes = b"") -> bytes:
    return _s(name) + bytes((level, flags)) + b"\x00\x3c" + rest


# (level, bytes, reason, words the rule must contain)
V4_ERRORS = [
    # fixed header
    (4, b"\x00\x00", MALFORMED, "type 0"),
    (4, b"\xf0\x00", MALFORMED, "type 15"),
    (4, _raw(0x80, b"\x00\x01\x00\x01a\x00"), MALFORMED, "MQTT-2.2.2-1"),  # SUBSCRIBE flags 0000
    (4, _raw(0x60, b"\x00\x01"), MALFORMED, "MQTT-2.2.2-1"),  # PUBREL flags 0000
    (4, _raw(0xA0, b"\x00\x01\x00\x01a"), MALFORMED, "MQTT-2.2.2-1"),  # UNSUBSCRIBE flags 0000
    (4, _raw(0x41, b"\x00\x01"), MALFORMED, "MQTT-2.2.2-1"),  # PUBACK flags 0001
    (4, _raw(0xC1, b""), MALFORMED, "MQTT-2.2.2-1"),
    (4, b"\x30\xff\xff\xff\xff\x01", MALFORMED, "longer than 4 bytes"),
    # PUBLISH
    (4, _raw(0x36, _s("a") + b"\x00\x01"), MALFORMED, "MQTT-3.3.1-4"),  # qos 3
    (4, _raw(0x38, _s("a")), MALFORMED, "MQTT-3.3.1-2"),  # dup with qos 0
    (4, _raw(0x30, _s("a/+")), Reason.TOPIC_NAME_INVALID, "wildcard"),
    (4, _raw(0x30, _s("a/#")), Reason.TOPIC_NAME_INVALID, "wildcard"),
    (4, _raw(0x30, _s("")), Reason.TOPIC_NAME_INVALID, "empty"),
    (4, _raw(0x32, _s("a") + b"\x00\x00"), PROTOCOL, "non-zero packet identifier"),
    (4, _raw(0x32, _s("a") + b"\x00"), MALFORMED, "packet identifier"),
    (4, _raw(0x30, b"\x00\x05ab"), MALFORMED, "topic"),
    (4, _raw(0x30, b"\x00"), MALFORMED, "topic length"),
    (4, _raw(0x30, _s(b"a\xff")), MALFORMED, "MQTT-1.5.3-1"),
    (4, _raw(0x30, _s(b"\xed\xa0\x80")), MALFORMED, "MQTT-1.5.3-1"),  # encoded surrogate U+D800
    (4, _raw(0x30, _s(b"\xc0\xaf")), MALFORMED, "MQTT-1.5.3-1"),  # overlong '/'
    (4, _raw(0x30, _s(b"a\x00b")), MALFORMED, "MQTT-1.5.3-2"),
    # acks
    (4, _raw(0x40, b"\x00\x00"), PROTOCOL, "non-zero"),
    (4, _raw(0x50, b"\x00\x01\x00"), MALFORMED, "unexpected bytes"),
    (4, _raw(0x40, b"\x00\x01\x00"), MALFORMED, "unexpected bytes"),
    (4, _raw(0x40, b"\x00"), MALFORMED, "packet identifier"),
    (4, _raw(0x50, b"\x00\x00"), PROTOCOL, "non-zero"),
    (4, _raw(0x70, b"\x00\x00"), PROTOCOL, "non-zero"),
    (4, _raw(0x20, b"\x00"), MALFORMED, "CONNACK"),
    (4, _raw(0xB0, b"\x00\x01\x00"), MALFORMED, "unexpected bytes"),
    (4, _raw(0x20, b"\x02\x00"), MALFORMED, "MQTT-3.2.2-1"),
    (4, _raw(0x20, b"\x00\x00\x00"), MALFORMED, "unexpected bytes"),
    # PINGREQ / PINGRESP / DISCONNECT have no body before v5
    (4, _raw(0xC0, b"\x00"), MALFORMED, "PINGREQ"),
    (4, _raw(0xD0, b"\x00"), MALFORMED, "PINGRESP"),
    (4, _raw(0xE0, b"\x00"), MALFORMED, "DISCONNECT"),
    # SUBSCRIBE / UNSUBSCRIBE
    (4, _raw(0x82, b"\x00\x01"), PROTOCOL, "MQTT-3.8.3-3"),
    (4, _raw(0x82, b"\x00\x00" + _s("a") + b"\x00"), PROTOCOL, "non-zero"),
    (4, _raw(0x82, b"\x00\x01" + _s("a") + b"\x03"), MALFORMED, "MQTT-3.8.3-4"),
    (4, _raw(0x82, b"\x00\x01" + _s("a") + b"\x04"), MALFORMED, "reserved"),  # no_local bit in v3
    (4, _raw(0x82, b"\x00\x01" + _s("a")), MALFORMED, "subscription options"),
    (4, _raw(0x82, b"\x00\x01" + _s(b"a\x00") + b"\x00"), MALFORMED, "MQTT-1.5.3-2"),
    (4, _raw(0xA2, b"\x00\x01"), PROTOCOL, "MQTT-3.10.3-2"),
    (4, _raw(0xA2, b"\x00\x00" + _s("a")), PROTOCOL, "non-zero"),
    (4, _raw(0xA2, b"\x00\x01" + _s("a") + b"\x00"), MALFORMED, "string length"),
    # CONNECT
    (None, _raw(0x10, _connect_body(b"MQTT", 3)), Reason.UNSUPPORTED_PROTOCOL_VERSION, "MQTT-3.1.2-2"),
    (None, _raw(0x10, _connect_body(b"MQTT", 6)), Reason.UNSUPPORTED_PROTOCOL_VERSION, "MQTT-3.1.2-2"),
    (None, _raw(0x10, _connect_body(b"MQIsdp", 4)), Reason.UNSUPPORTED_PROTOCOL_VERSION, "MQTT-3.1.2-2"),
    (None, _raw(0x10, _connect_body(b"HTTP", 4)), Reason.UNSUPPORTED_PROTOCOL_VERSION, "MQTT-3.1.2-2"),
    (None, _raw(0x10, _connect_body(flags=0x03, rest=_s("c"))), MALFORMED, "MQTT-3.1.2-3"),
    (None, _raw(0x10, _connect_body(flags=0x0A, rest=_s("c"))), MALFORMED, "Will QoS"),  # qos 1, no will
    (None, _raw(0x10, _connect_body(flags=0x22, rest=_s("c"))), MALFORMED, "Will Retain"),
    (None, _raw(0x10, _connect_body(flags=0x1E, rest=_s("c") + _s("w") + _s("p"))), MALFORMED, "MQTT-3.1.2-14"),
    (None, _raw(0x10, _connect_body(flags=0x42, rest=_s("c") + _s("p"))), MALFORMED, "MQTT-3.1.2-22"),
    (None, _raw(0x10, _connect_body(flags=0x06, rest=_s("c") + _s("w/+") + _s("p"))),
     Reason.TOPIC_NAME_INVALID, "Will Topic"),
    (None, _raw(0x10, _connect_body(flags=0x06, rest=_s("c") + _s("") + _s("p"))),
     Reason.TOPIC_NAME_INVALID, "Will Topic"),
    (None, _raw(0x10, _connect_body(rest=_s("c") + b"x")), MALFORMED, "unexpected bytes"),
    (None, _raw(0x10, _connect_body(flags=0x82, rest=_s("c"))), MALFORMED, "string length"),
    (None, _raw(0x10, _connect_body(rest=_s(b"\xff"))), MALFORMED, "MQTT-1.5.3-1"),
    (None, _raw(0x10, _connect_body(flags=0xC2, rest=_s("c") + _s("u") + b"\x00")), MALFORMED, "binary data length"),
    (None, _raw(0x10, _connect_body(flags=0xC2, rest=_s("c") + _s("u") + b"\x00\x05ab")), MALFORMED, "binary data"),
    (None, _raw(0x10, _s("MQTT")), MALFORMED, "protocol level"),
    (None, _raw(0x10, _s("MQTT") + b"\x04\x02"), MALFORMED, "keepalive"),
]

V5_PROPS_ERRORS = [
    # PUBLISH properties (body after topic "a" and QoS 0)
    (b"\x02\x23\x00", MALFORMED, "runs past"),
    (b"\x05\x7f\x00\x00\x00\x00", MALFORMED, "unknown property"),
    (b"\x02\x02\x00\x00\x00\x00", MALFORMED, "runs past"),
    (b"\x05\x11\x00\x00\x00\x00", MALFORMED, "not valid in this packet type"),  # session expiry
    (b"\x04\x01\x00\x01\x01", PROTOCOL, "more than once"),
    (b"\x06\x23\x00\x01\x23\x00\x02", PROTOCOL, "more than once"),
    (b"\x03\x23\x00\x00", Reason.TOPIC_ALIAS_INVALID, "MQTT-3.3.2-8"),
    (b"\x02\x0b\x00", PROTOCOL, "Subscription Identifier"),
    (b"\x05\x0b\xff\xff\xff\xff", MALFORMED, "longer than 4 bytes"),
    (b"\x04\x03\x00\x01\xff", MALFORMED, "MQTT-1.5.3-1"),
    (b"\x04\x03\x00\x05a", MALFORMED, "runs past"),
    (b"\x08\x26\x00\x01k\x00\x02v\x00", MALFORMED, "MQTT-1.5.3-2"),
    (b"\xff\xff\xff\xff\x01", MALFORMED, "longer than 4 bytes"),
    (b"\x80\x01", MALFORMED, "property block"),
    (b"", MALFORMED, "property length"),
    (b"\x01\x01", MALFORMED, "property runs past"),
    (b"\x02\x0b\x80", MALFORMED, "variable byte integer runs past"),
    (b"\x03\x09\x00\x05", MALFORMED, "binary data runs past"),
]

V5_ERRORS = [
    (5, _raw(0x30, _s("") + b"\x00"), PROTOCOL, "Topic Alias"),
    (5, _raw(0x82, b"\x00\x01\x00" + _s("a") + b"\x40"), MALFORMED, "MQTT-3.8.3-5"),
    (5, _raw(0x82, b"\x00\x01\x00" + _s("a") + b"\x30"), PROTOCOL, "Retain Handling"),
    (5, _raw(0x82, b"\x00\x01\x00" + _s("a") + b"\x03"), PROTOCOL, "Maximum QoS"),  # 3.8.3.1
    (5, _raw(0x82, b"\x00\x01\x00"), PROTOCOL, "MQTT-3.8.3-3"),
    (5, _raw(0x82, b"\x00\x01\x02\x0b\x00" + _s("a") + b"\x00"), PROTOCOL, "Subscription Identifier"),
    (5, _raw(0xA2, b"\x00\x01\x00"), PROTOCOL, "MQTT-3.10.3-2"),
    (5, _raw(0xA2, b"\x00\x01\x02\x0b\x01" + _s("a")), MALFORMED, "not valid"),
    (5, _raw(0x40, b"\x00\x01\x00\x00\x00"), MALFORMED, "unexpected bytes"),
    (5, _raw(0x40, b"\x00\x01\x00\x02\x11\x00"), MALFORMED, "not valid"),
    (5, _raw(0x20, b"\x00\x00"), MALFORMED, "property length"),
    (5, _raw(0x20, b"\x00\x00\x02\x24\x02"), PROTOCOL, "0 or 1"),
    (5, _raw(0x20, b"\x00\x00\x03\x21\x00\x00"), PROTOCOL, "must not be 0"),
    (5, _raw(0xE0, b"\x00\x00\x00"), MALFORMED, "unexpected bytes"),
    (5, _raw(0xE0, b"\x00\x02\x23\x00"), MALFORMED, "not valid"),
    (5, _raw(0xF1, b""), MALFORMED, "MQTT-2.2.2-1"),
    (5, _raw(0xF0, b"\x18\x02\x23\x00"), MALFORMED, "not valid"),
    (None, _raw(0x10, _connect_body(level=5, flags=0x02, rest=b"\x02\x27\x00")), MALFORMED, "runs past"),
    (None, _raw(0x10, _connect_body(level=5, flags=0x02, rest=b"\x05\x27\x00\x00\x00\x00" + _s("c"))),
     PROTOCOL, "must not be 0"),
    (None, _raw(0x10, _connect_body(level=5, flags=0x02, rest=b"\x02\x17\x02" + _s("c"))), PROTOCOL, "0 or 1"),
    (None, _raw(0x10, _connect_body(level=5, flags=0x02, rest=b"\x02\x23\x01" + _s("c"))), MALFORMED, "not valid"),
    (None, _raw(0x10, _connect_body(level=5, flags=0x06, rest=b"\x00" + _s("c") + b"\x02\x11\x00" + _s("w") + _s("p"))),
     MALFORMED, "not valid"),  # session expiry is not a will property
]


def _check_error(level: int | None, data: bytes, reason: int, words: str) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        Decoder(protocol_level=level).feed(data)
    assert info.value.reason == reason, info.value.rule
    assert words.lower() in info.value.rule.lower(), info.value.rule
    return info.value


@pytest.mark.parametrize(("level", "data", "reason", "words"), V4_ERRORS, ids=lambda v: repr(v)[:40])
def test_v4_rule(level: int | None, data: bytes, reason: int, words: str) -> None:
    _check_error(level, data, reason, words)


@pytest.mark.parametrize(("level", "data", "reason", "words"), V5_ERRORS, ids=lambda v: repr(v)[:40])
def test_v5_rule(level: int | None, data: bytes, reason: int, words: str) -> None:
    _check_error(level, data, reason, words)


@pytest.mark.parametrize(("props", "reason", "words"), V5_PROPS_ERRORS, ids=lambda v: repr(v)[:40])
def test_v5_property_rule(props: bytes, reason: int, words: str) -> None:
    _check_error(5, _raw(0x30, _s("a") + props), reason, words)


@pytest.mark.parametrize("level", [3, 4])
def test_auth_is_reserved_before_v5(level: int) -> None:
    _check_error(level, b"\xf0\x00", MALFORMED, "type 15")


def test_mqtt31_packets_sent_again_may_carry_dup_and_311_ones_may_not() -> None:
    """3.1 sets DUP on a PUBREL, SUBSCRIBE or UNSUBSCRIBE it sends again; 3.1.1 reserved those flags."""
    again = b"\x6a\x02\x00\x07" + b"\x8a\x06\x00\x08\x00\x01t\x01" + b"\xaa\x05\x00\x09\x00\x01t"
    assert Decoder(protocol_level=3).feed(again) == [Pubrel(7), Subscribe(8, [Subscription("t", 1)]),
                                                     Unsubscribe(9, ["t"])]
    for first in (b"\x6a\x02\x00\x07", b"\x8a\x06\x00\x08\x00\x01t\x01"):
        with pytest.raises(ProtocolError, match="reserved flags"):
            Decoder(protocol_level=4).feed(first)


def test_errors_are_raised_byte_at_a_time_too() -> None:
    """The rules hold however the bytes arrive."""
    for level, data, reason, _words in V4_ERRORS + V5_ERRORS:
        decoder = Decoder(protocol_level=level)
        with pytest.raises(ProtocolError) as info:
            for i in range(len(data)):
                decoder.feed(data[i : i + 1])
        assert info.value.reason == reason, (data, info.value.rule)


def test_bad_first_byte_is_rejected_before_the_body_arrives() -> None:
    with pytest.raises(ProtocolError):
        Decoder().feed(b"\x00")
    with pytest.raises(ProtocolError):
        Decoder().feed(b"GET / HTTP/1.1\r\n")  # 0x47: PUBACK with flags 0111


def test_password_without_username_is_fine_in_v5() -> None:
    pkt = Connect("c", protocol_level=5, password=b"pw")
    assert Decoder().feed(encode(pkt)) == [pkt]


def test_unsupported_protocol_leaves_level_unset() -> None:
    decoder = Decoder()
    with pytest.raises(ProtocolError) as info:
        decoder.feed(_raw(0x10, _connect_body(b"MQTT", 7)))
    assert info.value.reason == Reason.UNSUPPORTED_PROTOCOL_VERSION
    assert decoder.protocol_level is None


def test_level_is_known_after_a_malformed_connect() -> None:
    """So the protocol layer can answer a v5 client in the v5 form."""
    decoder = Decoder()
    with pytest.raises(ProtocolError):
        decoder.feed(_raw(0x10, _connect_body(level=5, flags=0x03, rest=b"\x00" + _s("c"))))
    assert decoder.protocol_level == 5


def test_second_connect_is_a_protocol_error() -> None:
    raw = encode(Connect("a"))
    with pytest.raises(ProtocolError) as info:
        Decoder().feed(raw + encode(Connect("b", protocol_level=5)))
    assert info.value.reason == PROTOCOL
    assert "MQTT-3.1.0-2" in info.value.rule
    assert info.value.packets == [Connect("a")]  # type: ignore[attr-defined]


def test_subscribe_filters_are_not_validated_by_the_decoder() -> None:
    """Filter syntax is the router's business: it answers 0x80/0x8F per filter. (An empty filter
    is not syntax but a malformed packet, MQTT-4.7.3-1: see test_codec_mqtt5.)"""
    sub = Subscribe(1, [Subscription("a/#/b"), Subscription("a+")])
    assert Decoder(protocol_level=4).feed(encode(sub)) == [sub]


# --------------------------------------------------------------------------------------------------
# Maximum packet size
# --------------------------------------------------------------------------------------------------


def test_packet_too_large_is_refused_from_the_fixed_header() -> None:
    decoder = Decoder(max_packet_size=1000)
    raw = encode(Publish("t", b"x" * 2000))
    with pytest.raises(ProtocolError) as info:
        decoder.feed(raw[:4])  # fixed header only: the body is never buffered
    assert info.value.reason == Reason.PACKET_TOO_LARGE


def test_max_packet_size_counts_the_whole_packet() -> None:
    raw = encode(Publish("t", b"x" * 100))
    assert len(Decoder(max_packet_size=len(raw)).feed(raw)) == 1
    with pytest.raises(ProtocolError) as info:
        Decoder(max_packet_size=len(raw) - 1).feed(raw)
    assert info.value.reason == Reason.PACKET_TOO_LARGE


def test_largest_remaining_length_header_is_accepted() -> None:
    decoder = Decoder(max_packet_size=268_435_455 + 5, protocol_level=4)
    assert decoder.feed(b"\x30\xff\xff\xff\x7f\x00\x01a") == []
    assert decoder.buffered == 8


# --------------------------------------------------------------------------------------------------
# publish_parts / with_dup
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("level", [4, 5])
@pytest.mark.parametrize("qos", [0, 1, 2])
@pytest.mark.parametrize("retain", [False, True])
def test_publish_parts(level: int, qos: int, retain: bool) -> None:
    props = {Prop.CONTENT_TYPE: "c", Prop.USER_PROPERTY: [("a", "b")]} if level == 5 else {}
    payload = b"p" * 200
    head, tail = publish_parts(b"x/y", payload, qos, retain, level, props)
    pid = 513
    raw = head + pid.to_bytes(2, "big") + tail if qos else head + tail
    expected = Publish("x/y", payload, qos, retain, False, pid if qos else None, props)
    assert raw == encode(expected, level)
    assert Decoder(protocol_level=level).feed(raw) == [expected]
    if level == 4:
        assert tail is payload  # shared, not copied
    if qos:
        dup = with_dup(head) + pid.to_bytes(2, "big") + tail
        expected.dup = True
        assert Decoder(protocol_level=level).feed(dup) == [expected]
        assert with_dup(with_dup(head)) == with_dup(head)


def test_publish_parts_defaults_and_long_remaining_length() -> None:
    head, tail = publish_parts(b"t", b"z" * 20000, 1, False)
    assert head[1:4] == bytes((0xA5, 0x9C, 0x01))  # 20000 + 2 + 1 + 2 = 20005 as varint
    assert Decoder(protocol_level=4).feed(head + b"\x00\x07" + tail) == [Publish("t", b"z" * 20000, 1, packet_id=7)]
    head5, tail5 = publish_parts(b"t", b"", 0, False, 5)
    assert head5 + tail5 == b"\x30\x04\x00\x01t\x00"


# --------------------------------------------------------------------------------------------------
# TLS on a plain listener
# --------------------------------------------------------------------------------------------------


def _real_client_hello() -> bytes:
    context = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="broker.test")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def test_is_tls_client_hello() -> None:
    hello = _real_client_hello()
    assert is_tls_client_hello(hello)
    assert is_tls_client_hello(hello[:6])
    assert is_tls_client_hello(hello[:3])
    # TLS 1.0 ClientHello record prefix, as old clients send it.
    assert is_tls_client_hello(bytes.fromhex("160301020001"))
    assert not is_tls_client_hello(encode(Connect("c")))
    assert not is_tls_client_hello(encode(Connect("c", protocol_level=5)))
    assert not is_tls_client_hello(b"")
    assert not is_tls_client_hello(b"\x16\x02")
    assert not is_tls_client_hello(b"\x16\x03\x07")
    assert not is_tls_client_hello(bytes.fromhex("160301020002"))  # a ServerHello
    with pytest.raises(ProtocolError):
        Decoder().feed(hello)  # and the decoder refuses it by itself


def test_repeated_topics_share_one_str_and_bad_ones_stay_bad() -> None:
    """Decoded topic names are cached (one ``str`` per topic); a rejected name is never cached."""
    a, b = Decoder(protocol_level=4).feed(encode(Publish("same/topic", b"1")) * 2)
    assert a.topic is b.topic  # type: ignore[union-attr]
    for _ in range(2):
        _check_error(4, _raw(0x30, _s("bad/+")), Reason.TOPIC_NAME_INVALID, "wildcard")
        _check_error(4, _raw(0x30, _s(b"bad\xff")), MALFORMED, "UTF-8")
    long_topic = "x" * 1000
    [p] = Decoder(protocol_level=4).feed(encode(Publish(long_topic)))
    assert p.topic == long_topic  # type: ignore[union-attr]


def test_a_limit_decodes_a_read_in_turns_without_losing_or_reordering():
    packets = [Publish(f"t/{i}", b"p" * i, 0) for i in range(10)]
    data = b"".join(encode(p, 4) for p in packets)
    d = Decoder(protocol_level=4, limit=3)
    got = d.feed(data[:-2])  # the last packet arrives incomplete
    assert [p.topic for p in got] == ["t/0", "t/1", "t/2"] and d.has_more
    while d.has_more:
        got += d.more()
    assert [p.topic for p in got] == [f"t/{i}" for i in range(9)]
    assert d.buffered > 0  # the incomplete one waits for the rest of its bytes
    got += d.feed(data[-2:])
    assert got == packets


def test_feeding_before_more_keeps_the_order():
    packets = [Publish(f"o/{i}", b"x", 0) for i in range(6)]
    data = b"".join(encode(p, 4) for p in packets)
    d = Decoder(protocol_level=4, limit=2)
    got = d.feed(data[: len(data) // 2])
    got += d.feed(data[len(data) // 2 :])  # a caller that did not drain with more() first
    while d.has_more:
        got += d.more()
    assert got == packets


def test_a_violation_beyond_the_limit_surfaces_in_more_with_the_packets_before_it():
    good = b"".join(encode(Publish(f"v/{i}", b"", 0), 4) for i in range(3))
    d = Decoder(protocol_level=4, limit=2)
    assert len(d.feed(good + b"\xf0\x00")) == 2  # 0xF0: AUTH, not a 3.1.1 packet
    with pytest.raises(ProtocolError) as err:
        d.more()
    assert [p.topic for p in err.value.packets] == ["v/2"]
