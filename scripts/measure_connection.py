#!/usr/bin/env python3
"""What an idle client connection costs a worker (not a test).

    .venv/bin/python scripts/measure_connection.py [--count 2000] [--level 4] [--persistent]
        [--log on] [--top 15] [--profile FILE] [--password] [-- BROKERD OPTIONS]

Starts one worker in this process, on its own event loop (uvloop), as ``cluster.worker`` runs it;
a child process forked before anything is traced opens ``--count`` connections to it (CONNECT,
CONNACK, then silence). Three figures per connection:

* RSS: the process's growth while the connections came (what ``./scripts/bench conn`` reads);
* tracemalloc: the bytes still allocated once they are all connected, by the line that
  allocated them (uvloop's and libuv's allocations go through Python's allocator too);
* the census: each per-connection object's ``sys.getsizeof`` (a dict's or set's table included),
  and what the worker's tables grew by, so the total can be read object by object.

``--cpu``: instead, the worker's CPU time per connect while the child connects (nothing traced;
``--count`` connections as fast as one client process opens them); ``--profile FILE``: that storm
under cProfile. ``--password``: the worker has a password file (one user, mosquitto_passwd's
PBKDF2) and every client connects with its user name and password.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import os
import select
import socket
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

# This checkout's brokerd (scripts/lib/pythonpath), not whichever the virtualenv's install points at.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib", "pythonpath"))

import psutil  # noqa: E402

from brokerd.cluster import config as broker_config  # noqa: E402
from brokerd.cluster.worker import Worker, tune_gc  # noqa: E402
from brokerd.router.auth import hash_password  # noqa: E402
from brokerd.router.session import NO_ENTRIES  # noqa: E402

BATCH = 200  # connects the child has in flight at once
USER = "device"  # --password: every client's user name in the password file made for the run
PASSWORD = b"a-device-password"  # and its password


def _field(data: bytes) -> bytes:
    return len(data).to_bytes(2, "big") + data


def _connect_packet(i: int, level: int, clean: bool, password: bytes | None = None) -> bytes:
    """A CONNECT as a device sends it: client id ``idle-<i>``, keepalive 60 s; with ``password``,
    user name ``USER`` and that password."""
    cid = f"idle-{i}".encode()
    name = b"\x00\x04MQTT"
    flags = (0x02 if clean else 0x00) | (0xC0 if password is not None else 0)
    variable = name + bytes([level, flags]) + (60).to_bytes(2, "big") + (b"\x00" if level == 5 else b"")
    body = variable + _field(cid)
    if password is not None:
        body += _field(USER.encode()) + _field(password)
    return bytes([0x10, len(body)]) + body


def _connecting(port: int, i: int, level: int, clean: bool, password: bytes | None) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(_connect_packet(i, level, clean, password))
    return s


def _client(port: int, count: int, level: int, clean: bool, go: int, done: int, release: int,
            password: bytes | None = None) -> None:
    """The child: wait for ``go``, open ``count`` connections (``BATCH`` at a time; one closed
    before its CONNACK is tried again at once, as a device does), say ``done`` with the number of
    tries again, hold them until ``release``."""
    os.read(go, 1)
    socks: list[socket.socket] = []
    retries = 0
    todo = list(range(count))
    while todo:
        batch = [(i, _connecting(port, i, level, clean, password)) for i in todo[:BATCH]]
        del todo[:BATCH]
        for i, s in batch:
            s.settimeout(30)
            try:
                answer = s.recv(64)
            except ConnectionResetError:
                answer = b""
            if answer[:1] == b"\x20" and answer[3:4] == b"\x00":
                socks.append(s)
            elif answer:
                raise SystemExit(f"not a CONNACK that accepts: {answer!r}")
            else:
                s.close()
                retries += 1
                todo.append(i)
    os.write(done, str(retries).encode())
    os.read(release, 1)
    for s in socks:
        s.close()


def fork_client(run: Callable[[int, int, int], None]) -> tuple[int, int, int, int]:
    """Fork the client process, which does ``run(go, done, release)`` with the ends of three
    pipes it reads or writes; returns its pid and the parent's ends (go, done, release). A
    client that fails says so and writes ``done``: the parent goes on with what connected."""
    go_r, go_w = os.pipe()
    done_r, done_w = os.pipe()
    rel_r, rel_w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            run(go_r, done_w, rel_r)
        except BaseException as exc:  # noqa: BLE001 - reported, and the parent goes on
            print(f"client: {exc!r}", file=sys.stderr)
            os.write(done_w, b"0")
        finally:
            os._exit(0)
    return child, go_w, done_r, rel_w


def _live(port: int, rate: float, go: int, ready: int, stop: int, out: str) -> None:
    """The child with live traffic: a subscriber and a publisher of QoS 0 messages at ``rate`` a
    second to it, each carrying the time it was sent; writes (sent, latency) in ns to ``out``."""
    os.read(go, 1)
    sub = socket.create_connection(("127.0.0.1", port))
    pub = socket.create_connection(("127.0.0.1", port))
    sub.sendall(_connect_packet(-1, 4, True))
    pub.sendall(_connect_packet(-2, 4, True))
    for s in (sub, pub):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no 40 ms of Nagle and delayed ACKs
        s.recv(4)
    sub.sendall(bytes([0x82, 11, 0, 1, 0, 6]) + b"live/t" + b"\x00")  # SUBSCRIBE live/t QoS 0
    sub.recv(5)
    os.write(ready, b"1")
    sub.setblocking(False)
    samples: list[tuple[int, int]] = []
    buf = b""
    interval = int(1e9 / rate)
    due = time.monotonic_ns()
    while True:
        now = time.monotonic_ns()
        if now >= due:
            pub.sendall(bytes([0x30, 16, 0, 6]) + b"live/t" + now.to_bytes(8, "big"))
            due += interval
        readable = select.select([sub, stop], [], [], max(0.0, (due - time.monotonic_ns()) / 1e9))[0]
        if stop in readable:
            break
        if sub in readable:
            buf += sub.recv(65536)
            got = time.monotonic_ns()
            while len(buf) >= 18:
                sent = int.from_bytes(buf[10:18], "big")
                samples.append((sent, got - sent))
                buf = buf[18:]
    with open(out, "w") as f:
        f.write("\n".join(f"{a} {b}" for a, b in samples))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sizes(objs: Iterable[Any]) -> int:
    return sum(sys.getsizeof(o) for o in objs)


def census(worker: Worker) -> list[tuple[str, float]]:
    """(object, bytes per connection) for what each connection holds, by ``sys.getsizeof``; the
    worker's tables by their growth (read before and after by the caller: ``tables``)."""
    conns = list(worker.connections)
    n = len(conns)
    rows: list[tuple[str, Callable[[Any], Iterable[Any]]]] = [
        ("MQTTConnection", lambda c: [c]),
        ("transport (uvloop TCPTransport)", lambda c: [c.transport]),
        ("Decoder", lambda c: [c._decoder]),
        ("Decoder._buf (bytearray)", lambda c: [c._decoder._buf]),
        ("ConnectionState", lambda c: [c._cstate]),
        ("ConnectionCounters", lambda c: [c.counters]),
        ("_out (list)", lambda c: [c._out]),
        ("peer (str)", lambda c: [c.peer]),
        ("client_id (str)", lambda c: [c.client_id]),
        ("_reading_paused_by", lambda c: [c._reading_paused_by] if c._reading_paused_by.__class__ is set else []),
        ("ClientRate", lambda c: [c._rate] if c._rate is not None else []),
        ("Client", lambda c: [c.handler]),
        ("Client._aliases", lambda c: [c.handler._aliases] if c.handler._aliases is not None else []),
        ("Session", lambda c: [c.handler.session]),
        ("Session.subscriptions (dict)", lambda c: [c.handler.session.subscriptions]),
        ("Session.inflight (dict)", lambda c: [c.handler.session.inflight]),
        ("Session.shared (dict)", lambda c: [c.handler.session.shared]),
        ("Session.queue", lambda c: [c.handler.session.queue] if c.handler.session.queue != () else []),
    ]
    out = []
    for name, objects in rows:
        seen: set[int] = set()
        total = 0
        for c in conns:
            for o in objects(c):
                if o is not None and id(o) not in seen and not _shared(o):
                    seen.add(id(o))
                    total += sys.getsizeof(o)
        out.append((name, total / n))
    return out


def _shared(o: Any) -> bool:
    """Objects every connection points to (interned or module-level): not per connection."""
    return o is None or o is NO_ENTRIES or o == () or (isinstance(o, frozenset) and not o)


def tables(worker: Worker) -> dict[str, int]:
    """The worker's containers that grow by one entry per connection."""
    router = worker.router
    assert router is not None
    wheel = worker.keepalive
    return {
        "worker.connections (set)": sys.getsizeof(worker.connections),
        "router.clients (dict)": sys.getsizeof(router.clients),
        "router.sessions (dict)": sys.getsizeof(router.sessions),
        "keepalive wheel (buckets)": _sizes(wheel._buckets.values()) + sys.getsizeof(wheel._buckets),
    }


def _percentiles(latencies: list[int]) -> str:
    if not latencies:
        return "no messages"
    latencies.sort()
    n = len(latencies)
    return (f"p50 {latencies[n // 2] / 1e6:.2f} / p99 {latencies[min(n - 1, n * 99 // 100)] / 1e6:.2f} / "
            f"max {latencies[-1] / 1e6:.2f} ms ({n} messages)")


def flood(loop: asyncio.AbstractEventLoop, worker: Worker, go: int, done: int, live: int, live_go: int,
          live_ready: int, live_stop: int, samples_file: str) -> None:
    """Live traffic for a second, then the connect storm beside it until every connection has its
    CONNACK, then a second more: the live messages' latency before and during the storm, the
    storm's length and the worker's CPU."""
    async def run() -> tuple[int, int, int, float]:
        await loop.run_in_executor(None, time.sleep, 0)  # its thread started before anything is timed
        os.write(live_go, b"1")
        await loop.run_in_executor(None, os.read, live_ready, 1)
        await asyncio.sleep(1.0)
        t0, cpu0 = time.monotonic_ns(), time.process_time()
        os.write(go, b"1")
        retries = int(await loop.run_in_executor(None, os.read, done, 16))
        t1, cpu = time.monotonic_ns(), time.process_time() - cpu0
        await asyncio.sleep(1.0)
        os.write(live_stop, b"1")
        return t0, t1, retries, cpu

    t0, t1, retries, cpu = loop.run_until_complete(run())
    os.waitpid(live, 0)  # it wrote its samples
    with open(samples_file) as f:
        samples = [tuple(map(int, line.split())) for line in f if line.strip()]
    n = len(worker.connections) - 2
    span = (t1 - t0) / 1e9
    rate = worker.config.max_connection_rate
    print(f"--max-connection-rate {rate:g}: {n} connections in {span:.2f} s ({n / span:,.0f}/s), "
          f"{retries} tries again; worker CPU {cpu:.2f} s ({n / cpu:,.0f} connects per CPU-second)")
    print(f"  live before: {_percentiles([lat for sent, lat in samples if sent < t0])}")
    print(f"  live during: {_percentiles([lat for sent, lat in samples if t0 <= sent <= t1])}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--level", type=int, choices=(4, 5), default=4)
    ap.add_argument("--persistent", action="store_true", help="clean session 0")
    ap.add_argument("--log", default="off", choices=("on", "off"), help="the worker's commit log")
    ap.add_argument("--frames", type=int, default=1, help="tracemalloc's frames per allocation")
    ap.add_argument("--top", type=int, default=15, help="tracemalloc lines shown")
    ap.add_argument("--cpu", action="store_true", help="the connect storm's CPU per connect instead")
    ap.add_argument("--profile", help="cProfile the connect storm into this file instead")
    ap.add_argument("--flood", action="store_true", help="instead: the connect storm beside live traffic, "
                    "whose latency it reports (set the worker's --max-connection-rate after --)")
    ap.add_argument("--live-rate", type=float, default=1000.0, help="--flood: live messages a second")
    ap.add_argument("--password", action="store_true", help=f"a password file for the worker: every "
                    f"client connects as user {USER!r} with its password (PBKDF2, mosquitto_passwd's cost)")
    ap.add_argument("broker", nargs="*", help="more brokerd options (after --)")
    args = ap.parse_args(argv)

    port = _free_port()
    child, go_w, done_r, rel_w = fork_client(  # before anything is traced or started
        lambda go, done, release: _client(port, args.count, args.level, not args.persistent, go, done, release,
                                          PASSWORD if args.password else None))
    live = None
    fd, samples_file = tempfile.mkstemp(prefix="measure-conn-live-")
    os.close(fd)
    if args.flood:
        live, live_go_w, live_ready_r, live_stop_w = fork_client(
            lambda go, ready, stop: _live(port, args.live_rate, go, ready, stop, samples_file))

    with tempfile.TemporaryDirectory(prefix="measure-conn-") as data_dir:
        # No connection rate: the child connects as fast as it can (a later option overrides it).
        auth: list[str] = []
        if args.password:
            auth = ["--password-file", os.path.join(data_dir, "passwords")]
            with open(auth[1], "w") as f:
                f.write(f"{USER}:{hash_password(PASSWORD.decode())}\n")
        config = broker_config.load(["--listen", f"127.0.0.1:{port}", "--data-dir", data_dir, *auth,
                                     "--workers", "1", "--log", args.log, "--max-connection-rate", "0", *args.broker])
        import uvloop

        loop = uvloop.new_event_loop()
        asyncio.set_event_loop(loop)
        worker = Worker(config, 0)
        loop.run_until_complete(worker.start())
        tune_gc()
        proc = psutil.Process()

        async def storm() -> None:
            os.write(go_w, b"1")
            await loop.run_in_executor(None, os.read, done_r, 1)
            await asyncio.sleep(0.5)  # the last CONNACKs' writes, the end-of-tick work

        loop.run_until_complete(asyncio.sleep(0.3))
        gc.collect()
        before_tables = tables(worker)
        rss0 = proc.memory_info().rss
        if args.flood:
            assert live is not None
            flood(loop, worker, go_w, done_r, live, live_go_w, live_ready_r, live_stop_w, samples_file)
            os.remove(samples_file)
        elif args.profile or args.cpu:
            profiler = cProfile.Profile() if args.profile else None
            cpu0 = time.process_time()
            if profiler is not None:
                profiler.enable()
            loop.run_until_complete(storm())
            if profiler is not None:
                profiler.disable()
                profiler.dump_stats(args.profile)
            cpu = time.process_time() - cpu0  # (the storm's last 0.5 s idles: a few ms)
            n = len(worker.connections)
            print(f"{n} connections, {cpu:.3f} s of the worker's CPU: {n / cpu:,.0f} connects per "
                  f"CPU-second, {cpu / n * 1e6:.1f} us each{' (under cProfile)' if profiler else ''}")
        else:
            tracemalloc.start(args.frames)
            snap0 = tracemalloc.take_snapshot()
            loop.run_until_complete(storm())
            gc.collect()
            snap1 = tracemalloc.take_snapshot()
            tracemalloc.stop()
            rss1 = proc.memory_info().rss
            n = len(worker.connections)
            stats = snap1.compare_to(snap0, "traceback" if args.frames > 1 else "lineno")
            traced = sum(s.size_diff for s in stats)
            print(f"{n} idle connections (MQTT level {args.level}, "
                  f"{'persistent' if args.persistent else 'clean'} sessions, log {args.log})")
            print(f"RSS growth: {(rss1 - rss0) / n:,.0f} B per connection (with tracemalloc's own cost)")
            print(f"tracemalloc: {traced / n:,.0f} B per connection still allocated")
            print("\nby line that allocated (B per connection, blocks per connection):")
            for s in stats[:args.top]:
                if s.size_diff <= 0:
                    continue
                where = " <- ".join(f"{os.path.relpath(f.filename)}:{f.lineno}" for f in s.traceback)
                print(f"  {s.size_diff / n:8.1f}  {s.count_diff / n:5.2f}  {where}")
            print("\ncensus (sys.getsizeof, B per connection):")
            rows = census(worker)
            for name, size in rows:
                print(f"  {size:8.1f}  {name}")
            after_tables = tables(worker)
            for name, size in after_tables.items():
                grew = (size - before_tables[name]) / n
                rows.append((name, grew))
                print(f"  {grew:8.1f}  {name}: growth")
            print(f"  {sum(s for _, s in rows):8.1f}  total (Python objects named above)")
            kinds = Counter(type(o).__name__ for o in gc.get_objects())
            print("\nmost common tracked objects now:", ", ".join(f"{k} {v}" for k, v in kinds.most_common(8)))
        os.write(rel_w, b"1")
        os.waitpid(child, 0)
        loop.run_until_complete(worker.stop())
        loop.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
