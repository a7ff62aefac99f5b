#!/usr/bin/env python3
"""What holding an idle TCP connection costs a CPython process before any broker state (not a test).

    .venv/bin/python scripts/measure_transport_floor.py [--count 2000] [--modes a,b,...] [--json]

The floor under brokerd's per-connection memory (docs/benchmarks.md, "An idle connection's
memory, again"): each mode below holds ``--count`` accepted loopback connections, idle, in a
fresh process of its own, and reports bytes per connection two ways, each in a run of its own:

* tracemalloc: what is still allocated once all are accepted (uvloop's and libuv's allocations
  go through Python's allocator too, so they are in it);
* RSS: the process's growth over the same span, without tracemalloc.

The kernel's socket memory is in neither (every broker pays it alike). The modes:

``uvloop-transport``  uvloop's ``TCPTransport`` and a protocol of one slot (what brokerd runs on,
                      less the peer's address, which brokerd reads);
``uvloop-reader``     the accepted socket's descriptor, registered with uvloop's ``add_reader``
                      (a libuv poll handle and a callback handle), beside a state of one slot:
                      the least an own transport over uvloop would hold;
``asyncio-reader``    the same over asyncio's selector loop (epoll, a selector key);
``asyncio-transport`` asyncio's own ``_SelectorSocketTransport``, for comparison.

A forked client opens the connections one after another and holds them until the server has
measured; nothing is sent on them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tracemalloc
from collections.abc import Callable

MODES = ("uvloop-transport", "uvloop-reader", "asyncio-reader", "asyncio-transport")


class Minimal(asyncio.Protocol):
    """A protocol that holds its transport and nothing else."""

    __slots__ = ("transport",)

    def __init__(self, made: Callable[[], None]) -> None:
        self.transport: asyncio.BaseTransport | None = None
        made()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        pass


class Held:
    """An own transport's per-connection state at its least: the descriptor."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd


def _readable(held: Held) -> None:
    """Nothing is sent on the idle connections; a close from the client would land here."""


def _client(port: int, count: int, go: int, done: int, release: int) -> None:
    """The forked client: wait for ``go``, open ``count`` connections, say ``done``, hold them
    until ``release``."""
    os.read(go, 1)
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(count)]  # (the backlog holds them)
    os.write(done, b"1")
    os.read(release, 1)
    for s in socks:
        s.close()


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def one(mode: str, count: int, traced: bool) -> dict:
    """Measure one mode in this process (which the parent started for it alone)."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4096)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    go_r, go_w = os.pipe()
    done_r, done_w = os.pipe()
    rel_r, rel_w = os.pipe()
    child = os.fork()  # before anything is measured
    if child == 0:
        try:
            _client(port, count, go_r, done_w, rel_r)
        finally:
            os._exit(0)
    if mode.startswith("uvloop"):
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    else:
        loop = asyncio.SelectorEventLoop()
    asyncio.set_event_loop(loop)
    accepted = 0
    everything_in = loop.create_future()
    kept: list[object] = []  # the readers' states (a transport's protocol is held by its transport)

    def counted() -> None:
        nonlocal accepted
        accepted += 1
        if accepted == count:
            everything_in.set_result(None)

    def accept_all() -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except BlockingIOError:
                return
            sock.setblocking(False)
            held = Held(sock.detach())  # the descriptor alone: no socket object held
            loop.add_reader(held.fd, _readable, held)
            kept.append(held)
            counted()

    async def serve() -> None:
        if mode.endswith("transport"):
            server = await loop.create_server(lambda: Minimal(counted), sock=listener)
            kept.append(server)
        else:
            loop.add_reader(listener.fileno(), accept_all)
        await asyncio.sleep(0.1)

    loop.run_until_complete(serve())
    kept.extend([None] * count)  # the list's own growth is not the connections'
    del kept[-count:]
    rss0 = _rss()
    if traced:
        tracemalloc.start()
    snap0 = tracemalloc.take_snapshot() if traced else None
    os.write(go_w, b"1")
    patience = 30 + count / 50  # (a full listen queue drops SYNs, which come again seconds later)
    loop.run_until_complete(asyncio.wait_for(everything_in, patience))
    loop.run_until_complete(asyncio.wait_for(loop.run_in_executor(None, os.read, done_r, 1), patience))
    loop.run_until_complete(asyncio.sleep(0.2))
    out = {"mode": mode, "count": accepted}
    if snap0 is not None:
        snap1 = tracemalloc.take_snapshot()
        tracemalloc.stop()
        out["traced"] = sum(s.size_diff for s in snap1.compare_to(snap0, "filename")) / accepted
    else:
        out["rss"] = (_rss() - rss0) / accepted
    os.write(rel_w, b"1")
    os.waitpid(child, 0)
    return out


def measure(modes: list[str], count: int) -> list[dict]:
    """Each mode twice (traced, then RSS), each run in a new process: (mode, bytes each way)."""
    rows = []
    for mode in modes:
        row: dict = {"mode": mode}
        for traced in (True, False):
            args = [sys.executable, os.path.abspath(__file__), "--one", mode, "--count", str(count)]
            proc = subprocess.run(args + (["--traced"] if traced else []), capture_output=True, text=True,
                                  timeout=60 + count / 25, check=True)
            row.update(json.loads(proc.stdout.splitlines()[-1]))
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--modes", default=",".join(MODES), help=f"of {', '.join(MODES)}")
    ap.add_argument("--json", action="store_true", help="one JSON object per mode")
    ap.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)  # a run's own process
    ap.add_argument("--traced", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one, args.count, args.traced)))
        return 0
    modes = args.modes.split(",")
    unknown = set(modes) - set(MODES)
    if unknown:
        ap.error(f"unknown mode(s): {', '.join(sorted(unknown))}")
    rows = measure(modes, args.count)
    for row in rows:
        if args.json:
            print(json.dumps(row))
        else:
            print(f"{row['mode']:18} {row['count']} connections: tracemalloc {row['traced']:,.0f} B, "
                  f"RSS {row['rss']:,.0f} B per connection")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
