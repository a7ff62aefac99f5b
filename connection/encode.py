"""Encoding: packet values → bytes (``encode``), and a PUBLISH as shared parts (``publish_parts``)
so that a message is encoded once per (protocol level, QoS) and a QoS>0 send only adds its packet id.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .packets import (
    MQTT_3_1,
    MQTT_3_1_1,
    MQTT_5,
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
)
from .properties import _encode_props
from .wire import _ONE_BYTE, _bin, _packet, _str, _varint


def success_ack(b0: int, pid: int) -> bytes:
    """PUBACK, PUBREC or PUBCOMP (``b0``) with success for packet id ``pid``: the same bytes in
    MQTT 3.1.1 and 5.0 (the reason code and properties are omitted), so one helper serves both."""
    return bytes((b0, 2, pid >> 8, pid & 0xFF))


def publish_parts(
    topic: bytes,
    payload: bytes,
    qos: int,
    retain: bool,
    protocol_level: int = MQTT_3_1_1,
    properties: Properties | None = None,
) -> tuple[bytes, bytes]:
    """Encode a PUBLISH once, split around the packet id so QoS>0 sends only add 2 bytes.

    ``head`` is the fixed header (its remaining length counts a 2-byte packet id when qos > 0), the
    topic length and the topic; ``tail`` is (MQTT 5) the property block and the payload. QoS 0:
    ``head + tail`` is the whole packet; QoS>0: ``head + pid.to_bytes(2, "big") + tail``. Before
    MQTT 5 ``tail`` *is* ``payload`` (the same object), so writelines-style sends share it.
    ``topic`` is not checked: the caller passes a topic it already validated.
    """
    if protocol_level == MQTT_5:
        props = _encode_props(properties)
        tail = props + payload
    else:
        tail = payload
    tlen = len(topic)
    if tlen > 0xFFFF:
        raise ValueError("topic longer than 65535 bytes")
    rl = 2 + tlen + len(tail) + (2 if qos else 0)
    b0 = 0x30 | qos << 1 | (1 if retain else 0)
    head = _ONE_BYTE[b0] + _varint(rl) + tlen.to_bytes(2, "big") + topic
    return head, tail


def with_dup(head: bytes) -> bytes:
    """``head`` of ``publish_parts`` with the DUP bit set, for a redelivery (MQTT-3.3.1-1)."""
    return _ONE_BYTE[head[0] | 0x08] + head[1:]


def _enc_connect(pk: Connect, level: int) -> bytes:
    level = pk.protocol_level  # a CONNECT carries its own level
    v5 = level == MQTT_5
    will = pk.will
    flags = 0x02 if pk.clean_start else 0
    if will is not None:
        flags |= 0x04 | will.qos << 3 | (0x20 if will.retain else 0)
    if pk.password is not None:
        flags |= 0x40
    if pk.username is not None:
        flags |= 0x80
    parts = [_str(pk.protocol_name), bytes((level, flags)), pk.keepalive.to_bytes(2, "big")]
    if v5:
        parts.append(_encode_props(pk.properties))
    parts.append(_str(pk.client_id))
    if will is not None:
        if v5:
            parts.append(_encode_props(will.properties))
        parts.append(_str(will.topic))
        parts.append(_bin(will.payload))
    if pk.username is not None:
        parts.append(_str(pk.username))
    if pk.password is not None:
        parts.append(_bin(pk.password))
    return _packet(0x10, b"".join(parts))


def _enc_connack(pk: Connack, level: int) -> bytes:
    # MQTT 3.1 has no session present flag: that byte is reserved there, so it is sent as 0.
    body = bytes((1 if pk.session_present and level != MQTT_3_1 else 0, pk.reason_code))
    if level == MQTT_5:
        body += _encode_props(pk.properties)
    return _packet(0x20, body)


def _enc_publish(pk: Publish, level: int) -> bytes:
    head, tail = publish_parts(pk.topic.encode(), pk.payload, pk.qos, pk.retain, level, pk.properties)
    if pk.dup:
        head = with_dup(head)
    if pk.qos:
        if not pk.packet_id:
            raise ValueError("a PUBLISH with QoS > 0 needs a non-zero packet_id")
        return head + pk.packet_id.to_bytes(2, "big") + tail
    return head + tail


def _ack_encoder(b0: int) -> Callable[[Any, int], bytes]:
    """PUBACK/PUBREC/PUBREL/PUBCOMP: MQTT 5 omits a success code and empty properties (3.4.2.1)."""

    def enc(pk: Puback | Pubrec | Pubrel | Pubcomp, level: int) -> bytes:
        pid = pk.packet_id
        if level != MQTT_5 or (pk.reason_code == 0 and not pk.properties):
            return bytes((b0, 2, pid >> 8, pid & 0xFF))
        if not pk.properties:
            return bytes((b0, 3, pid >> 8, pid & 0xFF, pk.reason_code))
        return _packet(b0, bytes((pid >> 8, pid & 0xFF, pk.reason_code)) + _encode_props(pk.properties))

    return enc


def _enc_subscribe(pk: Subscribe, level: int) -> bytes:
    v5 = level == MQTT_5
    parts = [pk.packet_id.to_bytes(2, "big")]
    if v5:
        parts.append(_encode_props(pk.properties))
    for sub in pk.subscriptions:
        opts = sub.qos
        if v5:
            opts |= (4 if sub.no_local else 0) | (8 if sub.retain_as_published else 0) | sub.retain_handling << 4
        parts.append(_str(sub.topic_filter) + _ONE_BYTE[opts])
    return _packet(0x82, b"".join(parts))


def _enc_suback(pk: Suback, level: int) -> bytes:
    body = pk.packet_id.to_bytes(2, "big")
    if level == MQTT_5:
        body += _encode_props(pk.properties)
    return _packet(0x90, body + bytes(pk.reason_codes))


def _enc_unsubscribe(pk: Unsubscribe, level: int) -> bytes:
    parts = [pk.packet_id.to_bytes(2, "big")]
    if level == MQTT_5:
        parts.append(_encode_props(pk.properties))
    parts.extend(_str(f) for f in pk.topic_filters)
    return _packet(0xA2, b"".join(parts))


def _enc_unsuback(pk: Unsuback, level: int) -> bytes:
    body = pk.packet_id.to_bytes(2, "big")
    if level == MQTT_5:
        body += _encode_props(pk.properties) + bytes(pk.reason_codes)
    return _packet(0xB0, body)


def _enc_pingreq(pk: Pingreq, level: int) -> bytes:
    return b"\xc0\x00"


def _enc_pingresp(pk: Pingresp, level: int) -> bytes:
    return b"\xd0\x00"


def _enc_disconnect(pk: Disconnect, level: int) -> bytes:
    if level != MQTT_5 or (pk.reason_code == 0 and not pk.properties):
        return b"\xe0\x00"
    if not pk.properties:
        return bytes((0xE0, 1, pk.reason_code))
    return _packet(0xE0, _ONE_BYTE[pk.reason_code] + _encode_props(pk.properties))


def _enc_auth(pk: Auth, level: int) -> bytes:
    if level != MQTT_5:
        raise ValueError("AUTH exists only in MQTT 5")
    if pk.reason_code == 0 and not pk.properties:
        return b"\xf0\x00"
    return _packet(0xF0, _ONE_BYTE[pk.reason_code] + _encode_props(pk.properties))


_ENCODERS: dict[type, Callable[[Any, int], bytes]] = {
    Connect: _enc_connect,
    Connack: _enc_connack,
    Publish: _enc_publish,
    Puback: _ack_encoder(0x40),
    Pubrec: _ack_encoder(0x50),
    Pubrel: _ack_encoder(0x62),
    Pubcomp: _ack_encoder(0x70),
    Subscribe: _enc_subscribe,
    Suback: _enc_suback,
    Unsubscribe: _enc_unsubscribe,
    Unsuback: _enc_unsuback,
    Pingreq: _enc_pingreq,
    Pingresp: _enc_pingresp,
    Disconnect: _enc_disconnect,
    Auth: _enc_auth,
}


def encode(packet: Packet, protocol_level: int = MQTT_3_1_1) -> bytes:
    """The wire bytes of ``packet`` in the form of ``protocol_level`` (CONNECT uses its own level).

    Values the wire cannot carry (a string over 65535 bytes, QoS>0 PUBLISH without packet id,
    AUTH before MQTT 5) raise ValueError: those are the caller's bugs, not protocol errors.
    """
    return _ENCODERS[type(packet)](packet, protocol_level)
