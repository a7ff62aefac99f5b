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
_PAYLOAD_FORMAT = int(Prop.PAYLOAD_FORMAT_INDICATOR)
_RESPONSE_TOPIC = int(Prop.RESPONSE_TOPIC)
_AUTH_METHOD = int(Prop.AUTHENTICATION_METHOD)
_AUTH_DATA = int(Prop.AUTHENTICATION_DATA)

MAX_USER_PROPERTIES = 1024
"""User Properties one packet may carry; one more closes the connection (DISCONNECT 0x97 quota
exceeded; a CONNECT is closed unanswered, as any CONNECT the broker cannot read). The standard sets
no number, and each pair is held decoded, a tuple and two strings (about 64 bytes for the 5 of an
empty pair on the wire): a 1 MiB PUBLISH of empty pairs held 17 MB, and a subscriber that does not
read keeps up to --max-inflight plus --max-queued such messages (the queue's bound is a count).
With this bound a packet's pairs hold at most about 170 KB more than their bytes."""

_LIST_PROPS = frozenset({_USER, _SUBID})
"""Decoded as a list in wire order wherever they appear (see ``connection.packets``), so a packet
type that allows them once and one that allows them many times give the same shape. Every property
a table below lets repeat is one of these."""

PropTable = dict[int, bool]
"""Which properties one packet type may carry, each mapped to whether it may appear more than once."""


def _table(*once: Prop, many: tuple[Prop, ...] = (Prop.USER_PROPERTY,)) -> PropTable:
    """A packet type's table: ``once`` may appear at most once, ``many`` any number of times."""
    return {**{int(p): False for p in once}, **{int(p): True for p in many}}


# Which properties each packet may carry, and which of them more than once (spec 2.2.2.2, and
# each packet's section). The one home of both rules: a property not in its packet's table is a
# Malformed Packet (2.2.2.2); one that may appear once appearing twice is a Protocol Error (each
# property's "It is a Protocol Error to include ... more than once"). User Property may always
# repeat (3.1.2.11.8 and its like); Subscription Identifier only in PUBLISH (3.3.2.3.8: one per
# matching subscription), in SUBSCRIBE once (3.8.2.1.2).
_P = Prop
_PUBLISH_PROPS = _table(
    _P.PAYLOAD_FORMAT_INDICATOR, _P.MESSAGE_EXPIRY_INTERVAL, _P.CONTENT_TYPE, _P.RESPONSE_TOPIC,
    _P.CORRELATION_DATA, _P.TOPIC_ALIAS, many=(_P.USER_PROPERTY, _P.SUBSCRIPTION_IDENTIFIER),
)
_WILL_PROPS = _table(
    _P.PAYLOAD_FORMAT_INDICATOR, _P.MESSAGE_EXPIRY_INTERVAL, _P.CONTENT_TYPE, _P.RESPONSE_TOPIC,
    _P.CORRELATION_DATA, _P.WILL_DELAY_INTERVAL,
)
_CONNECT_PROPS = _table(
    _P.SESSION_EXPIRY_INTERVAL, _P.AUTHENTICATION_METHOD, _P.AUTHENTICATION_DATA,
    _P.REQUEST_PROBLEM_INFORMATION, _P.REQUEST_RESPONSE_INFORMATION, _P.RECEIVE_MAXIMUM,
    _P.TOPIC_ALIAS_MAXIMUM, _P.MAXIMUM_PACKET_SIZE,
)
_CONNACK_PROPS = _table(
    _P.SESSION_EXPIRY_INTERVAL, _P.ASSIGNED_CLIENT_IDENTIFIER, _P.SERVER_KEEP_ALIVE,
    _P.AUTHENTICATION_METHOD, _P.AUTHENTICATION_DATA, _P.RESPONSE_INFORMATION, _P.SERVER_REFERENCE,
    _P.REASON_STRING, _P.RECEIVE_MAXIMUM, _P.TOPIC_ALIAS_MAXIMUM, _P.MAXIMUM_QOS, _P.RETAIN_AVAILABLE,
    _P.MAXIMUM_PACKET_SIZE, _P.WILDCARD_SUBSCRIPTION_AVAILABLE, _P.SUBSCRIPTION_IDENTIFIER_AVAILABLE,
    _P.SHARED_SUBSCRIPTION_AVAILABLE,
)
_ACK_PROPS = _table(_P.REASON_STRING)  # PUBACK..PUBCOMP, SUBACK, UNSUBACK
_SUBSCRIBE_PROPS = _table(_P.SUBSCRIPTION_IDENTIFIER)
_UNSUBSCRIBE_PROPS = _table()
_DISCONNECT_PROPS = _table(_P.SESSION_EXPIRY_INTERVAL, _P.REASON_STRING, _P.SERVER_REFERENCE)
_AUTH_PROPS = _table(_P.AUTHENTICATION_METHOD, _P.AUTHENTICATION_DATA, _P.REASON_STRING)
del _P

# Value rules, every one a Protocol Error in the 5.0 spec: these may only be 0 or 1 (3.1.2.11.6-7,
# 3.2.2.3.4-5, 3.2.2.3.11-13; and Payload Format Indicator, whose only values 3.1.3.2.3 and
# 3.3.2.3.2 define, as Mosquitto checks it) ...
_BOOLEAN_PROPS = frozenset(int(p) for p in (
    Prop.PAYLOAD_FORMAT_INDICATOR, Prop.REQUEST_PROBLEM_INFORMATION, Prop.REQUEST_RESPONSE_INFORMATION,
    Prop.MAXIMUM_QOS, Prop.RETAIN_AVAILABLE, Prop.WILDCARD_SUBSCRIPTION_AVAILABLE,
    Prop.SUBSCRIPTION_IDENTIFIER_AVAILABLE, Prop.SHARED_SUBSCRIPTION_AVAILABLE,
))
# ... and these must not be 0 (3.1.2.11.3-4, 3.2.2.3.3, 3.2.2.3.6, 3.3.2.3.8, 3.8.2.1.2; Topic
# Alias: MQTT-3.3.2-8, refused with 0x94 Topic Alias invalid). A Subscription Identifier above
# 268,435,455 cannot be encoded at all: a variable byte integer has at most 4 bytes (``_read_varint``).
_NONZERO_PROPS = frozenset(int(p) for p in (
    Prop.RECEIVE_MAXIMUM, Prop.MAXIMUM_PACKET_SIZE, Prop.SUBSCRIPTION_IDENTIFIER, Prop.TOPIC_ALIAS,
))
_CHECKED_PROPS = _BOOLEAN_PROPS | _NONZERO_PROPS | {_RESPONSE_TOPIC}


def _check_value(pid: int, value: Any) -> None:
    """The value rules of one property (``_CHECKED_PROPS``); off the path of the others."""
    if pid in _BOOLEAN_PROPS:
        if value > 1:
            raise ProtocolError(f"property 0x{pid:02x} must be 0 or 1, not {value}", _PROTOCOL_ERROR)
    elif pid == _RESPONSE_TOPIC:
        # The Topic Name of the response: no wildcards (MQTT-3.3.2-14), not empty (MQTT-4.7.3-1).
        # A Will's too: it is published as a PUBLISH carrying it.
        if not value or "+" in value or "#" in value:
            raise ProtocolError(f"MQTT-3.3.2-14 Response Topic {value!r} is not a valid topic name",
                                _PROTOCOL_ERROR)
    elif not value:  # _NONZERO_PROPS
        if pid == _TOPIC_ALIAS:
            raise ProtocolError("MQTT-3.3.2-8 Topic Alias must not be 0", Reason.TOPIC_ALIAS_INVALID)
        if pid == _SUBID:
            raise ProtocolError("Subscription Identifier must not be 0 (3.3.2.3.8, 3.8.2.1.2)", _PROTOCOL_ERROR)
        raise ProtocolError(f"property 0x{pid:02x} must not be 0", _PROTOCOL_ERROR)


def _read_props(data: bytes, p: int, stop: int, allowed: PropTable) -> tuple[Properties, int]:
    """An MQTT 5 property block (spec 2.2.2): length, then identifier/value pairs, each checked
    against the packet's table (``allowed``) and the value rules above.

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
        many = allowed.get(pid)
        if many is None:
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

        if pid in _CHECKED_PROPS:
            _check_value(pid, value)
        if pid in props:
            if not many:
                raise ProtocolError(f"MQTT-2.2.2 property 0x{pid:02x} included more than once", _PROTOCOL_ERROR)
            values = props[pid]
            values.append(value)
            if len(values) > MAX_USER_PROPERTIES and pid == _USER:
                raise ProtocolError(f"more than {MAX_USER_PROPERTIES} User Properties in one packet",
                                    Reason.QUOTA_EXCEEDED)
        else:
            props[pid] = [value] if pid in _LIST_PROPS else value
    return props, end


def _check_auth_props(props: Properties) -> None:
    """CONNECT (3.1.2.11.10): Authentication Data without an Authentication Method is a Protocol Error."""
    if _AUTH_DATA in props and _AUTH_METHOD not in props:
        raise ProtocolError("Authentication Data without an Authentication Method (3.1.2.11.10)", _PROTOCOL_ERROR)


def _check_payload_format(props: Properties, data: bytes, p: int, stop: int, what: str) -> None:
    """A payload (``data[p:stop]``) whose Payload Format Indicator is 1 must be well-formed UTF-8
    (3.3.2.3.2, 3.1.3.2.3). The standard lets a receiver check it and refuse with 0x99 Payload
    format invalid, as Mosquitto does: a subscriber told "this is text" gets text. Only a payload
    that claims to be text is decoded (in place, without a copy); any other costs a dict lookup."""
    if props.get(_PAYLOAD_FORMAT) == 1:
        try:
            str(memoryview(data)[p:stop], "utf-8")
        except UnicodeDecodeError:
            raise ProtocolError(f"{what} payload has Payload Format Indicator 1 but is not valid UTF-8",
                                Reason.PAYLOAD_FORMAT_INVALID) from None


def _check_client_publish(props: Properties, data: bytes, p: int, stop: int) -> None:
    """The rules of a PUBLISH with properties that only bind a client's: no Subscription
    Identifier (MQTT-3.3.4-6: the server attaches them, one per matching subscription), and the
    payload format (``_check_payload_format``), which the broker checks on the way in only."""
    if _SUBID in props:
        raise ProtocolError("MQTT-3.3.4-6 a PUBLISH from a client must not carry a Subscription Identifier",
                            _PROTOCOL_ERROR)
    _check_payload_format(props, data, p, stop, "PUBLISH")


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
