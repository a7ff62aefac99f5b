"""MQTT 5 properties (spec 2.2.2): each identifier's data type, which packet may carry which, and
the property block read and written."""

from __future__ import annotations

from typing import Any

from .packets import Prop, Properties
from .reasons import ProtocolError, Reason
from .wire import (
    _MALFORMED,
    _ONE_BYTE,
    _PROTOCOL_ERROR,
    _bin,
    _read_bin,
    _read_str,
    _read_u16,
    _read_varint,
    _str,
    _truncated,
    _varint,
)

_BYTE, _U16, _U32, _VARINT, _STR, _BIN, _PAIR = range(7)

# Data type of each property (spec 2.2.2.2). An identifier missing here is unknown: malformed.
_PROP_TYPE: dict[int, int] = {
    Prop.PAYLOAD_FORMAT_INDICATOR: _BYTE,
    Prop.MESSAGE_EXPIRY_INTERVAL: _U32,
    Prop.CONTENT_TYPE: _STR,
    Prop.RESPONSE_TOPIC: _STR,
    Prop.CORRELATION_DATA: _BIN,
    Prop.SUBSCRIPTION_IDENTIFIER: _VARINT,
    Prop.SESSION_EXPIRY_INTERVAL: _U32,
    Prop.ASSIGNED_CLIENT_IDENTIFIER: _STR,
    Prop.SERVER_KEEP_ALIVE: _U16,
    Prop.AUTHENTICATION_METHOD: _STR,
    Prop.AUTHENTICATION_DATA: _BIN,
    Prop.REQUEST_PROBLEM_INFORMATION: _BYTE,
    Prop.WILL_DELAY_INTERVAL: _U32,
    Prop.REQUEST_RESPONSE_INFORMATION: _BYTE,
    Prop.RESPONSE_INFORMATION: _STR,
    Prop.SERVER_REFERENCE: _STR,
    Prop.REASON_STRING: _STR,
    Prop.RECEIVE_MAXIMUM: _U16,
    Prop.TOPIC_ALIAS_MAXIMUM: _U16,
    Prop.TOPIC_ALIAS: _U16,
    Prop.MAXIMUM_QOS: _BYTE,
    Prop.RETAIN_AVAILABLE: _BYTE,
    Prop.USER_PROPERTY: _PAIR,
    Prop.MAXIMUM_PACKET_SIZE: _U32,
    Prop.WILDCARD_SUBSCRIPTION_AVAILABLE: _BYTE,
    Prop.SUBSCRIPTION_IDENTIFIER_AVAILABLE: _BYTE,
    Prop.SHARED_SUBSCRIPTION_AVAILABLE: _BYTE,
}
_PROP_TYPE = {int(k): v for k, v in _PROP_TYPE.items()}  # plain int keys: faster lookups

_USER = int(Prop.USER_PROPERTY)
_SUBID = int(Prop.SUBSCRIPTION_IDENTIFIER)
_TOPIC_ALIAS = int(Prop.TOPIC_ALIAS)

# Which properties each packet may carry (spec 2.2.2.2 table). Anything else is malformed.
_P = Prop
_PUBLISH_PROPS = frozenset({
    _P.PAYLOAD_FORMAT_INDICATOR, _P.MESSAGE_EXPIRY_INTERVAL, _P.CONTENT_TYPE, _P.RESPONSE_TOPIC,
    _P.CORRELATION_DATA, _P.SUBSCRIPTION_IDENTIFIER, _P.TOPIC_ALIAS, _P.USER_PROPERTY,
})
_WILL_PROPS = frozenset({
    _P.PAYLOAD_FORMAT_INDICATOR, _P.MESSAGE_EXPIRY_INTERVAL, _P.CONTENT_TYPE, _P.RESPONSE_TOPIC,
    _P.CORRELATION_DATA, _P.WILL_DELAY_INTERVAL, _P.USER_PROPERTY,
})
_CONNECT_PROPS = frozenset({
    _P.SESSION_EXPIRY_INTERVAL, _P.AUTHENTICATION_METHOD, _P.AUTHENTICATION_DATA,
    _P.REQUEST_PROBLEM_INFORMATION, _P.REQUEST_RESPONSE_INFORMATION, _P.RECEIVE_MAXIMUM,
    _P.TOPIC_ALIAS_MAXIMUM, _P.USER_PROPERTY, _P.MAXIMUM_PACKET_SIZE,
})
_CONNACK_PROPS = frozenset({
    _P.SESSION_EXPIRY_INTERVAL, _P.ASSIGNED_CLIENT_IDENTIFIER, _P.SERVER_KEEP_ALIVE,
    _P.AUTHENTICATION_METHOD, _P.AUTHENTICATION_DATA, _P.RESPONSE_INFORMATION, _P.SERVER_REFERENCE,
    _P.REASON_STRING, _P.RECEIVE_MAXIMUM, _P.TOPIC_ALIAS_MAXIMUM, _P.MAXIMUM_QOS, _P.RETAIN_AVAILABLE,
    _P.USER_PROPERTY, _P.MAXIMUM_PACKET_SIZE, _P.WILDCARD_SUBSCRIPTION_AVAILABLE,
    _P.SUBSCRIPTION_IDENTIFIER_AVAILABLE, _P.SHARED_SUBSCRIPTION_AVAILABLE,
})
_ACK_PROPS = frozenset({_P.REASON_STRING, _P.USER_PROPERTY})  # PUBACK..PUBCOMP, SUBACK, UNSUBACK
_SUBSCRIBE_PROPS = frozenset({_P.SUBSCRIPTION_IDENTIFIER, _P.USER_PROPERTY})
_UNSUBSCRIBE_PROPS = frozenset({_P.USER_PROPERTY})
_DISCONNECT_PROPS = frozenset({
    _P.SESSION_EXPIRY_INTERVAL, _P.REASON_STRING, _P.USER_PROPERTY, _P.SERVER_REFERENCE,
})
_AUTH_PROPS = frozenset({
    _P.AUTHENTICATION_METHOD, _P.AUTHENTICATION_DATA, _P.REASON_STRING, _P.USER_PROPERTY,
})
del _P

# Value rules the 5.0 spec calls a Protocol Error: these may only be 0 or 1 ...
_BOOLEAN_PROPS = frozenset(int(p) for p in (
    Prop.REQUEST_PROBLEM_INFORMATION, Prop.REQUEST_RESPONSE_INFORMATION, Prop.MAXIMUM_QOS,
    Prop.RETAIN_AVAILABLE, Prop.WILDCARD_SUBSCRIPTION_AVAILABLE, Prop.SUBSCRIPTION_IDENTIFIER_AVAILABLE,
    Prop.SHARED_SUBSCRIPTION_AVAILABLE,
))
# ... and these must not be 0.
_NONZERO_PROPS = frozenset(int(p) for p in (Prop.RECEIVE_MAXIMUM, Prop.MAXIMUM_PACKET_SIZE))


def _read_props(data: bytes, p: int, stop: int, allowed: frozenset[int]) -> tuple[Properties, int]:
    """An MQTT 5 property block (spec 2.2.2): length, then identifier/value pairs.

    Returns plain-int keyed properties; User Property is a list of (key, value) pairs and
    Subscription Identifier a list of ints, both in wire order.
    """
    if p >= stop:
        raise _truncated("property length")
    if data[p] == 0:  # by far the common case
        return {}, p + 1
    n, p = _read_varint(data, p, stop)
    end = p + n
    if end > stop:
        raise _truncated("property block")
    props: Properties = {}
    ptype = _PROP_TYPE
    while p < end:
        pid = data[p]
        p += 1
        kind = ptype.get(pid)
        if kind is None:
            raise ProtocolError(f"MQTT-2.2.2 unknown property identifier 0x{pid:02x}", _MALFORMED)
        if pid not in allowed:
            raise ProtocolError(
                f"MQTT-2.2.2 property 0x{pid:02x} is not valid in this packet type", _MALFORMED
            )
        value: Any
        if kind == _STR:
            value, p = _read_str(data, p, end)
        elif kind == _BYTE:
            if p >= end:
                raise _truncated("property")
            value = data[p]
            p += 1
        elif kind == _U16:
            value = _read_u16(data, p, end, "property")
            p += 2
        elif kind == _U32:
            if p + 4 > end:
                raise _truncated("property")
            value = int.from_bytes(data[p : p + 4], "big")
            p += 4
        elif kind == _VARINT:
            value, p = _read_varint(data, p, end)
        elif kind == _BIN:
            value, p = _read_bin(data, p, end)
        else:  # _PAIR
            key, p = _read_str(data, p, end)
            value, p = _read_str(data, p, end)
            value = (key, value)

        if pid == _USER:
            props.setdefault(pid, []).append(value)
        elif pid == _SUBID:
            if value == 0:
                raise ProtocolError("MQTT-3.8.2.1.2 Subscription Identifier must not be 0", _PROTOCOL_ERROR)
            props.setdefault(pid, []).append(value)
        elif pid in props:
            raise ProtocolError(f"MQTT-2.2.2 property 0x{pid:02x} included more than once", _PROTOCOL_ERROR)
        else:
            if pid in _BOOLEAN_PROPS and value > 1:
                raise ProtocolError(f"MQTT-2.2.2 property 0x{pid:02x} must be 0 or 1", _PROTOCOL_ERROR)
            if pid in _NONZERO_PROPS and value == 0:
                raise ProtocolError(f"MQTT-2.2.2 property 0x{pid:02x} must not be 0", _PROTOCOL_ERROR)
            if pid == _TOPIC_ALIAS and value == 0:
                raise ProtocolError("MQTT-3.3.2-8 Topic Alias must not be 0", Reason.TOPIC_ALIAS_INVALID)
            props[pid] = value
    return props, end


def _encode_props(props: Properties | None) -> bytes:
    """An MQTT 5 property block; keys are Prop or int, repeatable properties lists (see packets)."""
    if not props:
        return b"\x00"
    parts: list[bytes] = []
    for key, value in props.items():
        pid = int(key)
        kind = _PROP_TYPE.get(pid)
        if kind is None:
            raise ValueError(f"unknown property identifier {key!r}")
        if pid == _USER:
            for k, v in value:
                parts.append(b"\x26" + _str(k) + _str(v))
        elif pid == _SUBID:
            for v in value if isinstance(value, list | tuple) else (value,):
                parts.append(b"\x0b" + _varint(v))
        elif kind == _STR:
            parts.append(_ONE_BYTE[pid] + _str(value))
        elif kind == _BYTE:
            parts.append(bytes((pid, value)))
        elif kind == _U16:
            parts.append(_ONE_BYTE[pid] + value.to_bytes(2, "big"))
        elif kind == _U32:
            parts.append(_ONE_BYTE[pid] + value.to_bytes(4, "big"))
        elif kind == _BIN:
            parts.append(_ONE_BYTE[pid] + _bin(value))
        else:  # pragma: no cover - _VARINT is only Subscription Identifier
            parts.append(_ONE_BYTE[pid] + _varint(value))
    body = b"".join(parts)
    return _varint(len(body)) + body
