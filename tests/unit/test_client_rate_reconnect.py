"""A client's message rate is its client id's, not its connection's (``ConnectionGuard.client_rate_of``):
a reconnect finds the debt its last connection left, and what came behind its CONNECT waits for
it. Connections on one worker's guard, on a ``FakeClock``, bytes in through ``data_received``."""

from __future__ import annotations

import pytest

import brokerd.connection.guard as guard_mod
from brokerd.connection.batching import EndOfTick
from brokerd.connection.guard import ClientRate, ConnectionGuard
from brokerd.connection.packets import Connect, Publish
from brokerd.connection.protocol import MQTTConnection
from brokerd.router.clock import FakeClock
from tests.unit.test_connection_adapter import CONNECT_V4, PUBLISH_V4, _Handler

from .sockets import FakeTransport

CONNECT_D = CONNECT_V4.replace(b"\x00\x01c", b"\x00\x01d")  # the same CONNECT from client "d"


def _open(clock: FakeClock, guard: ConnectionGuard, waits: bool = False):
    handlers: list[_Handler] = []

    def open_handler(conn: MQTTConnection) -> _Handler:
        handlers.append(_Handler(conn, waits))
        return handlers[0]

    conn = MQTTConnection(open_handler, EndOfTick(clock), max_packet_size=1 << 20, loop=clock, guard=guard)
    transport = FakeTransport()
    conn.connection_made(transport)
    return conn, transport, handlers[0]


def _kinds(handler: _Handler) -> list[type]:
    return [type(p) for p in handler.got]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(now=1000.0)


def test_a_reconnect_finds_its_debt_and_what_came_behind_its_connect_waits_for_it(clock):
    """--max-client-msg-rate 2: six packets are four over the burst (two seconds). Half a second
    later the client connects again with a CONNECT and a PUBLISH: three tokens of debt left, and
    the new read's two on top, 2.5 s before its PUBLISH is handled."""
    guard = ConnectionGuard(clock, msg_rate=2)
    first, _, _ = _open(clock, guard)
    first.data_received(CONNECT_V4 + PUBLISH_V4 * 5)
    first.connection_lost(None)
    clock.advance(0.5)
    again, transport, handler = _open(clock, guard)
    again.data_received(CONNECT_V4 + PUBLISH_V4)
    assert _kinds(handler) == [Connect] and not transport.reading
    clock.advance(2.49)
    assert _kinds(handler) == [Connect] and not transport.reading
    clock.advance(0.02)
    assert _kinds(handler) == [Connect, Publish] and transport.reading


def test_another_client_id_has_a_rate_of_its_own(clock):
    guard = ConnectionGuard(clock, msg_rate=2)
    first, _, _ = _open(clock, guard)
    first.data_received(CONNECT_V4 + PUBLISH_V4 * 5)
    other, transport, handler = _open(clock, guard)
    other.data_received(CONNECT_D + PUBLISH_V4)
    assert _kinds(handler) == [Connect, Publish] and transport.reading


def test_a_connect_never_accepted_leaves_no_rate_for_its_client_id(clock):
    """An identity not checked (the handler never accepted) must not charge the rate a client of
    that id finds next: anyone could then slow anyone down by naming them."""
    guard = ConnectionGuard(clock, msg_rate=2)
    refused, _, _ = _open(clock, guard, waits=True)
    refused.data_received(CONNECT_V4 + PUBLISH_V4 * 5)
    refused.connection_lost(None)
    real, transport, handler = _open(clock, guard)
    real.data_received(CONNECT_V4 + PUBLISH_V4)
    assert _kinds(handler) == [Connect, Publish] and transport.reading


def test_the_client_ids_kept_are_the_most_recently_connected(clock, monkeypatch):
    monkeypatch.setattr(guard_mod, "RECENT_CLIENT_RATES", 2)
    guard = ConnectionGuard(clock, msg_rate=2)
    rates = {cid: guard.client_rate_of(cid, ClientRate(2, 0, clock.time)) for cid in "abc"}
    fresh = ClientRate(2, 0, clock.time)
    assert guard.client_rate_of("a", fresh) is fresh  # forgotten: c came after two others
    assert guard.client_rate_of("c", ClientRate(2, 0, clock.time)) is rates["c"]


def test_what_a_new_connection_spent_before_its_accept_is_charged_to_its_client(clock):
    kept, own = ClientRate(2, 0, clock.time), ClientRate(2, 0, clock.time)
    assert own.charge(5, 0) == 1.5
    kept.take_on(own)
    assert kept.due() == 1.5 and ClientRate(2, 0, clock.time).due() == 0

