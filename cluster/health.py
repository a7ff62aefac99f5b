"""`brokerd health`: does the local broker answer MQTT on its listener, as its clients reach it?

For container HEALTHCHECKs, Kubernetes probes and scripts. Exit status, the one place it is defined
(``--help``, README, docs/operations.md and deploy/Dockerfile say the same): 0 healthy, 1 not healthy,
2 bad options.

The listener comes from the broker's own options (``--listen``/``--port``, ``--config FILE``,
``BROKERD_*``; a wildcard address means loopback). Of several, the probe takes the one with the fewest
layers to get wrong: plain ``mqtt://``, else ``mqtts://``, ``ws://``, ``wss://``, one that requires a
client certificate last. It speaks that listener's protocol: TLS for ``mqtts://`` and ``wss://``; an HTTP
upgrade (the listener's path, subprotocol ``mqtt``) and binary frames for ``ws://`` and ``wss://``. Then it
sends an MQTT 3.1.1 CONNECT with a clean session and expects CONNACK 0, and disconnects.

A closed port, a port that accepts but does not answer (a hung worker), a failed TLS or WebSocket
handshake and a refused CONNECT (at ``--max-connections``) are unhealthy, each said in one line on
stderr. CONNACK 0x04 / 0x05 (bad credentials, not authorized) is healthy: the probe is anonymous, a
listener off loopback or with a password file refuses anonymous clients, and the router read the CONNECT
and answered it. So the probe needs no credentials. Bounded by ``--timeout`` seconds.

TLS: the probe does not check the node's certificate unless told to (``--verify CAFILE``: its chain and
dates, not its names). It reaches its own node on loopback, where the names meant for clients do not
apply; and a check that failed while a renewed certificate waits for SIGHUP would take every node of a
cluster out of service at once. A listener that requires a client certificate is shown the node's own
``--certfile``, which passes where ``--cafile`` signed it.
"""

from __future__ import annotations

import argparse
import os
import socket
import ssl
import sys
import time
from collections.abc import Iterable

from brokerd.connection.listener import Listener

from .config import ConfigError, load

EXIT_HEALTHY, EXIT_UNHEALTHY, EXIT_USAGE = 0, 1, 2
EXIT_STATUS = "exit status: 0 healthy, 1 not healthy, 2 bad options"

CONNACK_CODES = {1: "unacceptable protocol version", 2: "identifier rejected", 3: "server unavailable",
                 4: "bad user name or password", 5: "not authorized"}
HEALTHY_CODES = (0, 4, 5)  # accepted, or refused for who the (anonymous) probe is: the broker works
PREFERENCE = ("mqtt", "mqtts", "ws", "wss")  # fewest layers first
LOOPBACK = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}


class Unhealthy(Exception):
    """What went wrong, in one line."""


def connect_packet(client_id: str, keepalive: int = 10) -> bytes:
    """An MQTT 3.1.1 CONNECT, clean session, no will or credentials."""
    cid = client_id.encode()
    var = b"\x00\x04MQTT\x04\x02" + keepalive.to_bytes(2, "big")
    body = var + len(cid).to_bytes(2, "big") + cid
    return bytes([0x10, len(body)]) + body


def pick(listeners: Iterable[Listener]) -> Listener:
    """The listener to probe: plain before TLS before WebSockets; one that needs a client certificate last."""
    return min(listeners, key=lambda x: (bool(x.require_certificate), PREFERENCE.index(x.scheme)))


def tls_context(listener: Listener, verify: str | None) -> ssl.SSLContext:
    """The probe's TLS client side. Raises OSError / ssl.SSLError when a file cannot be used."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False  # on loopback: the certificate's names are for the node's clients
    if verify:
        ctx.load_verify_locations(cafile=verify)
    else:
        ctx.verify_mode = ssl.CERT_NONE
    if listener.require_certificate and listener.certfile:
        ctx.load_cert_chain(listener.certfile, listener.keyfile)
    return ctx


class _Stream:
    """MQTT bytes on the socket as they are (mqtt://, mqtts://)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self) -> bytes:
        data = self.sock.recv(4096)
        if not data:
            raise Unhealthy("the connection was closed before CONNACK")
        return data


class _WebSocket(_Stream):
    """MQTT bytes in binary WebSocket frames, after the HTTP upgrade (ws://, wss://)."""

    def __init__(self, sock: socket.socket, host: str, path: str) -> None:
        from wsproto import ConnectionType, WSConnection
        from wsproto.events import AcceptConnection, RejectConnection, Request

        super().__init__(sock)
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.sock.sendall(self.ws.send(Request(host=host, target=path, subprotocols=["mqtt"])))
        while True:
            data = self.sock.recv(4096)
            if not data:
                raise Unhealthy("the connection was closed during the WebSocket upgrade")
            self.ws.receive_data(data)
            for event in self.ws.events():
                if isinstance(event, RejectConnection):
                    raise Unhealthy(f"WebSocket upgrade refused: HTTP {event.status_code}")
                if isinstance(event, AcceptConnection):
                    return

    def send(self, data: bytes) -> None:
        from wsproto.events import BytesMessage

        self.sock.sendall(self.ws.send(BytesMessage(data=data)))

    def recv(self) -> bytes:
        from wsproto.events import BytesMessage, CloseConnection

        while True:
            data = self.sock.recv(4096)
            if not data:
                raise Unhealthy("the connection was closed before CONNACK")
            self.ws.receive_data(data)
            payload = b""
            for event in self.ws.events():
                if isinstance(event, BytesMessage):
                    payload += event.data
                elif isinstance(event, CloseConnection):
                    raise Unhealthy(f"WebSocket closed before CONNACK (code {event.code})")
            if payload:
                return payload


def probe(listener: Listener, host: str, timeout: float, context: ssl.SSLContext | None = None) -> str | None:
    """None when ``listener``, reached at ``host``, answers a CONNECT with a CONNACK that means it works;
    else what went wrong. ``context``: the TLS client side for mqtts:// and wss://."""
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection((host, listener.port), timeout=timeout) as raw:
            sock = raw
            raw.settimeout(max(0.01, deadline - time.monotonic()))  # the handshakes have what is left
            if listener.tls:
                sock = (context or tls_context(listener, None)).wrap_socket(raw, server_hostname=host)
            stream = _WebSocket(sock, host, listener.path) if listener.websocket else _Stream(sock)
            stream.send(connect_packet(f"brokerd-health-{os.getpid()}-{os.urandom(4).hex()}"))
            data = b""
            while len(data) < 4:
                sock.settimeout(max(0.01, deadline - time.monotonic()))
                data += stream.recv()
            if data[0] != 0x20 or data[1] != 2:
                return f"expected CONNACK, got {data[:4].hex()}"
            if data[3] not in HEALTHY_CODES:
                return f"CONNACK refused: {CONNACK_CODES.get(data[3], data[3])}"
            stream.send(b"\xe0\x00")  # DISCONNECT
    except Unhealthy as exc:
        return str(exc)
    except TimeoutError:
        return f"no CONNACK within {timeout:g} s"
    except ssl.SSLCertVerificationError as exc:  # before OSError, its base
        return f"TLS: certificate verify failed: {exc.verify_message}"
    except ssl.SSLError as exc:  # the handshake's own words: "tlsv1 alert unknown ca"
        return f"TLS: {(exc.reason or str(exc)).lower().replace('_', ' ')}"
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def main(argv: list[str]) -> int:
    own = argparse.ArgumentParser(prog="brokerd health", description=__doc__.split("\n")[0],
                                  epilog=f"Other options are the broker's (--listen, --port, --config ...). "
                                  f"{EXIT_STATUS.capitalize()}.")
    own.add_argument("--timeout", type=float, default=3.0, metavar="SECONDS",
                     help="how long to wait for CONNACK, connecting and handshakes included (default 3)")
    own.add_argument("--verify", metavar="CAFILE",
                     help="TLS listeners: check the node's certificate chain and dates (not its names) against "
                     "the CAs in CAFILE (default: not checked)")
    args, rest = own.parse_known_args(argv)
    try:
        config = load(rest)
    except ConfigError as exc:
        print(f"brokerd health: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    listener = pick(config.listeners)
    context = None
    if listener.tls:
        try:
            context = tls_context(listener, args.verify)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            which = f"--verify {args.verify}" if args.verify else f"--certfile {listener.certfile}"
            print(f"brokerd health: error: {which}: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
            return EXIT_USAGE
    host = LOOPBACK.get(listener.host, listener.host)
    shown = f"{listener.scheme}://" + (f"[{host}]" if ":" in host else host) + f":{listener.port}" + (
        listener.path if listener.websocket else "")
    problem = probe(listener, host, args.timeout, context)
    if problem is not None:
        print(f"brokerd health: {shown}: {problem}", file=sys.stderr)
        return EXIT_UNHEALTHY
    print(f"brokerd health: {shown}: ok")
    return EXIT_HEALTHY
