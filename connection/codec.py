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

The codec lives in five modules, h11's way: ``connection.wire`` (MQTT's data representations),
``connection.properties`` (MQTT 5 properties), ``connection.decode`` (the framing, PUBLISH and
PUBACK), ``connection.bodies`` (the other packet kinds' bodies) and ``connection.encode``; this
module is their public face.
"""

from __future__ import annotations

from .decode import DEFAULT_MAX_TOPIC_LEVELS, Decoder, qos0_payload, topic_levels_ok
from .encode import encode, publish_parts, success_ack, with_dup
from .wire import (
    MAX_REMAINING_LENGTH,
    PUBACK,
    PUBCOMP,
    PUBLISH_QOS0,
    PUBLISH_QOS1,
    PUBLISH_QOS2,
    PUBREC,
    PUBREL,
)

__all__ = ["Decoder", "encode", "publish_parts", "with_dup", "success_ack", "qos0_payload",
           "is_tls_client_hello", "MAX_REMAINING_LENGTH", "DEFAULT_MAX_TOPIC_LEVELS", "topic_levels_ok",
           "PUBLISH_QOS0", "PUBLISH_QOS1", "PUBLISH_QOS2", "PUBACK", "PUBREC", "PUBREL", "PUBCOMP"]


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
