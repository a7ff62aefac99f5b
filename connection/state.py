"""The rules of one MQTT connection, whatever the broker behind it: everything that decides what a
packet means *to the connection* (not to the router) lives here, as data (h11's ``_state.py``).

No I/O and no clock: the adapter (``connection.protocol.MQTTConnection``) feeds it packets and the
time, and acts on what it answers, so every rule is tested with bytes and a fake clock.

=============  ======================================================================================
AWAIT_CONNECT  the first packet must be CONNECT (anything else: MQTT-3.1.0-1); an unsupported
               version is answered CONNACK 0x01 first (MQTT-3.1.2-2); nothing within
               ``CONNECT_TIMEOUT_S``: aborted; a TLS ClientHello as the first bytes: aborted
CONNECTING     CONNECT handed to the handler, which has not accepted it yet (it may be asking the
               cluster or an auth plugin); the handler bounds its own wait, the timeout no longer
               applies; otherwise as CONNECTED
CONNECTED      the handler accepted CONNECT: keepalive enforced at 1.5 x (MQTT-3.1.2-24);
               PINGREQ answered here; a second CONNECT: MQTT-3.1.0-2; anything else is the handler's
DISCONNECTING  the client sent DISCONNECT: the handler sees it, then the connection closes (with the
               will unless reason 0x04); a protocol error in it is still answered with DISCONNECT
CLOSED         closed by either side: nothing more is read or dispatched
=============  ======================================================================================

A close with a reason says so to an MQTT 5 client that got past CONNECT (DISCONNECT ``reason``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .codec import encode, is_tls_client_hello
from .packets import (
    MQTT_5,
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
)
from .reasons import ProtocolError, Reason

CONNECT_TIMEOUT_S = 10.0  # docs/limits.md: a socket not yet CONNECTed is held 10 s at most
KEEPALIVE_FACTOR = 1.5  # MQTT-3.1.2-24: silent for 1.5 times its Keep Alive, the client is gone


class State(enum.Enum):
    # Enum's own __hash__ is Python code (the name's hash): every table lookup by state paid a
    # call; a member is its only instance, so identity is equality.
    __hash__ = object.__hash__

    AWAIT_CONNECT = "awaiting CONNECT"
    CONNECTING = "connecting"
    CONNECTED = "connected"
    DISCONNECTING = "disconnecting"
    CLOSED = "closed"


AWAIT_CONNECT = State.AWAIT_CONNECT
CONNECTING = State.CONNECTING
CONNECTED = State.CONNECTED
DISCONNECTING = State.DISCONNECTING
CLOSED = State.CLOSED


class Action(enum.Enum):
    """What the adapter does with a packet."""

    __hash__ = object.__hash__  # (as ``State``'s)

    HANDLE = "to the handler"
    CONNECT = "to the handler, with the connection's identity taken from it"
    ANSWER = "answered here (``Rule.answer``)"
    DISCONNECT = "to the handler, then closed"
    REFUSE = "a protocol violation (``Rule.error``): closed"
    IGNORE = "dropped: the connection is closed"


@dataclass(frozen=True, slots=True)
class Rule:
    action: Action
    then: State | None = None  # the state it leads to (None: unchanged)
    answer: bytes = b""  # ANSWER: what is sent back
    rule: str = ""  # REFUSE: the rule broken, as the log and the ProtocolError name it

    def error(self) -> ProtocolError:
        return ProtocolError(self.rule, Reason.PROTOCOL_ERROR)


HANDLE = Rule(Action.HANDLE)
_IGNORE = Rule(Action.IGNORE)
_BEGIN = Rule(Action.CONNECT, then=CONNECTING)
_PONG = Rule(Action.ANSWER, answer=encode(Pingresp()))
_BYE = Rule(Action.DISCONNECT, then=DISCONNECTING)
_NOT_FIRST = Rule(Action.REFUSE, rule="MQTT-3.1.0-1 the first packet must be CONNECT")
_SECOND = Rule(Action.REFUSE, rule="MQTT-3.1.0-2 a second CONNECT is a protocol violation")

PACKET_KINDS: tuple[type[Packet], ...] = (
    Connect, Connack, Publish, Puback, Pubrec, Pubrel, Pubcomp, Subscribe, Suback, Unsubscribe, Unsuback,
    Pingreq, Pingresp, Disconnect, Auth,
)
# The rules of an open connection; packet kinds a client may not send (CONNACK, SUBACK ...) are
# the handler's to refuse, with the rule of its own layer.
_OPEN = {kind: HANDLE for kind in PACKET_KINDS} | {Connect: _SECOND, Pingreq: _PONG, Disconnect: _BYE}

TABLE: dict[State, dict[type[Packet], Rule]] = {
    AWAIT_CONNECT: {kind: _NOT_FIRST for kind in PACKET_KINDS} | {Connect: _BEGIN},
    CONNECTING: _OPEN,
    CONNECTED: _OPEN,
    # After DISCONNECT the connection closes at once; packets behind it are not read.
    DISCONNECTING: {kind: _IGNORE for kind in PACKET_KINDS},
    CLOSED: {kind: _IGNORE for kind in PACKET_KINDS},
}
"""(state, packet kind) -> rule: complete, every kind listed in every state."""

# The handler's answer to CONNECT moves CONNECTING on; in any other state it changes nothing.
_ACCEPTED = {CONNECTING: CONNECTED}
# keepalive -> the silence allowed (KEEPALIVE_FACTOR x): one float object per value, which every
# connection with that keepalive shares (a float of its own was 24 bytes a connection). Keepalives
# from 0 to SHARED_SILENCES - 1 are kept (a fleet's are a few values); others get floats of their own.
SHARED_SILENCES = 4096
_SILENCES: dict[int, float] = {}


def allowed_silence(keepalive: int) -> float:
    """Seconds of silence allowed to a client with ``keepalive`` (MQTT-3.1.2-24: 1.5 times it)."""
    silence = _SILENCES.get(keepalive)
    if silence is None:
        silence = keepalive * KEEPALIVE_FACTOR
        if 0 <= keepalive < SHARED_SILENCES:
            _SILENCES[keepalive] = silence
    return silence


# States in which a close with a reason tells an MQTT 5 client why: it got past CONNECT.
_SAYS_WHY = frozenset({CONNECTING, CONNECTED, DISCONNECTING})
# (state, reason of a violation) -> what is answered before closing instead of DISCONNECT.
_VIOLATION_ANSWERS: dict[tuple[State, int], bytes] = {
    (AWAIT_CONNECT, Reason.UNSUPPORTED_PROTOCOL_VERSION): encode(Connack(reason_code=1), 4),  # MQTT-3.1.2-2
}


class ConnectionState:
    """One connection's place in ``TABLE`` and its keepalive, advanced by packets and the time.

    ``row``: the current state's rules (the adapter reads ``row[type(packet)]`` per packet, and
    hands the packet to ``receive`` only when the rule is not ``HANDLE``). ``heard_at``: when the
    client was last heard from (the adapter stamps each read). ``keepalive``: seconds of silence
    allowed (1.5 x the negotiated Keep Alive; 0: none). ``graceful``: the client ended with
    DISCONNECT and the will is not to be published."""

    __slots__ = ("state", "row", "heard_at", "keepalive", "graceful", "_written")

    def __init__(self, now: float = 0.0) -> None:
        self.state = AWAIT_CONNECT
        self.row = TABLE[AWAIT_CONNECT]
        self.heard_at = now
        self.keepalive = 0.0
        self.graceful = False
        self._written = 0  # bytes the client had taken at the last keepalive check

    def _enter(self, state: State) -> None:
        self.state = state
        self.row = TABLE[state]

    def receive(self, packet: Packet) -> Rule:
        """The rule for ``packet`` in this state; the state follows it."""
        rule = self.row[type(packet)]
        if rule.then is not None:
            self._enter(rule.then)
        if rule.action is Action.DISCONNECT:
            # (mypy: the DISCONNECT row's packet is a Disconnect)
            self.graceful = packet.reason_code != Reason.DISCONNECT_WITH_WILL  # type: ignore[union-attr]
        return rule

    def first_bytes_refused(self, data: bytes, buffered: int) -> bool:
        """Whether ``data`` opens a TLS handshake on a plain listener (a client with the wrong URL)."""
        return self.state is AWAIT_CONNECT and not buffered and is_tls_client_hello(data)

    def connect_timed_out(self) -> bool:
        """``CONNECT_TIMEOUT_S`` has passed since the socket opened: whether it goes for it."""
        return self.state is AWAIT_CONNECT

    def accept(self, keepalive: int, now: float) -> float | None:
        """The handler accepted CONNECT with ``keepalive`` seconds: the first keepalive deadline,
        None when it has none."""
        state = _ACCEPTED.get(self.state)
        if state is not None:
            self._enter(state)
        self.keepalive = allowed_silence(keepalive)
        return now + self.keepalive if keepalive else None

    def keepalive_deadline(self, now: float, taken: int | None = None) -> float | None:
        """At a keepalive deadline: None when the client has been silent for its whole keepalive
        (it is closed), else the next deadline. ``taken``: while its output backs up and its
        reads are held, the bytes it has taken of what was written to it: a client that still
        reads (slowly) is not silent by its own doing; one that takes nothing at all is dead."""
        if taken is not None and taken != self._written:
            self._written = taken
            self.heard_at = now
        if now - self.heard_at >= self.keepalive:
            return None
        return self.heard_at + self.keepalive

    def disconnect_for(self, reason: int | None, protocol_level: int) -> bytes:
        """What a close with ``reason`` says first: DISCONNECT to an MQTT 5 client past CONNECT."""
        if reason is None or protocol_level < MQTT_5 or self.state not in _SAYS_WHY:
            return b""
        return encode(Disconnect(reason_code=reason), MQTT_5)

    def violation_answer(self, exc: ProtocolError) -> bytes | None:
        """What a protocol violation is answered with before the close, where it is not the
        close's DISCONNECT (``disconnect_for``)."""
        return _VIOLATION_ANSWERS.get((self.state, exc.reason))

    def close(self) -> None:
        self._enter(CLOSED)
