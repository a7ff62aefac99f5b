"""connection/handshake.py on real sockets and both loops (asyncio's, uvloop's): a TLS socket counts
from accept until its handshake ends, however it ends, and what the client sends with its handshake
reaches the listener's protocol in order."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import ssl
import subprocess
from types import SimpleNamespace

import pytest

from brokerd.connection.guard import ConnectionGuard
from brokerd.connection.handshake import Handshaking
from brokerd.router.clock import FakeClock
from tests.helpers import wait_for

from .sockets import FakeTransport

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


@pytest.fixture(scope="module")
def cert(tmp_path_factory) -> tuple[str, str]:
    d = tmp_path_factory.mktemp("cert")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(d / "k.pem"), "-out", str(d / "c.pem")],
                   check=True, capture_output=True, timeout=60)
    return str(d / "c.pem"), str(d / "k.pem")


class _Inner(asyncio.Protocol):
    """The listener's protocol: answers every read with what it read."""

    def __init__(self) -> None:
        self.admitted = False
        self.made = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.made = True
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(b"echo:" + data)  # type: ignore[attr-defined]


def _loops() -> list[str]:
    try:
        import uvloop  # noqa: F401
    except ImportError:  # pragma: no cover
        return ["asyncio"]
    return ["asyncio", "uvloop"]


def _run(kind: str, main) -> object:
    if kind == "uvloop":
        import uvloop

        return uvloop.run(main())
    return asyncio.run(main())


# The handshake bound of the test's sockets: the silent one is counted this long, while the test
# reads the count with the garbage one done. The silent one is opened after the five handshakes:
# opened before, its bound (0.5 s, then 2 s) ran out while they were made on a loaded box.
HANDSHAKE_S = 2.0


def _until_closed(sock: socket.socket) -> None:
    """Read (a TLS alert, maybe) until the server closes ``sock``; bounded by its timeout."""
    while sock.recv(100):
        pass


@pytest.mark.parametrize("kind", _loops())
def test_a_tls_socket_counts_from_accept_until_its_handshake_ends(kind, cert):
    """Each count is read once what it follows has happened on the server (the echoes back, the
    garbage socket closed, the silent socket closed), not after a sleep: the loop is another
    thread, late on a loaded box."""
    certfile, keyfile = cert

    async def main() -> tuple[list[int], list[bytes], bool]:
        loop = asyncio.get_running_loop()
        stats = SimpleNamespace(unconnected=0, limit_connection_rate=0)
        guard = ConnectionGuard(loop, stats=stats)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(certfile, keyfile)
        inners: list[_Inner] = []

        def factory() -> Handshaking:
            inners.append(_Inner())
            return Handshaking(inners[-1], ctx, guard, None, timeout=HANDSHAKE_S)

        server = await loop.create_server(factory, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        counts: list[int] = []

        def count(expected: int, what: str) -> None:
            """The count once it is ``expected`` (bounded): the loop applies each change a moment
            after the client sees its effect."""
            with contextlib.suppress(AssertionError):
                wait_for(lambda: stats.unconnected == expected, 5.0, what)
            counts.append(stats.unconnected)

        def clients() -> list[bytes]:
            got = []
            client = ssl.create_default_context(cafile=certfile)
            for i in range(5):  # the CONNECT-like bytes go with the handshake's last flight
                with client.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10),
                                        server_hostname="127.0.0.1") as s:
                    s.sendall(b"hello%d" % i)
                    got.append(s.recv(100))
            counts.append(stats.unconnected)  # the handed-over ones are the handler's to count
            silent = socket.create_connection(("127.0.0.1", port), timeout=HANDSHAKE_S + 10)
            count(1, "the silent socket counted")
            garbage = socket.create_connection(("127.0.0.1", port), timeout=10)
            garbage.sendall(b"GET / HTTP/1.1\r\n\r\n")
            _until_closed(garbage)  # its handshake failed
            count(1, "the garbage socket uncounted, the silent one still counted")
            got.append(silent.recv(1))  # closed after the handshake timeout
            silent.close()
            garbage.close()
            count(0, "the silent socket uncounted")
            return got

        got = await loop.run_in_executor(None, clients)
        server.close()
        return counts, got, all(i.admitted for i in inners) and sum(i.made for i in inners) == 5

    counts, got, handed = _run(kind, main)  # type: ignore[misc]
    assert counts == [0, 1, 1, 0]
    assert got == [b"echo:hello%d" % i for i in range(5)] + [b""]
    assert handed


def test_the_connection_rate_is_charged_at_accept_before_any_tls_on_the_guards_clock(cert):
    """--max-connection-rate 1 on a fake clock: the first socket is admitted, counted, and its TLS
    layer put on it; a second at the same time is aborted with nothing counted and no TLS; a
    second later the bucket holds one again. (The TLS layer is the loop's own: a loop runs.)"""
    certfile, keyfile = cert

    async def main() -> None:
        clock = FakeClock()
        stats = SimpleNamespace(unconnected=0, limit_connection_rate=0)
        guard = ConnectionGuard(clock, connection_rate=1, stats=stats)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(certfile, keyfile)

        def accept() -> tuple[FakeTransport, _Inner, Handshaking]:
            inner = _Inner()
            handshaking = Handshaking(inner, ctx, guard, None)
            transport = FakeTransport(("127.0.0.1", 50000))
            transport.set_protocol(handshaking)
            handshaking.connection_made(transport)
            return transport, inner, handshaking

        first, inner, handshaking = accept()
        assert not first.aborted and inner.admitted and stats.unconnected == 1
        assert first.get_protocol() is not handshaking  # the TLS layer's, waiting for a ClientHello
        second, inner, handshaking = accept()
        assert second.aborted and not inner.admitted and second.get_protocol() is handshaking
        assert stats.unconnected == 1 and stats.limit_connection_rate == 1
        clock.advance(0.99)
        assert accept()[0].aborted
        clock.advance(0.02)
        assert not accept()[0].aborted and stats.unconnected == 2

    asyncio.run(main())
