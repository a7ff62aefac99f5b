"""Decoding: bytes → packet values (``Decoder``), the broker's hot path.

See ``connection.codec`` for why it is written the way it is (one offset walking over one
``bytes`` object, PUBLISH and PUBACK inline, a first-byte table, a topic cache).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

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
    _PUBLISH_PROPS,
    _SUBSCRIBE_PROPS,
    _TOPIC_ALIAS,
    _UNSUBSCRIBE_PROPS,
    _WILL_PROPS,
    PropTable,
    _check_auth_props,
    _check_client_publish,
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
from .wire import (
    _VALID_B0_V3,
    _VALID_B0_V5,
    _VALID_B0_V31,
    MAX_REMAINING_LENGTH,
    _first_byte_error,
    _not_minimal,
    _read_bin,
    _read_pid,
    _read_str,
    _read_u16,
    _truncated,
)

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


def _too_deep(topic: str, what: str, max_levels: int) -> ProtocolError:
    return ProtocolError(f"{what} has {topic.count('/') + 1} levels, more than the maximum of {max_levels} "
                         "(--max-topic-levels)", Reason.TOPIC_NAME_INVALID)


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
        self._buf = bytearray()  # the start of a packet not yet complete
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
        self._from_client = True
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
            _check_auth_props(props)
        client_id, p = _read_str(data, p, stop)
        will = None
        if will_flag:
            will_props: Properties = {}
            if v5:
                will_props, p = _read_props(data, p, stop, _WILL_PROPS)
            will_topic, p = _read_str(data, p, stop)
            _check_topic_name(will_topic, "Will Topic", self._max_topic_levels)
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
        return _decode_ack(Puback, "PUBACK", data, p, stop, v5, PUBACK_REASONS)

    def _pubrec(self, data: bytes, p: int, stop: int, v5: bool) -> Pubrec:
        return _decode_ack(Pubrec, "PUBREC", data, p, stop, v5, PUBACK_REASONS)

    def _pubrel(self, data: bytes, p: int, stop: int, v5: bool) -> Pubrel:
        return _decode_ack(Pubrel, "PUBREL", data, p, stop, v5, PUBREL_REASONS)

    def _pubcomp(self, data: bytes, p: int, stop: int, v5: bool) -> Pubcomp:
        return _decode_ack(Pubcomp, "PUBCOMP", data, p, stop, v5, PUBREL_REASONS)

    def _subscribe(self, data: bytes, p: int, stop: int, v5: bool) -> Subscribe:
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

    def _suback(self, data: bytes, p: int, stop: int, v5: bool) -> Suback:
        pid, props, p = _read_pid_props(data, p, stop, v5, _ACK_PROPS, required=False)
        return Suback(pid, list(data[p:stop]), props)

    def _unsubscribe(self, data: bytes, p: int, stop: int, v5: bool) -> Unsubscribe:
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
        codes = DISCONNECT_REASONS_FROM_CLIENT if self._from_client else DISCONNECT_REASONS
        code, props = self._reason_and_props(data, p, stop, _DISCONNECT_PROPS, "DISCONNECT", codes)
        return Disconnect(code, props)

    def _auth(self, data: bytes, p: int, stop: int, v5: bool) -> Auth:
        code, props = self._reason_and_props(data, p, stop, _AUTH_PROPS, "AUTH", AUTH_REASONS)
        return Auth(code, props)

    @staticmethod
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
