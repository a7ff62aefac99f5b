"""Reason codes as values, not strings.

MQTT 3.1.1 has CONNACK return codes (0-5) and the SUBACK failure code 0x80; MQTT 5 has one table of
reason codes for every packet. The broker decides in MQTT 5 terms and ``connack_code`` maps the
decision onto the 3.1.1 value when the client speaks 3.1.1.
"""

from __future__ import annotations

from enum import IntEnum


class ConnackV3(IntEnum):
    ACCEPTED = 0
    UNACCEPTABLE_PROTOCOL_VERSION = 1
    IDENTIFIER_REJECTED = 2
    SERVER_UNAVAILABLE = 3
    BAD_USERNAME_OR_PASSWORD = 4
    NOT_AUTHORIZED = 5


class Reason(IntEnum):
    """MQTT 5 reason codes (spec 2.4)."""

    SUCCESS = 0x00
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    CONTINUE_AUTHENTICATION = 0x18
    RE_AUTHENTICATE = 0x19
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


_V5_TO_V3_CONNACK = {
    Reason.SUCCESS: ConnackV3.ACCEPTED,
    Reason.UNSUPPORTED_PROTOCOL_VERSION: ConnackV3.UNACCEPTABLE_PROTOCOL_VERSION,
    Reason.CLIENT_IDENTIFIER_NOT_VALID: ConnackV3.IDENTIFIER_REJECTED,
    Reason.SERVER_UNAVAILABLE: ConnackV3.SERVER_UNAVAILABLE,
    Reason.SERVER_BUSY: ConnackV3.SERVER_UNAVAILABLE,
    Reason.QUOTA_EXCEEDED: ConnackV3.SERVER_UNAVAILABLE,
    Reason.SERVER_SHUTTING_DOWN: ConnackV3.SERVER_UNAVAILABLE,
    Reason.BAD_USER_NAME_OR_PASSWORD: ConnackV3.BAD_USERNAME_OR_PASSWORD,
    Reason.NOT_AUTHORIZED: ConnackV3.NOT_AUTHORIZED,
}


def connack_code(reason: int, protocol_level: int) -> int:
    """The CONNACK code to send for ``reason`` to a client of ``protocol_level``."""
    if protocol_level >= 5:
        return int(reason)
    return int(_V5_TO_V3_CONNACK.get(Reason(reason), ConnackV3.SERVER_UNAVAILABLE))


class ProtocolError(Exception):
    """A rule of the protocol was broken; the connection is closed with ``reason``.

    ``rule`` names the rule in words (and the spec's normative statement where there is one), so
    the log line says exactly why a client was dropped.
    """

    def __init__(self, rule: str, reason: int = Reason.MALFORMED_PACKET) -> None:
        super().__init__(rule)
        self.rule = rule
        self.reason = reason
