"""Fakes shared by the unit tests: the socket side of a connection, a recording mesh, a way to put
a session online, and a directory in memory. One home, so that a change to what the router asks of
a connection or a mesh changes one fake."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from brokerd.connection.codec import Decoder
from brokerd.connection.packets import Subscription
from brokerd.connection.protocol import ConnectionCounters, Traffic
from brokerd.router.message import Message
from brokerd.router.ports import NullMesh
from brokerd.router.router import Router


class FakeConn:
    """A ``connection.protocol.Connection`` without a socket: collects what the router writes.
    Hashable, like the real one (stats keep connections in sets)."""

    def __init__(self, level: int = 4, counters: ConnectionCounters | None = None,
                 peer: str = "127.0.0.1:1") -> None:
        self.protocol_level = level
        self.outbound = None
        self.write_paused = False
        self.closing = False
        self.counters = counters if counters is not None else ConnectionCounters()
        self.traffic = Traffic()
        self.peer = peer
        self.client_id: str | None = None
        self.chunks: list[bytes] = []  # what was written
        self.gated: list[bytes] = []  # what a gate holds
        self.gate_until: int | None = None
        self.refused: int | None = None

    def send(self, data: bytes) -> None:
        (self.gated if self.gate_until is not None else self.chunks).append(data)

    def gate(self, until: int) -> None:
        if self.gate_until is None or until > self.gate_until:
            self.gate_until = until

    def open_gate(self, reached: int) -> None:
        if self.gate_until is not None and self.gate_until <= reached:
            self.gate_until = None
            self.chunks += self.gated
            self.gated = []

    def refuse_output(self, reason: int) -> None:
        self.gate_until, self.gated, self.refused, self.closing = None, [], reason, True

    def packets(self) -> list:
        d = Decoder(protocol_level=self.protocol_level)
        return d.feed(b"".join(self.chunks))


class FakeMesh(NullMesh):
    """Records what the router hands the mesh; every announcement is acknowledged at once."""

    def __init__(self) -> None:
        self.forwards: list[tuple[str, str, list[str] | None]] = []
        self.announced: list[tuple[str, Any]] = []
        self.only: list[tuple[str, bytes, list[str]]] = []

    def forward(self, router_id: str, msg: Message, source: Any = None, groups: list[str] | None = None,
                only: bool = False) -> None:
        self.forwards.append((router_id, msg.topic, groups))
        if only:
            self.only.append((router_id, msg.payload, groups))

    def announce_interest(self, topic_filter: str, add: Any) -> None:
        self.announced.append((topic_filter, add))


class HandOnMesh(NullMesh):
    """Records the router's hand-ons of a moved session's copies (no peers: no barrier, so a
    hand-on follows the confirmation at once)."""

    def __init__(self) -> None:
        self.handed: list[tuple[str, str, list]] = []

    def hand_on(self, router_id: str, client_id: str, items: list, answered: object = None,
                stale: bool = False) -> None:
        self.handed.append((router_id, client_id, items))


class PeerStatsMesh(NullMesh):
    """A mesh with nobody to talk to that reports fixed per-peer traffic."""

    def __init__(self, stats: dict[str, list[int]]) -> None:
        self._stats = stats

    def peer_stats(self) -> dict[str, list[int]]:
        return self._stats


def online(router: Router, cid: str, *subs: tuple[str, int], level: int = 4):
    """A clean session of ``cid`` attached to a FakeConn, subscribed to ``subs``."""
    s = router.new_session(cid, False)
    conn = FakeConn(level)
    s.attach(conn)  # type: ignore[arg-type]
    for f, q in subs:
        router.subscribe(s, Subscription(f, q))
    return s, conn


RAM_FS = Path("/dev/shm")  # Linux's tmpfs for everyone: a file system in memory, fsync a no-op


@pytest.fixture
def ram_path(tmp_path: Path) -> Iterator[Path]:
    """A fresh directory in memory where the system has one, else ``tmp_path``. For a test that
    opens a log hundreds of times over, each open fsyncing what it repaired: on a disk those
    fsyncs are most of its time (seconds, tens on a busy disk), yet what it checks is what the
    files hold, which is the same in memory."""
    if not (RAM_FS.is_dir() and os.access(RAM_FS, os.W_OK)):
        yield tmp_path
        return
    path = Path(tempfile.mkdtemp(prefix="brokerd-test-", dir=RAM_FS))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
