"""A socket in memory for the connection layer's unit tests: what a connection wrote to it, whether
it is read, and how it was closed. A real ``asyncio.Transport`` subclass, so that the compiled
``MQTTConnection`` takes it as its transport; no file descriptor, no loop."""

from __future__ import annotations

import asyncio


class FakeTransport(asyncio.Transport):
    def __init__(self, peer: tuple[str, int] | None = None) -> None:
        super().__init__()
        self.written = b""
        self.reading = True
        self.eof = False  # half-closed (write_eof): the lingering close of a connection with something to say
        self.closed = False
        self.aborted = False
        self._peer = peer
        self._protocol: asyncio.BaseProtocol | None = None

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self._protocol is not None
        return self._protocol

    def get_extra_info(self, name: str, default: object = None) -> object:
        return self._peer if name == "peername" and self._peer is not None else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def take(self) -> bytes:
        """What was written since the last ``take``."""
        out, self.written = self.written, b""
        return out

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_reading(self) -> bool:
        return self.reading

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = self.aborted = True
