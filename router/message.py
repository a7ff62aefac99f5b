"""A published message as it travels through routers, with its encoded forms cached.

A message fanned out to many subscribers is encoded once per variant (protocol level, QoS, RETAIN
flag) and the bytes are shared by every send: QoS 0 sends the whole packet as one bytes object;
QoS > 0 sends ``head + packet id + tail`` so only two bytes differ per subscriber.

It reads no clock of its own: a time it needs (when it was published, the expiry interval left
for a subscriber) is the asker's, given as a value or as the asker's ``Clock``
(``router.clock``), so its expiry rules are tested with a ``FakeClock``. What is not given is
``LOOP_CLOCK``'s, as for every part made without a clock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgpack

from brokerd.connection.codec import publish_parts, qos0_payload
from brokerd.connection.packets import MQTT_5, Prop

from .clock import LOOP_CLOCK

if TYPE_CHECKING:
    from .clock import Clock
    from .log import Record

# Properties a broker forwards to MQTT 5 subscribers (spec 3.3.2.3): unchanged, except the Message
# Expiry Interval (the time left) and the Subscription Identifiers (the subscriber's own, set on
# the copy ``with_ids`` makes). A Topic Alias is per connection and never kept in a message.
_FORWARDED = frozenset({
    Prop.PAYLOAD_FORMAT_INDICATOR, Prop.MESSAGE_EXPIRY_INTERVAL, Prop.CONTENT_TYPE,
    Prop.RESPONSE_TOPIC, Prop.CORRELATION_DATA, Prop.USER_PROPERTY, Prop.SUBSCRIPTION_IDENTIFIER,
})
_EXPIRY = Prop.MESSAGE_EXPIRY_INTERVAL
_SUB_IDS = Prop.SUBSCRIPTION_IDENTIFIER
_V5_KEYS = MQTT_5 << 3  # keys of Message._enc from here up are MQTT 5 encodings


def expiry_deadline(properties: dict | None, timestamp_ms: int) -> int:
    """When a message with these properties expires, in ms since the epoch (0: never). An
    absolute time travels with the message (mesh, log, takeover, restart) as its timestamp and
    interval, so every router and every restart agrees on it (MQTT 5 3.3.2.3.3)."""
    if properties:
        interval = properties.get(_EXPIRY)
        if interval is not None:
            return timestamp_ms + int(interval) * 1000
    return 0


def will_delay(will: Message) -> int:
    """A will's Will Delay Interval in seconds (MQTT 5 3.1.3.2.2; 0: none, it goes out with its
    connection)."""
    return will.properties.get(Prop.WILL_DELAY_INTERVAL, 0) if will.properties else 0


# Keys of Message._enc: (protocol level << 3) | (QoS << 1) | RETAIN.
_QOS0_V3, _QOS0_V4, _QOS0_V5 = 3 << 3, 4 << 3, MQTT_5 << 3
_QOS1_V3, _QOS1_V4, _QOS2_V3, _QOS2_V4 = 3 << 3 | 2, 4 << 3 | 2, 3 << 3 | 4, 4 << 3 | 4
encode_count = 0  # how many encodes happened: the unit test of "encode once" reads it


class Message:
    __slots__ = ("topic", "_payload", "qos", "retain", "client_id", "origin_router", "origin_offset",
                 "properties", "timestamp_ms", "log_offset", "_enc", "_topic_bytes", "expires_ms")

    def __init__(
        self,
        topic: str = "",  # (defaults: compiled, ``_new`` is the constructor called without arguments)
        payload: bytes = b"",
        qos: int = 0,
        retain: bool = False,
        client_id: str = "",
        origin_router: str = "",
        origin_offset: int = -1,
        properties: dict | None = None,
        timestamp_ms: int | None = None,  # None: now, by ``LOOP_CLOCK``
    ) -> None:
        self.topic = topic
        self._payload: bytes | None = payload  # None: still in the packet (``payload``)
        self.qos = qos
        self.retain = retain
        self.client_id = client_id
        self.origin_router = origin_router
        self.origin_offset = origin_offset
        self.properties = properties or None
        self.timestamp_ms = int(LOOP_CLOCK.unix() * 1000) if timestamp_ms is None else timestamp_ms
        self.log_offset = -1  # where this router's commit log holds it (-1: not logged)
        self._enc: dict[int, tuple[bytes, bytes]] = {}
        self._topic_bytes: bytes | None = None
        self.expires_ms = expiry_deadline(self.properties, self.timestamp_ms)  # 0: never

    @property
    def payload(self) -> bytes:
        """The payload; a message forwarded as its packet cuts it out of the packet only when
        something asks (the commit log, an MQTT 5 or QoS > 0 subscriber, a retained store)."""
        payload = self._payload
        if payload is None:
            self._payload = payload = qos0_payload(self._enc[_QOS0_V4][0], len(self.topic_bytes))
        return payload

    @property
    def topic_bytes(self) -> bytes:
        if self._topic_bytes is None:
            self._topic_bytes = self.topic.encode()
        return self._topic_bytes

    @classmethod
    def published(cls, topic: str, payload: bytes, qos: int, retain: bool, client_id: str, router_id: str,
                  properties: dict | None, raw: bytes | None, level: int,
                  timestamp_ms: int | None = None) -> Message:
        """A message a client of protocol ``level`` published to router ``router_id`` at
        ``timestamp_ms`` (its router's clock, Unix ms; None: now, by ``LOOP_CLOCK``).

        ``raw`` is what the decoder kept of its packet (``Publish.raw``). For QoS 0 it is the
        whole packet, byte for byte what subscribers of that level get at QoS 0; for QoS 1/2
        (MQTT 3.1.1) it is the packet up to its packet identifier, the head of what subscribers
        at that QoS get before their own packet id and the payload. Either is kept as that
        variant's encoding, so the commonest deliveries encode nothing.

        Once per publish, so it fills the slots itself like ``from_mesh``."""
        msg = _new(cls)
        msg.topic = topic
        msg._payload = payload
        msg.qos = qos
        msg.retain = retain
        msg.client_id = client_id
        msg.origin_router = router_id
        msg.origin_offset = -1
        msg.properties = properties or None
        msg.timestamp_ms = now = int(LOOP_CLOCK.unix() * 1000) if timestamp_ms is None else timestamp_ms
        msg.expires_ms = expiry_deadline(properties, now) if properties else 0
        msg.log_offset = -1
        if raw is None:
            msg._enc = {}
        elif qos:  # 3.1 and 3.1.1 share the PUBLISH wire form
            parts = (raw, payload)
            msg._enc = {_QOS1_V3: parts, _QOS1_V4: parts} if qos == 1 else {_QOS2_V3: parts, _QOS2_V4: parts}
        elif level >= MQTT_5:
            msg._enc = {_QOS0_V5: (raw, b"")}
        else:
            parts = (raw, b"")
            msg._enc = {_QOS0_V3: parts, _QOS0_V4: parts}
        msg._topic_bytes = None
        return msg

    @classmethod
    def from_record(cls, rec: Record) -> Message:
        """A message read back from the commit log (session catch-up, retained recovery). A
        record's origin offset may read back None (a copy whose origin did not say where its log
        holds it): -1 here, the log format's and the message's "unknown", which a mark compares
        with (None would not; compiled, it is refused outright)."""
        props = msgpack.unpackb(rec.properties, strict_map_key=False) if rec.properties else None
        origin_offset = rec.origin_offset
        msg = cls(rec.topic, rec.payload, rec.qos, rec.retain, rec.client_id, rec.origin_router,
                  -1 if origin_offset is None else origin_offset, props, rec.timestamp_ms)
        msg.log_offset = rec.offset
        return msg

    def to_list(self) -> list:
        """The message as plain values (msgpack-able): mesh frames, session transfer, snapshots."""
        return [self.topic, self.payload, self.qos, self.retain, self.client_id, self.origin_router,
                self.origin_offset, self.properties, self.timestamp_ms]

    @classmethod
    def from_list(cls, values: list) -> Message:
        topic, payload, qos, retain, client_id, origin_router, origin_offset, props, ts = values
        if props:  # msgpack may hand back the property ids as they were packed: ints
            props = {int(k): v for k, v in props.items()}
        return cls(topic, payload, qos, retain, client_id, origin_router, origin_offset, props, ts)

    def packed_properties(self) -> bytes:
        return msgpack.packb(self.properties) if self.properties else b""

    def expired(self, now_ms: float) -> bool:
        """Whether its Message Expiry Interval has passed at ``now_ms`` (Unix ms, the asker's
        ``Clock``; only messages with one are asked)."""
        return self.expires_ms <= now_ms

    def with_ids(self, ids: tuple[int, ...]) -> Message:
        """This message as a subscriber with Subscription Identifiers ``ids`` gets it: a copy that
        shares the payload and the MQTT 3.1/3.1.1 encodings (which carry no identifiers) and
        adds the identifiers to the properties; made per delivery, only for such subscribers."""
        msg = self.clone()
        msg._payload = self.payload
        props = dict(self.properties) if self.properties else {}
        props[_SUB_IDS] = list(ids)
        msg.properties = props
        msg._enc = {k: v for k, v in self._enc.items() if k < _V5_KEYS}
        return msg

    def clone(self) -> Message:
        """A copy to change a field of (``log_offset``): shares the payload and the encodings.
        ``copy.copy`` would do in Python, but compiled (mypyc) a native class has no pickling
        protocol to copy by."""
        msg = _new(Message)
        msg.topic = self.topic
        msg._payload = self._payload
        msg.qos = self.qos
        msg.retain = self.retain
        msg.client_id = self.client_id
        msg.origin_router = self.origin_router
        msg.origin_offset = self.origin_offset
        msg.properties = self.properties
        msg.timestamp_ms = self.timestamp_ms
        msg.expires_ms = self.expires_ms
        msg.log_offset = self.log_offset
        msg._enc = self._enc
        msg._topic_bytes = self._topic_bytes
        return msg

    def outgoing_properties(self, clock: Clock = LOOP_CLOCK) -> dict | None:
        """The properties an MQTT 5 subscriber gets: those forwarded, the expiry interval as the
        time left by ``clock`` (the sender's; MQTT-3.3.2-6; at least 1 s: 0 would mean it never
        expires). A clock, not a time: it is read only for a message that expires."""
        props = self.properties
        if not props:
            return None
        out = {k: v for k, v in props.items() if k in _FORWARDED}
        if self.expires_ms:
            out[_EXPIRY] = max(1, -int((clock.unix() * 1000 - self.expires_ms) // 1000))
        return out or None

    def encoded(self, level: int, qos: int, retain: bool, clock: Clock = LOOP_CLOCK) -> tuple[bytes, bytes]:
        """(head, tail) of the PUBLISH for this variant; QoS 0: head + tail is the whole packet.

        An MQTT 5 encoding of a message that expires carries the seconds left by ``clock`` (the
        sender's: ``outgoing_properties``), so it is cached
        under its key and those seconds (never under the key alone: that lookup stays the
        common case's single dict hit)."""
        key = (level << 3) | (qos << 1) | retain
        parts = self._enc.get(key)
        if parts is None:
            props = None
            if level >= MQTT_5 and self.properties:
                props = self.outgoing_properties(clock)
                if self.expires_ms:
                    enc = self._enc
                    if len(enc) > 32:
                        enc.clear()
                    key |= props[_EXPIRY] << 8  # type: ignore[index]  # expires_ms: props has it
                    parts = enc.get(key)
                    if parts is not None:
                        return parts
            global encode_count
            encode_count += 1
            parts = publish_parts(self.topic_bytes, self.payload, qos, retain, level, props)
            if qos == 0:
                parts = (parts[0] + parts[1], b"")
            self._enc[key] = parts
        return parts

    def __repr__(self) -> str:
        return f"Message({self.topic!r}, {len(self.payload)} B, qos={self.qos}, retain={self.retain})"



# A message made without ``__init__`` (its defaults, the clock read, the expiry computed) where
# every field is set at once: ``published``, ``with_ids``, ``clone``, the mesh's ``from_mesh``.
# ``Message.__new__``, not ``object.__new__``: compiled (mypyc), Message is a native class, whose
# instances only its own ``__new__`` may make, and that runs ``__init__`` with its defaults (a
# few attributes set twice, cheap there); in Python it is ``object.__new__``, and nothing runs.
_new = Message.__new__
