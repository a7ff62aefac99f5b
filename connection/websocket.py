"""MQTT over WebSockets (ws:// and wss:// listeners), as browsers and dashboards speak it.

``WebSocketConnection`` is the asyncio Protocol of such a listener: wsproto (sans-IO) parses the
HTTP upgrade and the frames; once the handshake is done (path as configured, subprotocol ``mqtt``
negotiated) it hands the inner ``MQTTConnection`` a transport of its own, ``_FrameTransport``, which
wraps each write in one binary frame. Binary messages' payloads go to the inner connection's
``data_received`` as a byte stream (MQTT packets may span frames, MQTT-6.0.0-2), so the MQTT
connection cannot tell a WebSocket from TCP. Text frames close the connection (MQTT-6.0.0-1).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)
from wsproto.utilities import RemoteProtocolError

from .codec import is_tls_client_hello
from .guard import ConnectionGuard
from .loop import Loop, Timer
from .protocol import CONNECT_TIMEOUT_S, MQTTConnection

log = logging.getLogger(__name__)

SUBPROTOCOLS = ("mqtt", "mqttv3.1")  # "mqttv3.1": what MQTT 3.1 clients (and some libraries) still offer


class WebSocketConnection(asyncio.Protocol):
    """The WebSocket layer of one client connection, around its ``MQTTConnection``."""

    def __init__(self, inner: MQTTConnection, path: str = "/mqtt") -> None:
        self.inner = inner
        self.path = path
        self.ws = WSConnection(ConnectionType.SERVER)
        self.transport: asyncio.Transport | None = None
        self.open = False  # handshake done: the inner connection has been made
        self.peer = "?"
        self._paused = False  # the inner connection paused reading: events wait in wsproto
        self._timer: Timer | None = None  # the handshake's timeout
        self.admitted = False  # charged to the connection rate already (by the TLS layer in front)
        self._counted = False  # counted under --max-connections until the upgrade (guard.opened)
        self._loop = inner.loop  # its MQTT connection's time and timers (a test's: a FakeClock)

    @property
    def guard(self) -> ConnectionGuard | None:
        """The worker's connection-layer limits, its MQTT connection's (None: a test's, no limits)."""
        return self.inner.guard

    @property
    def loop(self) -> Loop:
        """Its MQTT connection's time and timers, which a TLS layer in front of it uses too."""
        return self._loop

    # -- asyncio.Protocol ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (mypy: uvloop's stream transports lack asyncio.Transport's base class)
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = f"{peer[0]}:{peer[1]}"
        # Admitted and counted from accept, as a plain socket is: a socket that never sends its
        # upgrade request holds a descriptor as much as one that never sends CONNECT.
        guard = self.guard
        if guard is not None:
            if not self.admitted and not guard.admit(self.inner.listener):
                log.debug("%s: over the listener's --max-connection-rate; closed", self.peer)
                self._abort()
                return
            guard.opened(self.inner.listener)
            self._counted = True
        self.inner.admitted = True
        self._timer = self._loop.call_later(CONNECT_TIMEOUT_S, self._handshake_timeout)

    def data_received(self, data: bytes) -> None:
        if not self.open and is_tls_client_hello(data) and self.ws.state is ConnectionState.CONNECTING:
            hint = self.inner.listener.tls_url if self.inner.listener is not None else None
            log.warning("%s: TLS handshake on a plain WebSocket listener%s; closing", self.peer,
                        f" (TLS is on {hint})" if hint else "")
            self._abort()
            return
        self.ws.receive_data(data)
        self._pump()

    def eof_received(self) -> bool | None:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._uncount()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.open:
            self.open = False
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    # -- WebSocket events ---------------------------------------------------------------------------

    def _pump(self) -> None:
        """Handle wsproto's events until none is left or the inner connection pauses reading."""
        ws = self.ws
        try:
            for event in ws.events():
                if isinstance(event, BytesMessage):
                    if self.open and not self.inner.closing:
                        self.inner.data_received(bytes(event.data))
                    if self._paused:
                        return  # the rest waits in wsproto until the inner connection reads again
                elif isinstance(event, Request):
                    self._handshake(event)
                elif isinstance(event, Ping):
                    self._write(ws.send(event.response()))
                elif isinstance(event, CloseConnection):
                    if ws.state is not ConnectionState.CLOSED:
                        self._write(ws.send(event.response()))
                    self._close_transport()
                    return
                elif isinstance(event, TextMessage):
                    log.warning("%s: text frame on an MQTT WebSocket (MQTT-6.0.0-1); closing", self.peer)
                    self.close_ws(1003)
                    return
        except RemoteProtocolError as exc:
            log.warning("%s: WebSocket protocol error: %s; closing", self.peer, exc)
            hint = getattr(exc, "event_hint", None)
            if hint is not None:
                try:
                    self._write(ws.send(hint))
                except Exception:  # noqa: BLE001 - the connection goes anyway
                    pass
            self._close_transport()

    def _handshake(self, request: Request) -> None:
        target = request.target.split("?", 1)[0]
        if target != self.path:
            log.warning("%s: WebSocket request for %s, not %s; refused", self.peer, target, self.path)
            self._reject(404)
            return
        offered = [p.strip().lower() for p in request.subprotocols]
        chosen = next((p for p in SUBPROTOCOLS if p in offered), None)
        if chosen is None:
            log.warning("%s: WebSocket without the mqtt subprotocol (offered: %s); refused", self.peer,
                        ", ".join(offered) or "none")
            self._reject(400)
            return
        self._write(self.ws.send(AcceptConnection(subprotocol=chosen)))
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.open = True
        self._uncount()  # its MQTT connection counts it from here
        self.inner.connection_made(_FrameTransport(self))

    def _uncount(self) -> None:
        if self._counted:
            self._counted = False
            guard = self.inner.guard
            if guard is not None:  # counted only where there is one
                guard.closed(self.inner.listener)

    def _reject(self, status: int) -> None:
        self._write(self.ws.send(RejectConnection(status_code=status, headers=[(b"content-length", b"0")],
                                                  has_body=False)))
        self._close_transport()

    def _handshake_timeout(self) -> None:
        self._timer = None
        if not self.open:
            log.info("%s: no WebSocket handshake within %.0f s; closing", self.peer, CONNECT_TIMEOUT_S)
            self._abort()

    # -- writing and closing ------------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def send_binary(self, data: bytes) -> None:
        if self.ws.state is ConnectionState.OPEN:
            self._write(self.ws.send(BytesMessage(data=data)))

    def close_ws(self, code: int = 1000) -> None:
        """A closing handshake (the client answers; its close frame ends the connection), then close."""
        if self.ws.state is ConnectionState.OPEN:
            self._write(self.ws.send(CloseConnection(code=code)))
        self._close_transport()

    def _close_transport(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def pause_reading(self) -> None:
        self._paused = True
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if not self._paused:
            return
        self._paused = False
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()
        # Events parsed but not handed over yet: next iteration (not inside the inner connection's call).
        self._loop.call_soon(self._pump)


class _FrameTransport(asyncio.Transport):
    """The transport the inner MQTT connection writes to: every write is one binary frame."""

    def __init__(self, ws: WebSocketConnection) -> None:
        super().__init__()
        self._ws = ws
        self._closing = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        assert self._ws.transport is not None
        return self._ws.transport.get_extra_info(name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._ws.send_binary(bytes(data))

    def is_closing(self) -> bool:
        transport = self._ws.transport
        return self._closing or transport is None or transport.is_closing()

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            self._ws.close_ws(1000)

    def abort(self) -> None:
        self._closing = True
        self._ws._abort()

    def pause_reading(self) -> None:
        self._ws.pause_reading()

    def resume_reading(self) -> None:
        self._ws.resume_reading()

    def is_reading(self) -> bool:
        return not self._ws._paused

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if self._ws.transport is not None:
            self._ws.transport.set_write_buffer_limits(high=high, low=low)

    def get_write_buffer_size(self) -> int:
        return self._ws.transport.get_write_buffer_size() if self._ws.transport is not None else 0
