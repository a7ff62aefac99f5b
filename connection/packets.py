"""MQTT control packets as plain values, for protocol levels 3 (3.1), 4 (3.1.1) and 5 (5.0).

The codec turns bytes into these and back; nothing here does I/O. Every packet type carries the
fields of the richest version it exists in (MQTT 5 reason codes and properties), with defaults
that encode to the 3.1.1 form, so MQTT 5 slots in without a second set of classes.

Properties are a dict keyed by the numeric property identifier (see ``Prop``); a property that
may repeat (User Property, Subscription Identifier) holds a list.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

MQTT_3_1 = 3
MQTT_3_1_1 = 4
MQTT_5 = 5


class PacketType(IntEnum):
    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


class Prop(IntEnum):
    """MQTT 5 property identifiers (spec 2.2.2.2)."""

    PAYLOAD_FORMAT_INDICATOR = 0x01
    MESSAGE_EXPIRY_INTERVAL = 0x02
    CONTENT_TYPE = 0x03
    RESPONSE_TOPIC = 0x08
    CORRELATION_DATA = 0x09
    SUBSCRIPTION_IDENTIFIER = 0x0B
    SESSION_EXPIRY_INTERVAL = 0x11
    ASSIGNED_CLIENT_IDENTIFIER = 0x12
    SERVER_KEEP_ALIVE = 0x13
    AUTHENTICATION_METHOD = 0x15
    AUTHENTICATION_DATA = 0x16
    REQUEST_PROBLEM_INFORMATION = 0x17
    WILL_DELAY_INTERVAL = 0x18
    REQUEST_RESPONSE_INFORMATION = 0x19
    RESPONSE_INFORMATION = 0x1A
    SERVER_REFERENCE = 0x1C
    REASON_STRING = 0x1F
    RECEIVE_MAXIMUM = 0x21
    TOPIC_ALIAS_MAXIMUM = 0x22
    TOPIC_ALIAS = 0x23
    MAXIMUM_QOS = 0x24
    RETAIN_AVAILABLE = 0x25
    USER_PROPERTY = 0x26
    MAXIMUM_PACKET_SIZE = 0x27
    WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
    SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
    SHARED_SUBSCRIPTION_AVAILABLE = 0x2A


Properties = dict[int, Any]


@dataclass(slots=True)
class Will:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Connect:
    client_id: str
    protocol_level: int = MQTT_3_1_1
    protocol_name: str = "MQTT"
    clean_start: bool = True
    keepalive: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Connack:
    session_present: bool = False
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Publish:
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = field(default_factory=dict)
    # The packet's own bytes when they are also what a subscriber of the same protocol level gets
    # at QoS 0 (QoS 0, no RETAIN/DUP, no properties): set by the decoder so the router can forward
    # them as they came instead of encoding the same bytes again. For QoS 1/2 from MQTT 3.1.1
    # (no RETAIN/DUP) it is the packet up to its packet identifier: the head that subscribers at
    # the same QoS get before their own packet id and the payload. Not part of equality.
    raw: bytes | None = field(default=None, compare=False, repr=False)


@dataclass(slots=True)
class Puback:
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Pubrec:
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Pubrel:
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Pubcomp:
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Subscription:
    """One topic filter of a SUBSCRIBE with its options (MQTT 5 option bits default off)."""

    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    sub_id: int = 0  # MQTT 5 Subscription Identifier of its SUBSCRIBE (0: none)

    def to_values(self) -> tuple:
        """As plain values (msgpack-able): session transfer, snapshots. One home for the form."""
        return (self.topic_filter, self.qos, self.no_local, self.retain_as_published, self.retain_handling,
                self.sub_id)

    @classmethod
    def from_values(cls, values: list | tuple) -> Subscription:
        """The inverse of ``to_values``; also takes the five values written before identifiers,
        and None for "no identifier" (0). Values come from peers and from disk: the compiled
        build checks each field's type, so they are made what the fields say here."""
        sub_id = values[5] if len(values) > 5 else 0
        return cls(values[0], values[1], bool(values[2]), bool(values[3]), values[4], sub_id or 0)


@dataclass(slots=True)
class Subscribe:
    packet_id: int
    subscriptions: list[Subscription] = field(default_factory=list)
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Suback:
    packet_id: int
    reason_codes: list[int] = field(default_factory=list)
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Unsubscribe:
    packet_id: int
    topic_filters: list[str] = field(default_factory=list)
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Unsuback:
    """In 3.1.1 UNSUBACK has no payload; ``reason_codes`` is only encoded for MQTT 5."""

    packet_id: int
    reason_codes: list[int] = field(default_factory=list)
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Pingreq:
    pass


@dataclass(slots=True)
class Pingresp:
    pass


@dataclass(slots=True)
class Disconnect:
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Auth:
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


Packet = (
    Connect | Connack | Publish | Puback | Pubrec | Pubrel | Pubcomp | Subscribe | Suback
    | Unsubscribe | Unsuback | Pingreq | Pingresp | Disconnect | Auth
)
