"""The connection guard's rules (``connection.guard``) against a fake clock: an unfinished packet
held beyond ``packet_timeout`` closes its connection at the next once-a-second look, never before;
a client's rates and a listener's connection rate pay back their debt at the rate's pace. The guard
asks its loop for ``time`` and ``call_later`` only: a ``FakeClock`` answers both. The clock starts
far from the machine's monotonic time, so a rule that read ``time`` itself would fail here."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from brokerd.connection.guard import ConnectionGuard
from brokerd.router.clock import FakeClock


def _stats() -> SimpleNamespace:
    return SimpleNamespace(unconnected=0, limit_connection_rate=0, limit_client_rate=0, limit_packet_timeout=0)


def _clock() -> FakeClock:
    return FakeClock(now=10_000_000.0)  # days of uptime beyond this machine's monotonic clock, or short of it


class _Holder:
    """A connection holding an unfinished packet since ``since`` (0: none)."""

    def __init__(self, since: float) -> None:
        self.partial_since = since
        self.closing = False
        self.timed_out: list[float] = []

    def unfinished_packet_timeout(self, held: float) -> None:
        self.timed_out.append(held)
        self.closing = True


def test_an_unfinished_packet_is_closed_at_the_first_look_after_its_timeout_and_not_before():
    clock, stats = _clock(), _stats()
    guard = ConnectionGuard(clock, packet_timeout=2.5, stats=stats)
    conn = _Holder(clock.time())
    guard.holding(conn)
    clock.advance(2.9)  # looked at after 1 s and 2 s: held 2 s at most
    assert conn.timed_out == [] and stats.limit_packet_timeout == 0
    clock.advance(0.1)  # the look at 3 s: held 3 s, beyond 2.5
    assert conn.timed_out == [3.0] and stats.limit_packet_timeout == 1
    assert clock.pending == 0  # nobody holds one: no look any more


def test_a_packet_finished_in_time_is_forgotten_and_its_looks_stop():
    clock, stats = _clock(), _stats()
    guard = ConnectionGuard(clock, packet_timeout=2.0, stats=stats)
    slow, done = _Holder(clock.time()), _Holder(clock.time())
    guard.holding(slow)
    guard.holding(done)
    clock.advance(1.5)
    done.partial_since = 0.0  # its packet came whole
    clock.advance(1.5)  # the look at 3 s: slow held 3 s
    assert slow.timed_out == [3.0] and done.timed_out == []
    assert stats.limit_packet_timeout == 1 and clock.pending == 0


def test_a_clients_message_rate_pauses_it_for_its_debt_and_refills_with_time():
    clock = _clock()
    rate = ConnectionGuard(clock, msg_rate=10.0).client_rate()
    assert rate is not None
    assert rate.charge(10, 0) == 0.0  # a second's worth saved up
    assert rate.charge(5, 0) == pytest.approx(0.5)  # 5 in debt: half a second at 10 a second
    clock.advance(0.5)
    assert rate.charge(0, 0) == 0.0  # paid back
    assert rate.charge(1, 0) == pytest.approx(0.1)
    clock.advance(5.0)  # refilled, up to one second's worth only
    assert rate.charge(10, 0) == 0.0
    assert rate.charge(1, 0) == pytest.approx(0.1)


def test_a_clients_byte_rate_and_message_rate_pause_it_for_the_longer_debt():
    clock = _clock()
    rate = ConnectionGuard(clock, msg_rate=100.0, byte_rate=1000.0).client_rate()
    assert rate is not None
    assert rate.charge(1, 3000) == pytest.approx(2.0)  # 2000 bytes beyond a second's 1000
    clock.advance(2.0)
    assert rate.charge(150, 0) == pytest.approx(0.5)  # now the messages: 50 beyond 100


def test_a_listeners_connection_rate_refuses_beyond_it_until_a_token_comes_back():
    clock, stats = _clock(), _stats()
    guard = ConnectionGuard(clock, connection_rate=2.0, stats=stats)
    assert [guard.admit(None) for _ in range(3)] == [True, True, False]
    assert stats.limit_connection_rate == 1
    clock.advance(0.4)  # 0.8 of a token back: not yet one
    assert guard.admit(None) is False
    clock.advance(0.1)
    assert [guard.admit(None) for _ in range(2)] == [True, False]
    assert stats.limit_connection_rate == 3
