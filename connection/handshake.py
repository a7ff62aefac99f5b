"""A TLS listener's socket from accept until its handshake is done, then handed to the listener's
protocol (MQTT, or WebSockets over TLS).

Why not the loop's ``create_server(ssl=...)``: it calls the protocol only once the handshake is done,
so a socket that never sends a ClientHello was not counted under ``--max-connections``, not charged
to the listener's ``--max-connection-rate``, and was held for the loop's own 60 s handshake timeout
(600 of them locked a real client out of a worker with 512 descriptors). Here the socket is admitted
and counted at accept, as a plain one is, and its handshake is bounded by ``HANDSHAKE_TIMEOUT_S``.

The TLS layer is the loop's own ``SSLProtocol`` (uvloop's, or asyncio's), put on the socket in
``connection_made`` as ``create_server(ssl=...)`` does. Not ``loop.start_tls``: it is a coroutine,
and uvloop hands a ClientHello that came with the accept to the plain protocol before it runs.

Time: the rate charged at accept is the guard's clock (a ``FakeClock`` in a unit test); the
handshake's bound is that TLS protocol's own timer, on the event loop that runs it (I/O, as its
waiter future is: tested on real sockets).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import TYPE_CHECKING, Any

from .guard import ConnectionGuard
from .listener import Listener
from .state import CONNECT_TIMEOUT_S

if TYPE_CHECKING:
    from .protocol import MQTTConnection
    from .websocket import WebSocketConnection

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = CONNECT_TIMEOUT_S  # docs/limits.md: a socket not yet CONNECTed is held 10 s at most


def _ssl_protocol_class(loop: asyncio.AbstractEventLoop) -> Any:  # uvloop's class is untyped
    """The TLS protocol the loop itself puts on a TLS server's sockets."""
    try:
        import uvloop.loop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        pass
    else:
        if isinstance(loop, uvloop.loop.Loop):
            return uvloop.loop.SSLProtocol
    from asyncio.sslproto import SSLProtocol

    return SSLProtocol


class Handshaking(asyncio.Protocol):
    """The application side of one TLS socket until its handshake is done. ``inner``: the listener's
    protocol (an ``MQTTConnection`` or a ``WebSocketConnection``), made at accept; it gets the TLS
    transport in its ``connection_made``, with ``admitted`` set so that it does not charge the rate
    again, and becomes the TLS transport's protocol."""

    __slots__ = ("inner", "context", "guard", "listener", "timeout", "_counted", "_peer")

    def __init__(self, inner: MQTTConnection | WebSocketConnection, context: ssl.SSLContext,
                 guard: ConnectionGuard | None, listener: Listener | None,
                 timeout: float = HANDSHAKE_TIMEOUT_S) -> None:
        self.inner = inner
        self.context = context
        self.guard = guard  # the worker's ConnectionGuard (None: no limits, a test's)
        self.listener = listener
        self.timeout = timeout
        self._counted = False
        self._peer = "?"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Called twice: with the TCP transport at accept, then with the TLS one (handshake done)."""
        if self._peer != "?" or transport.get_extra_info("sslcontext") is not None:
            self._handover(transport)
            return
        peer = transport.get_extra_info("peername")
        self._peer = f"{peer[0]}:{peer[1]}" if peer else "-"
        guard = self.guard
        if guard is not None:
            if not guard.admit(self.listener):
                log.debug("%s: over the listener's --max-connection-rate; closed", self._peer)
                transport.abort()  # type: ignore[attr-defined]  # a stream's (uvloop's lack the base class)
                return
            guard.opened(self.listener)
            self._counted = True
        self.inner.admitted = True
        loop = asyncio.get_running_loop()  # the TLS protocol and its waiter: the loop's I/O
        waiter = loop.create_future()
        waiter.add_done_callback(self._handshake_done)
        tls = _ssl_protocol_class(loop)(loop, self, self.context, waiter, True, None,
                                        ssl_handshake_timeout=self.timeout)
        transport.set_protocol(tls)
        tls.connection_made(transport)

    def _handshake_done(self, waiter: asyncio.Future) -> None:
        exc = waiter.exception() if not waiter.cancelled() else None
        if exc is not None or waiter.cancelled():
            log.debug("%s: TLS handshake failed: %s", self._peer, exc or "cancelled")
            self._uncount()

    def _handover(self, tls: asyncio.BaseTransport) -> None:
        self._uncount()  # the inner protocol's handler counts it from here
        inner = self.inner
        tls.set_protocol(inner)
        inner.connection_made(tls)

    def data_received(self, data: bytes) -> None:  # pragma: no cover - the inner protocol has it by then
        self.inner.data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:  # pragma: no cover - likewise
        self._uncount()

    def _uncount(self) -> None:
        if self._counted and self.guard is not None:  # counted only where there is a guard
            self._counted = False
            self.guard.closed(self.listener)
