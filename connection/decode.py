"""Decoding: bytes → packet values (``Decoder``), the broker's hot path: the framing, and PUBLISH and
PUBACK inline; the other packet kinds' bodies are ``connection.bodies``'.

See ``connection.codec`` for why it is written the way it is (one offset walking over one
``bytes`` object, PUBLISH and PUBACK inline, a first-byte table, a topic cache).
"""

from __future__ import annotations

from typing import ClassVar

from .bodies import BODIES, Body
from .packets import MQTT_3_1, MQTT_5, Packet, Properties, Puback, Publish
from .properties import _PUBLISH_PROPS, _TOPIC_ALIAS, _check_client_publish, _read_props
from .reasons import ProtocolError, Reason
from .wire import (
    _VALID_B0_V3,
    _VALID_B0_V5,
    _VALID_B0_V31,
    MAX_REMAINING_LENGTH,
    _first_byte_error,
    _not_minimal,
    _too_deep,
    _truncated,
    topic_levels_ok,
)

DEFAULT_MAX_TOPIC_LEVELS = 128
"""Most levels a topic name or filter may have (as EMQX's default). MQTT sets no limit, but the
topic walks cost time per level and a 30,000-level topic fits in a packet: a server may refuse
topics it will not handle (MQTT 5: 0x90 Topic Name invalid, 0x8F Topic Filter invalid)."""


_MALFORMED = Reason.MALFORMED_PACKET
_PROTOCOL_ERROR = Reason.PROTOCOL_ERROR

# --------------------------------------------------------------------------------------------------
# Decoder
# --------------------------------------------------------------------------------------------------


def _header_length(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """Remaining length of the packet at ``pos`` and where its body starts; (-1, -1) if incomplete.

    Only called when the length takes more than two bytes, is cut off, or is a two-byte form of a
    value that fits in one (the loop handles valid one- and two-byte lengths inline).
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
            if not b and shift:
                raise _not_minimal()
            return value, p
        shift += 7
    if p == limit:
        raise ProtocolError("MQTT-2.2.3 remaining length longer than 4 bytes", _MALFORMED)
    return -1, -1


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


def qos0_payload(packet: bytes, topic_len: int) -> bytes:
    """The payload of a whole QoS 0 PUBLISH without properties (MQTT 3.1.1 form) whose topic is
    ``topic_len`` bytes: what follows the fixed header, the topic's length and the topic."""
    i = 1
    while packet[i] & 0x80:  # the remaining length's bytes
        i += 1
    return packet[i + 3 + topic_len:]


class Decoder:
    """Incremental MQTT decoder for one connection (either direction).

    ``protocol_level`` selects the wire forms: 5 decodes MQTT 5 properties and reason codes, any
    other value (or None) the 3.1/3.1.1 forms. It is None until a CONNECT is decoded (unless given),
    and decoding a CONNECT sets it to that packet's level *as soon as name and level are checked*,
    before the rest of the CONNECT is parsed, so that after a ProtocolError on a malformed CONNECT
    the caller still knows which form of CONNACK to answer with. Packets after a CONNECT in the same
    ``feed`` are decoded at the new level.

    ``from_client``: the packets come from a client, so the rules that bind only a client's packets
    apply too (no Subscription Identifier in a PUBLISH, no DISCONNECT reason code that only a server
    sends, the payload format check). A decoder that decodes a CONNECT reads a client and sets it
    then (a client's decoder never sees one), so the broker's decoders need not be told.

    After ``feed`` raises, the decoder's state is undefined: the connection is to be closed. The
    ProtocolError then carries ``packets``: the packets decoded from that call's data before the
    violation, in case the caller wants to act on them (for example a DISCONNECT before garbage).
    """

    __slots__ = ("max_packet_size", "protocol_level", "limit", "_buf", "_need", "_connect_seen", "_rest",
                 "_rest_pos", "_max_topic_levels", "_topics", "_from_client")

    def __init__(self, max_packet_size: int = MAX_REMAINING_LENGTH, protocol_level: int | None = None,
                 limit: int = 0, max_topic_levels: int = DEFAULT_MAX_TOPIC_LEVELS,
                 from_client: bool = False) -> None:
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
        # The start of a packet not yet complete: a bytearray while there is one, else the shared
        # b"" (an empty bytearray kept by every idle connection was 56 bytes each).
        self._buf: bytearray | bytes = b""
        self._need = 0  # total size of that packet once its fixed header is known, else 0
        self._connect_seen = False
        self._rest: bytes | None = None  # data beyond the limit, from _rest_pos on
        self._rest_pos = 0
        self._from_client = from_client

    @property
    def from_client(self) -> bool:
        """Whether the client-only rules apply (see the class docstring)."""
        return self._from_client

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

    def feed(self, data: bytes | bytearray | memoryview) -> list[Packet]:
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
                    self._buf = b""
                    self._need = 0
                    self._decode(packet, 0, out)
                else:
                    # Not even the fixed header was complete (at most 4 bytes held): prepend them.
                    data = bytes(buf) + data
                    self._buf = b""
            pos = self._decode(data, pos, out)
        except ProtocolError as exc:
            # (mypy: what was decoded before the error travels with it)
            exc.packets = out  # type: ignore[attr-defined]
            raise
        if pos < len(data):
            self._keep(data, pos)
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
            # (mypy: what was decoded before the error travels with it)
            exc.packets = out  # type: ignore[attr-defined]
            raise
        if pos < len(data):
            self._keep(data, pos)
        return out

    def _keep(self, data: bytes, pos: int) -> None:
        """Hold ``data[pos:]``: the start of a packet not yet complete (after what is held)."""
        if self._buf:
            self._buf += memoryview(data)[pos:]  # a bytearray: in place
        else:
            self._buf = bytearray(memoryview(data)[pos:])

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
        valid = _VALID_B0_V5 if v5 else _VALID_B0_V31 if level == MQTT_3_1 else _VALID_B0_V3
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
            elif pos + 2 < end and 0 < data[pos + 2] < 0x80:  # 128 B to 16 KiB: two bytes, inline too
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
                        if self._from_client:
                            _check_client_publish(props, data, p, stop)
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
                    valid = _VALID_B0_V5 if v5 else _VALID_B0_V31 if level == MQTT_3_1 else _VALID_B0_V3
            pos = stop
            if limit and len(out) >= limit and pos < end:
                self._rest = data
                self._rest_pos = pos
                return end
        return pos

    # The other packet kinds' bodies, indexed by type (connection.bodies); set below the class.
    _decoders: ClassVar[tuple[Body, ...]]


Decoder._decoders = BODIES
