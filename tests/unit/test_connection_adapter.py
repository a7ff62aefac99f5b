"""MQTTConnection acts on the rules of ``connection.state``: bytes in through ``data_received``, and
what reaches the handler and the socket checked (a recording transport, no socket, no sleeps)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from brokerd.connection.batching import EndOfTick
from brokerd.connection.packets import Connect, Disconnect, Packet, Publish
from brokerd.connection.protocol import CONNECT_TIMEOUT_S, MQTTConnection

CONNECT_V4 = b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x1e\x00\x01c"
CONNECT_V5 = b"\x10\x0e\x00\x04MQTT\x05\x02\x00\x1e\x00\x00\x01c"
PUBLISH_V4 = b"\x30\x06\x00\x03a/bx"
CONNECTING = "connecting"  # the handler's pause cause while it asks the cluster


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = False
        self.eof = False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True


class _Handler:
    """Accepts CONNECT at once, or (``waits``) pauses reading as the router does while it asks
    the cluster."""

    def __init__(self, conn: MQTTConnection, waits: bool = False) -> None:
        self.conn = conn
        self.waits = waits
        self.got: list[Packet] = []
        self.graceful: bool | None = None

    def packet_received(self, packet: Packet) -> None:
        self.got.append(packet)
        if type(packet) is Connect:
            if self.waits:
                self.conn.pause_reading(CONNECTING)
            else:
                self.conn.accept(30, packet.protocol_level)

    def connection_lost(self, graceful: bool) -> None:
        self.graceful = graceful


def _run(test: Callable[[MQTTConnection, _Transport, _Handler], object], waits: bool = False) -> None:
    async def run() -> None:
        handlers: list[_Handler] = []

        def open_handler(conn: MQTTConnection) -> _Handler:
            handlers.append(_Handler(conn, waits))
            return handlers[0]

        conn = MQTTConnection(open_handler, EndOfTick(asyncio.get_running_loop()), max_packet_size=1 << 20)
        transport = _Transport()
        conn.connection_made(transport)
        result = test(conn, transport, handlers[0])
        if asyncio.iscoroutine(result):
            await result

    asyncio.run(run())


def test_pingreq_is_answered_by_the_connection_not_the_handler() -> None:
    def test(conn: MQTTConnection, transport: _Transport, handler: _Handler) -> None:
        conn.data_received(CONNECT_V4)
        conn.data_received(b"\xc0\x00")
        assert transport.written == b"\xd0\x00"
        assert [type(p) for p in handler.got] == [Connect]

    _run(test)


def test_a_packet_before_connect_closes_the_connection_unhandled() -> None:
    def test(conn: MQTTConnection, transport: _Transport, handler: _Handler) -> None:
        conn.data_received(PUBLISH_V4)
        assert conn.closing and transport.closed
        assert handler.got == [] and transport.written == b""

    _run(test)


def test_an_unsupported_version_gets_connack_1_and_a_half_close() -> None:
    def test(conn: MQTTConnection, transport: _Transport, handler: _Handler) -> None:
        conn.data_received(b"\x10\x0d\x00\x04MQTT\x06\x02\x00\x1e\x00\x01c")
        assert transport.written == b"\x20\x02\x00\x01"
        assert conn.closing and transport.eof and not transport.closed  # lingers while the client reads it

    _run(test)


def test_disconnect_reaches_the_handler_and_its_reason_decides_the_will() -> None:
    for reason, graceful in ((b"\x00", True), (b"\x04", False)):
        def test(conn: MQTTConnection, transport: _Transport, handler: _Handler,
                 reason: bytes = reason, graceful: bool = graceful) -> None:
            conn.data_received(CONNECT_V5 + b"\xe0\x01" + reason + b"\xc0\x00")
            assert [type(p) for p in handler.got] == [Connect, Disconnect]
            assert conn.closing and transport.written == b""  # the PINGREQ behind it is not answered
            conn.connection_lost(None)
            assert handler.graceful is graceful

        _run(test)


def test_a_close_with_a_reason_says_disconnect_to_an_mqtt_5_client() -> None:
    def test(conn: MQTTConnection, transport: _Transport, handler: _Handler) -> None:
        conn.data_received(CONNECT_V5)
        conn.close(0x8D)
        assert transport.written == b"\xe0\x01\x8d"

    _run(test)


def test_packets_behind_a_connect_the_handler_waits_on_are_held_until_it_resumes() -> None:
    async def test(conn: MQTTConnection, transport: _Transport, handler: _Handler) -> None:
        conn.data_received(CONNECT_V4 + PUBLISH_V4 + b"\xc0\x00")
        assert [type(p) for p in handler.got] == [Connect]
        await asyncio.sleep(0)
        assert [type(p) for p in handler.got] == [Connect] and transport.written == b""
        conn.accept(30, 4)
        conn.resume_reading(CONNECTING)
        for _ in range(10):  # bounded: the held packets go in the next loop turn
            if len(handler.got) == 2:
                break
            await asyncio.sleep(0)
        assert [type(p) for p in handler.got] == [Connect, Publish]
        conn.flush()
        assert transport.written == b"\xd0\x00"

    _run(test, waits=True)


# -- the CONNECT timeout: a keepalive deadline until the CONNECT is accepted ----------------------

def _due(conn: MQTTConnection) -> None:
    """What the keepalive wheel does when the connection's bucket comes due."""
    conn._settings.keepalive.discard(conn)
    conn.check_keepalive()


def test_a_silent_socket_is_due_within_the_connect_timeout_and_then_closed() -> None:
    """No timer of its own: its CONNECT timeout is its first keepalive deadline, at most
    CONNECT_TIMEOUT_S after it opened (the wheel's buckets are whole seconds), and when that
    comes due a connection that sent no CONNECT is closed."""
    def test(conn: MQTTConnection, transport: _Transport, handler: _Handler) -> None:
        opened = conn._cstate.heard_at
        assert conn._timer is None
        assert conn.keepalive_key is not None
        assert opened + CONNECT_TIMEOUT_S - 1 <= conn.keepalive_key <= opened + CONNECT_TIMEOUT_S
        _due(conn)
        assert transport.closed and conn.closing and handler.got == []

    _run(test)


def test_the_connect_timeout_spares_a_connect_the_handler_is_deciding_on() -> None:
    """A CONNECT the handler is still deciding on (it asks the cluster) is not timed out: the
    handler answers it; the connection leaves the wheel until it is accepted."""
    def test(conn: MQTTConnection, transport: _Transport, handler: _Handler) -> None:
        conn.data_received(CONNECT_V4)
        _due(conn)
        assert not transport.closed and not conn.closing
        assert conn.keepalive_key is None  # not put back: its keepalive starts at its accept

    _run(test, waits=True)


def test_an_accepted_connect_replaces_the_connect_timeout_with_its_keepalive() -> None:
    def test(conn: MQTTConnection, transport: _Transport, handler: _Handler) -> None:
        conn.data_received(CONNECT_V4)  # keepalive 30 s: checked after 45 s of silence
        now = conn._cstate.heard_at
        assert conn.keepalive_key is not None and conn.keepalive_key >= now + 45
        conn.accept(0, 4)  # (accepted again, without a keepalive: none to check)
        assert conn.keepalive_key is None

    _run(test)
