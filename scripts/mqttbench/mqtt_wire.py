"""MQTT 3.1.1 on the wire, encoded by hand: the few packets the load generator sends and reads.

Why by hand: the generator must cost far less CPU than the broker it drives, and must not share code
with it (a codec bug would then hide itself). Publishers send pre-encoded bytes; subscribers count
packets by reading fixed headers only (``count_packets``), and look into a packet only where they
must (packet ids to acknowledge, timestamps of the latency side channel).
"""

from __future__ import annotations

import struct

CONNECT = 1
CONNACK = 2
PUBLISH = 3
PUBACK = 4
SUBSCRIBE = 8
SUBACK = 9
DISCONNECT_PACKET = b"\xe0\x00"

PROTOCOL_LEVEL_3_1_1 = 4


def encode_remaining_length(n: int) -> bytes:
    """The variable byte integer of the fixed header (spec 2.2.3)."""
    if not 0 <= n <= 268_435_455:
        raise ValueError(f"remaining length out of range: {n}")
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _utf8(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack(">H", len(b)) + b


def connect(client_id: str, keepalive: int = 0, clean_session: bool = True) -> bytes:
    """CONNECT with no will, user or password. Keepalive 0 (off) so short runs need no PINGREQ."""
    flags = 0x02 if clean_session else 0x00
    body = _utf8("MQTT") + bytes([PROTOCOL_LEVEL_3_1_1, flags]) + struct.pack(">H", keepalive)
    body += _utf8(client_id)
    return bytes([CONNECT << 4]) + encode_remaining_length(len(body)) + body


def subscribe(packet_id: int, topic_filter: str, qos: int) -> bytes:
    """SUBSCRIBE to one filter (fixed header flags 0b0010 as the spec requires)."""
    body = struct.pack(">H", packet_id) + _utf8(topic_filter) + bytes([qos])
    return bytes([(SUBSCRIBE << 4) | 0x02]) + encode_remaining_length(len(body)) + body


def publish(topic: str | bytes, payload: bytes, qos: int = 0, packet_id: int = 0, retain: bool = False) -> bytes:
    """PUBLISH; ``packet_id`` is only written for QoS > 0."""
    first = (PUBLISH << 4) | (qos << 1) | (1 if retain else 0)
    var = _utf8(topic)
    if qos:
        if not 1 <= packet_id <= 0xFFFF:
            raise ValueError("QoS > 0 needs a packet id in 1..65535")
        var += struct.pack(">H", packet_id)
    body_len = len(var) + len(payload)
    return bytes([first]) + encode_remaining_length(body_len) + var + payload


def puback(packet_id: int) -> bytes:
    return struct.pack(">BBH", PUBACK << 4, 2, packet_id)


# Every PUBACK a subscriber may need, built once: acknowledging is then a list index and a join.
PUBACKS: tuple[bytes, ...] = tuple(puback(i) if i else b"" for i in range(0x10000))


def decode_remaining_length(buf: bytes, pos: int) -> tuple[int, int] | None:
    """(value, index after it) of the variable byte integer at ``pos``; None if ``buf`` ends first."""
    value = 0
    shift = 0
    for k in range(4):
        if pos + k >= len(buf):
            return None
        byte = buf[pos + k]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos + k + 1
        shift += 7
    raise ValueError("malformed remaining length (more than 4 bytes)")


def count_packets(buf: bytes, pos: int = 0) -> tuple[int, int]:
    """Count the whole packets in ``buf`` from ``pos``: (count, index of the first incomplete byte).

    The hot path of every subscriber: one or two byte reads per packet, no slicing. Remaining
    lengths below 128 (16 B payloads) and below 16384 (1 KiB payloads) are handled inline.
    """
    n = len(buf)
    count = 0
    while pos + 2 <= n:
        rl = buf[pos + 1]
        if rl < 0x80:
            end = pos + 2 + rl
        elif pos + 3 <= n and buf[pos + 2] < 0x80:
            end = pos + 3 + ((rl & 0x7F) | (buf[pos + 2] << 7))
        else:
            dec = decode_remaining_length(buf, pos + 1)
            if dec is None:
                break
            end = dec[1] + dec[0]
        if end > n:
            break
        count += 1
        pos = end
    return count, pos


def fixed_header(buf: bytes, pos: int = 0) -> tuple[bytes, int] | None:
    """The fixed header of the packet at ``pos`` and that packet's whole length, or None if
    ``buf`` ends inside the fixed header."""
    dec = decode_remaining_length(buf, pos + 1)
    if dec is None:
        return None
    rl, body = dec
    return buf[pos:body], body - pos + rl


def count_same(buf: bytes, pos: int, plen: int, head: bytes) -> tuple[int, int]:
    """``count_packets`` for a stream of packets that all have ``plen`` bytes and the fixed header
    ``head`` (one topic, one payload size: every load scenario but fanin): strided slices check
    each header byte of every packet in C, instead of a Python loop per packet. (-1, pos) if
    some packet is not like that: the caller counts with ``count_packets``."""
    n = (len(buf) - pos) // plen
    if n == 0:
        return 0, pos
    end = pos + n * plen
    for i, byte in enumerate(head):
        if buf[pos + i : end : plen].count(byte) != n:
            return -1, pos
    return n, end


def publish_topic(buf: bytes, pos: int = 0) -> bytes | None:
    """The topic of the PUBLISH at ``pos``; b"" if that packet is not a PUBLISH; None if ``buf`` ends first.

    Subscribers check the first packet of every read with it: cheap, and a stream that is not what
    was subscribed to (wrong packets, lost framing) shows up at once instead of inflating counts.
    """
    if pos >= len(buf):
        return None
    if buf[pos] >> 4 != PUBLISH:
        return b""
    dec = decode_remaining_length(buf, pos + 1)
    if dec is None or dec[1] + 2 > len(buf):
        return None
    at = dec[1]
    end = at + 2 + ((buf[at] << 8) | buf[at + 1])
    return bytes(buf[at + 2 : end]) if end <= len(buf) else None


def iter_packets(buf: bytes, pos: int = 0) -> tuple[list[tuple[int, int, int]], int]:
    """Whole packets in ``buf`` as (first byte, body start, end) and the index where parsing stopped."""
    out: list[tuple[int, int, int]] = []
    n = len(buf)
    while pos + 2 <= n:
        dec = decode_remaining_length(buf, pos + 1)
        if dec is None:
            break
        length, body = dec
        end = body + length
        if end > n:
            break
        out.append((buf[pos], body, end))
        pos = end
    return out, pos
