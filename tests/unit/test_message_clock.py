"""A message's times (``router.message``) from its asker's clock, a fake one here: when it was
published, so when it expires, and the Message Expiry Interval left that an MQTT 5 subscriber is
sent (MQTT-3.3.2-6). The fake clock's wall time is years from the machine's, so a message that
read ``time`` itself would fail here."""

from __future__ import annotations

import pytest

from brokerd.connection.codec import Decoder
from brokerd.connection.packets import MQTT_5, Prop, Publish
from brokerd.router import message
from brokerd.router.clock import FakeClock
from brokerd.router.message import Message

_EXPIRY = Prop.MESSAGE_EXPIRY_INTERVAL


def _clock() -> FakeClock:
    return FakeClock(unix=1_000_000_000.0)  # 2001


def _published(clock: FakeClock, seconds: int) -> Message:
    return Message.published("e/1", b"x", 1, False, "pub", "n/w0", {_EXPIRY: seconds}, None, MQTT_5,
                             int(clock.unix() * 1000))


def _interval_sent(msg: Message, clock: FakeClock) -> int:
    head, tail = msg.encoded(MQTT_5, 1, False, clock)
    [packet] = Decoder(protocol_level=MQTT_5).feed(head + b"\x00\x01" + tail)
    assert isinstance(packet, Publish)
    return packet.properties[_EXPIRY]


def test_a_published_message_expires_its_interval_after_its_routers_time():
    clock = _clock()
    msg = _published(clock, 10)
    assert msg.timestamp_ms == 1_000_000_000_000
    assert msg.expires_ms == 1_000_000_010_000
    clock.advance(9.999)
    assert not msg.expired(clock.unix() * 1000)
    clock.advance(0.001)
    assert msg.expired(clock.unix() * 1000)


@pytest.mark.parametrize("waited,left", [(0, 10), (4, 6), (9.5, 1), (30, 1)])
def test_a_subscriber_is_sent_the_interval_left_by_the_senders_clock(waited, left):
    """At least 1 s: 0 would mean it never expires (the sender drops an expired one first)."""
    clock = _clock()
    msg = _published(clock, 10)
    clock.advance(waited)
    assert msg.outgoing_properties(clock) == {_EXPIRY: left}
    assert _interval_sent(msg, clock) == left


def test_each_second_left_has_its_own_encoding_and_a_second_later_is_not_the_cached_one():
    clock = _clock()
    msg = _published(clock, 10)
    before = message.encode_count
    msg.encoded(MQTT_5, 1, False, clock)
    clock.advance(0.5)
    msg.encoded(MQTT_5, 1, False, clock)  # the same seconds left (10): cached
    assert message.encode_count == before + 1
    clock.advance(2.5)
    assert _interval_sent(msg, clock) == 7
    assert message.encode_count == before + 2


def test_a_message_without_an_interval_never_asks_the_clock():
    class Unread:
        def unix(self) -> float:
            raise AssertionError("the clock was read")

    msg = Message.published("p/1", b"x", 1, False, "pub", "n/w0", {Prop.CONTENT_TYPE: "text"}, None, MQTT_5, 5)
    assert msg.expires_ms == 0
    assert msg.outgoing_properties(Unread()) == {Prop.CONTENT_TYPE: "text"}  # type: ignore[arg-type]  # unix() alone
    msg.encoded(MQTT_5, 1, False, Unread())  # type: ignore[arg-type]  # (unix alone: all it may ask)
