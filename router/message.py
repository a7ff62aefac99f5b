"""A published message as it travels through routers, with its encoded forms cached.

A message fanned out to many subscribers is encoded once per variant (protocol level, QoS, RETAIN
flag) and the bytes are shared by every send: QoS 0 sends the whole packet as one bytes object;
QoS > 0 sends ``head + packet id + tail`` so only two bytes differ per subscriber.
"""

from __future__ import annotations

import time

import msgpack

from connection.codec import PUBLISH_QOS0, PUBLISH_QOS1, PUBLISH_QOS2, publish_parts, qos0_payload
from connection.packets import MQTT_5, Prop
from connection.reasons import ProtocolError, Reason

# Properties a broker forwards unchanged to MQTT 5 subscribers (spec 3.3.2.3); Topic Alias and
# Subscription Identifier are per connection and never forwarded.
_FORWARDED = frozenset({
    Prop.PAYLOAD_FORMAT_INDICATOR, Prop.MESSAGE_EXPIRY_INTERVAL, Prop.CONTENT_TYPE,
    Prop.RESPONSE_TOPIC, Prop.CORRELATION_DATA, Prop.USER_PROPERTY,
})

_new = object.__new__
_time = time.time
# Keys of Message._enc: (protocol level << 3) | (QoS << 1) | RETAIN.
_QOS0_V3, _QOS0_V4, _QOS0_V5 = 3 << 3, 4 << 3, MQTT_5 << 3
_QOS1_V3, _QOS1_V4, _QOS2_V3, _QOS2_V4 = 3 << 3 | 2, 4 << 3 | 2, 3 << 3 | 4, 4 << 3 | 4
encode_count = 0  # how many encodes happened: the unit test of "encode once" reads it


class Message:
    __slots__ = ("topic", "_payload", "qos", "retain", "client_id", "origin_router", "origin_offset",
                 "properties", "timestamp_ms", "log_offset", "_enc", "_topic_bytes")

    def __init__(
        self,
        topic: str,
        payload: bytes,
        qos: int = 0,
        retain: bool = False,
        client_id: str = "",
        origin_router: str = "",
        origin_offset: int = -1,
        properties: dict | None = None,
        timestamp_ms: int | None = None,
    ) -> None:
        self.topic = topic
        self._payload = payload
        self.qos = qos
        self.retain = retain
        self.client_id = client_id
        self.origin_router = origin_router
        self.origin_offset = origin_offset
        self.properties = properties or None
        self.timestamp_ms = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
        self.log_offset = -1  # where this router's commit log holds it (-1: not logged)
        self._enc: dict[int, tuple[bytes, bytes]] = {}
        self._topic_bytes: bytes | None = None

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
                  properties: dict | None, raw: bytes | None, level: int) -> Message:
        """A message a client of protocol ``level`` published to router ``router_id`` just now.

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
        msg.timestamp_ms = int(_time() * 1000)
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
    def from_record(cls, rec) -> Message:  # noqa: ANN001 - router.log.Record
        """A message read back from the commit log (session catch-up, retained recovery)."""
        props = msgpack.unpackb(rec.properties, strict_map_key=False) if rec.properties else None
        msg = cls(rec.topic, rec.payload, rec.qos, rec.retain, rec.client_id, rec.origin_router,
                  rec.origin_offset, props, rec.timestamp_ms)
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

    def to_mesh(self) -> list:
        """The form of a forwarded message. A plain QoS 0 message (no RETAIN, no properties) whose
        MQTT 3.1.1 packet is at hand - it came so from its publisher, or a local subscriber needed
        it - travels as ``[packet, topic, client_id, origin_offset, timestamp_ms]``: the receiving
        router hands the packet to its subscribers as it is instead of encoding it again, and
        routes by the topic beside it instead of parsing the packet (parsing in Python cost more
        than msgpack spends on the topic). Its origin router is the frame's sender. A plain QoS 1
        or 2 message whose MQTT 3.1.1 head is at hand travels the same way with ``[head, payload]``
        in the packet's place, so its subscribers' head is not encoded again either. Anything
        else is ``to_list()`` (nine values)."""
        if not self.retain and self.properties is None:
            qos = self.qos
            parts = self._enc.get((4 << 3) | (qos << 1))
            if parts is not None:
                return [parts[0] if qos == 0 else [parts[0], parts[1]], self.topic, self.client_id,
                        self.origin_offset, self.timestamp_ms]
        return self.to_list()

    @classmethod
    def from_mesh(cls, values: list, sender: str) -> Message:
        """The inverse of ``to_mesh`` for a frame from router ``sender``; raises ProtocolError on a
        packet that is not a QoS 0 PUBLISH (or a head that is not a QoS 1/2 one), ValueError or
        TypeError on values of the wrong shape.

        Once per forwarded message on the receiving router, so it fills the slots itself: the
        constructor's defaults and keyword handling cost more than the message's whole delivery
        to one subscriber. The payload stays inside the packet until asked for."""
        if len(values) != 5:
            return cls.from_list(values)
        packet, topic, client_id, origin_offset, ts = values
        if topic.__class__ is not str:
            raise TypeError("forwarded topic is not a string")
        if packet.__class__ is bytes:
            if packet[0] != PUBLISH_QOS0:
                raise ProtocolError("forwarded packet is not a QoS 0 PUBLISH", Reason.MALFORMED_PACKET)
            payload = None
            qos = 0
            parts = (packet, b"")
            enc = {_QOS0_V3: parts, _QOS0_V4: parts}  # as published() at level 4
        else:  # [head, payload]: QoS 1 or 2
            head, payload = packet
            b0 = head[0]
            if (b0 != PUBLISH_QOS1 and b0 != PUBLISH_QOS2) or payload.__class__ is not bytes:
                raise ProtocolError("forwarded head is not a QoS 1/2 PUBLISH", Reason.MALFORMED_PACKET)
            parts = (head, payload)
            if b0 == PUBLISH_QOS1:
                qos = 1
                enc = {_QOS1_V3: parts, _QOS1_V4: parts}
            else:
                qos = 2
                enc = {_QOS2_V3: parts, _QOS2_V4: parts}
        msg = _new(cls)
        msg.topic = topic
        msg._payload = payload
        msg.qos = qos
        msg.retain = False
        msg.client_id = client_id
        msg.origin_router = sender
        msg.origin_offset = origin_offset
        msg.properties = None
        msg.timestamp_ms = ts
        msg.log_offset = -1
        msg._enc = enc
        msg._topic_bytes = None
        return msg

    def to_mesh_shared(self, groups: list[str], only: bool = False) -> list:
        """``to_mesh()`` plus the shared subscriptions the receiving router was chosen for, as a
        last element: 6 values for the plain QoS 0 form, 10 for the full one (``only``: the
        groups as ``{"only": groups}``, the message is for them alone). Only messages that some
        shared subscription matches pay for it; the 5-value hot form is unchanged."""
        values = self.to_mesh()
        values.append({"only": groups} if only else groups)
        return values

    @classmethod
    def from_mesh_shared(cls, values: list, sender: str) -> tuple[Message, list[str], bool]:
        """The inverse of ``to_mesh_shared``: the message, its shared subscriptions, and whether
        it is for them alone."""
        groups = values[-1]
        only = isinstance(groups, dict)
        if only:
            groups = groups["only"]
        return cls.from_mesh(values[:-1], sender), [str(g) for g in groups], only

    def packed_properties(self) -> bytes:
        return msgpack.packb(self.properties) if self.properties else b""

    def encoded(self, level: int, qos: int, retain: bool) -> tuple[bytes, bytes]:
        """(head, tail) of the PUBLISH for this variant; QoS 0: head + tail is the whole packet."""
        key = (level << 3) | (qos << 1) | retain
        parts = self._enc.get(key)
        if parts is None:
            global encode_count
            encode_count += 1
            props = None
            if level >= MQTT_5 and self.properties:
                props = {k: v for k, v in self.properties.items() if k in _FORWARDED} or None
            parts = publish_parts(self.topic_bytes, self.payload, qos, retain, level, props)
            if qos == 0:
                parts = (parts[0] + parts[1], b"")
            self._enc[key] = parts
        return parts

    def __repr__(self) -> str:
        return f"Message({self.topic!r}, {len(self.payload)} B, qos={self.qos}, retain={self.retain})"

