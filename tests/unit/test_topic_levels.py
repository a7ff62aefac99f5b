"""--max-topic-levels at the codec: deeper PUBLISH topic names and will topics are refused with
0x90 Topic Name invalid; filters decode (the router refuses them per filter in the SUBACK)."""

from __future__ import annotations

import pytest

from brokerd.connection.codec import DEFAULT_MAX_TOPIC_LEVELS, Decoder, encode, topic_levels_ok
from brokerd.connection.packets import Connect, Publish, Subscribe, Subscription, Unsubscribe, Will
from brokerd.connection.reasons import ProtocolError, Reason


def deep(n: int, level: str = "l") -> str:
    return "/".join([level] * n)


def test_topic_levels_ok_counts_levels_not_slashes():
    assert topic_levels_ok("a", 1) and not topic_levels_ok("a/b", 1)
    assert topic_levels_ok(deep(128), 128) and not topic_levels_ok(deep(129), 128)
    assert not topic_levels_ok("/", 1)  # two empty levels
    assert topic_levels_ok(deep(127) + "/#", 128) and not topic_levels_ok(deep(128) + "/#", 128)
    assert DEFAULT_MAX_TOPIC_LEVELS == 128


@pytest.mark.parametrize("level", [4, 5])
@pytest.mark.parametrize("qos", [0, 1])
def test_publish_deeper_than_the_limit_is_topic_name_invalid(level, qos):
    ok = Publish(deep(128), b"p", qos, packet_id=qos or None)
    assert Decoder(protocol_level=level).feed(encode(ok, level)) == [ok]
    with pytest.raises(ProtocolError) as exc:
        Decoder(protocol_level=level).feed(encode(Publish(deep(1500), b"p", qos, packet_id=qos or None), level))
    assert exc.value.reason == Reason.TOPIC_NAME_INVALID
    assert "1500 levels" in exc.value.rule and "128" in exc.value.rule


def test_the_limit_is_the_decoders():
    pk = Publish(deep(900), b"p")
    assert Decoder(protocol_level=4, max_topic_levels=1000).feed(encode(pk)) == [pk]
    assert Decoder(protocol_level=4, max_topic_levels=1000).max_topic_levels == 1000
    with pytest.raises(ProtocolError):
        Decoder(protocol_level=4, max_topic_levels=899).feed(encode(pk))


def test_a_name_cached_under_a_higher_limit_is_still_refused_under_a_lower_one():
    short_but_deep = Publish(deep(200, ""), b"p")  # 199 bytes: short enough for the topic cache
    assert Decoder(protocol_level=4, max_topic_levels=1000).feed(encode(short_but_deep)) == [short_but_deep]
    with pytest.raises(ProtocolError):
        Decoder(protocol_level=4).feed(encode(short_but_deep))
    assert Decoder(protocol_level=4, max_topic_levels=200).feed(encode(short_but_deep)) == [short_but_deep]


@pytest.mark.parametrize("level", [4, 5])
def test_will_topic_deeper_than_the_limit_is_refused(level):
    ok = Connect("w", protocol_level=level, will=Will(deep(128), b"bye"))
    assert Decoder().feed(encode(ok, level)) == [ok]
    decoder = Decoder()
    with pytest.raises(ProtocolError) as exc:
        decoder.feed(encode(Connect("w", protocol_level=level, will=Will(deep(129), b"bye")), level))
    assert exc.value.reason == Reason.TOPIC_NAME_INVALID and "Will Topic" in exc.value.rule
    assert decoder.protocol_level == level  # the CONNACK form is known


def test_filters_are_decoded_whatever_their_depth():
    """SUBSCRIBE gets a per-filter failure from the router, UNSUBSCRIBE of a filter no
    subscription can have answers 'no subscription existed': neither closes the connection."""
    sub = Subscribe(1, [Subscription(deep(1500, "+")), Subscription("ok/#")])
    assert Decoder(protocol_level=4).feed(encode(sub)) == [sub]
    unsub = Unsubscribe(2, [deep(1500, "+")])
    assert Decoder(protocol_level=4).feed(encode(unsub)) == [unsub]
