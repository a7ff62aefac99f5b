"""What a connection and its handler (the router) see of each other: declared, so that each side is
typed against these and tested with fakes of them, not against the other's classes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from .listener import Listener
from .packets import Packet
from .reasons import ProtocolError

if TYPE_CHECKING:
    # Named for their types only, never imported at run time: the one thing this layer takes from
    # the router is the message it sends (dependencies point one way, cluster -> router -> connection).
    from brokerd.router.clock import Clock
    from brokerd.router.message import Message

    from .traffic import ConnectionCounters, Traffic


class Handler(Protocol):
    """What the application does with a connection's packets."""

    def packet_received(self, packet: Packet) -> None: ...

    def connection_lost(self, graceful: bool) -> None:
        """The connection is gone; ``graceful`` when the client sent DISCONNECT first."""


class Outgoing(Protocol):
    """What an MQTT 5 client asked of the PUBLISHes sent to it (a Maximum Packet Size, topic
    aliases): the router's ``router.outbound.Outbound``."""

    def parts(self, msg: Message, qos: int, retain: bool, clock: Clock = ...) -> tuple[bytes, bytes] | None:
        """``msg`` (the router's message) as (head, tail) for this client, its expiry interval
        left by ``clock`` (the sender's); None: too large for it, not sent."""


class Connection(Protocol):
    """What a handler (the router) uses of its connection: declared, so that router code is typed
    against this and tested with fakes of it, not against ``MQTTConnection``."""

    client_id: str | None
    peer: str
    protocol_level: int
    counters: ConnectionCounters
    traffic: Traffic  # the worker's sums of every connection's counters
    write_paused: bool  # the client is not reading: QoS 0 messages to it are dropped
    closing: bool
    tls_identity: str | None  # TLS listeners: the client certificate's CN (or first SAN), when it sent one
    outbound: Outgoing | None  # None: the client asked nothing of the PUBLISHes sent to it

    @property
    def max_topic_levels(self) -> int:
        """Deeper topic names are refused; the handler refuses deeper SUBSCRIBE filters."""

    @property
    def listener(self) -> Listener | None:
        """The listener it came in on: allow_anonymous, use_identity_as_username ..."""

    def send(self, data: bytes) -> None:
        """Queue bytes for this loop iteration's one write."""

    def gate(self, until: int) -> None:
        """Hold what is queued, and what is queued later, until ``open_gate(until)``."""

    def open_gate(self, reached: int) -> None:
        """Write what the gate held once ``reached`` is ``until`` or more."""

    def refuse_output(self, reason: int) -> None:
        """Drop what is queued and held, unwritten, and close."""

    def accept(self, keepalive: int, protocol_level: int) -> None:
        """CONNECT accepted: the keepalive is enforced from now on."""

    def close(self, reason: int | None = None) -> None:
        """Close after flushing (MQTT 5: DISCONNECT with ``reason``)."""

    def protocol_violation(self, exc: ProtocolError) -> None:
        """Close for breaking a rule, logged with the rule."""

    def pause_reading(self, by: object) -> None:
        """Stop reading for cause ``by`` (backpressure)."""

    def resume_reading(self, by: object) -> None:
        """Cause ``by`` is gone; reading resumes when no cause is left."""

    def hold(self, by: object) -> None:
        """Pause reading for ``by`` and hold the client's later packets until ``resume_reading(by)``."""
