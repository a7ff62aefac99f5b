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


# Which reason codes each acknowledgement, DISCONNECT and AUTH may carry (MQTT 5 section 3; for
# DISCONNECT also by who sends it): the one home of these tables, which the decoder checks. A code
# outside its table breaks the sender's "MUST use one of the ... Reason Codes" (MQTT-3.4.2-1,
# MQTT-3.5.2-1, MQTT-3.6.2-1, MQTT-3.7.2-1, MQTT-3.14.2-1, MQTT-3.15.2-1): a Protocol Error, as
# Mosquitto treats it.
_R = Reason
PUBACK_REASONS = frozenset({  # Table 3-4 (PUBACK) and 3-5 (PUBREC) list the same codes
    _R.SUCCESS, _R.NO_MATCHING_SUBSCRIBERS, _R.UNSPECIFIED_ERROR, _R.IMPLEMENTATION_SPECIFIC_ERROR,
    _R.NOT_AUTHORIZED, _R.TOPIC_NAME_INVALID, _R.PACKET_IDENTIFIER_IN_USE, _R.QUOTA_EXCEEDED,
    _R.PAYLOAD_FORMAT_INVALID,
})
PUBREL_REASONS = frozenset({_R.SUCCESS, _R.PACKET_IDENTIFIER_NOT_FOUND})  # Tables 3-6 and 3-7 (PUBCOMP)
DISCONNECT_REASONS_FROM_CLIENT = frozenset({  # Table 3-10, "Client" or "Client & Server"
    _R.SUCCESS, _R.DISCONNECT_WITH_WILL, _R.UNSPECIFIED_ERROR, _R.MALFORMED_PACKET, _R.PROTOCOL_ERROR,
    _R.IMPLEMENTATION_SPECIFIC_ERROR, _R.TOPIC_NAME_INVALID, _R.RECEIVE_MAXIMUM_EXCEEDED,
    _R.TOPIC_ALIAS_INVALID, _R.PACKET_TOO_LARGE, _R.MESSAGE_RATE_TOO_HIGH, _R.QUOTA_EXCEEDED,
    _R.ADMINISTRATIVE_ACTION, _R.PAYLOAD_FORMAT_INVALID,
})
DISCONNECT_REASONS = DISCONNECT_REASONS_FROM_CLIENT | {  # ... and those only a Server sends
    _R.NOT_AUTHORIZED, _R.SERVER_BUSY, _R.SERVER_SHUTTING_DOWN, _R.KEEP_ALIVE_TIMEOUT, _R.SESSION_TAKEN_OVER,
    _R.TOPIC_FILTER_INVALID, _R.RETAIN_NOT_SUPPORTED, _R.QOS_NOT_SUPPORTED, _R.USE_ANOTHER_SERVER,
    _R.SERVER_MOVED, _R.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED, _R.CONNECTION_RATE_EXCEEDED,
    _R.MAXIMUM_CONNECT_TIME, _R.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED, _R.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED,
}
AUTH_REASONS = frozenset({_R.SUCCESS, _R.CONTINUE_AUTHENTICATION, _R.RE_AUTHENTICATE})  # Table 3-11
del _R


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
