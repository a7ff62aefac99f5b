"""The mesh requests' deadlines (cluster/mesh/waiter.py ``Deadlines``): one timer for all of
them, set for the earliest; a request answered in time is never due, one past its deadline is,
once, and may be added again. A fake loop: its clock moves only when the test says."""

from __future__ import annotations

from typing import Any

from brokerd.cluster.mesh.waiter import Deadlines


class FakeTimer:
    def __init__(self, when: float, callback: Any) -> None:
        self._when = when
        self.callback = callback
        self.cancelled = False

    def when(self) -> float:
        return self._when

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    """``time`` and ``call_at`` as asyncio's; ``advance`` runs what is due, in order."""

    def __init__(self) -> None:
        self.now = 100.0
        self.timers: list[FakeTimer] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Any) -> FakeTimer:
        timer = FakeTimer(when, callback)
        self.timers.append(timer)
        return timer

    def pending(self) -> list[FakeTimer]:
        return [t for t in self.timers if not t.cancelled]

    def advance(self, seconds: float) -> None:
        self.now += seconds
        while True:
            due = sorted((t for t in self.pending() if t.when() <= self.now), key=FakeTimer.when)
            if not due:
                return
            timer = due[0]
            self.timers.remove(timer)
            timer.callback()


def deadlines() -> tuple[Deadlines, FakeLoop, list[int]]:
    loop = FakeLoop()
    expired: list[int] = []
    return Deadlines(loop, expired.append), loop, expired  # type: ignore[arg-type]


def test_a_storm_of_asks_answered_in_time_sets_one_timer_and_expires_nothing() -> None:
    d, loop, expired = deadlines()
    for req in range(1, 5001):
        d.add(req, 3.0)
        loop.advance(0.0002)  # 5,000 asks in a second
        d.discard(req)
    assert len(loop.timers) == 1
    loop.advance(5.0)
    assert expired == []
    assert loop.pending() == [] and len(d) == 0


def test_a_request_unanswered_is_due_once_at_its_deadline() -> None:
    d, loop, expired = deadlines()
    d.add(1, 3.0)
    loop.advance(0.5)
    d.add(2, 3.0)
    loop.advance(2.4)
    assert expired == []
    loop.advance(0.1)
    assert expired == [1]
    loop.advance(0.4)
    assert expired == [1]
    loop.advance(0.1)
    assert expired == [1, 2]
    loop.advance(10.0)
    assert expired == [1, 2] and loop.pending() == []


def test_an_earlier_deadline_added_later_sets_the_timer_earlier() -> None:
    d, loop, expired = deadlines()
    d.add(1, 3.0)
    d.add(2, 2.0)
    loop.advance(2.0)
    assert expired == [2]
    loop.advance(1.0)
    assert expired == [2, 1]


def test_a_request_added_again_when_due_is_due_again_and_the_others_keep_their_times() -> None:
    loop = FakeLoop()
    expired: list[int] = []
    d: Deadlines

    def due(req: int) -> None:
        expired.append(req)
        if req == 1 and expired.count(1) == 1:
            d.add(1, 2.0)  # (a session still arriving: two more seconds)

    d = Deadlines(loop, due)  # type: ignore[arg-type]
    d.add(1, 3.0)
    loop.advance(1.0)
    d.add(2, 3.0)  # due at 4.0, before request 1's second deadline (5.0)
    loop.advance(2.0)
    assert expired == [1]
    loop.advance(1.0)
    assert expired == [1, 2]
    loop.advance(1.0)
    assert expired == [1, 2, 1]
    assert loop.pending() == []


def test_a_discarded_request_is_never_due() -> None:
    d, loop, expired = deadlines()
    d.add(1, 3.0)
    d.add(2, 3.5)
    d.discard(1)
    loop.advance(3.2)
    assert expired == []
    loop.advance(0.3)
    assert expired == [2]
