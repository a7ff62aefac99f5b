"""Sans-IO MQTT codec: bytes → packet values (``Decoder``) and packet values → bytes (``encode``).

Nothing here does I/O, logs or keeps time, so the codec is tested with bytes alone and the asyncio
protocol in ``connection.protocol`` stays a thin driver.

Decoding is the broker's hot path (every byte a client sends passes through ``Decoder.feed``), so the
decoder is written for CPython speed rather than elegance:

* one ``feed`` decodes every complete packet in the data with an offset walking over one ``bytes``
  object; nothing is re-concatenated per packet, and only the tail of a packet split across reads is
  kept (in a ``bytearray`` that grows until the packet is whole, so a large packet arriving in many
  reads costs O(size), not O(size²));
* PUBLISH and the short PUBACK are decoded inline in the loop; every other packet goes through one
  method call per packet; PUBLISH topic names come from a small process-wide cache of decoded,
  already validated names;
* the first byte of each packet is checked against a precomputed 256-entry table, so reserved
  flags, reserved packet types and the PUBLISH QoS/DUP rules cost one list index;
* the only per-byte Python loop is the variable byte integer (remaining length, property lengths).

Every protocol violation raises ``ProtocolError(rule, reason)``; ``rule`` names the rule and the
spec's normative statement (3.1.1 numbering, or 5.0 for rules that only exist in 5.0), ``reason`` the
MQTT 5 reason code the connection should be closed with.

Encoding builds whole packets with ``encode``; PUBLISH has ``publish_parts`` so a message is encoded
once per (protocol level, QoS) and QoS>0 sends only add the 2-byte packet id between shared parts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

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
    Prop,
    Properties,
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
from .reasons import ProtocolError, Reason

__all__ = ["Decoder", "encode", "publish_parts", "with_dup", "is_tls_client_hello", "MAX_REMAINING_LENGTH",
           "DEFAULT_MAX_TOPIC_LEVELS", "topic_levels_ok"]

MAX_REMAINING_LENGTH = 268_435_455
"""The largest value a 4-byte variable byte integer holds (spec 1.5.5 / 2.2.3)."""

DEFAULT_MAX_TOPIC_LEVELS = 128
"""Most levels a topic name or filter may have (as EMQX's default). MQTT sets no limit, but the
topic walks cost time per level and a 30,000-level topic fits in a packet: a server may refuse
topics it will not handle (MQTT 5: 0x90 Topic Name invalid, 0x8F Topic Filter invalid)."""


def topic_levels_ok(topic: str, limit: int) -> bool:
    """Whether ``topic`` (a name or a filter) has at most ``limit`` levels: the one place the rule
    is written, for the decoder (PUBLISH and will topics) and the router (SUBSCRIBE filters)."""
    return topic.count("/") < limit

_MALFORMED = Reason.MALFORMED_PACKET
_PROTOCOL_ERROR = Reason.PROTOCOL_ERROR

# Protocol name and level pairs a CONNECT may carry (MQTT-3.1.2-1, MQTT-3.1.2-2).
_PROTOCOLS = {("MQTT", MQTT_3_1_1), ("MQTT", MQTT_5), ("MQIsdp", MQTT_3_1)}

# --------------------------------------------------------------------------------------------------
# First byte of the fixed header
# --------------------------------------------------------------------------------------------------

# Fixed-header flags each packet type must carry (MQTT-2.2.2-1); PUBLISH (3) is checked separately.
_REQUIRED_FLAGS = {1: 0, 2: 0, 4: 0, 5: 0, 6: 2, 7: 0, 8: 2, 9: 0, 10: 2, 11: 0, 12: 0, 13: 0, 14: 0, 15: 0}


def _first_byte_ok(b0: int, v5: bool) -> bool:
    ptype, flags = b0 >> 4, b0 & 0x0F
    if ptype == 3:
        qos = (flags >> 1) & 3
        return qos != 3 and not (flags & 0x08 and qos == 0)
    if ptype == 0 or (ptype == 15 and not v5):
        return False
    return flags == _REQUIRED_FLAGS[ptype]


# Indexed by the first byte: is it acceptable at all? One lookup per packet in the decode loop.
_VALID_B0_V3 = tuple(_first_byte_ok(b, False) for b in range(256))
_VALID_B0_V5 = tuple(_first_byte_ok(b, True) for b in range(256))


def _first_byte_error(b0: int, v5: bool) -> ProtocolError:
    """The precise error for a first byte that the table rejected (off the hot path)."""
    ptype, flags = b0 >> 4, b0 & 0x0F
    if ptype == 0:
        return ProtocolError("MQTT-2.2.1 packet type 0 is reserved", _MALFORMED)
    if ptype == 15 and not v5:
        return ProtocolError("MQTT-2.2.1 packet type 15 (AUTH) is reserved before MQTT 5", _MALFORMED)
    if ptype == 3:
        if (flags >> 1) & 3 == 3:
            return ProtocolError("MQTT-3.3.1-4 PUBLISH must not have both QoS bits set", _MALFORMED)
        return ProtocolError("MQTT-3.3.1-2 DUP must be 0 in a QoS 0 PUBLISH", _MALFORMED)
    return ProtocolError(
        f"MQTT-2.2.2-1 reserved flags of packet type {ptype} must be {_REQUIRED_FLAGS[ptype]:04b}, "
        f"got {flags:04b}",
        _MALFORMED,
    )


# --------------------------------------------------------------------------------------------------
# Field readers. Each takes the packet bytes, a position and the end of the field's enclosing
# structure (the packet, or its property block), and returns (value, next position). Every read is
# checked against that end, so a length that overruns its packet never reads the next packet.
# --------------------------------------------------------------------------------------------------


def _truncated(what: str) -> ProtocolError:
    return ProtocolError(f"malformed packet: {what} runs past the end of the packet", _MALFORMED)


def _read_varint(data: bytes, p: int, stop: int) -> tuple[int, int]:
    """A variable byte integer of at most 4 bytes (spec 1.5.5)."""
    value = 0
    shift = 0
    for _ in range(4):
        if p >= stop:
            raise _truncated("variable byte integer")
        b = data[p]
        p += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, p
        shift += 7
    raise ProtocolError("MQTT-1.5.5 variable byte integer longer than 4 bytes", _MALFORMED)


def _read_u16(data: bytes, p: int, stop: int, what: str) -> int:
    if p + 2 > stop:
        raise _truncated(what)
    return data[p] << 8 | data[p + 1]


def _read_pid(data: bytes, p: int, stop: int) -> int:
    """A packet identifier where one is required: present and non-zero (MQTT-2.3.1-1)."""
    pid = _read_u16(data, p, stop, "packet identifier")
    if not pid:
        raise ProtocolError("MQTT-2.3.1-1 packet identifier must be non-zero", _PROTOCOL_ERROR)
    return pid


def _read_pid_props(data: bytes, p: int, stop: int, v5: bool, allowed: frozenset[int],
                    required: bool = True) -> tuple[int, Properties, int]:
    """The opening of SUBSCRIBE, SUBACK and UNSUBSCRIBE: a packet identifier (non-zero where
    ``required``), then the MQTT 5 properties. Returns (packet id, properties, where the rest starts)."""
    pid = _read_pid(data, p, stop) if required else _read_u16(data, p, stop, "packet identifier")
    p += 2
    props: Properties = {}
    if v5:
        props, p = _read_props(data, p, stop, allowed)
    return pid, props, p


def _read_str(data: bytes, p: int, stop: int) -> tuple[str, int]:
    """A UTF-8 encoded string: valid UTF-8 (MQTT-1.5.3-1) without U+0000 (MQTT-1.5.3-2).

    Python's strict decoder already rejects overlong forms and encoded surrogates (U+D800-DFFF),
    which MQTT-1.5.3-1 forbids too.
    """
    if p + 2 > stop:
        raise _truncated("string length")
    q = p + 2 + (data[p] << 8 | data[p + 1])
    if q > stop:
        raise _truncated("string")
    try:
        s = data[p + 2 : q].decode()
    except UnicodeDecodeError:
        raise ProtocolError("MQTT-1.5.3-1 string is not valid UTF-8", _MALFORMED) from None
    if "\x00" in s:
        raise ProtocolError("MQTT-1.5.3-2 string must not contain U+0000", _MALFORMED)
    return s, q


def _read_bin(data: bytes, p: int, stop: int) -> tuple[bytes, int]:
    """Binary data: a 2-byte length and that many bytes (spec 1.5.6)."""
    if p + 2 > stop:
        raise _truncated("binary data length")
    q = p + 2 + (data[p] << 8 | data[p + 1])
    if q > stop:
        raise _truncated("binary data")
    return data[p + 2 : q], q


def _check_topic_name(topic: str, what: str, max_levels: int) -> None:
    """A topic name (not a filter): no wildcards (MQTT-4.7.1-1), not empty (MQTT-4.7.3-1), not
    deeper than ``max_levels``."""
    if not topic:
        raise ProtocolError(f"MQTT-4.7.3-1 {what} must not be empty", Reason.TOPIC_NAME_INVALID)
    if "+" in topic or "#" in topic:
        raise ProtocolError(f"MQTT-3.3.2-2 {what} must not contain wildcards", Reason.TOPIC_NAME_INVALID)
    if not topic_levels_ok(topic, max_levels):
        raise _too_deep(topic, what, max_levels)


def _too_deep(topic: str, what: str, max_levels: int) -> ProtocolError:
    return ProtocolError(f"{what} has {topic.count('/') + 1} levels, more than the maximum of {max_levels} "
                         "(--max-topic-levels)", Reason.TOPIC_NAME_INVALID)


# --------------------------------------------------------------------------------------------------
# MQTT 5 properties
# --------------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------------
# Decoder
# --------------------------------------------------------------------------------------------------


def _header_length(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """Remaining length of the packet at ``pos`` and where its body starts; (-1, -1) if incomplete.

    Only called when the length takes more than two bytes or is cut off (the loop handles one- and
    two-byte lengths inline).
    """
    value = 0
    shift = 0
    p = pos + 1
    limit = pos + 5
    while p < end and p < limit:
        b = data[p]
        p += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, p
        shift += 7
    if p == limit:
        raise ProtocolError("MQTT-2.2.3 remaining length longer than 4 bytes", _MALFORMED)
    return -1, -1


_AckT = TypeVar("_AckT", Puback, Pubrec, Pubrel, Pubcomp)


_TOPICS: dict[int, dict[bytes, str]] = {}
"""Recently decoded PUBLISH topic names, shared by every decoder of the process with the same
maximum number of topic levels (one cache per limit: a name cached as valid under one limit is
not valid under a lower one; a broker process has one limit, so one cache).

Most traffic reuses a small set of topics, so a dict lookup replaces UTF-8 decoding and validation,
and every message on a topic carries the same ``str`` object, whose hash is computed once for
all the router's dict lookups. Bounded: only short topics are kept, and the dict is cleared when
full (at most about 2.5 MB).
"""
_TOPICS_MAX = 10_000
_TOPIC_CACHE_LEN = 256


def _new_topic(raw: bytes, cache: dict[bytes, str], max_levels: int) -> str:
    """Decode and check a PUBLISH topic name not in the cache, then cache it."""
    try:
        topic = raw.decode()
    except UnicodeDecodeError:
        raise ProtocolError("MQTT-1.5.3-1 topic name is not valid UTF-8", _MALFORMED) from None
    if "\x00" in topic:
        raise ProtocolError("MQTT-1.5.3-2 string must not contain U+0000", _MALFORMED)
    if "+" in topic or "#" in topic:
        raise ProtocolError("MQTT-3.3.2-2 PUBLISH topic name must not contain wildcards", Reason.TOPIC_NAME_INVALID)
    if not topic_levels_ok(topic, max_levels):
        raise _too_deep(topic, "PUBLISH topic name", max_levels)
    if len(raw) <= _TOPIC_CACHE_LEN:
        if len(cache) >= _TOPICS_MAX:
            cache.clear()
        cache[raw] = topic
    return topic


class Decoder:
    """Incremental MQTT decoder for one connection (either direction).

    ``protocol_level`` selects the wire forms: 5 decodes MQTT 5 properties and reason codes, any
    other value (or None) the 3.1/3.1.1 forms. It is None until a CONNECT is decoded (unless given),
    and decoding a CONNECT sets it to that packet's level *as soon as name and level are checked*,
    before the rest of the CONNECT is parsed, so that after a ProtocolError on a malformed CONNECT
    the caller still knows which form of CONNACK to answer with. Packets after a CONNECT in the same
    ``feed`` are decoded at the new level.

    After ``feed`` raises, the decoder's state is undefined: the connection is to be closed. The
    ProtocolError then carries ``packets``: the packets decoded from that call's data before the
    violation, in case the caller wants to act on them (for example a DISCONNECT before garbage).
    """

    __slots__ = ("max_packet_size", "protocol_level", "limit", "_buf", "_need", "_connect_seen", "_rest",
                 "_rest_pos", "_max_topic_levels", "_topics")

    def __init__(self, max_packet_size: int = MAX_REMAINING_LENGTH, protocol_level: int | None = None,
                 limit: int = 0, max_topic_levels: int = DEFAULT_MAX_TOPIC_LEVELS) -> None:
        """``limit``: most packets one ``feed`` or ``more`` decodes (0: all). The rest of the data
        stays here, undecoded and uncopied, until ``more`` is called (see ``has_more``): a reader
        that handles a bounded number of packets per turn also decodes only that many.

        ``max_topic_levels``: a deeper PUBLISH topic name or will topic is a ProtocolError (0x90
        Topic Name invalid). Filters are not checked here: a too-deep one in a SUBSCRIBE gets its
        own failure code in the SUBACK, which is the router's to send (``topic_levels_ok``)."""
        self.max_packet_size = max_packet_size
        self._max_topic_levels = max_topic_levels
        self._topics = _TOPICS.setdefault(max_topic_levels, {})
        self.protocol_level = protocol_level
        self.limit = limit
        self._buf = bytearray()  # the start of a packet not yet complete
        self._need = 0  # total size of that packet once its fixed header is known, else 0
        self._connect_seen = False
        self._rest: bytes | None = None  # data beyond the limit, from _rest_pos on
        self._rest_pos = 0

    @property
    def max_topic_levels(self) -> int:
        """Read-only: the topic-name cache this decoder shares was chosen for this limit."""
        return self._max_topic_levels

    @property
    def buffered(self) -> int:
        """Bytes held of a partial packet."""
        return len(self._buf)

    @property
    def undecoded(self) -> int:
        """Bytes fed but not yet decoded: a partial packet and whatever waits for ``more``."""
        rest = self._rest
        return len(self._buf) + (len(rest) - self._rest_pos if rest is not None else 0)

    def feed(self, data: bytes) -> list[Packet]:
        """Decode every complete packet in buffered data + ``data``; keep a partial one for next time.

        Raises ProtocolError on any violation (with ``.packets``, see the class docstring).
        """
        if type(data) is not bytes:
            data = bytes(data)
        if self._rest is not None:  # fed before ``more`` drained the last read: keep the order
            data = self._rest[self._rest_pos:] + data
            self._rest = None
        out: list[Packet] = []
        pos = 0
        buf = self._buf
        try:
            if buf:
                need = self._need
                if need:
                    # The held packet's size is known: add only what it lacks, decode it alone, and
                    # go on in ``data`` itself, so the rest of this read is never copied.
                    have = len(buf)
                    if have + len(data) < need:
                        buf += data
                        return out
                    pos = need - have
                    buf += memoryview(data)[:pos]
                    packet = bytes(buf)
                    buf.clear()
                    self._need = 0
                    self._decode(packet, 0, out)
                else:
                    # Not even the fixed header was complete (at most 4 bytes held): prepend them.
                    data = bytes(buf) + data
                    buf.clear()
            pos = self._decode(data, pos, out)
        except ProtocolError as exc:
            exc.packets = out  # type: ignore[attr-defined]
            raise
        if pos < len(data):
            buf += memoryview(data)[pos:]
        return out

    @property
    def has_more(self) -> bool:
        """Complete packets may wait beyond the last call's ``limit``."""
        return self._rest is not None

    def more(self) -> list[Packet]:
        """The next ``limit`` packets of what ``feed`` left undecoded (ProtocolError as ``feed``)."""
        data, pos = self._rest, self._rest_pos
        if data is None:
            return []
        self._rest = None
        out: list[Packet] = []
        try:
            pos = self._decode(data, pos, out)
        except ProtocolError as exc:
            exc.packets = out  # type: ignore[attr-defined]
            raise
        if pos < len(data):
            self._buf += memoryview(data)[pos:]
        return out

    def _decode(self, data: bytes, pos: int, out: list[Packet]) -> int:
        """Decode packets from ``data[pos:]`` into ``out``; return where the first incomplete one starts.

        Sets ``_need`` to the size of that incomplete packet when its fixed header is complete. With
        a ``limit``, stops after that many packets in ``out``, keeps the rest as ``_rest`` and returns
        the end of ``data`` (nothing of it is to be buffered).
        """
        end = len(data)
        limit = self.limit
        level = self.protocol_level
        v5 = level == MQTT_5
        valid = _VALID_B0_V5 if v5 else _VALID_B0_V3
        max_size = self.max_packet_size
        append = out.append
        topics = self._topics
        while pos < end:
            b0 = data[pos]
            if not valid[b0]:
                raise _first_byte_error(b0, v5)
            if pos + 1 == end:
                break
            rl = data[pos + 1]
            if rl < 0x80:
                start = pos + 2
            elif pos + 2 < end and data[pos + 2] < 0x80:  # 128 B to 16 KiB: two bytes, inline too
                rl = (rl & 0x7F) | data[pos + 2] << 7
                start = pos + 3
            else:
                rl, start = _header_length(data, pos, end)
                if start < 0:
                    break
            stop = start + rl
            if stop - pos > max_size:
                raise ProtocolError(
                    f"packet of {stop - pos} bytes exceeds the maximum packet size {max_size}",
                    Reason.PACKET_TOO_LARGE,
                )
            if stop > end:
                self._need = stop - pos
                break

            if b0 >> 4 == 3:
                # PUBLISH, inline: the bulk of all traffic.
                if rl < 2:
                    raise _truncated("PUBLISH topic length")
                p = start + 2 + (data[start] << 8 | data[start + 1])
                if p > stop:
                    raise _truncated("PUBLISH topic")
                raw_topic = data[start + 2 : p]
                topic = topics.get(raw_topic)
                if topic is None:
                    topic = _new_topic(raw_topic, topics, self._max_topic_levels)
                qos = (b0 >> 1) & 3
                if qos:
                    if p + 2 > stop:
                        raise _truncated("PUBLISH packet identifier")
                    pid = data[p] << 8 | data[p + 1]
                    if not pid:
                        raise ProtocolError(
                            "MQTT-2.3.1-1 PUBLISH with QoS > 0 needs a non-zero packet identifier",
                            _PROTOCOL_ERROR,
                        )
                    p += 2
                else:
                    pid = None
                if v5:
                    if p < stop and data[p] == 0:
                        props: Properties = {}
                        p += 1
                    else:
                        props, p = _read_props(data, p, stop, _PUBLISH_PROPS)
                    if not topic and _TOPIC_ALIAS not in props:
                        raise ProtocolError(
                            "MQTT-3.3.2-1 empty PUBLISH topic name without a Topic Alias", _PROTOCOL_ERROR
                        )
                else:
                    props = {}
                    if not topic:
                        raise ProtocolError(
                            "MQTT-4.7.3-1 PUBLISH topic name must not be empty", Reason.TOPIC_NAME_INVALID
                        )
                if b0 == 0x30 and not props:
                    append(Publish(topic, data[p:stop], 0, False, False, None, props, data[pos:stop]))
                elif (b0 == 0x32 or b0 == 0x34) and not v5:
                    # QoS 1/2 from MQTT 3.1.1, no RETAIN/DUP: the packet before its packet id is
                    # the head of what subscribers at this QoS get (the payload is the tail).
                    append(Publish(topic, data[p:stop], qos, False, False, pid, props, data[pos : p - 2]))
                else:
                    append(Publish(topic, data[p:stop], qos, b0 & 1 == 1, b0 & 8 == 8, pid, props))
            elif b0 == 0x40 and rl == 2:
                # PUBACK without reason code or properties (any level), inline: one per QoS 1 message.
                pid = data[start] << 8 | data[start + 1]
                if not pid:
                    raise ProtocolError("MQTT-2.3.1-1 packet identifier must be non-zero", _PROTOCOL_ERROR)
                append(Puback(pid))
            else:
                append(self._decoders[b0 >> 4](self, data, start, stop, v5))
                if self.protocol_level != level:  # a CONNECT switched the level
                    level = self.protocol_level
                    v5 = level == MQTT_5
                    valid = _VALID_B0_V5 if v5 else _VALID_B0_V3
            pos = stop
            if limit and len(out) >= limit and pos < end:
                self._rest = data
                self._rest_pos = pos
                return end
        return pos

    # -- one method per packet type: (data, start of body, end of body, v5) -> packet --------------

    def _connect(self, data: bytes, p: int, stop: int, v5: bool) -> Connect:
        if self._connect_seen:
            raise ProtocolError("MQTT-3.1.0-2 a second CONNECT is a protocol violation", _PROTOCOL_ERROR)
        name, p = _read_str(data, p, stop)
        if p >= stop:
            raise _truncated("CONNECT protocol level")
        level = data[p]
        if (name, level) not in _PROTOCOLS:
            raise ProtocolError(
                f"MQTT-3.1.2-2 unsupported protocol {name!r} level {level}", Reason.UNSUPPORTED_PROTOCOL_VERSION
            )
        self._connect_seen = True
        self.protocol_level = level
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
        client_id, p = _read_str(data, p, stop)
        will = None
        if will_flag:
            will_props: Properties = {}
            if v5:
                will_props, p = _read_props(data, p, stop, _WILL_PROPS)
            will_topic, p = _read_str(data, p, stop)
            _check_topic_name(will_topic, "Will Topic", self._max_topic_levels)
            will_payload, p = _read_bin(data, p, stop)
            will = Will(will_topic, will_payload, will_qos, bool(will_retain), will_props)
        username = password = None
        if flags & 0x80:
            username, p = _read_str(data, p, stop)
        if flags & 0x40:
            password, p = _read_bin(data, p, stop)
        _check_end(p, stop, "CONNECT")
        return Connect(client_id, level, name, bool(flags & 0x02), keepalive, username, password, will, props)

    def _connack(self, data: bytes, p: int, stop: int, v5: bool) -> Connack:
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

    def _puback(self, data: bytes, p: int, stop: int, v5: bool) -> Puback:
        return _decode_ack(Puback, "PUBACK", data, p, stop, v5)

    def _pubrec(self, data: bytes, p: int, stop: int, v5: bool) -> Pubrec:
        return _decode_ack(Pubrec, "PUBREC", data, p, stop, v5)

    def _pubrel(self, data: bytes, p: int, stop: int, v5: bool) -> Pubrel:
        return _decode_ack(Pubrel, "PUBREL", data, p, stop, v5)

    def _pubcomp(self, data: bytes, p: int, stop: int, v5: bool) -> Pubcomp:
        return _decode_ack(Pubcomp, "PUBCOMP", data, p, stop, v5)

    def _subscribe(self, data: bytes, p: int, stop: int, v5: bool) -> Subscribe:
        pid, props, p = _read_pid_props(data, p, stop, v5, _SUBSCRIBE_PROPS)
        subs: list[Subscription] = []
        while p < stop:
            topic_filter, p = _read_str(data, p, stop)
            if p >= stop:
                raise _truncated("subscription options")
            opts = data[p]
            p += 1
            qos = opts & 3
            if qos == 3:
                raise ProtocolError("MQTT-3.8.3-4 subscription QoS must not be 3", _MALFORMED)
            if v5:
                if opts & 0xC0:
                    raise ProtocolError("MQTT-3.8.3-5 reserved subscription option bits must be 0", _MALFORMED)
                retain_handling = (opts >> 4) & 3
                if retain_handling == 3:
                    raise ProtocolError("MQTT-3.8.3.1 Retain Handling must not be 3", _PROTOCOL_ERROR)
                subs.append(Subscription(topic_filter, qos, bool(opts & 4), bool(opts & 8), retain_handling))
            else:
                if opts & 0xFC:
                    raise ProtocolError("MQTT-3.8.3-4 reserved subscription option bits must be 0", _MALFORMED)
                subs.append(Subscription(topic_filter, qos))
        if not subs:
            raise ProtocolError("MQTT-3.8.3-3 SUBSCRIBE must contain at least one topic filter", _PROTOCOL_ERROR)
        return Subscribe(pid, subs, props)

    def _suback(self, data: bytes, p: int, stop: int, v5: bool) -> Suback:
        pid, props, p = _read_pid_props(data, p, stop, v5, _ACK_PROPS, required=False)
        return Suback(pid, list(data[p:stop]), props)

    def _unsubscribe(self, data: bytes, p: int, stop: int, v5: bool) -> Unsubscribe:
        pid, props, p = _read_pid_props(data, p, stop, v5, _UNSUBSCRIBE_PROPS)
        filters: list[str] = []
        while p < stop:
            topic_filter, p = _read_str(data, p, stop)
            filters.append(topic_filter)
        if not filters:
            raise ProtocolError(
                "MQTT-3.10.3-2 UNSUBSCRIBE must contain at least one topic filter", _PROTOCOL_ERROR
            )
        return Unsubscribe(pid, filters, props)

    def _unsuback(self, data: bytes, p: int, stop: int, v5: bool) -> Unsuback:
        pid = _read_u16(data, p, stop, "packet identifier")
        p += 2
        if not v5:
            _check_end(p, stop, "UNSUBACK")
            return Unsuback(pid)
        props, p = _read_props(data, p, stop, _ACK_PROPS)
        return Unsuback(pid, list(data[p:stop]), props)

    def _pingreq(self, data: bytes, p: int, stop: int, v5: bool) -> Pingreq:
        _check_end(p, stop, "PINGREQ")
        return Pingreq()

    def _pingresp(self, data: bytes, p: int, stop: int, v5: bool) -> Pingresp:
        _check_end(p, stop, "PINGRESP")
        return Pingresp()

    def _disconnect(self, data: bytes, p: int, stop: int, v5: bool) -> Disconnect:
        if not v5:
            _check_end(p, stop, "DISCONNECT")
            return Disconnect()
        code, props = self._reason_and_props(data, p, stop, _DISCONNECT_PROPS, "DISCONNECT")
        return Disconnect(code, props)

    def _auth(self, data: bytes, p: int, stop: int, v5: bool) -> Auth:
        code, props = self._reason_and_props(data, p, stop, _AUTH_PROPS, "AUTH")
        return Auth(code, props)

    @staticmethod
    def _reason_and_props(
        data: bytes, p: int, stop: int, allowed: frozenset[int], what: str
    ) -> tuple[int, Properties]:
        """v5 DISCONNECT/AUTH body: both fields may be omitted (remaining length 0 = success)."""
        if p == stop:
            return 0, {}
        code = data[p]
        p += 1
        props: Properties = {}
        if p < stop:
            props, p = _read_props(data, p, stop, allowed)
        _check_end(p, stop, what)
        return code, props

    _decoders: tuple[Callable[[Decoder, bytes, int, int, bool], Packet], ...]  # indexed by type


Decoder._decoders = (
    None,  # type: ignore[assignment]  # 0 is rejected by the first-byte table
    Decoder._connect,
    Decoder._connack,
    None,  # PUBLISH is decoded inline
    Decoder._puback,
    Decoder._pubrec,
    Decoder._pubrel,
    Decoder._pubcomp,
    Decoder._subscribe,
    Decoder._suback,
    Decoder._unsubscribe,
    Decoder._unsuback,
    Decoder._pingreq,
    Decoder._pingresp,
    Decoder._disconnect,
    Decoder._auth,
)


def _check_end(p: int, stop: int, what: str) -> None:
    if p != stop:
        raise ProtocolError(f"malformed packet: {stop - p} unexpected bytes at the end of {what}", _MALFORMED)


def _decode_ack(cls: type[_AckT], what: str, data: bytes, p: int, stop: int, v5: bool) -> _AckT:
    """PUBACK, PUBREC, PUBREL, PUBCOMP: packet id, then (v5) optional reason code and properties."""
    pid = _read_pid(data, p, stop)
    p += 2
    if not v5:
        _check_end(p, stop, what)
        return cls(pid)
    code = 0
    props: Properties = {}
    if p < stop:  # 5.0 3.4.2.1: reason code and properties may be omitted
        code = data[p]
        p += 1
        if p < stop:
            props, p = _read_props(data, p, stop, _ACK_PROPS)
    _check_end(p, stop, what)
    return cls(pid, code, props)


# --------------------------------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------------------------------

_ONE_BYTE = tuple(bytes((i,)) for i in range(256))


def _varint(n: int) -> bytes:
    """Variable byte integer (spec 1.5.5)."""
    if n < 0x80:
        return _ONE_BYTE[n]
    if n > MAX_REMAINING_LENGTH:
        raise ValueError(f"{n} does not fit a variable byte integer")
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _str(s: str) -> bytes:
    raw = s.encode()
    if len(raw) > 0xFFFF:
        raise ValueError("string longer than 65535 bytes")
    return len(raw).to_bytes(2, "big") + raw


def _bin(b: bytes) -> bytes:
    if len(b) > 0xFFFF:
        raise ValueError("binary data longer than 65535 bytes")
    return len(b).to_bytes(2, "big") + bytes(b)


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


def _packet(b0: int, body: bytes) -> bytes:
    return _ONE_BYTE[b0] + _varint(len(body)) + body


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
    body = bytes((1 if pk.session_present else 0, pk.reason_code))
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


def is_tls_client_hello(data: bytes) -> bool:
    """Do these first bytes of a connection look like a TLS handshake record?

    A TLS record starts 0x16 (handshake), 0x03 0x00-0x04 (version), 2 length bytes, then 0x01 for
    ClientHello. 0x16 can never start an MQTT stream (CONNECT with reserved flags 0110), so a
    prefix shorter than that already decides it; the remaining bytes are checked where present.
    """
    n = len(data)
    if n == 0 or data[0] != 0x16:
        return False
    if n > 1 and data[1] != 0x03:
        return False
    if n > 2 and data[2] > 0x04:
        return False
    return not (n > 5 and data[5] != 0x01)
