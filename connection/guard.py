"""Limits applied where bytes come in, one ``ConnectionGuard`` per worker: the connection rate of
each listener, each client's message and byte rates, and how long a connection may hold an
unfinished packet. The router's limits (client ids, subscriptions, retained, QoS 2 ...) are in
``router/limits.py``; these are the ones a client can push against before any packet is whole.

Costs: without rates nothing per read; with them two token-bucket updates per read (not per
message) and one timer per pause. The unfinished-packet check is one attribute test per read, a
set entry while a connection holds an unfinished packet, and once a second a look at those
connections only (it was all of the worker's connections: a pause a second at 100k of them).

Time is the loop's (``time()``, ``call_later``; ``connection.loop.Loop``), as the keepalive
wheel's: nothing here reads ``time``, so a test gives a ``router.clock.FakeClock`` as the loop
and no second passes for real.
The rates need only a monotonic clock; the unfinished packet's start (``Holder.partial_since``)
is on the loop's clock too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from .listener import Listener
from .loop import Loop

RATE = "rate"  # the pause_reading cause while a client is over its rate
# Client ids whose rates a worker keeps, the most recently connected: a reconnect within them
# finds the debt its client left (``ConnectionGuard.client_rate_of``). About 300 bytes each with
# both rates on (measured, compiled), and the id string of a client gone.
RECENT_CLIENT_RATES = 10_000


class GuardStats(Protocol):
    """The router's counters the guard bumps (``router.stats.Stats``)."""

    unconnected: int
    limit_connection_rate: int
    limit_client_rate: int
    limit_packet_timeout: int


class Holder(Protocol):
    """A connection that may hold an unfinished packet (``MQTTConnection``)."""

    partial_since: float  # when the unfinished packet began, the loop's time (0: none)
    closing: bool

    def unfinished_packet_timeout(self, held: float) -> None: ...


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up (a second's worth by default), full
    at ``now`` (the seconds of any monotonic clock: ``take`` is given the same clock's)."""

    __slots__ = ("rate", "burst", "tokens", "stamp")

    def __init__(self, rate: float, now: float, burst: float | None = None) -> None:
        self.rate = rate
        self.burst = burst if burst is not None else max(rate, 1.0)
        self.tokens = self.burst
        self.stamp = now

    def take(self, n: float, now: float) -> float:
        """Spend ``n`` tokens (going into debt if need be); the seconds until the debt is paid."""
        tokens = self.tokens + (now - self.stamp) * self.rate
        self.stamp = now
        tokens = (tokens if tokens < self.burst else self.burst) - n
        self.tokens = tokens
        return 0.0 if tokens >= 0 else -tokens / self.rate


class ClientRate:
    """One client's message and byte budgets; ``charge`` says how long to pause its reads.
    ``clock``: the loop's ``time`` (seconds), read once a charge."""

    __slots__ = ("msgs", "bytes", "clock")

    def __init__(self, msg_rate: float, byte_rate: float, clock: Callable[[], float]) -> None:
        now = clock()
        self.clock = clock
        self.msgs = TokenBucket(msg_rate, now) if msg_rate > 0 else None
        self.bytes = TokenBucket(byte_rate, now) if byte_rate > 0 else None

    def charge(self, packets: int, nbytes: int) -> float:
        now = self.clock()
        wait = 0.0
        if self.msgs is not None and packets:
            wait = self.msgs.take(packets, now)
        if self.bytes is not None and nbytes:
            wait = max(wait, self.bytes.take(nbytes, now))
        return wait

    def due(self) -> float:
        """The seconds until the debt is paid (0: none)."""
        now = self.clock()
        wait = 0.0
        if self.msgs is not None:
            wait = self.msgs.take(0, now)
        if self.bytes is not None:
            wait = max(wait, self.bytes.take(0, now))
        return wait

    def take_on(self, other: ClientRate) -> None:
        """Charge what ``other`` (a new connection's budgets, full when it began) has spent and not
        earned back yet: its reads before its CONNECT was accepted count for its client."""
        now = self.clock()
        for mine, theirs in ((self.msgs, other.msgs), (self.bytes, other.bytes)):
            if mine is not None and theirs is not None:
                spent = theirs.burst - min(theirs.burst, theirs.tokens + (now - theirs.stamp) * theirs.rate)
                if spent > 0:
                    mine.take(spent, now)


class ConnectionGuard:
    def __init__(self, loop: Loop, *, connection_rate: float = 0.0, msg_rate: float = 0.0,
                 byte_rate: float = 0.0, packet_timeout: float = 0.0, stats: GuardStats | None = None,
                 sockets: dict[Listener, int] | None = None) -> None:
        """``connection_rate``: new connections a second per listener for this worker (its share);
        ``msg_rate``/``byte_rate``: per client; ``packet_timeout``: seconds; 0 turns each off.
        ``stats``: the router's counters (``limit_*``); ``sockets``: the router's open sockets per
        listener with a max_connections (``router.limits.listener_opened``). ``loop``: its
        ``time()`` and ``call_later`` (a ``FakeClock`` in a unit test)."""
        self.loop = loop
        self.connection_rate = connection_rate
        self.msg_rate = msg_rate
        self.byte_rate = byte_rate
        self.packet_timeout = packet_timeout
        self.stats = stats
        self.sockets = sockets
        self._accepts: dict[Listener | None, TokenBucket] = {}
        self._partial: set[Holder] = set()  # connections that held an unfinished packet at a read
        # The rates of the RECENT_CLIENT_RATES client ids accepted last, oldest first: a client's
        # rate is its own, not its connection's (``client_rate_of``).
        self._rates: dict[str, ClientRate] = {}
        self._sweeping = False

    def holding(self, conn: Holder) -> None:
        """``conn`` began holding an unfinished packet (its ``partial_since``): looked at once a
        second while it does."""
        if self.packet_timeout <= 0:
            return
        self._partial.add(conn)
        if not self._sweeping:
            self._sweeping = True
            self.loop.call_later(1.0, self._sweep)

    def admit(self, listener: Listener | None) -> bool:
        """Whether a new connection on ``listener`` is within its rate (counted when not)."""
        if self.connection_rate <= 0:
            return True
        bucket = self._accepts.get(listener)
        now = self.loop.time()
        if bucket is None:
            bucket = self._accepts[listener] = TokenBucket(self.connection_rate, now)
        if bucket.take(1, now) <= 0:
            return True
        bucket.tokens += 1  # a refused connection costs nothing
        if self.stats is not None:
            self.stats.limit_connection_rate += 1
        return False

    def opened(self, listener: Listener | None) -> None:
        """A socket accepted on a TLS or WebSocket listener, its handshake not done: it counts under
        --max-connections (``unconnected``, as a plain socket not yet CONNECTed does) and its
        listener's max_connections until ``closed``, when it is handed to its MQTT connection (which
        counts it from there) or gone."""
        if self.stats is not None:
            self.stats.unconnected += 1
        sockets = self.sockets
        if sockets is not None and listener is not None and listener.max_connections:
            sockets[listener] = sockets.get(listener, 0) + 1

    def closed(self, listener: Listener | None) -> None:
        if self.stats is not None:
            self.stats.unconnected -= 1
        sockets = self.sockets
        if sockets is not None and listener is not None and listener.max_connections:
            n = sockets.get(listener, 0) - 1
            if n > 0:
                sockets[listener] = n
            else:
                sockets.pop(listener, None)

    def client_rate(self) -> ClientRate | None:
        if self.msg_rate > 0 or self.byte_rate > 0:
            return ClientRate(self.msg_rate, self.byte_rate, self.loop.time)
        return None

    def client_rate_of(self, client_id: str, own: ClientRate) -> ClientRate:
        """The rate of ``client_id``, whose CONNECT was accepted on a connection with the rate
        ``own``: the one of its last connection, if among the recent, with what ``own`` spent
        taken on, else ``own``. Kept for its next connection, or one that takes this one over
        (sharing it meanwhile): a reconnect does not clear the debt of what it sent, as it would
        if each connection had its own. Accepted only (an identity checked): a CONNECT refused
        never charges another client's rate. Once a CONNECT, never per message."""
        rates = self._rates
        kept = rates.pop(client_id, None)
        if kept is None:
            kept = own
            if len(rates) >= RECENT_CLIENT_RATES:
                del rates[next(iter(rates))]  # the least recently connected
        elif kept is not own:
            kept.take_on(own)
        rates[client_id] = kept
        return kept

    def paused_for_rate(self) -> None:
        if self.stats is not None:
            self.stats.limit_client_rate += 1

    def _sweep(self) -> None:
        """Close the connections that have held an unfinished packet for ``packet_timeout``;
        forget those that finished it (or closed)."""
        now = self.loop.time()
        limit = self.packet_timeout
        for conn in list(self._partial):
            since = conn.partial_since
            if not since or conn.closing:
                self._partial.discard(conn)
            elif now - since > limit:
                self._partial.discard(conn)
                if self.stats is not None:
                    self.stats.limit_packet_timeout += 1
                conn.unfinished_packet_timeout(now - since)
        if self._partial:
            self.loop.call_later(1.0, self._sweep)
        else:
            self._sweeping = False
