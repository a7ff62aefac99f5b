"""The keepalive wheel (``connection.keepalive``) against a fake clock: a connection is checked at
the first whole second at or after its deadline, never before; one discarded, never; one added
again when checked, at its new deadline; no timer once nothing waits. The wheel asks its loop
(``connection.loop.Loop``) for ``time`` and ``call_at`` only: here a ``FakeClock`` is the loop, so
no second passes for real."""

from __future__ import annotations

from brokerd.connection.keepalive import KeepaliveWheel
from brokerd.router.clock import FakeClock


class _Conn:
    def __init__(self, wheel: KeepaliveWheel, clock: FakeClock, again: float | None = None) -> None:
        self.keepalive_key: int | None = None
        self.wheel, self.clock, self.again = wheel, clock, again
        self.checked: list[float] = []

    def check_keepalive(self) -> None:
        self.checked.append(self.clock.now())
        if self.again is not None:  # heard from meanwhile: its deadline moved on
            again, self.again = self.again, None
            self.wheel.add(self, self.clock.now() + again)


def _wheel(now: float = 1000.25) -> tuple[FakeClock, KeepaliveWheel]:
    clock = FakeClock(now=now)
    return clock, KeepaliveWheel(clock)


def test_a_connection_is_checked_at_the_second_its_deadline_falls_in_and_not_before():
    clock, wheel = _wheel()
    conn = _Conn(wheel, clock)
    wheel.add(conn, 1001.5)  # rounded up: checked at 1002
    clock.advance(1.7)  # 1001.95
    assert conn.checked == []
    clock.advance(0.05)
    assert conn.checked == [1002.0] and conn.keepalive_key is None
    assert len(wheel) == 0 and clock.pending == 0  # nothing waits: no timer


def test_a_sooner_deadline_moves_the_timer_and_a_discarded_connection_is_never_checked():
    clock, wheel = _wheel()
    later, soon, gone = _Conn(wheel, clock), _Conn(wheel, clock), _Conn(wheel, clock)
    wheel.add(later, 1005.0)
    wheel.add(soon, 1001.2)
    wheel.add(gone, 1001.2)
    wheel.discard(gone)
    clock.advance(1.75)  # 1002
    assert soon.checked == [1002.0] and later.checked == []
    clock.advance(3)
    assert later.checked == [1005.0] and gone.checked == [] and gone.keepalive_key is None


def test_a_connection_heard_from_is_checked_again_at_its_new_deadline():
    clock, wheel = _wheel()
    conn = _Conn(wheel, clock, again=2.5)
    wheel.add(conn, 1001.0)
    clock.advance(10)
    assert conn.checked == [1001.0, 1004.0]  # 1001 + 2.5, rounded up
    assert len(wheel) == 0 and clock.pending == 0


def test_adding_a_connection_again_moves_it_out_of_its_old_bucket():
    clock, wheel = _wheel()
    conn = _Conn(wheel, clock)
    wheel.add(conn, 1001.0)
    wheel.add(conn, 1003.0)
    assert len(wheel) == 1
    clock.advance(10)
    assert conn.checked == [1003.0]
