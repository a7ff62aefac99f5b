#!/usr/bin/env python3
"""A connect storm against a whole brokerd node, and what it costs each process (not a test).

    .venv/bin/python scripts/connect_storm.py [--count 5000] [--workers 2] [--client burst|async]
        [--concurrency 100] [--profile DIR | --perf-stat FILE] [-- BROKERD OPTIONS]

Forks a brokerd node (the supervisor and its ``--workers``, as ``brokerd`` runs them, in the
default configuration but for no connection-rate limit; its log lines discarded) and a client process that opens ``--count`` clean MQTT
3.1.1 connections to it and holds them (CONNECT, CONNACK). Prints the node's CPU per connect
(user + system of every process, psutil), each thread's share and each worker's context
switches. ``scripts/measure_connection.py`` runs one worker in its own process instead, for
memory and single-worker profiles; this one sees what two or more workers add (the takeover
ask every CONNECT makes of the other routers, ZeroMQ's threads).

The client: ``burst`` (``measure_connection``'s: blocking sockets, 200 CONNECTs sent, then their
CONNACKs read) or ``async`` (``--concurrency`` connects in flight on uvloop, as ``./scripts/bench
--scenarios conn``'s generator). ``--profile DIR``: each worker under cProfile with its thread's
CPU clock (``time.thread_time``: the wall clock would charge a worker for the time it was
descheduled), one file a worker. ``--perf-stat FILE``: ``perf stat`` of the workers' context
switches and system calls (tracepoints; counts, which a loaded machine moves far less than CPU
time).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

# This checkout's brokerd (scripts/lib/pythonpath), not whichever the virtualenv's install points at.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib", "pythonpath"))

import psutil  # noqa: E402
from measure_connection import _client, _connect_packet, _free_port, fork_client  # noqa: E402

PERF_EVENTS = ["context-switches"] + [f"syscalls:sys_enter_{call}" for call in (
    "epoll_wait", "epoll_pwait", "io_uring_enter", "poll", "read", "write", "sendto", "recvfrom")]


def _async_client(port: int, count: int, concurrency: int, go: int, done: int, release: int) -> None:
    """The child as the bench's generator connects: ``concurrency`` connects in flight."""
    import uvloop

    os.read(go, 1)
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    held: list[asyncio.StreamWriter] = []

    async def one(i: int, slots: asyncio.Semaphore) -> None:
        async with slots:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_connect_packet(i, 4, True))
            answer = await reader.readexactly(4)
            if answer[:1] != b"\x20" or answer[3:4] != b"\x00":
                raise SystemExit(f"not a CONNACK that accepts: {answer!r}")
            held.append(writer)

    async def storm() -> None:
        slots = asyncio.Semaphore(concurrency)
        await asyncio.gather(*(one(i, slots) for i in range(count)))

    loop.run_until_complete(storm())
    os.write(done, b"0")
    os.read(release, 1)


def _profiled_workers(directory: str) -> None:
    """Each worker this process forks from now on: cProfile by thread CPU, on and off at
    SIGUSR2, written to ``directory``/w<index>.prof when turned off."""
    from brokerd.cluster import worker

    run = worker.Worker.run

    async def profiled(self: Any, ready_fd: int | None) -> None:
        profile = cProfile.Profile(time.thread_time)
        on: list[bool] = []

        def toggle() -> None:
            if not on:
                on.append(True)
                profile.enable()
            else:
                profile.disable()
                profile.dump_stats(os.path.join(directory, f"w{self.index}.prof"))

        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, toggle)
        await run(self, ready_fd)

    worker.Worker.run = profiled  # type: ignore[method-assign]  # (this process's forks only)


def _cpu(processes: list[psutil.Process]) -> dict[Any, float]:
    """CPU seconds of each process, and of each worker's threads by (pid, thread id)."""
    times: dict[Any, float] = {}
    for p in processes:
        times[p.pid] = sum(p.cpu_times()[:2])
        for t in p.threads():
            times[(p.pid, t.id)] = t.user_time + t.system_time
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=5000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--client", choices=("burst", "async"), default="burst")
    ap.add_argument("--concurrency", type=int, default=100, help="--client async: connects in flight")
    ap.add_argument("--profile", metavar="DIR", help="cProfile each worker (thread CPU) into DIR")
    ap.add_argument("--perf-stat", metavar="FILE", help="perf stat the workers' switches and system calls")
    ap.add_argument("broker", nargs="*", help="more brokerd options (after --)")
    args = ap.parse_args(argv)

    port = _free_port()
    if args.client == "async":
        client, go_w, done_r, rel_w = fork_client(
            lambda go, done, release: _async_client(port, args.count, args.concurrency, go, done, release))
    else:
        client, go_w, done_r, rel_w = fork_client(
            lambda go, done, release: _client(port, args.count, 4, True, go, done, release))
    data_dir = tempfile.mkdtemp(prefix="connect-storm-")
    node = os.fork()
    if node == 0:
        if args.profile:
            os.makedirs(args.profile, exist_ok=True)
            _profiled_workers(args.profile)
        from brokerd.cluster.cli import main as brokerd

        quiet = os.open(os.devnull, os.O_WRONLY)  # its log lines (the default level, as shipped) go nowhere
        os.dup2(quiet, 2)
        os._exit(brokerd(["--listen", f"127.0.0.1:{port}", "--data-dir", data_dir, "--workers", str(args.workers),
                          "--max-connection-rate", "0", *args.broker]))
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        time.sleep(1.5)  # every worker up, the mesh joined
        supervisor = psutil.Process(node)
        workers = supervisor.children(recursive=True)
        perf = None
        if args.profile:
            for w in workers:
                os.kill(w.pid, signal.SIGUSR2)
        elif args.perf_stat:
            perf = subprocess.Popen(["perf", "stat", "-e", ",".join(PERF_EVENTS), "-o", args.perf_stat,
                                     "-p", ",".join(str(w.pid) for w in workers)], stderr=subprocess.DEVNULL)
            time.sleep(0.5)
        switches0 = {w.pid: w.num_ctx_switches() for w in workers}
        cpu0 = _cpu([supervisor, *workers])
        t0 = time.monotonic()
        os.write(go_w, b"1")
        retries = int(os.read(done_r, 16) or b"0")
        span = time.monotonic() - t0
        time.sleep(0.3)  # the last CONNACKs' writes, the end-of-tick work
        cpu1 = _cpu([supervisor, *workers])
        switches = {w.pid: w.num_ctx_switches() for w in workers}
        if args.profile:
            for w in workers:
                os.kill(w.pid, signal.SIGUSR2)
            time.sleep(1.0)
        elif perf is not None:
            perf.send_signal(signal.SIGINT)
            perf.wait()
        total = sum(cpu1[k] - cpu0[k] for k in cpu1 if not isinstance(k, tuple))
        n = args.count
        print(f"{n} connects to {args.workers} worker(s) in {span:.2f} s, {retries} tried again; node CPU "
              f"{total:.3f} s: {n / total:,.0f} connects per CPU-second, {total / n * 1e6:.1f} us each"
              f"{' (under cProfile)' if args.profile else ''}")
        for w in workers:
            threads = sorted(((k[1], cpu1[k] - cpu0.get(k, 0.0)) for k in cpu1 if isinstance(k, tuple) and k[0] == w.pid),
                             key=lambda item: -item[1])
            voluntary, involuntary = (b - a for a, b in zip(switches0[w.pid], switches[w.pid], strict=True))
            print(f"  worker {w.pid}: {cpu1[w.pid] - cpu0[w.pid]:.3f} s; threads "
                  + ", ".join(f"{cpu:.3f}" for _, cpu in threads if cpu > 0)
                  + f"; main thread's context switches {voluntary} voluntary, {involuntary} involuntary")
    finally:
        os.write(rel_w, b"1")
        os.waitpid(client, 0)
        os.kill(node, signal.SIGTERM)
        os.waitpid(node, 0)
        shutil.rmtree(data_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
