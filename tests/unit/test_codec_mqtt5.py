"""The decoder against the MQTT 5.0 standard's rules for well-formed packets that a server checks
on what it receives (issue #16): raw bytes in, ProtocolError with the standard's reason code out,
and the valid neighbours of each case still decoded.

A decoder that has decoded a CONNECT reads a client, so most cases here go through ``_client``: a
decoder fed an MQTT 5 CONNECT first. Statement ids (MQTT-x.y.z-n) are the 5.0 standard's.
"""

from __future__ import annotations

import pytest

from brokerd.connection.codec import Decoder, encode
from brokerd.connection.packets import (
    Auth,
    Connect,
    Disconnect,
    Prop,
    Puback,
    Publish,
    Pubrel,
    Subscribe,
    Subscription,
    Unsubscribe,
    Will,
)
from brokerd.connection.reasons import ProtocolError, Reason

MALFORMED = Reason.MALFORMED_PACKET
PROTOCOL = Reason.PROTOCOL_ERROR
CONNECT = encode(Connect("c", protocol_level=5))


def _raw(b0: int, body: bytes) -> bytes:
    assert len(body) < 128
    return bytes((b0, len(body))) + body


def _s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return len(raw).to_bytes(2, "big") + raw


def _props(*pairs: bytes) -> bytes:
    """A property block of already encoded identifier/value pairs (length < 128)."""
    body = b"".join(pairs)
    assert len(body) < 128
    return bytes((len(body),)) + body


def _publish(props: bytes, payload: bytes = b"p", b0: int = 0x30, topic: str = "a") -> bytes:
    """A PUBLISH with the given property block; QoS 1 (b0 0x32) gets packet id 1."""
    pid = b"\x00\x01" if (b0 >> 1) & 3 else b""
    return _raw(b0, _s(topic) + pid + props + payload)


def _subscribe(props: bytes, *subs: tuple[str, int]) -> bytes:
    return _raw(0x82, b"\x00\x01" + props + b"".join(_s(f) + bytes((o,)) for f, o in subs))


def _unsubscribe(props: bytes, *filters: str) -> bytes:
    return _raw(0xA2, b"\x00\x01" + props + b"".join(_s(f) for f in filters))


def _connect(props: bytes = b"\x00", flags: int = 0x02, payload: bytes = b"") -> bytes:
    """An MQTT 5 CONNECT: ``props``, client id "c", then ``payload`` (will, user name ...)."""
    return _raw(0x10, _s("MQTT") + bytes((5, flags)) + b"\x00\x3c" + props + _s("c") + payload)


def _will(props: bytes, payload: bytes = b"bye") -> bytes:
    """The CONNECT payload after the client id for a will on "w" (flags 0x06)."""
    return props + _s("w") + _s(payload)


def _client() -> Decoder:
    decoder = Decoder()
    assert decoder.feed(CONNECT) == [Connect("c", protocol_level=5)]
    assert decoder.from_client
    return decoder


PFI_1 = b"\x01\x01"  # Payload Format Indicator 1: UTF-8
TOPIC_ALIAS_1 = b"\x23\x00\x01"
SUB_ID_1 = b"\x0b\x01"

# (bytes sent after the CONNECT, reason, words the rule names)
AFTER_CONNECT = [
    # SUBSCRIBE / UNSUBSCRIBE: an empty filter makes the packet malformed (MQTT-4.7.3-1) ...
    (_subscribe(b"\x00", ("", 0)), MALFORMED, "MQTT-4.7.3-1"),
    (_subscribe(_props(SUB_ID_1), ("", 1)), MALFORMED, "MQTT-4.7.3-1"),
    (_subscribe(b"\x00", ("a", 0), ("", 0)), MALFORMED, "MQTT-4.7.3-1"),
    (_unsubscribe(b"\x00", ""), MALFORMED, "MQTT-4.7.3-1"),
    (_unsubscribe(_props(b"\x26" + _s("k") + _s("v")), "a", ""), MALFORMED, "MQTT-4.7.3-1"),
    # ... and no filter at all is a protocol error (MQTT-3.8.3-2, MQTT-3.10.3-2)
    (_subscribe(b"\x00"), PROTOCOL, "at least one topic filter"),
    (_subscribe(_props(SUB_ID_1)), PROTOCOL, "at least one topic filter"),
    (_unsubscribe(b"\x00"), PROTOCOL, "at least one topic filter"),
    # subscription options (3.8.3.1): Maximum QoS 3 and Retain Handling 3 are protocol errors,
    # the reserved bits 6-7 make the packet malformed (MQTT-3.8.3-5)
    (_subscribe(b"\x00", ("a", 0x03)), PROTOCOL, "Maximum QoS"),
    (_subscribe(b"\x00", ("a", 0x30)), PROTOCOL, "Retain Handling"),
    (_subscribe(b"\x00", ("a", 0x40)), MALFORMED, "MQTT-3.8.3-5"),
    (_subscribe(b"\x00", ("a", 0x80)), MALFORMED, "MQTT-3.8.3-5"),
    # Subscription Identifier: not 0, at most once in SUBSCRIBE (3.8.2.1.2)
    (_subscribe(_props(b"\x0b\x00"), ("a", 0)), PROTOCOL, "Subscription Identifier"),
    (_subscribe(_props(SUB_ID_1, b"\x0b\x02"), ("a", 0)), PROTOCOL, "more than once"),
    # a property its packet type may not carry is malformed (2.2.2.2)
    (_subscribe(_props(TOPIC_ALIAS_1), ("a", 0)), MALFORMED, "not valid in this packet type"),
    (_unsubscribe(_props(SUB_ID_1), "a"), MALFORMED, "not valid in this packet type"),
    (_publish(_props(b"\x11\x00\x00\x00\x01")), MALFORMED, "not valid in this packet type"),  # session expiry
    (_publish(_props(b"\x18\x00\x00\x00\x01")), MALFORMED, "not valid in this packet type"),  # will delay
    (_raw(0x40, b"\x00\x01\x00" + _props(b"\x23\x00\x01")), MALFORMED, "not valid in this packet type"),
    (_raw(0xE0, b"\x00" + _props(b"\x21\x00\x01")), MALFORMED, "not valid in this packet type"),
    # a property that may appear once, twice (each property's "more than once")
    (_publish(_props(PFI_1, PFI_1)), PROTOCOL, "more than once"),
    (_publish(_props(b"\x02\x00\x00\x00\x01", b"\x02\x00\x00\x00\x02")), PROTOCOL, "more than once"),
    (_publish(_props(b"\x08" + _s("r"), b"\x08" + _s("r"))), PROTOCOL, "more than once"),
    (_raw(0xE0, b"\x00" + _props(b"\x1f" + _s("x"), b"\x1f" + _s("y"))), PROTOCOL, "more than once"),
    # PUBLISH values
    (_publish(_props(b"\x01\x02")), PROTOCOL, "0 or 1"),  # Payload Format Indicator 2
    (_publish(_props(b"\x01\xff")), PROTOCOL, "0 or 1"),
    (_publish(_props(PFI_1), b"\xff\xfe"), Reason.PAYLOAD_FORMAT_INVALID, "not valid UTF-8"),
    (_publish(_props(PFI_1), b"\xed\xa0\x80"), Reason.PAYLOAD_FORMAT_INVALID, "not valid UTF-8"),  # U+D800
    (_publish(_props(PFI_1), b"ok\xc3", 0x32), Reason.PAYLOAD_FORMAT_INVALID, "not valid UTF-8"),  # cut off
    (_publish(_props(SUB_ID_1)), PROTOCOL, "MQTT-3.3.4-6"),
    (_publish(_props(b"\x0b\x80\x01")), PROTOCOL, "MQTT-3.3.4-6"),
    (_publish(_props(b"\x23\x00\x00")), Reason.TOPIC_ALIAS_INVALID, "MQTT-3.3.2-8"),
    (_publish(_props(b"\x23\x00\x00"), topic=""), Reason.TOPIC_ALIAS_INVALID, "MQTT-3.3.2-8"),
    (_publish(b"\x00", topic=""), PROTOCOL, "Topic Alias"),  # MQTT-3.3.2-1 in 5.0 terms
    (_publish(_props(b"\x08" + _s("r/+"))), PROTOCOL, "MQTT-3.3.2-14"),
    (_publish(_props(b"\x08" + _s("r/#"))), PROTOCOL, "MQTT-3.3.2-14"),
    (_publish(_props(b"\x08" + _s(""))), PROTOCOL, "Response Topic"),
    # reason codes outside their packet's table (MQTT-3.4.2-1, -3.5.2-1, -3.6.2-1, -3.7.2-1,
    # -3.14.2-1, -3.15.2-1), and DISCONNECT codes only a server sends (Table 3-10)
    (_raw(0x40, b"\x00\x01\x01"), PROTOCOL, "reason code 0x01"),
    (_raw(0x50, b"\x00\x01\x92"), PROTOCOL, "reason code 0x92"),
    (_raw(0x62, b"\x00\x01\x10"), PROTOCOL, "reason code 0x10"),
    (_raw(0x70, b"\x00\x01\x80" + b"\x00"), PROTOCOL, "reason code 0x80"),
    (_raw(0xE0, b"\x05"), PROTOCOL, "reason code 0x05"),
    (_raw(0xE0, b"\x8b\x00"), PROTOCOL, "reason code 0x8b"),  # Server shutting down
    (_raw(0xE0, b"\x8e"), PROTOCOL, "reason code 0x8e"),  # Session taken over
    (_raw(0xF0, b"\x01" + _props(b"\x15" + _s("m"))), PROTOCOL, "reason code 0x01"),
    # variable byte integers in their shortest form only (MQTT-1.5.5-1)
    (b"\x30\x80\x00", MALFORMED, "MQTT-1.5.5-1"),  # remaining length 0 in two bytes
    (b"\x30\x85\x00" + _s("a") + b"\x00", MALFORMED, "MQTT-1.5.5-1"),  # 5 in two bytes
    (b"\x30\x85\x80\x00" + _s("a") + b"\x00", MALFORMED, "MQTT-1.5.5-1"),  # 5 in three bytes
    (_publish(b"\x82\x00" + PFI_1), MALFORMED, "MQTT-1.5.5-1"),  # property length 2 in two bytes
    (_subscribe(_props(b"\x0b\x81\x00"), ("a", 0)), MALFORMED, "MQTT-1.5.5-1"),  # subscription id 1
]

CONNECTS = [
    # CONNECT property values (3.1.2.11)
    (_connect(_props(b"\x21\x00\x00")), PROTOCOL, "must not be 0"),  # Receive Maximum
    (_connect(_props(b"\x27\x00\x00\x00\x00")), PROTOCOL, "must not be 0"),  # Maximum Packet Size
    (_connect(_props(b"\x19\x02")), PROTOCOL, "0 or 1"),  # Request Response Information
    (_connect(_props(b"\x17\x02")), PROTOCOL, "0 or 1"),  # Request Problem Information
    (_connect(_props(b"\x17\x01", b"\x17\x01")), PROTOCOL, "more than once"),
    (_connect(_props(b"\x11\x00\x00\x00\x01", b"\x11\x00\x00\x00\x01")), PROTOCOL, "more than once"),
    (_connect(_props(b"\x16" + _s(b"d"))), PROTOCOL, "Authentication Method"),  # data, no method
    (_connect(_props(b"\x15" + _s("m"), b"\x15" + _s("m"))), PROTOCOL, "more than once"),
    (_connect(_props(b"\x23\x00\x01")), MALFORMED, "not valid in this packet type"),  # Topic Alias
    (_connect(_props(b"\x18\x00\x00\x00\x01")), MALFORMED, "not valid in this packet type"),  # Will Delay
    # Will properties (3.1.3.2)
    (_connect(flags=0x06, payload=_will(_props(b"\x01\x02"))), PROTOCOL, "0 or 1"),
    (_connect(flags=0x06, payload=_will(_props(PFI_1), b"\xc3\x28")), Reason.PAYLOAD_FORMAT_INVALID, "Will"),
    (_connect(flags=0x06, payload=_will(_props(b"\x18\x00\x00\x00\x01", b"\x18\x00\x00\x00\x01"))),
     PROTOCOL, "more than once"),
    (_connect(flags=0x06, payload=_will(_props(b"\x11\x00\x00\x00\x01"))), MALFORMED, "not valid"),
    (_connect(flags=0x06, payload=_will(_props(b"\x0b\x01"))), MALFORMED, "not valid"),  # subscription id
    (_connect(flags=0x06, payload=_will(_props(b"\x08" + _s("r/#")))), PROTOCOL, "Response Topic"),
]


def _reason(decoder: Decoder, data: bytes) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        decoder.feed(data)
    return info.value


@pytest.mark.parametrize(("data", "reason", "words"), AFTER_CONNECT, ids=lambda v: repr(v)[:50])
def test_refused_after_connect(data: bytes, reason: int, words: str) -> None:
    exc = _reason(_client(), data)
    assert exc.reason == reason, exc.rule
    assert words.lower() in exc.rule.lower(), exc.rule


@pytest.mark.parametrize(("data", "reason", "words"), CONNECTS, ids=lambda v: repr(v)[:50])
def test_refused_connect(data: bytes, reason: int, words: str) -> None:
    decoder = Decoder()
    exc = _reason(decoder, data)
    assert exc.reason == reason, exc.rule
    assert words.lower() in exc.rule.lower(), exc.rule
    assert decoder.protocol_level == 5  # so the protocol layer knows the client speaks MQTT 5


def test_same_answer_byte_at_a_time() -> None:
    """The rules hold however the bytes arrive (the shortest-form rule of the fixed header too)."""
    cases = [(CONNECT + d, r) for d, r, _ in AFTER_CONNECT] + [(d, r) for d, r, _ in CONNECTS]
    for data, reason in cases:
        decoder = Decoder()
        with pytest.raises(ProtocolError) as info:
            for i in range(len(data)):
                decoder.feed(data[i : i + 1])
        assert info.value.reason == reason, (data, info.value.rule)


def test_empty_filter_is_malformed_in_3_1_1_too() -> None:
    """MQTT-4.7.3-1 is in 3.1.1 as well; there the connection is closed without a reason code."""
    for data in (_raw(0x82, b"\x00\x01" + _s("") + b"\x00"), _raw(0xA2, b"\x00\x01" + _s(""))):
        assert _reason(Decoder(protocol_level=4), data).reason == MALFORMED


# --------------------------------------------------------------------------------------------------
# The valid neighbours of the refused cases
# --------------------------------------------------------------------------------------------------


def test_valid_neighbours_are_decoded() -> None:
    decoder = _client()
    packets = [
        Publish("a", "héllo".encode(), properties={Prop.PAYLOAD_FORMAT_INDICATOR: 1}),
        Publish("a", b"\xff", properties={Prop.PAYLOAD_FORMAT_INDICATOR: 0}),
        Publish("a", b"", 1, packet_id=1, properties={Prop.PAYLOAD_FORMAT_INDICATOR: 1}),
        Publish("", b"x", properties={Prop.TOPIC_ALIAS: 1}),
        Publish("a", b"x", properties={Prop.RESPONSE_TOPIC: "r/1", Prop.USER_PROPERTY: [("k", "v"), ("k", "w")]}),
        Subscribe(2, [Subscription("a", 2, True, True, 2), Subscription("#", 0)],
                  {Prop.SUBSCRIPTION_IDENTIFIER: [268_435_455]}),
        Unsubscribe(3, ["a", "#"], {Prop.USER_PROPERTY: [("k", "v")]}),
        Puback(4, Reason.PAYLOAD_FORMAT_INVALID),
        Puback(4, Reason.NO_MATCHING_SUBSCRIBERS),
        Pubrel(5, Reason.PACKET_IDENTIFIER_NOT_FOUND),
        Auth(Reason.RE_AUTHENTICATE, {Prop.AUTHENTICATION_METHOD: "m"}),
        Disconnect(Reason.DISCONNECT_WITH_WILL, {Prop.SESSION_EXPIRY_INTERVAL: 10}),
    ]
    assert decoder.feed(b"".join(encode(p, 5) for p in packets)) == packets


def test_connect_with_valid_properties_and_will() -> None:
    connect = Connect("c", protocol_level=5, will=Will("w", b"fin", properties={
        Prop.PAYLOAD_FORMAT_INDICATOR: 1, Prop.WILL_DELAY_INTERVAL: 5, Prop.RESPONSE_TOPIC: "r",
    }), properties={
        Prop.RECEIVE_MAXIMUM: 1, Prop.MAXIMUM_PACKET_SIZE: 1, Prop.REQUEST_PROBLEM_INFORMATION: 0,
        Prop.REQUEST_RESPONSE_INFORMATION: 1, Prop.AUTHENTICATION_METHOD: "m", Prop.AUTHENTICATION_DATA: b"d",
    })
    assert Decoder().feed(encode(connect)) == [connect]
    binary = Connect("c", protocol_level=5, will=Will("w", b"\xff", properties={Prop.PAYLOAD_FORMAT_INDICATOR: 0}))
    assert Decoder().feed(encode(binary)) == [binary]


def test_server_only_values_are_decoded_from_a_server() -> None:
    """A client's decoder (it never decodes a CONNECT) takes what only a server sends: several
    Subscription Identifiers in a PUBLISH (MQTT-3.3.4-4), the server's DISCONNECT codes."""
    decoder = Decoder(protocol_level=5)
    assert not decoder.from_client
    packets = [
        Publish("a", b"\xff", properties={Prop.SUBSCRIPTION_IDENTIFIER: [1, 7], Prop.PAYLOAD_FORMAT_INDICATOR: 0}),
        Disconnect(Reason.SESSION_TAKEN_OVER),
        Disconnect(Reason.SERVER_SHUTTING_DOWN, {Prop.SERVER_REFERENCE: "b"}),
    ]
    assert decoder.feed(b"".join(encode(p, 5) for p in packets)) == packets
    # ... but not what nobody may send.
    assert _reason(Decoder(protocol_level=5), _raw(0xE0, b"\x05")).reason == PROTOCOL


def test_from_client_can_be_given() -> None:
    """A decoder told it reads a client applies the client rules without a CONNECT (as the router's
    unit tests feed packets)."""
    assert _reason(Decoder(protocol_level=5, from_client=True), _publish(_props(SUB_ID_1))).reason == PROTOCOL


def test_plain_publish_keeps_its_fast_path() -> None:
    """A QoS 0 PUBLISH without properties still carries its own bytes for forwarding as they came."""
    raw = _publish(b"\x00", b"payload")
    [pkt] = _client().feed(raw)
    assert isinstance(pkt, Publish)
    assert pkt.raw == raw


def test_two_byte_remaining_length_still_inline_and_valid() -> None:
    """128 B and up: the shortest two-byte form is accepted whatever its split."""
    pkt = Publish("a", b"x" * 200)
    raw = encode(pkt, 5)
    assert raw[1] & 0x80 and raw[2]
    decoder = _client()
    assert decoder.feed(raw[:2]) == []
    assert decoder.feed(raw[2:]) == [pkt]
