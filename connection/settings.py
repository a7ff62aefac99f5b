"""What every connection of one listener in one worker shares, held once (``ConnectionSettings``).

Why: these are the same for thousands of connections, and each of them kept its own copy of the
references (a slot each), and of the handler factory a bound method of its own (the worker's
``_open``: a new method object at every attribute read, 64 bytes kept per connection). One
object per (factory, listener, buffer limit, keepalive wheel) holds them now; a connection holds
that one. Read only off the hot path: at accept, at the CONNECT, at close.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .keepalive import KeepaliveWheel
    from .listener import Listener
    from .ports import Handler

KEPT = 64  # settings remembered at most (a worker has one per listener; tests make many)


class ConnectionSettings:
    __slots__ = ("open_handler", "listener", "write_buffer_high", "keepalive")

    def __init__(self, open_handler: Callable, listener: Listener | None, write_buffer_high: int,
                 keepalive: KeepaliveWheel) -> None:
        self.open_handler: Callable[..., Handler] = open_handler  # makes the connection's handler
        self.listener = listener  # the listener it came in on (None: a test's connection)
        self.write_buffer_high = write_buffer_high  # the transport's high-water mark
        self.keepalive = keepalive  # the worker's keepalive deadlines


_kept: dict[tuple[object, int, int, int], ConnectionSettings] = {}


def shared_settings(open_handler: Callable, listener: Listener | None, write_buffer_high: int,
                    keepalive: KeepaliveWheel) -> ConnectionSettings:
    """The settings object of these values, made once: equal factories (a bound method of the same
    object and function) and the same listener and wheel give the same object."""
    key = (open_handler, id(listener), write_buffer_high, id(keepalive))
    settings = _kept.get(key)
    if settings is not None and settings.listener is listener and settings.keepalive is keepalive:
        return settings
    if len(_kept) >= KEPT:
        _kept.clear()
    settings = _kept[key] = ConnectionSettings(open_handler, listener, write_buffer_high, keepalive)
    return settings
