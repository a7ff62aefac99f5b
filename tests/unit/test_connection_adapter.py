"""MQTTConnection acts on the rules of ``connection.state``: bytes in through ``data_received``, and
what reaches the handler and the socket checked (a recording transport, no socket, no sleeps). The
rules with a time in them (the CONNECT timeout, the keepalive, a client's rate, an unfinished
packet's timeout, the lingering close) run on a ``FakeClock`` given as the connection's loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from brokerd.connection.batching import EndOfTick
from brokerd.connection.guard import ConnectionGuard
from brokerd.connection.output import LINGER_S
from brokerd.connection.packets import Connect, Disconnect, Packet, Publish
from brokerd.connection.protocol import CONNECT_TIMEOUT_S, MQTTConnection
from brokerd.router.clock import FakeClock

from .sockets import FakeTransport

CONNECT_V4 = b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x1e\x00\x01c"
CONNECT_V5 = b"\x10\x0e\x00\x04MQTT\x05\x02\x00\x1e\x00\x00\x01c"
PUBLISH_V4 = b"\x30\x06\x00\x03a/bx"
CONNECTING = "connecting"  # the handler's pause cause while it asks the cluster


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


def _run(test: Callable[[MQTTConnection, FakeTransport, _Handler], object], waits: bool = False) -> None:
    async def run() -> None:
        handlers: list[_Handler] = []

        def open_handler(conn: MQTTConnection) -> _Handler:
            handlers.append(_Handler(conn, waits))
            return handlers[0]

        conn = MQTTConnection(open_handler, EndOfTick(asyncio.get_running_loop()), max_packet_size=1 << 20)
        transport = FakeTransport()
        conn.connection_made(transport)
        result = test(conn, transport, handlers[0])
        if asyncio.iscoroutine(result):
            await result

    asyncio.run(run())


def test_pingreq_is_answered_by_the_connection_not_the_handler() -> None:
    def test(conn: MQTTConnection, transport: FakeTransport, handler: _Handler) -> None:
        conn.data_received(CONNECT_V4)
        conn.data_received(b"\xc0\x00")
        assert transport.written == b"\xd0\x00"
        assert [type(p) for p in handler.got] == [Connect]

    _run(test)


def test_a_packet_before_connect_closes_the_connection_unhandled() -> None:
    def test(conn: MQTTConnection, transport: FakeTransport, handler: _Handler) -> None:
        conn.data_received(PUBLISH_V4)
        assert conn.closing and transport.closed
        assert handler.got == [] and transport.written == b""

    _run(test)


def test_an_unsupported_version_gets_connack_1_and_a_half_close() -> None:
    def test(conn: MQTTConnection, transport: FakeTransport, handler: _Handler) -> None:
        conn.data_received(b"\x10\x0d\x00\x04MQTT\x06\x02\x00\x1e\x00\x01c")
        assert transport.written == b"\x20\x02\x00\x01"
        assert conn.closing and transport.eof and not transport.closed  # lingers while the client reads it

    _run(test)


def test_disconnect_reaches_the_handler_and_its_reason_decides_the_will() -> None:
    for reason, graceful in ((b"\x00", True), (b"\x04", False)):
        def test(conn: MQTTConnection, transport: FakeTransport, handler: _Handler,
                 reason: bytes = reason, graceful: bool = graceful) -> None:
            conn.data_received(CONNECT_V5 + b"\xe0\x01" + reason + b"\xc0\x00")
            assert [type(p) for p in handler.got] == [Connect, Disconnect]
            assert conn.closing and transport.written == b""  # the PINGREQ behind it is not answered
            conn.connection_lost(None)
            assert handler.graceful is graceful

        _run(test)


def test_a_close_with_a_reason_says_disconnect_to_an_mqtt_5_client() -> None:
    def test(conn: MQTTConnection, transport: FakeTransport, handler: _Handler) -> None:
        conn.data_received(CONNECT_V5)
        conn.close(0x8D)
        assert transport.written == b"\xe0\x01\x8d"

    _run(test)


def test_packets_behind_a_connect_the_handler_waits_on_are_held_until_it_resumes() -> None:
    async def test(conn: MQTTConnection, transport: FakeTransport, handler: _Handler) -> None:
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


# -- on the loop's clock: a FakeClock as the connection's loop, its keepalive wheel on it too -------

def _clocked(waits: bool = False, **guard: float) -> tuple[FakeClock, MQTTConnection, FakeTransport, _Handler]:
    """A connection opened at 1000.0 on a fake clock (``guard``: the worker's limits, on it too)."""
    clock = FakeClock(now=1000.0)
    handlers: list[_Handler] = []

    def open_handler(conn: MQTTConnection) -> _Handler:
        handlers.append(_Handler(conn, waits))
        return handlers[0]

    conn = MQTTConnection(open_handler, EndOfTick(clock), max_packet_size=1 << 20, loop=clock,
                          guard=ConnectionGuard(clock, **guard) if guard else None)
    transport = FakeTransport()
    conn.connection_made(transport)
    return clock, conn, transport, handlers[0]


def test_a_silent_socket_is_closed_by_its_connect_timeout_and_not_before() -> None:
    """No timer of its own: its CONNECT timeout is its first keepalive deadline, due in the
    wheel's whole second at most CONNECT_TIMEOUT_S after it opened, never a second earlier."""
    clock, conn, transport, handler = _clocked()
    assert conn._timer is None and conn.keepalive_key is not None
    clock.advance(CONNECT_TIMEOUT_S - 1 - 0.01)
    assert not transport.closed
    clock.advance(1.01)
    assert transport.aborted and conn.closing and handler.got == []
    assert clock.pending == 0  # nothing left behind: no timer waits for it


def test_the_connect_timeout_spares_a_connect_the_handler_is_deciding_on() -> None:
    """A CONNECT the handler is still deciding on (it asks the cluster) is not timed out: the
    handler answers it; the connection leaves the wheel until it is accepted."""
    clock, conn, transport, handler = _clocked(waits=True)
    conn.data_received(CONNECT_V4)
    clock.advance(2 * CONNECT_TIMEOUT_S)
    assert not transport.closed and not conn.closing
    assert conn.keepalive_key is None  # not put back: its keepalive starts at its accept


def test_an_accepted_connect_replaces_the_connect_timeout_with_its_keepalive() -> None:
    clock, conn, transport, handler = _clocked()
    conn.data_received(CONNECT_V4)  # keepalive 30 s: checked after 45 s of silence
    assert conn.keepalive_key is not None and conn.keepalive_key >= 1045
    clock.advance(CONNECT_TIMEOUT_S + 1)
    assert not transport.closed
    conn.accept(0, 4)  # (accepted again, without a keepalive: none to check)
    assert conn.keepalive_key is None


def test_a_client_silent_for_one_and_a_half_keepalives_is_closed_and_one_heard_from_is_not() -> None:
    """MQTT-3.1.2-24: keepalive 30 s, closed after 45 s without a packet; a PINGREQ at 40 s
    moves the deadline to 85 s."""
    clock, conn, transport, handler = _clocked()
    conn.data_received(CONNECT_V4)
    clock.advance(40)
    conn.data_received(b"\xc0\x00")
    assert transport.take() == b"\xd0\x00"
    clock.advance(44.9)  # 1084.9: checked at 1045, silent for 5 s then: looked at again at 1085
    assert not transport.closed
    clock.advance(0.2)
    assert transport.closed and conn.closing and transport.take() == b""  # 3.1.1: no DISCONNECT to say


def test_a_client_over_its_message_rate_is_read_again_when_the_clock_has_paid_its_debt() -> None:
    """--max-client-msg-rate 2: six packets in one read are four over the two-message burst, two
    seconds of debt at two a second; reading pauses for exactly that long."""
    clock, conn, transport, handler = _clocked(msg_rate=2)
    conn.data_received(CONNECT_V4 + PUBLISH_V4 * 5)
    assert len(handler.got) == 6 and not transport.reading
    clock.advance(1.99)
    assert not transport.reading
    clock.advance(0.02)
    assert transport.reading and not transport.closed


def test_an_unfinished_packet_held_past_the_packet_timeout_closes_the_connection() -> None:
    """--packet-timeout 5: half a PUBLISH, then nothing. The guard looks once a second, on the
    same clock as the connection's ``partial_since``; the whole packet in time is no hold."""
    clock, conn, transport, handler = _clocked(packet_timeout=5.0)
    conn.data_received(CONNECT_V4 + PUBLISH_V4[:4])
    clock.advance(3)
    conn.data_received(PUBLISH_V4[4:])  # finished at 3 s
    assert [type(p) for p in handler.got] == [Connect, Publish] and conn.partial_since == 0.0
    conn.data_received(PUBLISH_V4[:3])  # another, begun at 3 s and never finished
    clock.advance(5)
    assert not transport.closed
    clock.advance(1.01)
    assert transport.closed and conn.closing


def test_a_refused_connect_lingers_for_its_connack_then_the_socket_closes() -> None:
    """An unsupported protocol level: CONNACK 0x01, a half close, and LINGER_S for the client to
    read it; a client that does not close by then is closed."""
    clock, conn, transport, handler = _clocked()
    conn.data_received(b"\x10\x0d\x00\x04MQTT\x06\x02\x00\x1e\x00\x01c")
    assert transport.take() == b"\x20\x02\x00\x01" and transport.eof and not transport.closed
    clock.advance(LINGER_S - 0.01)
    assert not transport.closed
    clock.advance(0.02)
    assert transport.closed and not transport.aborted  # nothing unwritten: a close, not an abort


def test_sockets_over_the_listeners_connection_rate_are_refused_until_the_clock_refills_it() -> None:
    """--max-connection-rate 2 (this worker's share): two sockets at once are admitted, a third
    is aborted at accept, unhandled; half a second later the bucket holds one again."""
    clock = FakeClock(now=1000.0)
    guard = ConnectionGuard(clock, connection_rate=2)

    def accept() -> FakeTransport:
        conn = MQTTConnection(lambda c: _Handler(c), EndOfTick(clock), max_packet_size=1 << 20, loop=clock,
                              guard=guard)
        transport = FakeTransport()
        conn.connection_made(transport)
        return transport

    assert [accept().aborted for _ in range(3)] == [False, False, True]
    clock.advance(0.49)
    assert accept().aborted
    clock.advance(0.02)
    assert [accept().aborted for _ in range(2)] == [False, True]
