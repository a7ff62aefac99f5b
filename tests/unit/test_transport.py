"""What brokerd takes from its event loop's transports instead of doing itself."""

from __future__ import annotations

import asyncio
import socket

import pytest
import uvloop


@pytest.mark.parametrize("loop_factory", [uvloop.new_event_loop, asyncio.new_event_loop], ids=["uvloop", "asyncio"])
def test_accepted_tcp_connections_come_with_tcp_nodelay(loop_factory):
    """``MQTTConnection.connection_made`` does not set TCP_NODELAY: both loops set it on every
    TCP transport (Nagle's algorithm would hold a PUBACK or a small PUBLISH back for the peer's
    delayed ACK, up to 40 ms). Should a loop stop doing so, this fails."""
    seen: list[int] = []

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            sock = transport.get_extra_info("socket")
            seen.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()  # type: ignore[attr-defined]

    async def run() -> None:
        server = await asyncio.get_running_loop().create_server(Probe, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(200):  # bounded: 2 s
            if seen:
                break
            await asyncio.sleep(0.01)
        writer.close()
        server.close()
        await server.wait_closed()

    loop = loop_factory()
    try:
        loop.run_until_complete(run())
    finally:
        loop.close()
    assert seen and seen[0] != 0
