"""What an MQTT 5 client asked of the PUBLISHes the broker sends it: a Maximum Packet Size, and
(with ``--topic-alias-out on``) topic aliases.

Most connections ask neither and never see this class: their ``Connection.outbound`` is None and
a delivery sends the message's shared encoding (encode once). A connection that asks gets an
``Outbound``, and each delivery to it goes through ``parts``: the shared encoding when only the
size is checked, its own encoding when a topic alias replaces the topic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from brokerd.connection.codec import publish_parts
from brokerd.connection.packets import MQTT_5, Prop

from .clock import LOOP_CLOCK, Clock

if TYPE_CHECKING:
    from .message import Message

# The largest packet MQTT can carry (remaining length 268,435,455 plus a 5-byte fixed header):
# what a client that states no Maximum Packet Size accepts.
NO_LIMIT = 268_435_460
_TOPIC_ALIAS = Prop.TOPIC_ALIAS


class Outbound:
    """One connection's rules for outgoing PUBLISHes. Aliases are given to the first
    ``alias_max`` topics sent and kept for the connection (MQTT-3.3.2-8: never beyond the
    client's Topic Alias Maximum; a mapping lives as long as its network connection)."""

    __slots__ = ("max_size", "alias_max", "aliases")

    def __init__(self, max_size: int = NO_LIMIT, alias_max: int = 0) -> None:
        self.max_size = max_size
        self.alias_max = alias_max
        self.aliases: dict[str, int] = {}

    def parts(self, msg: Message, qos: int, retain: bool, clock: Clock = LOOP_CLOCK) -> tuple[bytes, bytes] | None:
        """(head, tail) as ``Message.encoded`` gives them, for this connection; None when the
        packet would exceed the client's Maximum Packet Size: the message is then not sent to it
        (MQTT-3.1.2-25: discarded for this client, as if it had been sent). ``clock``: the
        sender's, for the expiry interval left."""
        if not self.alias_max:
            head, tail = msg.encoded(MQTT_5, qos, retain, clock)
            return None if len(head) + len(tail) + (2 if qos else 0) > self.max_size else (head, tail)
        aliases = self.aliases
        topic = msg.topic
        alias = aliases.get(topic)
        props = msg.outgoing_properties(clock) or {}
        fresh = alias is None and len(aliases) < self.alias_max
        if fresh:
            alias = len(aliases) + 1
        if alias is not None:
            props[_TOPIC_ALIAS] = alias
        # A topic already mapped goes as an empty topic name with its alias (MQTT 3.3.2.3.4).
        head, tail = publish_parts(b"" if alias is not None and not fresh else msg.topic_bytes,
                                   msg.payload, qos, retain, MQTT_5, props or None)
        if len(head) + len(tail) + (2 if qos else 0) > self.max_size:
            return None  # never sent, so no mapping was made
        if fresh:
            aliases[topic] = alias  # type: ignore[assignment]  # fresh: alias is an int
        return (head + tail, b"") if qos == 0 else (head, tail)
