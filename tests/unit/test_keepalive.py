"""The keepalive wheel: connections checked once their deadline's second is past, never before;
a discarded one never; no timer once nothing waits."""

from __future__ import annotations

import asyncio

from brokerd.connection.keepalive import KeepaliveWheel


class _Conn:
    def __init__(self, wheel: KeepaliveWheel, loop: asyncio.AbstractEventLoop, again: float | None = None) -> None:
        self.keepalive_key: int | None = None
        self.wheel, self.loop, self.again = wheel, loop, again
        self.checked: list[float] = []

    def check_keepalive(self) -> None:
        self.checked.append(self.loop.time())
        if self.again is not None:  # still within its keepalive: checked again later
            again, self.again = self.again, None
            self.wheel.add(self, self.loop.time() + again)


def test_checked_after_the_deadline_rounded_up_to_a_second_and_never_when_discarded():
    async def run() -> tuple[list[_Conn], KeepaliveWheel]:
        loop = asyncio.get_running_loop()
        wheel = KeepaliveWheel(loop)
        t0 = loop.time()
        soon = _Conn(wheel, loop)
        later = _Conn(wheel, loop, again=0.3)  # re-added once when checked
        gone = _Conn(wheel, loop)
        wheel.add(later, t0 + 0.6)
        wheel.add(soon, t0 + 0.2)  # sooner than the timer already set: the timer moves
        wheel.add(gone, t0 + 0.2)
        wheel.discard(gone)
        for _ in range(400):  # bounded: 4 s
            if len(later.checked) == 2:
                break
            await asyncio.sleep(0.01)
        for conn, deadline in ((soon, t0 + 0.2), (later, t0 + 0.6)):
            assert conn.checked and conn.checked[0] >= deadline
            assert conn.checked[0] - deadline <= 1.2  # within the second it was rounded up to
        assert later.checked[1] >= later.checked[0] + 0.3
        assert not gone.checked
        return [soon, later, gone], wheel

    conns, wheel = asyncio.run(run())
    assert len(wheel) == 0 and wheel._timer is None  # nothing waits: no timer
    assert all(c.keepalive_key is None for c in conns)
