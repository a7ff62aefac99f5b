"""Decoding the body of each packet kind that ``Decoder._decode`` does not decode inline (all but
PUBLISH and the two-byte PUBACK): one function per kind, (decoder, data, start of the body, its end,
v5) -> packet, in ``BODIES`` indexed by packet type (h11's ``_readers.py``). A CONNECT's body sets
the decoder's protocol level; the rest only read it.

Part of the codec's hot path (see ``connection.codec``): plain typed functions, called through the
table as the decoder's methods were.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

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
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
    Will,
)
from .properties import (
    _ACK_PROPS,
    _AUTH_PROPS,
    _CONNACK_PROPS,
    _CONNECT_PROPS,
    _DISCONNECT_PROPS,
    _SUBSCRIBE_PROPS,
    _UNSUBSCRIBE_PROPS,
    _WILL_PROPS,
    PropTable,
    _check_auth_props,
    _check_payload_format,
    _read_props,
)
from .reasons import (
    AUTH_REASONS,
    DISCONNECT_REASONS,
    DISCONNECT_REASONS_FROM_CLIENT,
    PUBACK_REASONS,
    PUBREL_REASONS,
    ProtocolError,
    Reason,
)
from .wire import _read_bin, _read_pid, _read_str, _read_u16, _too_deep, _truncated, topic_levels_ok

if TYPE_CHECKING:
    from .decode import Decoder

Body = Callable[["Decoder", bytes, int, int, bool], Packet]

_MALFORMED = Reason.MALFORMED_PACKET
_PROTOCOL_ERROR = Reason.PROTOCOL_ERROR

# Protocol name and level pairs a CONNECT may carry (MQTT-3.1.2-1, MQTT-3.1.2-2).
_PROTOCOLS = {("MQTT", MQTT_3_1_1), ("MQTT", MQTT_5), ("MQIsdp", MQTT_3_1)}

_AckT = TypeVar("_AckT", Puback, Pubrec, Pubrel, Pubcomp)

# The control characters MQTT 1.5.4 lets a receiver take for a Malformed Packet. A client id holding
# one is refused, as Mosquitto refuses it (closed, no CONNACK): the id goes into log lines as it
# is, and a line feed in it wrote lines of the client's making into the broker's log, a forged
# "user ... is no longer in the password file" warning among them.
_CONTROL = re.compile("[\x01-\x1f\x7f-\x9f]")


def _read_pid_props(data: bytes, p: int, stop: int, v5: bool, allowed: PropTable,
                    required: bool = True) -> tuple[int, Properties, int]:
    """The opening of SUBSCRIBE, SUBACK and UNSUBSCRIBE: a packet identifier (non-zero where
    ``required``), then the MQTT 5 properties. Returns (packet id, properties, where the rest starts)."""
    pid = _read_pid(data, p, stop) if required else _read_u16(data, p, stop, "packet identifier")
    p += 2
    props: Properties = {}
    if v5:
        props, p = _read_props(data, p, stop, allowed)
    return pid, props, p


def _check_topic_name(topic: str, what: str, max_levels: int) -> None:
    """A topic name (not a filter): no wildcards (MQTT-4.7.1-1), not empty (MQTT-4.7.3-1), not
    deeper than ``max_levels``."""
    if not topic:
        raise ProtocolError(f"MQTT-4.7.3-1 {what} must not be empty", Reason.TOPIC_NAME_INVALID)
    if "+" in topic or "#" in topic:
        raise ProtocolError(f"MQTT-3.3.2-2 {what} must not contain wildcards", Reason.TOPIC_NAME_INVALID)
    if not topic_levels_ok(topic, max_levels):
        raise _too_deep(topic, what, max_levels)


def _connect(dec: Decoder, data: bytes, p: int, stop: int, v5: bool) -> Connect:
    if dec._connect_seen:
        raise ProtocolError("MQTT-3.1.0-2 a second CONNECT is a protocol violation", _PROTOCOL_ERROR)
    name, p = _read_str(data, p, stop)
    if p >= stop:
        raise _truncated("CONNECT protocol level")
    level = data[p]
    if (name, level) not in _PROTOCOLS:
        raise ProtocolError(
            f"MQTT-3.1.2-2 unsupported protocol {name!r} level {level}", Reason.UNSUPPORTED_PROTOCOL_VERSION
        )
    dec._connect_seen = True
    dec._from_client = True
    dec.protocol_level = level
    v5 = level == MQTT_5
    if p + 4 > stop:
        raise _truncated("CONNECT flags and keepalive")
    flags = data[p + 1]
    keepalive = data[p + 2] << 8 | data[p + 3]
    p += 4
    if flags & 0x01:
        raise ProtocolError("MQTT-3.1.2-3 reserved CONNECT flag must be 0", _MALFORMED)
    will_flag = flags & 0x04
    will_qos = (flags >> 3) & 3
    will_retain = flags & 0x20
    if not will_flag and (will_qos or will_retain):
        raise ProtocolError("MQTT-3.1.2-13/15 Will QoS and Will Retain must be 0 without a Will", _MALFORMED)
    if will_qos == 3:
        raise ProtocolError("MQTT-3.1.2-14 Will QoS must not be 3", _MALFORMED)
    if not v5 and flags & 0x40 and not flags & 0x80:
        raise ProtocolError("MQTT-3.1.2-22 password flag set without user name flag", _MALFORMED)
    props: Properties = {}
    if v5:
        props, p = _read_props(data, p, stop, _CONNECT_PROPS)
        _check_auth_props(props)
    client_id, p = _read_str(data, p, stop)
    if not (client_id.isascii() and client_id.isprintable()) and _CONTROL.search(client_id):
        raise ProtocolError(f"MQTT-1.5.4 client id {client_id[:64]!r} holds a control character", _MALFORMED)
    will = None
    if will_flag:
        will_props: Properties = {}
        if v5:
            will_props, p = _read_props(data, p, stop, _WILL_PROPS)
        will_topic, p = _read_str(data, p, stop)
        _check_topic_name(will_topic, "Will Topic", dec._max_topic_levels)
        will_payload, p = _read_bin(data, p, stop)
        if will_props:
            _check_payload_format(will_props, data, p - len(will_payload), p, "Will")
        will = Will(will_topic, will_payload, will_qos, bool(will_retain), will_props)
    username = password = None
    if flags & 0x80:
        username, p = _read_str(data, p, stop)
    if flags & 0x40:
        password, p = _read_bin(data, p, stop)
    _check_end(p, stop, "CONNECT")
    return Connect(client_id, level, name, bool(flags & 0x02), keepalive, username, password, will, props)

def _connack(dec: Decoder, data: bytes, p: int, stop: int, v5: bool) -> Connack:
    if p + 2 > stop:
        raise _truncated("CONNACK")
    ack_flags = data[p]
    code = data[p + 1]
    p += 2
    if ack_flags & 0xFE:
        raise ProtocolError("MQTT-3.2.2-1 reserved CONNACK flags must be 0", _MALFORMED)
    props: Properties = {}
    if v5:
        props, p = _read_props(data, p, stop, _CONNACK_PROPS)
    _check_end(p, stop, "CONNACK")
    return Connack(bool(ack_flags), code, props)

def _puback(dec: Decoder, data: bytes, p: int, stop: int, v5: bool) -> Puback:
    return _decode_ack(Puback, "PUBACK", data, p, stop, v5, PUBACK_REASONS)

def _pubrec(dec: Decoder, data: bytes, p: int, stop: int, v5: bool) -> Pubrec:
    return _decode_ack(Pubrec, "PUBREC", data, p, stop, v5, PUBACK_REASONS)

def _pubrel(dec: Decoder, data: bytes, p: int, stop: int, v5: bool) -> Pubrel:
    return _decode_ack(Pubrel, "PUBREL", data, p, stop, v5, PUBREL_REASONS)

def _pubcomp(dec: Decoder, data: bytes, p: int, stop: int, v5: bool) -> Pubcomp:
    return _decode_ack(Pubcomp, "PUBCOMP", data, p, stop, v5, PUBREL_REASONS)

def _subscribe(dec: Decoder, data: bytes, p: int, stop: int, v5: bool) -> Subscribe:
    """Filters and their options; what they mean is the router's to judge, a slice of them per
    loop turn (``Client._take_filters``)."""
    pid, props, p = _read_pid_props(data, p, stop, v5, _SUBSCRIBE_PROPS)
    subs: list[Subscription] = []
    append = subs.append
    bad_bits = 0xC0 if v5 else 0xFC
    while p < stop:
        topic_filter, p = _read_filter(data, p, stop)
        if p >= stop:
            raise _truncated("subscription options")
        opts = data[p]
        p += 1
        if opts & bad_bits or opts & 3 == 3 or (v5 and opts & 0x30 == 0x30):
            _bad_options(opts, v5)
        if v5:
            append(Subscription(topic_filter, opts & 3, bool(opts & 4), bool(opts & 8), (opts >> 4) & 3))
        else:
            append(Subscription(topic_filter, opts))
    if not subs:  # MQTT-3.8.3-2 in the 5.0 numbering
        raise ProtocolError("MQTT-3.8.3-3 SUBSCRIBE must contain at least one topic filter", _PROTOCOL_ERROR)
    return Subscribe(pid, subs, props)

def _suback(dec: Decoder, data: bytes, p: int, stop: int, v5: bool) -> Suback:
    pid, props, p = _read_pid_props(data, p, stop, v5, _ACK_PROPS, required=False)
    return Suback(pid, list(data[p:stop]), props)

def _unsubscribe(dec: Decoder, data: bytes, p: int, stop: int, v5: bool) -> Unsubscribe:
    pid, props, p = _read_pid_props(data, p, stop, v5, _UNSUBSCRIBE_PROPS)
    filters: list[str] = []
    while p < stop:
        topic_filter, p = _read_filter(data, p, stop)
        filters.append(topic_filter)
    if not filters:
        raise ProtocolError(
            "MQTT-3.10.3-2 UNSUBSCRIBE must contain at least one topic filter", _PROTOCOL_ERROR
        )
    return Unsubscribe(pid, filters, props)

def _unsuback(dec: Decoder, data: bytes, p: int, stop: int, v5: bool) -> Unsuback:
    pid = _read_u16(data, p, stop, "packet identifier")
    p += 2
    if not v5:
        _check_end(p, stop, "UNSUBACK")
        return Unsuback(pid)
    props, p = _read_props(data, p, stop, _ACK_PROPS)
    return Unsuback(pid, list(data[p:stop]), props)

def _pingreq(dec: Decoder, data: bytes, p: int, stop: int, v5: bool) -> Pingreq:
    _check_end(p, stop, "PINGREQ")
    return Pingreq()

def _pingresp(dec: Decoder, data: bytes, p: int, stop: int, v5: bool) -> Pingresp:
    _check_end(p, stop, "PINGRESP")
    return Pingresp()

def _disconnect(dec: Decoder, data: bytes, p: int, stop: int, v5: bool) -> Disconnect:
    if not v5:
        _check_end(p, stop, "DISCONNECT")
        return Disconnect()
    codes = DISCONNECT_REASONS_FROM_CLIENT if dec._from_client else DISCONNECT_REASONS
    code, props = _reason_and_props(data, p, stop, _DISCONNECT_PROPS, "DISCONNECT", codes)
    return Disconnect(code, props)

def _auth(dec: Decoder, data: bytes, p: int, stop: int, v5: bool) -> Auth:
    code, props = _reason_and_props(data, p, stop, _AUTH_PROPS, "AUTH", AUTH_REASONS)
    return Auth(code, props)

def _reason_and_props(
    data: bytes, p: int, stop: int, allowed: PropTable, what: str, codes: frozenset[int]
) -> tuple[int, Properties]:
    """v5 DISCONNECT/AUTH body: both fields may be omitted (remaining length 0 = success)."""
    if p == stop:
        return 0, {}
    code = data[p]
    if code not in codes:
        raise _bad_reason(code, what)
    p += 1
    props: Properties = {}
    if p < stop:
        props, p = _read_props(data, p, stop, allowed)
    _check_end(p, stop, what)
    return code, props


BODIES: tuple[Body, ...] = (
    None,  # type: ignore[assignment]  # 0 is rejected by the first-byte table: never called
    _connect,
    _connack,
    None,  # PUBLISH is decoded inline
    _puback,
    _pubrec,
    _pubrel,
    _pubcomp,
    _subscribe,
    _suback,
    _unsubscribe,
    _unsuback,
    _pingreq,
    _pingresp,
    _disconnect,
    _auth,
)


def _check_end(p: int, stop: int, what: str) -> None:
    if p != stop:
        raise ProtocolError(f"malformed packet: {stop - p} unexpected bytes at the end of {what}", _MALFORMED)


def _bad_reason(code: int, what: str) -> ProtocolError:
    """A reason code outside its packet's table (see ``connection.reasons``)."""
    return ProtocolError(f"reason code 0x{code:02x} is not valid in {what} from this sender", _PROTOCOL_ERROR)


def _bad_options(opts: int, v5: bool) -> None:
    """Why a subscription options byte is refused, checked in the order the rules were written."""
    if opts & 3 == 3:
        if v5:  # 3.8.3.1
            raise ProtocolError("subscription Maximum QoS must not be 3", _PROTOCOL_ERROR)
        raise ProtocolError("MQTT-3.8.3-4 subscription QoS must not be 3", _MALFORMED)
    if not v5:
        raise ProtocolError("MQTT-3.8.3-4 reserved subscription option bits must be 0", _MALFORMED)
    if opts & 0xC0:
        raise ProtocolError("MQTT-3.8.3-5 reserved subscription option bits must be 0", _MALFORMED)
    raise ProtocolError("Retain Handling must not be 3 (3.8.3.1)", _PROTOCOL_ERROR)


def _read_filter(data: bytes, p: int, stop: int) -> tuple[str, int]:
    """A SUBSCRIBE or UNSUBSCRIBE topic filter: a UTF-8 string (MQTT-3.8.3-1, MQTT-3.10.3-1) at least
    one character long (MQTT-4.7.3-1). An empty one makes the packet malformed, the whole packet,
    as Mosquitto has it, not a per-filter failure code: the standard leaves no room for an empty
    filter. Its syntax (wildcards, shared-subscription form, depth) is the router's to judge, with
    a SUBACK failure code per filter."""
    topic_filter, p = _read_str(data, p, stop)
    if not topic_filter:
        raise ProtocolError("MQTT-4.7.3-1 topic filter must not be empty", _MALFORMED)
    return topic_filter, p


def _decode_ack(cls: type[_AckT], what: str, data: bytes, p: int, stop: int, v5: bool,
                codes: frozenset[int]) -> _AckT:
    """PUBACK, PUBREC, PUBREL, PUBCOMP: packet id, then (v5) optional reason code (one of ``codes``)
    and properties."""
    pid = _read_pid(data, p, stop)
    p += 2
    if not v5:
        _check_end(p, stop, what)
        return cls(pid)
    code = 0
    props: Properties = {}
    if p < stop:  # 5.0 3.4.2.1: reason code and properties may be omitted
        code = data[p]
        if code not in codes:
            raise _bad_reason(code, what)
        p += 1
        if p < stop:
            props, p = _read_props(data, p, stop, _ACK_PROPS)
    _check_end(p, stop, what)
    return cls(pid, code, props)
