"""The asyncio Protocol that drives the codec for one client connection.

It owns what is true of every MQTT connection whatever the broker behind it: the first packet must
be CONNECT and only the first, PINGREQ is answered, the keepalive is enforced at 1.5 times the
client's interval, a malformed packet closes this connection (never another) with a log line that
names the client and the rule, and output is batched per loop iteration. What the packets *mean* is
the business of a ``Handler`` that the application (the router) hands over for each connection; this
module knows nothing of routers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from .batching import EndOfTick, TurnBudget
from .codec import DEFAULT_MAX_TOPIC_LEVELS, Decoder, encode, is_tls_client_hello
from .flow import BUDGET, OUTPUT, FlowControl
from .guard import RATE, ClientRate, ConnectionGuard
from .keepalive import KeepaliveWheel
from .listener import Listener
from .packets import MQTT_5, Connack, Connect, Disconnect, Packet, Pingreq, Pingresp
from .ratelimit import VIOLATIONS
from .reasons import ProtocolError, Reason

log = logging.getLogger(__name__)

_PINGRESP = encode(Pingresp())
CONNECT_TIMEOUT_S = 10.0
# After a close with something still to say (a DISCONNECT, a refusing CONNACK): how long the
# client's input is read and dropped while it reads why (see ``MQTTConnection._end``).
LINGER_S = 1.0
# A connection whose output backed up is read again once it drained: looked at after this, then
# twice as long each time up to the maximum (``MQTTConnection._drain_check``).
DRAIN_POLL_S = 0.01
DRAIN_POLL_MAX_S = 0.5
AWAITING_CONNECT = "awaiting CONNECT"  # the connection's phases (see MQTTConnection)
CONNECTED = "connected"
_NOBODY: frozenset[object] = frozenset()  # no pause_reading causes yet (an empty set is 216 bytes)
_OWN_PAUSES = frozenset({BUDGET, RATE, OUTPUT})  # the connection's own pause causes; any other is the handler's


class Handler(Protocol):
    """What the application does with a connection's packets."""

    def packet_received(self, packet: Packet) -> None: ...

    def connection_lost(self, graceful: bool) -> None:
        """The connection is gone; ``graceful`` when the client sent DISCONNECT first."""


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
    max_topic_levels: int
    listener: Listener | None  # the listener it came in on: allow_anonymous, use_identity_as_username ...
    tls_identity: str | None  # TLS listeners: the client certificate's CN (or first SAN), when it sent one
    # What an MQTT 5 client asked of the PUBLISHes sent to it (a Maximum Packet Size, topic
    # aliases): the router's ``router.outbound.Outbound``, None when it asked neither.
    outbound: Any

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


class ConnectionCounters:
    """Per-connection byte counters, plain integers bumped in the hot path. ``moved``: the
    ``Traffic.epoch`` in which the connection was put on ``Traffic.moved_conns``; it moved
    bytes since the stats last looked when that is the current one."""

    __slots__ = ("bytes_in", "bytes_out", "msgs_in", "msgs_out", "moved")

    def __init__(self) -> None:
        self.bytes_in = 0
        self.bytes_out = 0
        self.msgs_in = 0
        self.msgs_out = 0
        self.moved = -1


class Traffic(ConnectionCounters):
    """A worker's client traffic: its connections' counters summed as they are bumped (closed
    connections included), and the connections that moved bytes since the stats last looked.

    Why: a stats snapshot then reads the totals in O(1) and ranks the busiest connections among
    the previous busiest and those that moved (one that moved nothing cannot have climbed), so a
    quiet worker's snapshot costs what its traffic costs, not a walk over every connection each
    interval (6,000 idle connections: 3 ms a snapshot, most of an idle worker's CPU). The hot path
    pays one more integer add per read, per write and per message, and a list append per
    connection per interval."""

    __slots__ = ("moved_conns", "_prune_at", "epoch")

    PRUNE_MIN = 1024  # the list is cleared of closed connections when it reaches twice its live part

    def __init__(self) -> None:
        super().__init__()
        self.moved_conns: list[Connection] = []
        self._prune_at = self.PRUNE_MIN
        # One more at each ``take_moved``: a connection is on the list when its ``moved`` is
        # this, so taking the list resets no flag per connection (a fleet's thousands that move
        # every second cost the snapshot ~0.8 ms in that walk, each a cache miss).
        self.epoch = 0

    def mark_moved(self, conn: Connection) -> None:
        """``conn`` moved bytes (it was not on the list): on the list until ``take_moved``.
        Connections that closed meanwhile leave the list whenever it doubles: a long
        ``--stats-interval`` under heavy connection churn must not keep every closed connection
        of the interval alive."""
        conn.counters.moved = self.epoch
        moved = self.moved_conns
        moved.append(conn)
        if len(moved) >= self._prune_at:
            self.moved_conns = moved = [c for c in moved if not c.closing]
            self._prune_at = max(self.PRUNE_MIN, 2 * len(moved))

    def take_moved(self) -> list[Connection]:
        """The connections that moved bytes since the last call; they count as unmoved again."""
        moved, self.moved_conns = self.moved_conns, []
        self._prune_at = self.PRUNE_MIN
        self.epoch += 1
        return moved


class MQTTConnection(asyncio.Protocol):
    """One client connection: bytes → packets → handler; handler output → batched writes.

    Its life, in one place (h11's model: a phase and what each phase allows):

    ==================  ============================================================================
    AWAITING_CONNECT    the first packet must be CONNECT (else: protocol error; an unsupported
                        version: CONNACK 0x01 first); no CONNECT within ``CONNECT_TIMEOUT_S``: abort;
                        a TLS ClientHello as the first bytes: abort, logged
    CONNECTED           PINGREQ answered here; a second CONNECT: protocol error; DISCONNECT: closes
                        (with the will unless reason 0x04); everything else goes to the handler;
                        keepalive enforced once the handler accepts CONNECT (1.5 x)
    closing             nothing more is read or dispatched; what is queued is flushed, MQTT 5
                        clients that got past CONNECT get DISCONNECT with the reason
    ==================  ============================================================================

    ``phase`` is AWAITING_CONNECT or CONNECTED; ``closing`` is set by ``close``, ``abort``,
    ``protocol_violation`` and ``connection_lost`` alone, and checked where input arrives."""

    # One per client, so no instance dict: with 31 attributes the dict outgrew CPython's shared
    # keys (30) and cost 1.5 KB a connection.
    __slots__ = ("_open_handler", "_flow", "_batcher", "_decoder", "max_topic_levels", "listener", "_guard",
                 "_rate", "partial_since", "tls_identity", "_write_buffer_high", "transport", "handler", "peer",
                 "client_id", "protocol_level", "outbound", "counters", "traffic", "write_paused", "closing", "phase",
                 "_graceful", "_out", "_keepalive", "_last_rx", "_timer", "_loop", "_wheel", "keepalive_key",
                 "_reading_paused_by", "_held", "_gate", "_lingering", "admitted", "_polling", "_written")

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
    ) -> None:
        """``read_budget``: most packets of one connection decoded and handled per loop iteration;
        the rest of a read stays undecoded, with reading paused, until the next iteration. Without
        it one read of a pipelining publisher (a 256 KiB read: hundreds of packets) is decoded and
        handled in one go and every other connection - a quiet device's command among them -
        waits behind it: fairness costs a little batching.

        ``max_topic_levels``: the decoder refuses deeper topic names; the handler reads it here
        to refuse deeper SUBSCRIBE filters with a SUBACK failure code.

        ``traffic``: the worker's sums, which this connection's counts are added to (a test's
        connection gets one of its own)."""
        self._open_handler = open_handler
        self._flow = FlowControl(read_budget, turn)
        self._batcher = batcher
        self._decoder = Decoder(max_packet_size=max_packet_size, limit=max(1, read_budget),
                                max_topic_levels=max_topic_levels)
        self.max_topic_levels = max_topic_levels
        self.listener = listener
        self._guard = guard
        self._rate: ClientRate | None = guard.client_rate() if guard is not None else None
        self.partial_since = 0.0  # when the unfinished packet it holds began (0: none)
        self.tls_identity: str | None = None
        self._write_buffer_high = write_buffer_high
        self.transport: asyncio.Transport | None = None
        self.handler: Handler | None = None
        self.peer = "?"
        self.client_id: str | None = None
        self.protocol_level = 4
        self.outbound: Any = None
        self.counters = ConnectionCounters()
        self.traffic = traffic if traffic is not None else Traffic()
        self.write_paused = False  # transport above its high-water mark: a slow consumer
        self.closing = False
        self.phase = AWAITING_CONNECT
        self._graceful = False
        self._out: list[bytes] = []
        self._keepalive = 0.0
        self._last_rx = 0.0
        self._timer: asyncio.TimerHandle | None = None  # the CONNECT timeout
        self._loop = asyncio.get_event_loop()
        # The worker's keepalive deadlines (one of its own where none is given: a test's).
        self._wheel = keepalive if keepalive is not None else KeepaliveWheel(self._loop)
        self.keepalive_key: int | None = None  # its bucket there
        self._reading_paused_by: set[object] | frozenset[object] = _NOBODY  # a set once paused
        # Packets that came behind a CONNECT while the handler decides on it (reading paused for
        # the cluster or an auth plugin): dispatched once it resumes, after its CONNACK
        # (MQTT-3.2.0-1), in the client's order. None: nothing is held.
        self._held: list[Packet] | None = None
        self._gate: int | None = None  # output held until open_gate(this or more): see gate()
        self._lingering = False  # closed with something to say: see _end()
        self._polling = False  # its output backed up: _drain_check looks until it drained
        self._written = 0  # bytes its transport had written at the last keepalive check
        # Charged to its listener's connection rate at accept already (by the TLS or WebSocket
        # layer in front of it, which admits and counts a socket before its handshake).
        self.admitted = False

    @property
    def guard(self) -> ConnectionGuard | None:
        """The worker's connection-layer limits (what a TLS or WebSocket layer in front charges)."""
        return self._guard

    # -- asyncio.Protocol -------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        # No TCP_NODELAY here: uvloop (and asyncio) set it on every TCP transport already, and
        # setting it again through uvloop's pseudo-socket made a socket object per connection.
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = f"{peer[0]}:{peer[1]}"
        transport.set_write_buffer_limits(high=self._write_buffer_high)
        self._last_rx = self._loop.time()
        guard = self._guard
        if guard is not None and not self.admitted and not guard.admit(self.listener):
            log.debug("%s: over the listener's --max-connection-rate; closed", self.peer)
            self.abort()
            return
        self._timer = self._loop.call_later(CONNECT_TIMEOUT_S, self._connect_timeout)
        listener = self.listener
        if listener is not None and listener.tls:  # the loop finished the handshake before this call
            from .tls import peer_identity

            self.tls_identity = peer_identity(transport)
        self.handler = self._open_handler(self)

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        n = len(data)
        self.counters.bytes_in += n
        self.traffic.bytes_in += n
        if self.counters.moved != self.traffic.epoch:
            self.traffic.mark_moved(self)
        self._last_rx = self._loop.time()
        if self.phase is AWAITING_CONNECT and self._decoder.buffered == 0 and is_tls_client_hello(data):
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
        limit = flow.limit()
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
            flow.packets += 1  # the fan budget's mean packet size counts it
            return
        if not packets or not flow.measures_fan:
            self._dispatch(packets)
            return
        before = flow.delivered()
        self._dispatch(packets)
        n = len(packets)
        flow.packets += n
        flow.fanned(before, n, (self.counters.bytes_in - self._decoder.undecoded) // flow.packets)

    def _dispatch(self, packets: list[Packet]) -> None:
        handler = self.handler
        assert handler is not None
        for packet in packets:
            if self.closing:
                return
            if self.phase is AWAITING_CONNECT:
                if type(packet) is not Connect:
                    self.protocol_violation(ProtocolError("MQTT-3.1.0-1 the first packet must be CONNECT",
                                                          Reason.PROTOCOL_ERROR))
                    return
                self.phase = CONNECTED
                self.protocol_level = packet.protocol_level
                self.client_id = packet.client_id or None
                if self.tls_identity is not None and self.listener.use_identity_as_username:  # type: ignore[union-attr]
                    packet.username, packet.password = self.tls_identity, None  # Mosquitto's rule
                    log.debug("client %s (%s): user %r from its TLS certificate", self.client_id, self.peer,
                              self.tls_identity)
                handler.packet_received(packet)
                if not self._reading_paused_by <= _OWN_PAUSES:  # the handler waits for an answer
                    self._held = []
                continue
            held = self._held
            if held is not None:
                held.append(packet)
                continue
            cls = type(packet)
            if cls is Pingreq:
                self.send(_PINGRESP)
            elif cls is Connect:
                self.protocol_violation(ProtocolError("MQTT-3.1.0-2 a second CONNECT is a protocol violation",
                                                      Reason.PROTOCOL_ERROR))
                return
            elif cls is Disconnect:
                self._graceful = packet.reason_code != Reason.DISCONNECT_WITH_WILL
                handler.packet_received(packet)
                self.close()
                return
            else:
                handler.packet_received(packet)

    def _guarded(self, packets: int, nbytes: int) -> None:
        """The connection guard's part of a read: when an unfinished packet began, and the
        client's rates (over them: reading pauses until the debt is paid; nothing is dropped)."""
        if self._decoder.buffered:
            if not self.partial_since:
                self.partial_since = time.monotonic()
                self._guard.holding(self)  # type: ignore[union-attr]
        elif self.partial_since:
            self.partial_since = 0.0
        rate = self._rate
        if rate is not None:
            wait = rate.charge(packets, nbytes)
            if wait > 0 and RATE not in self._reading_paused_by:
                self.pause_reading(RATE)
                self._guard.paused_for_rate()  # type: ignore[union-attr]
                self._loop.call_later(wait, self._rate_paid)

    def _rate_paid(self) -> None:
        """The client's rate debt is paid: read again, and decode what its last read still holds."""
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
        self.closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._wheel.discard(self)
        self._out.clear()
        handler, self.handler = self.handler, None
        if handler is not None:
            handler.connection_lost(self._graceful)

    def pause_writing(self) -> None:
        """The transport holds more than ``--max-client-buffer`` unwritten: a slow consumer (QoS 0
        to it is dropped until it drains below a quarter of that)."""
        self.write_paused = True
        self._backed_up()

    def resume_writing(self) -> None:
        self.write_paused = False
        self._drained()

    def _backed_up(self) -> None:
        """The kernel did not take all of a write: the client reads slower than it is answered.
        Nothing more is read from it (nor decoded of its last read) until its buffer has drained
        (``_drain_check``, or ``resume_writing``). Every packet kind counts: a client that sends
        PINGREQs, SUBSCRIBEs or QoS 1 PUBLISHes and never reads the answers grew the worker by ten
        times what it sent (one uvloop write request of ~400 bytes per tick's few-byte write)."""
        if OUTPUT not in self._reading_paused_by and not self.closing:
            self.pause_reading(OUTPUT)
            if not self._polling:  # one look-out per connection, however often it backs up
                self._polling = True
                self._loop.call_later(DRAIN_POLL_S, self._drain_check, DRAIN_POLL_S)

    def _drain_check(self, delay: float) -> None:
        """Read again once the transport holds nothing unwritten; look again later if it does."""
        transport = self.transport
        if OUTPUT not in self._reading_paused_by or self.closing or transport is None:
            self._polling = False
            return
        if transport.get_write_buffer_size():
            delay = min(2 * delay, DRAIN_POLL_MAX_S)
            self._loop.call_later(delay, self._drain_check, delay)
            return
        self._polling = False
        self._drained()

    def _drained(self) -> None:
        if OUTPUT in self._reading_paused_by:
            # The time its reads were held is not its silence: the keepalive counts from now.
            self._last_rx = self._loop.time()
            self.resume_reading(OUTPUT)
            if self._decoder.has_more and not self.closing:
                self._loop.call_soon(self._read_more)  # what its last read still holds

    # -- what the handler calls ---------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        """Queue bytes for this iteration's single write."""
        out = self._out
        if not out:
            if self.closing:
                return
            self._batcher.mark(self)
        out.append(data)

    def flush(self) -> None:
        out = self._out
        if not out or self.transport is None or self._gate is not None:
            return
        self._out = []
        if self.closing and self.transport.is_closing():
            return
        n = 0
        for chunk in out:
            n += len(chunk)
        self.counters.bytes_out += n
        self.traffic.bytes_out += n
        if self.counters.moved != self.traffic.epoch:
            self.traffic.mark_moved(self)
        transport = self.transport
        transport.write(out[0] if len(out) == 1 else b"".join(out))
        if transport.get_write_buffer_size():
            self._backed_up()

    def gate(self, until: int) -> None:
        """Hold this connection's output, in order, until ``open_gate`` reaches ``until``: the
        router queues a PUBACK/PUBREC at once (so it keeps its place among the connection's
        packets) and gates the connection until the log has written the record (a crash of the
        process must not lose what was acknowledged). A gate opened later by a higher mark only."""
        if self._gate is None or until > self._gate:
            self._gate = until

    def open_gate(self, reached: int) -> None:
        gate = self._gate
        if gate is None or gate > reached:
            return
        self._gate = None
        self.flush()  # from the log's write, in the end-of-iteration pass (or a writer report)
        if self.closing and self.transport is not None and not self.transport.is_closing():
            self._end(True)  # close() came while the gate held the output

    def refuse_output(self, reason: int) -> None:
        """What the gate held can never go out (the log could not write the records it
        acknowledges): drop it, unwritten, and close (MQTT 5: DISCONNECT ``reason``)."""
        self._gate = None
        self._out.clear()
        if not self.closing:
            self.close(reason)
        elif self.transport is not None and not self.transport.is_closing():
            self.transport.close()  # close() came while the gate held the output: end it now

    def accept(self, keepalive: int, protocol_level: int) -> None:
        """The handler accepted CONNECT: start enforcing the keepalive (MQTT-3.1.2-24: 1.5×)."""
        self.protocol_level = protocol_level
        self._decoder.protocol_level = protocol_level
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._keepalive = keepalive * 1.5
        if keepalive:
            self._wheel.add(self, self._loop.time() + self._keepalive)

    def close(self, reason: int | None = None) -> None:
        """Close after flushing what is queued. MQTT 5 clients get DISCONNECT with ``reason``."""
        if self.closing:
            return
        if reason is not None and self.protocol_level >= MQTT_5 and self.phase is CONNECTED:
            self.send(encode(Disconnect(reason_code=reason), MQTT_5))
        # A stopping worker waits for no client: its connections close at once (their wills and
        # sessions are settled before its log closes).
        said = bool(self._out) and reason != Reason.SERVER_SHUTTING_DOWN
        self.flush()
        self.closing = True
        if self.transport is not None and self._gate is None:  # else open_gate closes it
            self._end(said)

    def _end(self, said: bool) -> None:
        """Close the transport. When the close has something to say (``said``: a DISCONNECT, a
        refusing CONNACK, what was queued before them), half-close instead and read and drop the
        client's input until it closes too, or for ``LINGER_S`` at most.

        Why: a socket closed with input unread (a client still pipelining, or answering PUBRECs)
        makes the kernel answer with RST, and the client's next write fails before it reads why it
        was closed (Paho's MQTT 5 flow-control test saw a broken pipe instead of DISCONNECT 0x93).
        TLS and WebSocket transports cannot half-close: they only wait for the client to close."""
        transport = self.transport
        assert transport is not None
        if not said:
            transport.close()
            return
        if self._lingering:
            return
        self._lingering = True
        try:
            if transport.can_write_eof():
                transport.write_eof()  # FIN once the output is written
        except (NotImplementedError, OSError, RuntimeError):
            pass
        if self._reading_paused_by:
            transport.resume_reading()  # drain what it sends meanwhile (data_received drops it)
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_later(LINGER_S, self._linger_over)

    def _linger_over(self) -> None:
        """The client did not close within ``LINGER_S``: close, dropping output it has not read."""
        self._timer = None
        transport = self.transport
        if transport is not None and not transport.is_closing():
            if transport.get_write_buffer_size():
                transport.abort()  # a client that reads nothing must not keep its buffer held
            else:
                transport.close()

    def abort(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.abort()

    def protocol_violation(self, exc: ProtocolError) -> None:
        VIOLATIONS.log(log, "client %s (%s): %s; closing the connection",  # at most 10 a second
                       self.client_id or "-", self.peer, exc.rule)
        counted = getattr(self.handler, "violation", None)
        if counted is not None:
            counted(exc)
        if self.phase is AWAITING_CONNECT and exc.reason == Reason.UNSUPPORTED_PROTOCOL_VERSION:
            # MQTT-3.1.2-2: answer CONNACK 0x01 before closing.
            self.send(encode(Connack(reason_code=1), 4))
            self.flush()
        else:
            self.close(int(exc.reason))
            return
        self.closing = True
        if self.transport is not None:
            self._end(True)

    def pause_reading(self, by: object) -> None:
        """Stop reading from this client (backpressure); several causes may hold it paused."""
        paused_by = self._reading_paused_by
        if not paused_by and self.transport is not None and not self.closing:
            self.transport.pause_reading()
        if paused_by.__class__ is not set:
            paused_by = self._reading_paused_by = set()
        paused_by.add(by)  # type: ignore[union-attr]

    def resume_reading(self, by: object) -> None:
        if by in self._reading_paused_by:
            self._reading_paused_by.remove(by)  # type: ignore[union-attr]
        if self._held is not None and self._reading_paused_by <= _OWN_PAUSES:
            self._loop.call_soon(self._release_held)  # the handler has answered the CONNECT
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
        self._timer = None
        if self.phase is AWAITING_CONNECT and not self.closing:
            log.info("%s: no CONNECT within %.0f s; closing", self.peer, CONNECT_TIMEOUT_S)
            self.abort()

    def check_keepalive(self) -> None:
        """Its keepalive bucket came due (``KeepaliveWheel``): close it if it has been silent for
        its whole keepalive, else check again at its new deadline."""
        if self.closing:
            return
        if OUTPUT in self._reading_paused_by and self.transport is not None:
            # Its reads are held while its output backs up: a client that still reads (slowly) is
            # not silent by its own doing; one that takes nothing at all is dead, and goes.
            written = self.counters.bytes_out - self.transport.get_write_buffer_size()
            if written != self._written:
                self._written = written
                self._last_rx = self._loop.time()
        idle = self._loop.time() - self._last_rx
        if idle >= self._keepalive:
            log.info("client %s (%s): keepalive timeout after %.1f s; closing",
                     self.client_id or "-", self.peer, idle)
            self.close(Reason.KEEP_ALIVE_TIMEOUT)
            return
        self._wheel.add(self, self._last_rx + self._keepalive)
