"""Property tests for the codec: whatever bytes a client sends, the decoder answers only with packets
or ProtocolError (never another exception, which would escape the protocol layer), the answer does
not depend on how the bytes are split across reads, and generated packets survive a round trip."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brokerd.connection.codec import Decoder, encode, publish_parts
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

PACKET_TYPES = (
    Connect, Connack, Publish, Puback, Pubrec, Pubrel, Pubcomp, Subscribe, Suback,
    Unsubscribe, Unsuback, Pingreq, Pingresp, Disconnect, Auth,
)
REASONS = set(Reason)

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ROUND_TRIP = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])

levels = st.sampled_from([None, 3, 4, 5])

# --------------------------------------------------------------------------------------------------
# Generated values
# --------------------------------------------------------------------------------------------------

mqtt_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
# Any text but the empty string, which makes a SUBSCRIBE or UNSUBSCRIBE malformed (MQTT-4.7.3-1).
topic_filter = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=12)
topic_name = st.text(st.characters(codec="utf-8", exclude_characters="\x00+#"), min_size=1, max_size=20)
u16 = st.integers(1, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
user_props = st.lists(st.tuples(mqtt_text, mqtt_text), min_size=1, max_size=3)


def _props(**fields: st.SearchStrategy) -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries({}, optional={int(Prop[name]): s for name, s in fields.items()})


publish_props = _props(
    PAYLOAD_FORMAT_INDICATOR=st.integers(0, 1),
    MESSAGE_EXPIRY_INTERVAL=u32,
    CONTENT_TYPE=mqtt_text,
    RESPONSE_TOPIC=topic_name,
    CORRELATION_DATA=st.binary(max_size=10),
    SUBSCRIPTION_IDENTIFIER=st.lists(st.integers(1, 268_435_455), min_size=1, max_size=3),
    TOPIC_ALIAS=u16,
    USER_PROPERTY=user_props,
)
subscribe_props = _props(
    SUBSCRIPTION_IDENTIFIER=st.lists(st.integers(1, 268_435_455), min_size=1, max_size=1),
    USER_PROPERTY=user_props,
)


@st.composite
def publishes(draw: st.DrawFn, level: int) -> Publish:
    qos = draw(st.integers(0, 2))
    return Publish(
        topic=draw(topic_name),
        payload=draw(st.binary(max_size=300)),
        qos=qos,
        retain=draw(st.booleans()),
        dup=draw(st.booleans()) if qos else False,
        packet_id=draw(u16) if qos else None,
        properties=draw(publish_props) if level == 5 else {},
    )


@st.composite
def subscribes(draw: st.DrawFn, level: int) -> Subscribe:
    if level == 5:
        sub = st.builds(Subscription, topic_filter, st.integers(0, 2), st.booleans(), st.booleans(),
                        st.integers(0, 2))
    else:
        sub = st.builds(Subscription, topic_filter, st.integers(0, 2))
    return Subscribe(
        packet_id=draw(u16),
        subscriptions=draw(st.lists(sub, min_size=1, max_size=4)),
        properties=draw(subscribe_props) if level == 5 else {},
    )


def _samples(level: int) -> list[bytes]:
    """Valid packets of every type, the seeds that mutation starts from."""
    ack = {Prop.REASON_STRING: "r", Prop.USER_PROPERTY: [("a", "b")]} if level == 5 else {}
    packets = [
        Publish("a/b", b"hello", 1, packet_id=10, properties={Prop.CONTENT_TYPE: "t"} if level == 5 else {}),
        Publish("a", b"", 0),
        Puback(10), Pubrec(11, 0x10 if level == 5 else 0, ack), Pubrel(12), Pubcomp(13),
        Subscribe(3, [Subscription("a/+", 1), Subscription("#", 2)]),
        Suback(3, [1, 2]), Unsubscribe(4, ["a/+"]), Unsuback(4, [0] if level == 5 else []),
        Pingreq(), Pingresp(), Disconnect(), Connack(True, 0, ack),
    ]
    if level == 5:
        packets += [Auth(0x18, {Prop.AUTHENTICATION_METHOD: "m"}), Disconnect(0x04, ack)]
    connect = Connect("client", protocol_level=level, protocol_name="MQIsdp" if level == 3 else "MQTT",
                      username="u", password=b"p", will=Will("w/t", b"bye", 1, True))
    return [encode(connect)] + [encode(p, level) for p in packets]


SAMPLES = {level: _samples(level) for level in (3, 4, 5)}
SAMPLES[None] = SAMPLES[4]  # type: ignore[index]

# --------------------------------------------------------------------------------------------------
# Decoding anything
# --------------------------------------------------------------------------------------------------


def _decode(level: int | None, data: bytes, cuts: list[int]) -> tuple[list[object], int | None]:
    """Feed ``data`` split at ``cuts``; return the packets and the error reason (None if none)."""
    decoder = Decoder(protocol_level=level, max_packet_size=4096)
    packets: list[object] = []
    bounds = [0, *sorted(c % (len(data) + 1) for c in cuts), len(data)]
    try:
        for a, b in zip(bounds, bounds[1:], strict=False):
            got = decoder.feed(data[a:b])
            assert all(type(p) in PACKET_TYPES for p in got)
            packets += got
    except ProtocolError as exc:
        assert exc.reason in REASONS
        assert isinstance(exc.rule, str) and exc.rule
        return packets + exc.packets, int(exc.reason)  # type: ignore[attr-defined]
    assert decoder.buffered <= len(data)
    return packets, None


def _check_stream(level: int | None, data: bytes, cuts: list[int]) -> None:
    whole = _decode(level, data, [])
    split = _decode(level, data, cuts)
    assert whole == split  # the same packets and the same error, however the bytes arrive


@FUZZ
@given(level=levels, data=st.binary(max_size=400), cuts=st.lists(st.integers(0, 400), max_size=6))
def test_random_bytes(level: int | None, data: bytes, cuts: list[int]) -> None:
    _check_stream(level, data, cuts)


@st.composite
def mutated_streams(draw: st.DrawFn) -> tuple[int | None, bytes]:
    level = draw(levels)
    seeds = SAMPLES[level]  # type: ignore[index]
    chosen = draw(st.lists(st.sampled_from(seeds), min_size=1, max_size=5))
    data = bytearray(b"".join(chosen))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        i = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set" and data:
            data[i] = draw(st.integers(0, 255))
        elif kind == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=4))
        elif kind == "delete" and data:
            del data[i : i + draw(st.integers(1, 4))]
        elif kind == "truncate":
            del data[i:]
    return level, bytes(data)


@FUZZ
@given(stream=mutated_streams(), cuts=st.lists(st.integers(0, 2000), max_size=6))
def test_mutated_valid_packets(stream: tuple[int | None, bytes], cuts: list[int]) -> None:
    level, data = stream
    _check_stream(level, data, cuts)


@FUZZ
@given(level=levels, cuts=st.lists(st.integers(0, 2000), max_size=8))
def test_valid_samples_any_chunking(level: int | None, cuts: list[int]) -> None:
    data = b"".join(SAMPLES[level])  # type: ignore[index]
    packets, error = _decode(level, data, cuts)
    assert error is None
    assert len(packets) == len(SAMPLES[level])  # type: ignore[index]


# --------------------------------------------------------------------------------------------------
# Round trips
# --------------------------------------------------------------------------------------------------


@ROUND_TRIP
@given(data=st.data(), level=st.sampled_from([4, 5]))
def test_publish_round_trip(data: st.DataObject, level: int) -> None:
    pkt = data.draw(publishes(level))
    assert Decoder(protocol_level=level).feed(encode(pkt, level)) == [pkt]
    head, tail = publish_parts(pkt.topic.encode(), pkt.payload, pkt.qos, pkt.retain, level, pkt.properties)
    if pkt.qos:
        raw = head + pkt.packet_id.to_bytes(2, "big") + tail  # type: ignore[union-attr]
    else:
        raw = head + tail
    assert Decoder(protocol_level=level).feed(raw) == [dataclasses.replace(pkt, dup=False)]


@ROUND_TRIP
@given(data=st.data(), level=st.sampled_from([4, 5]))
def test_subscribe_round_trip(data: st.DataObject, level: int) -> None:
    pkt = data.draw(subscribes(level))
    assert Decoder(protocol_level=level).feed(encode(pkt, level)) == [pkt]


@ROUND_TRIP
@given(data=st.data(), level=st.sampled_from([4, 5]), cuts=st.lists(st.integers(0, 5000), max_size=5))
def test_publish_stream_round_trip(data: st.DataObject, level: int, cuts: list[int]) -> None:
    pkts = data.draw(st.lists(publishes(level), min_size=1, max_size=8))
    raw = b"".join(encode(p, level) for p in pkts)
    packets, error = _decode(level, raw, cuts)
    assert error is None
    assert packets == pkts
