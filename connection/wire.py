"""MQTT's data representations (spec 1.5), read and written: variable byte integers, two-byte
integers, UTF-8 strings and binary data, and the fixed header's first byte.

Readers take the packet bytes, a position and the end of the field's enclosing structure (the
packet, or its property block), and return (value, next position); every read is checked against
that end, so a length that overruns its packet never reads the next packet. Writers return bytes.
Shared by ``connection.properties``, ``connection.decode``, ``connection.bodies`` and
``connection.encode``; so is the rule on a topic's depth (``topic_levels_ok``).
"""

from __future__ import annotations

from .reasons import ProtocolError, Reason

MAX_REMAINING_LENGTH = 268_435_455
"""The largest value a 4-byte variable byte integer holds (spec 1.5.5 / 2.2.3)."""

# First bytes of the packets the router writes or checks as bytes (no DUP, no RETAIN).
PUBLISH_QOS0, PUBLISH_QOS1, PUBLISH_QOS2 = 0x30, 0x32, 0x34
PUBACK, PUBREC, PUBREL, PUBCOMP = 0x40, 0x50, 0x62, 0x70

_MALFORMED = Reason.MALFORMED_PACKET
_PROTOCOL_ERROR = Reason.PROTOCOL_ERROR

# --------------------------------------------------------------------------------------------------
# First byte of the fixed header
# --------------------------------------------------------------------------------------------------

# Fixed-header flags each packet type must carry (MQTT-2.2.2-1); PUBLISH (3) is checked separately.
_REQUIRED_FLAGS = {1: 0, 2: 0, 4: 0, 5: 0, 6: 2, 7: 0, 8: 2, 9: 0, 10: 2, 11: 0, 12: 0, 13: 0, 14: 0, 15: 0}


# MQTT 3.1 set DUP on a PUBREL, SUBSCRIBE or UNSUBSCRIBE it sent again (3.1 section 2.1): a 3.1
# client resending its PUBREL after a reconnect must get its PUBCOMP, not a close (Mosquitto checks
# these flags from 3.1.1 on only).
_DUP = 0x08
_DUP_IN_31 = (6, 8, 10)


def _first_byte_ok(b0: int, v5: bool, v31: bool = False) -> bool:
    ptype, flags = b0 >> 4, b0 & 0x0F
    if ptype == 3:
        qos = (flags >> 1) & 3
        return qos != 3 and not (flags & 0x08 and qos == 0)
    if ptype == 0 or (ptype == 15 and not v5):
        return False
    if v31 and ptype in _DUP_IN_31:
        flags &= ~_DUP
    return flags == _REQUIRED_FLAGS[ptype]


# Indexed by the first byte: is it acceptable at all? One lookup per packet in the decode loop.
_VALID_B0_V3 = tuple(_first_byte_ok(b, False) for b in range(256))
_VALID_B0_V5 = tuple(_first_byte_ok(b, True) for b in range(256))
_VALID_B0_V31 = tuple(_first_byte_ok(b, False, True) for b in range(256))


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
    """A variable byte integer of at most 4 bytes (spec 1.5.5), in its shortest form (MQTT-1.5.5-1).

    At most 4 bytes also bounds every value read here (a Subscription Identifier among them) to
    268,435,455, the largest the standard allows."""
    value = 0
    shift = 0
    for _ in range(4):
        if p >= stop:
            raise _truncated("variable byte integer")
        b = data[p]
        p += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            if not b and shift:
                raise _not_minimal()
            return value, p
        shift += 7
    raise ProtocolError("MQTT-1.5.5 variable byte integer longer than 4 bytes", _MALFORMED)


def _not_minimal() -> ProtocolError:
    """A variable byte integer whose last byte is 0 after a continuation byte is longer than its
    value needs: the standard allows one encoding per value (MQTT-1.5.5-1), so it is malformed."""
    return ProtocolError("MQTT-1.5.5-1 variable byte integer not in its shortest form", _MALFORMED)


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


def _packet(b0: int, body: bytes) -> bytes:
    return _ONE_BYTE[b0] + _varint(len(body)) + body


# --------------------------------------------------------------------------------------------------
# Topic names (4.7): their depth
# --------------------------------------------------------------------------------------------------


def topic_levels_ok(topic: str, limit: int) -> bool:
    """Whether ``topic`` (a name or a filter) has at most ``limit`` levels: the one place the rule
    is written, for the decoder (PUBLISH and will topics) and the router (SUBSCRIBE filters)."""
    return topic.count("/") < limit


def _too_deep(topic: str, what: str, max_levels: int) -> ProtocolError:
    return ProtocolError(f"{what} has {topic.count('/') + 1} levels, more than the maximum of {max_levels} "
                         "(--max-topic-levels)", Reason.TOPIC_NAME_INVALID)
