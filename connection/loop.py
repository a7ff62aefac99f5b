"""What the connection's parts ask of their event loop: its time and its timers, and nothing else.

Why a protocol of its own: a connection's rules with a time in them (the CONNECT timeout, the
keepalive, the WebSocket handshake's timeout, a client's rate, the log lines' quota a second) read
the time and set timers through the loop their owner gives them, never ``time`` or
``asyncio.get_event_loop()``. A worker gives its uvloop loop; a unit test gives a
``router.clock.FakeClock``, which answers the same names, and drives the rules with bytes and
``advance``: no socket, no sleeping. Declared here, not as ``asyncio.AbstractEventLoop``: compiled
(mypyc), a declared class is checked at run time, and a fake clock is not one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class Timer(Protocol):
    """What ``call_later`` / ``call_at`` return (a ``TimerHandle``, or a fake clock's): cancelled,
    never looked into."""

    def cancel(self) -> None: ...


class Loop(Protocol):
    """The loop's time (seconds, monotonic) and timers."""

    def time(self) -> float: ...

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> Any: ...

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> Timer: ...

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> Timer: ...
