"""A connection whose output backs up: reading pauses until the transport has written everything,
and the keepalive tells a client that still reads, slowly, from one that takes nothing at all. The
connection's loop is a ``FakeClock``: the drain polls and the keepalive run on ``advance``."""

from __future__ import annotations

import asyncio

from brokerd.connection.batching import EndOfTick
from brokerd.connection.flow import OUTPUT
from brokerd.connection.packets import Connect
from brokerd.connection.protocol import MQTTConnection
from brokerd.router.clock import FakeClock


class _Transport(asyncio.Transport):
    """A socket whose kernel takes nothing while ``stuck``: what is written stays in ``buffered``."""

    def __init__(self) -> None:
        super().__init__()
        self.buffered = 0
        self.stuck = True
        self.reading = True
        self.closed = False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def write(self, data: bytes) -> None:
        if self.stuck:
            self.buffered += len(data)

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True


class _Handler:
    def __init__(self, conn: MQTTConnection) -> None:
        self.conn = conn

    def packet_received(self, packet: object) -> None:
        if type(packet) is Connect:
            self.conn.accept(1, 4)  # keepalive 1 s: enforced at 1.5 s

    def connection_lost(self, graceful: bool) -> None:
        pass


def _connected(clock: FakeClock) -> tuple[MQTTConnection, _Transport]:
    conn = MQTTConnection(_Handler, EndOfTick(clock), max_packet_size=1 << 20, loop=clock)
    transport = _Transport()
    conn.connection_made(transport)
    conn.data_received(b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x01\x00\x01c")
    return conn, transport


def test_reading_pauses_while_the_output_backs_up_and_resumes_once_written():
    clock = FakeClock()
    conn, transport = _connected(clock)
    assert transport.reading
    conn.send(b"\xd0\x00")
    conn.flush()  # the kernel took none of it
    assert not transport.reading
    clock.advance(0.05)
    assert not transport.reading  # still not written
    transport.buffered = 0  # written at last
    clock.advance(0.03)  # its next look, at 70 ms (at 10, 30, 70 ms: the wait doubles)
    assert transport.reading and OUTPUT not in conn._reading_paused_by


def test_the_keepalive_spares_a_slow_reader_and_closes_one_that_takes_nothing():
    clock = FakeClock()
    slow, slow_transport = _connected(clock)
    dead, dead_transport = _connected(clock)
    for conn in (slow, dead):
        conn.send(b"\x30\x05\x00\x01tab")
        conn.flush()
    for _ in range(40):  # 4 s: more than twice the 1.5 s keepalive, nothing read from either
        clock.advance(0.1)
        slow_transport.buffered -= 1  # the slow one takes a byte now and then
        slow.send(b"\x30\x05\x00\x01tab")
        slow.flush()  # and more comes for it
    assert (slow.closing, dead.closing) == (False, True)
