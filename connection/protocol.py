"""The asyncio Protocol that drives the codec and the connection's rules for one client connection:
uvicorn's ``h11_impl.py`` model, a thin adapter that feeds bytes to the pure parts and acts on what
they answer.

The rules of every MQTT connection (CONNECT first and once, PINGREQ, DISCONNECT, the keepalive) are
``connection.state``'s table; a malformed packet closes this connection (never another) with a log
line that names the client and the rule; output is batched per loop iteration. What the packets
*mean* is the business of a ``Handler`` that the application (the router) hands over for each
connection (``connection.ports``); this module knows nothing of routers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from .batching import EndOfTick, TurnBudget
from .codec import DEFAULT_MAX_TOPIC_LEVELS, Decoder
from .flow import BUDGET, OUTPUT, shared_flow
from .guard import RATE, ClientRate, ConnectionGuard
from .keepalive import KeepaliveWheel
from .listener import Listener
from .loop import Loop, Timer
from .output import NOTHING, Output
from .packets import Connect, Packet
from .ports import Connection, Handler, Outgoing
from .ratelimit import VIOLATIONS
from .reasons import ProtocolError, Reason
from .settings import ConnectionSettings, shared_settings
from .state import AWAIT_CONNECT, CONNECT_TIMEOUT_S, HANDLE, Action, ConnectionState, Rule
from .traffic import ConnectionCounters, Traffic

__all__ = ["CONNECT_TIMEOUT_S", "Connection", "ConnectionCounters", "Handler", "MQTTConnection", "Traffic"]

log = logging.getLogger(__name__)

_NOBODY: frozenset[object] = frozenset()  # no pause_reading causes yet (an empty set is 216 bytes)
_OWN_PAUSES = frozenset({BUDGET, RATE, OUTPUT})  # the connection's own pause causes; any other is the handler's
_RELEASING = _OWN_PAUSES - {RATE}  # held packets go once only these are left: not while over the rate


class MQTTConnection(Output, asyncio.Protocol):
    """One client connection: bytes → packets → rules (``_cstate``) → handler; handler output →
    batched writes.

    ``closing`` is the hot path's copy of ``_cstate.state is CLOSED``: set with it by ``_closed``
    alone, and checked where input arrives."""

    # One per client, so no instance dict (``Output`` has the output half's slots): with 31
    # attributes the dict outgrew CPython's shared keys (30) and cost 1.5 KB a connection. What
    # every connection of its listener shares is one object (``_settings``), not a slot each.
    __slots__ = ("_settings", "_flow", "_fan", "_packets", "_decoder", "_guard", "_rate", "partial_since", "tls_identity",
                 "handler", "peer", "client_id", "protocol_level", "outbound", "closing", "_cstate", "_loop",
                 "keepalive_key", "_reading_paused_by", "_held", "admitted")

    def __init__(
        self,
        open_handler: Callable[[MQTTConnection], Handler],
        batcher: EndOfTick,
        *,
        max_packet_size: int,
        write_buffer_high: int = 1 << 20,
        read_budget: int = 16,
        turn: TurnBudget | None = None,
        max_topic_levels: int = DEFAULT_MAX_TOPIC_LEVELS,
        listener: Listener | None = None,
        guard: ConnectionGuard | None = None,
        keepalive: KeepaliveWheel | None = None,
        traffic: Traffic | None = None,
        loop: Loop | None = None,
    ) -> None:
        """``read_budget``: most packets of one connection decoded and handled per loop iteration;
        the rest of a read stays undecoded, with reading paused, until the next iteration. Without
        it one read of a pipelining publisher (a 256 KiB read: hundreds of packets) is decoded and
        handled in one go and every other connection - a quiet device's command among them -
        waits behind it: fairness costs a little batching.

        ``max_topic_levels``: the decoder refuses deeper topic names; the handler reads it here
        to refuse deeper SUBSCRIBE filters with a SUBACK failure code.

        ``traffic``: the worker's sums, which this connection's counts are added to (a test's
        connection gets one of its own).

        ``loop``: its time and timers (``connection.loop``), the worker's (None: the current event
        loop); the layers in front of it (TLS, WebSocket) use the same one. A unit test gives a
        ``FakeClock``, with ``keepalive`` on it, and drives the CONNECT timeout and the keepalive
        with bytes and ``advance``."""
        self._loop: Loop = loop if loop is not None else asyncio.get_event_loop()
        if keepalive is not None:  # the worker's: shared with its other connections
            self._settings = shared_settings(open_handler, listener, write_buffer_high, keepalive)
        else:  # a test's connection: keepalive deadlines of its own
            self._settings = ConnectionSettings(open_handler, listener, write_buffer_high,
                                                KeepaliveWheel(self._loop))
        self._flow = shared_flow(read_budget, turn)  # the budgets, shared with its worker's others
        self._fan = 0.0  # its deliveries per packet last turn, with a fan budget (``FlowControl.fanned``)
        self._packets = 0  # packets it decoded (with a fan budget: the mean packet size's divisor)
        self._batcher = batcher
        self._decoder = Decoder(max_packet_size=max_packet_size, limit=max(1, read_budget),
                                max_topic_levels=max_topic_levels)
        self._guard = guard
        self._rate: ClientRate | None = guard.client_rate() if guard is not None else None
        self.partial_since = 0.0  # when the unfinished packet it holds began (0: none)
        self.tls_identity: str | None = None
        self.transport: asyncio.Transport | None = None
        self.handler: Handler | None = None
        self.peer = "?"
        self.client_id: str | None = None
        self.protocol_level = 4
        self.outbound: Outgoing | None = None
        self.counters = ConnectionCounters()
        self.traffic = traffic if traffic is not None else Traffic()
        self.write_paused = False  # transport above its high-water mark: a slow consumer
        self.closing = False
        self._out = NOTHING
        self._timer: Timer | None = None  # the linger after a close (``_end``)
        self._cstate = ConnectionState()  # the connection's rules and keepalive (connection.state)
        self.keepalive_key: int | None = None  # its bucket there
        self._reading_paused_by: set[object] | frozenset[object] = _NOBODY  # a set once paused
        # Packets that came behind a CONNECT while the handler decides on it (reading paused for
        # the cluster or an auth plugin): dispatched once it resumes, after its CONNACK
        # (MQTT-3.2.0-1), in the client's order. None: nothing is held.
        self._held: list[Packet] | None = None
        self._gate: int | None = None  # output held until open_gate(this or more): see gate()
        self._lingering = False  # closed with something to say: see _end()
        self._polling = False  # its output backed up: _drain_check looks until it drained
        # Charged to its listener's connection rate at accept already (by the TLS or WebSocket
        # layer in front of it, which admits and counts a socket before its handshake).
        self.admitted = False

    @property
    def loop(self) -> Loop:
        """Its time and timers, which a TLS or WebSocket layer in front of it uses too."""
        return self._loop

    @property
    def guard(self) -> ConnectionGuard | None:
        """The worker's connection-layer limits (what a TLS or WebSocket layer in front charges)."""
        return self._guard

    @property
    def listener(self) -> Listener | None:
        """The listener it came in on (None: a test's connection)."""
        return self._settings.listener

    @property
    def max_topic_levels(self) -> int:
        """Deeper topic names are refused by its decoder; the handler refuses deeper filters."""
        return self._decoder.max_topic_levels

    # -- asyncio.Protocol -------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's stream transports have asyncio.Transport's methods without subclassing it.
        stream: asyncio.Transport = transport  # type: ignore[assignment]
        self.transport = stream
        # No TCP_NODELAY here: uvloop (and asyncio) set it on every TCP transport already, and
        # setting it again through uvloop's pseudo-socket made a socket object per connection.
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = f"{peer[0]}:{peer[1]}"
        settings = self._settings
        stream.set_write_buffer_limits(high=settings.write_buffer_high)
        self._cstate.heard_at = self._loop.time()
        guard = self._guard
        if guard is not None and not self.admitted and not guard.admit(settings.listener):
            log.debug("%s: over the listener's --max-connection-rate; closed", self.peer)
            self.abort()
            return
        # The CONNECT timeout is a keepalive deadline until ``accept`` sets the first real one: a
        # timer of its own (made, then cancelled, per connection) cost every connect a uvloop timer.
        # Checked in the bucket before the timeout's second: closed within CONNECT_TIMEOUT_S.
        settings.keepalive.add(self, self._cstate.heard_at + CONNECT_TIMEOUT_S - 1.0)
        listener = settings.listener
        if listener is not None and listener.tls:  # the loop finished the handshake before this call
            from .tls import peer_identity

            self.tls_identity = peer_identity(transport)
        self.handler = settings.open_handler(self)

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        n = len(data)
        self.counters.bytes_in += n
        self.traffic.bytes_in += n
        if self.counters.moved != self.traffic.epoch:
            self.traffic.mark_moved(self)
        cstate = self._cstate
        cstate.heard_at = self._loop.time()
        if cstate.state is AWAIT_CONNECT and cstate.first_bytes_refused(data, self._decoder.buffered):
            hint = self.listener.tls_url if self.listener is not None else None
            log.warning("%s: TLS handshake on a plain MQTT listener%s; closing", self.peer,
                        f" (TLS is on {hint})" if hint else "")
            self.abort()
            return
        self._decoded(self._decoder.feed, data)

    def _decoded(self, decode: Callable[..., list[Packet]], *data: bytes) -> None:
        """Decode (at most the budget), handle the packets, and pause reading while more of the
        read is waiting: ``_read_more`` goes on with it in the next loop iteration."""
        flow = self._flow
        limit = flow.limit(self._fan)
        if limit is not None:
            self._decoder.limit = limit
        try:
            packets = decode(*data)
        except ProtocolError as exc:
            # The packets before the bad one were valid: they count, then the connection goes.
            self._dispatch(getattr(exc, "packets", None) or [])
            if not self.closing:
                self.protocol_violation(exc)
            return
        flow.took(len(packets))
        if self._guard is not None:
            self._guarded(len(packets), len(data[0]) if data else 0)
        more = self._decoder.has_more
        if more:
            # Scheduled before this turn's packets make output, so that the next turn runs ahead
            # of the end-of-tick flush and its output shares those writes.
            self.pause_reading(BUDGET)  # a no-op while it is paused already
            self._loop.call_soon(self._read_more)
        elif BUDGET in self._reading_paused_by:
            self.resume_reading(BUDGET)
        if len(packets) == 1 and not more:
            # A quiet client (one packet, nothing left in its read): what it causes is written at
            # once, not after the busy clients' reads and writes of this iteration.
            batcher = self._batcher
            mark = batcher.pending()
            self._dispatch(packets)
            batcher.flush_since(mark)
            self._packets += 1  # the fan budget's mean packet size counts it
            return
        if not packets or not flow.measures_fan:
            self._dispatch(packets)
            return
        before = flow.delivered()
        self._dispatch(packets)
        n = len(packets)
        self._packets += n
        self._fan = flow.fanned(before, n, (self.counters.bytes_in - self._decoder.undecoded) // self._packets)

    def _dispatch(self, packets: list[Packet]) -> None:
        """Each packet by its rule in the connection's state: the handler's, or ``_EFFECTS``'s."""
        handler = self.handler
        assert handler is not None
        cstate = self._cstate
        for packet in packets:
            if self.closing:
                return
            held = self._held
            if held is not None:
                held.append(packet)
                continue
            if cstate.row[type(packet)] is HANDLE:  # the bulk of all packets: one lookup
                handler.packet_received(packet)
            else:
                rule = cstate.receive(packet)
                _EFFECTS[rule.action](self, handler, packet, rule)

    def _begin(self, handler: Handler, packet: Connect, rule: Rule) -> None:
        """CONNECT: the connection's identity is the client's; the handler decides on it."""
        self.protocol_level = packet.protocol_level
        self.client_id = packet.client_id or None
        if self.tls_identity is not None and self.listener is not None and self.listener.use_identity_as_username:
            packet.username, packet.password = self.tls_identity, None  # Mosquitto's rule
            log.debug("client %s (%s): user %r from its TLS certificate", self.client_id, self.peer,
                      self.tls_identity)
        handler.packet_received(packet)
        if not self._reading_paused_by <= _OWN_PAUSES:  # the handler waits for an answer
            self._held = []

    def _answer(self, handler: Handler, packet: Packet, rule: Rule) -> None:
        self.send(rule.answer)

    def _disconnected(self, handler: Handler, packet: Packet, rule: Rule) -> None:
        handler.packet_received(packet)
        self.close()

    def _refused(self, handler: Handler, packet: Packet, rule: Rule) -> None:
        self.protocol_violation(rule.error())

    def _ignored(self, handler: Handler, packet: Packet, rule: Rule) -> None:
        pass

    def _guarded(self, packets: int, nbytes: int) -> None:
        """The connection guard's part of a read: when an unfinished packet began, and the
        client's rates (over them: reading pauses until the debt is paid; nothing is dropped)."""
        if self._decoder.buffered:
            if not self.partial_since:
                self.partial_since = self._loop.time()  # the guard's clock
                # (mypy: a buffered partial packet is watched only on a guarded connection)
                self._guard.holding(self)  # type: ignore[union-attr]
        elif self.partial_since:
            self.partial_since = 0.0
        rate = self._rate
        if rate is not None:
            wait = rate.charge(packets, nbytes)
            if wait > 0 and RATE not in self._reading_paused_by:
                self.pause_reading(RATE)
                # (mypy: a rate is set only on a guarded connection)
                self._guard.paused_for_rate()  # type: ignore[union-attr]
                self._loop.call_later(wait, self._rate_paid)

    def _rate_paid(self) -> None:
        """The client's rate debt is paid: read again, and decode what its last read still holds.
        A debt its client brought at CONNECT (``_client_rate``) may outlast this pause: on, then."""
        wait = self._rate.due()  # type: ignore[union-attr]  # (a rate set: it paused for it)
        if wait > 0:
            self._loop.call_later(wait, self._rate_paid)
            return
        self.resume_reading(RATE)
        if self._decoder.has_more and not self.closing:
            self._loop.call_soon(self._read_more)

    def unfinished_packet_timeout(self, held: float) -> None:
        """The guard found this connection holding an unfinished packet too long (a slow-loris
        client, or one that died mid-packet behind a proxy that keeps the socket open)."""
        log.info("client %s (%s): an unfinished packet held for %.0f s (--packet-timeout); closing",
                 self.client_id or "-", self.peer, held)
        self.close()

    def _read_more(self) -> None:
        """The next budget's worth of a long read, one loop iteration later (not while the client
        is over its rate or while its output backs up: ``_rate_paid`` or ``_drained`` goes on
        with it)."""
        paused = self._reading_paused_by
        if not self.closing and self.handler is not None and RATE not in paused and OUTPUT not in paused:
            self._decoded(self._decoder.more)

    def eof_received(self) -> bool | None:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._settings.keepalive.discard(self)
        self._out = NOTHING
        handler, self.handler = self.handler, None
        if handler is not None:
            handler.connection_lost(self._cstate.graceful)

    def _drained(self) -> None:
        if OUTPUT in self._reading_paused_by:
            # The time its reads were held is not its silence: the keepalive counts from now.
            self._cstate.heard_at = self._loop.time()
            self.resume_reading(OUTPUT)
            if self._decoder.has_more and not self.closing:
                self._loop.call_soon(self._read_more)  # what its last read still holds

    # -- what the handler calls ---------------------------------------------------------------------

    def accept(self, keepalive: int, protocol_level: int) -> None:
        """The handler accepted CONNECT: start enforcing the keepalive (MQTT-3.1.2-24: 1.5×)."""
        self.protocol_level = protocol_level
        self._decoder.protocol_level = protocol_level
        deadline = self._cstate.accept(keepalive, self._loop.time())
        if deadline is not None:
            self._settings.keepalive.add(self, deadline)  # in place of the CONNECT timeout
        else:
            self._settings.keepalive.discard(self)
        if self._rate is not None and self.client_id:
            self._client_rate()

    def _client_rate(self) -> None:
        """Its client's rate from here on, as its recent connections left it
        (``ConnectionGuard.client_rate_of``). In debt, it reads nothing more until the debt is
        paid, and what came behind its CONNECT waits too: else each reconnect would get a read's
        worth through."""
        own = self._rate
        # (mypy: a rate is set only on a guarded connection, and a client id at an accept)
        rate = self._rate = self._guard.client_rate_of(self.client_id, own)  # type: ignore[union-attr,arg-type]
        if rate is own:
            return
        wait = rate.due()
        if wait > 0:
            if self._held is None:
                self._held = []
            if RATE not in self._reading_paused_by:
                self.pause_reading(RATE)
                self._guard.paused_for_rate()  # type: ignore[union-attr]  # (as above)
                self._loop.call_later(wait, self._rate_paid)

    def close(self, reason: int | None = None) -> None:
        """Close after flushing what is queued. MQTT 5 clients get DISCONNECT with ``reason``."""
        if self.closing:
            return
        why = self._cstate.disconnect_for(reason, self.protocol_level)
        if why:
            self.send(why)
        # A stopping worker waits for no client: its connections close at once (their wills and
        # sessions are settled before its log closes).
        said = bool(self._out) and reason != Reason.SERVER_SHUTTING_DOWN
        self.flush()
        self._closed()
        if self.transport is not None and self._gate is None:  # else open_gate closes it
            self._end(said)

    def abort(self) -> None:
        self._closed()
        if self.transport is not None:
            self.transport.abort()

    def protocol_violation(self, exc: ProtocolError) -> None:
        VIOLATIONS.log(log, "client %s (%s): %s; closing the connection",  # at most 10 a second
                       self.client_id or "-", self.peer, exc.rule)
        counted = getattr(self.handler, "violation", None)
        if counted is not None:
            counted(exc)
        answer = self._cstate.violation_answer(exc)
        if answer is None:
            self.close(int(exc.reason))
            return
        self.send(answer)  # instead of the close's DISCONNECT: CONNACK 0x01 (MQTT-3.1.2-2)
        self.flush()
        self._closed()
        if self.transport is not None:
            self._end(True)

    def _closed(self) -> None:
        """Nothing more is read or dispatched."""
        self.closing = True
        self._cstate.close()

    def pause_reading(self, by: object) -> None:
        """Stop reading from this client (backpressure); several causes may hold it paused."""
        paused_by = self._reading_paused_by
        if not paused_by and self.transport is not None and not self.closing:
            self.transport.pause_reading()
        if paused_by.__class__ is not set:
            paused_by = self._reading_paused_by = set()
        paused_by.add(by)

    def resume_reading(self, by: object) -> None:
        if by in self._reading_paused_by:
            # (mypy: a set once paused (``_NOBODY``, the frozenset, is empty))
            self._reading_paused_by.remove(by)  # type: ignore[union-attr]
        if self._held is not None and self._reading_paused_by <= _RELEASING:
            self._loop.call_soon(self._release_held)  # the handler has answered; no rate debt
        if not self._reading_paused_by and self.transport is not None and not self.closing:
            self.transport.resume_reading()

    def hold(self, by: object) -> None:
        """Pause reading for ``by``, and hold the packets decoded behind the one being handled until
        ``resume_reading(by)``: the handler finishes that packet over later loop turns (a SUBSCRIBE's
        filters, a slice per turn) and the client's later packets keep their order behind it."""
        self.pause_reading(by)
        if self._held is None:
            self._held = []

    def _release_held(self) -> None:
        """Dispatch what came behind the CONNECT or a held packet (packets decoded meanwhile joined
        the list)."""
        held, self._held = self._held, None
        if held and not self.closing:
            self._dispatch(held)

    # -- timers ---------------------------------------------------------------------------------------

    def _connect_timeout(self) -> None:
        """Its CONNECT timeout came due (before ``accept``): close it if it sent no CONNECT (one
        the handler is still deciding on goes on: the handler answers it)."""
        if self._cstate.connect_timed_out():
            log.info("%s: no CONNECT within %.0f s; closing", self.peer, CONNECT_TIMEOUT_S)
            self.abort()

    def check_keepalive(self) -> None:
        """Its keepalive bucket came due (``KeepaliveWheel``): close it if it has been silent for
        its whole keepalive, else check again at its new deadline. Before ``accept`` set a
        keepalive the deadline was the CONNECT timeout's."""
        if self.closing:
            return
        if not self._cstate.keepalive:
            self._connect_timeout()
            return
        taken = None  # while its reads are held for its output: what it has taken of that
        if OUTPUT in self._reading_paused_by and self.transport is not None:
            taken = self.counters.bytes_out - self.transport.get_write_buffer_size()
        now = self._loop.time()
        cstate = self._cstate
        deadline = cstate.keepalive_deadline(now, taken)
        if deadline is None:
            log.info("client %s (%s): keepalive timeout after %.1f s; closing",
                     self.client_id or "-", self.peer, now - cstate.heard_at)
            self.close(Reason.KEEP_ALIVE_TIMEOUT)
            return
        self._settings.keepalive.add(self, deadline)


# What the connection does for each rule's action but HANDLE (``connection.state.TABLE``).
_EFFECTS: dict[Action, Callable[[MQTTConnection, Handler, Packet, Rule], None]] = {
    Action.CONNECT: MQTTConnection._begin,  # type: ignore[dict-item]  # the rule is CONNECT's alone
    Action.ANSWER: MQTTConnection._answer,
    Action.DISCONNECT: MQTTConnection._disconnected,
    Action.REFUSE: MQTTConnection._refused,
    Action.IGNORE: MQTTConnection._ignored,
}
