#!/usr/bin/env python3
"""A fleet of idle devices on one node: the connect storm, the memory and the idle CPU (not a test).

    .venv/bin/python scripts/measure_fleet.py [--count 100000] [--workers 8] [--broker brokerd|mosquitto]
        [--generators P] [--concurrency 500] [--persistent] [--idle 10] [--runs 1] [-- BROKERD OPTIONS]

Starts a broker on a free loopback port (brokerd of this checkout in its default configuration,
the commit log on, with ``--workers``; or Mosquitto, one process, as ``./scripts/bench`` configures
it), then ``--count`` MQTT 3.1.1 devices at once from P generator processes, as a fleet reconnects
after a restart: each device connects, sends CONNECT (keepalive ``--keepalive``), reads its CONNACK
and stays silent. A socket closed before its CONNACK, or a CONNACK that refuses, is tried again
after ``RETRY_PAUSE_S``, as a device's client library does.

Why several generators: the open-files limit is per process (20,000 on the VM this was written
on, and no process may raise its hard limit), so each generator holds at most ``PER_GENERATOR``
sockets, from its own source address in 127.0.0.0/8 and source ports it picks itself (``FIRST_PORT``
up: 55,000 an address). brokerd spreads them over its workers (SO_REUSEPORT); Mosquitto is one process and
holds no more than its own limit allows.

Prints, per run and as medians: the storm's length (go to the last CONNACK) and connects per
second and per broker-CPU-second; the node's RSS and PSS (every process, ``smaps_rollup``) before
and after, and the growth per connection; the node's CPU per second over ``--idle`` seconds of
silence; tries again, refusals by CONNACK code, failures, connections lost while idle; and
brokerd's clients per worker (each worker's open descriptors, less those it had before).
Loopback only; every process it starts is stopped at the end, on failure too.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing as mp
import os
import re
import signal
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

# This checkout's brokerd (scripts/lib/pythonpath), not whichever the virtualenv's install points at.
HERE = os.path.dirname(os.path.abspath(__file__))
PYTHONPATH = os.path.join(HERE, "lib", "pythonpath")
sys.path.insert(0, PYTHONPATH)
os.environ["PYTHONPATH"] = PYTHONPATH + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")

import psutil  # noqa: E402
from measure_memory import rollup  # noqa: E402
from mqttbench import mqtt_wire as wire  # noqa: E402
from mqttbench.brokers import BrokerKind, RunningBroker  # noqa: E402
from mqttbench.loadgen import raise_fd_limit  # noqa: E402

PER_GENERATOR = 18_000  # sockets a generator holds at most: under a 20,000 open-files limit, with room
RETRY_PAUSE_S = 0.1  # a device tries again this long after a refusal or a socket closed before CONNACK
CONNECT_TIMEOUT_S = 30.0  # a connect or CONNACK slower than this is a failure (and tried again)
SETTLE_S = 2.0  # after the broker's start and after the storm, before memory is read
# Each device's source port is chosen here, one after the other from this one: bind() to port 0
# searches the ephemeral range for a free port, a cost that grows with the ports taken (measured:
# 2.5 ms of the generator's CPU a connect at 16,000 sockets an address, the storm held by it).
FIRST_PORT = 10_000
SHOWN_LOG_LINES = 30  # of the broker's warnings and errors, with their tracebacks


class Device(asyncio.Protocol):
    """One device: CONNECT on connection, then its CONNACK's return code (or None if the socket
    closed first) into ``answer``; afterwards silence, and ``lost`` set if the broker closes it."""

    __slots__ = ("packet", "answer", "transport", "buf", "lost")

    def __init__(self, packet: bytes, answer: asyncio.Future[int | None]) -> None:
        self.packet = packet
        self.answer = answer
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.lost = False

    def itself(self) -> Device:
        """The protocol factory ``create_connection`` calls: this device."""
        return self

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport, not a subclass
        transport.write(self.packet)  # type: ignore[attr-defined]  # (the same)

    def data_received(self, data: bytes) -> None:
        if self.answer.done():
            return
        self.buf += data
        if len(self.buf) >= 4:
            ok = self.buf[0] >> 4 == wire.CONNACK
            self.answer.set_result(self.buf[3] if ok else -1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if not self.answer.done():
            self.answer.set_result(None)


@dataclass
class Storm:
    """What one generator saw: its devices connected, tries again and why, when it finished."""

    connected: int = 0
    failed: int = 0
    retries: int = 0
    closed_before_connack: int = 0
    refused: Counter[int] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    finished: float = 0.0  # time.monotonic() at its last CONNACK
    cpu: float = 0.0  # the generator's own CPU seconds over the storm
    lost_idle: int = 0  # connections the broker closed while they idled


def generator(source: str, port: int, first: int, count: int, clean: bool, keepalive: int,
              concurrency: int, deadline_s: float, pipe: Connection) -> None:
    """A generator process: ``count`` devices from ``source``, connected at ``go``, held until
    ``release``; its ``Storm`` is sent back after the storm and again after the idle window."""
    import uvloop

    raise_fd_limit()
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    storm = Storm()
    devices: list[Device] = []
    run = f"{os.getpid()}"

    ports = iter(range(FIRST_PORT, 65536))

    async def one(i: int, slots: asyncio.Semaphore, deadline: float) -> None:
        packet = wire.connect(f"fleet-{run}-{first + i}", keepalive=keepalive, clean_session=clean)
        while time.monotonic() < deadline:
            answer: asyncio.Future[int | None] = loop.create_future()
            device = Device(packet, answer)
            async with slots:
                try:
                    await asyncio.wait_for(loop.create_connection(device.itself, "127.0.0.1", port,
                                                                  local_addr=(source, next(ports))), CONNECT_TIMEOUT_S)
                    code = await asyncio.wait_for(answer, CONNECT_TIMEOUT_S)
                except (TimeoutError, OSError) as exc:
                    storm.errors[type(exc).__name__ + (f" {exc.errno}" if isinstance(exc, OSError) else "")] += 1
                    code = None
                    if device.transport is not None:
                        device.transport.abort()
            if code == 0:
                storm.connected += 1
                storm.finished = time.monotonic()
                devices.append(device)
                return
            if code is None:
                storm.closed_before_connack += 1
            else:
                storm.refused[code] += 1
                if device.transport is not None:
                    device.transport.abort()
            storm.retries += 1
            await asyncio.sleep(RETRY_PAUSE_S)
        storm.failed += 1

    async def connect_all() -> None:
        slots = asyncio.Semaphore(concurrency)
        deadline = time.monotonic() + deadline_s
        await asyncio.gather(*(one(i, slots, deadline) for i in range(count)))

    pipe.send("ready")
    assert pipe.recv() == "go"
    cpu0 = time.process_time()
    loop.run_until_complete(connect_all())
    storm.cpu = time.process_time() - cpu0
    pipe.send(storm)
    pipe.recv()  # "count": how many the broker closed while they idled
    storm.lost_idle = sum(d.lost for d in devices)
    pipe.send(storm)
    pipe.recv()  # "release"
    for d in devices:
        if d.transport is not None:
            d.transport.abort()
    loop.run_until_complete(asyncio.sleep(0.1))
    pipe.send("done")


def source_net() -> str:
    """The first three parts of the generators' addresses, 127.a.b: this run's own (from its pid),
    so that two runs at once (the tests, beside another session's) never bind the same
    address and port."""
    pid = os.getpid()
    return f"127.{(pid >> 8) & 255}.{pid & 255}"


def node_memory(pids: list[int]) -> tuple[int, int]:
    """(RSS, PSS) of these processes together, in bytes (``smaps_rollup``)."""
    rss = pss = 0
    for pid in pids:
        try:
            r = rollup(pid)
        except OSError:
            continue
        rss += r.get("Rss", 0) * 1024
        pss += (r.get("Pss_Anon", 0) + r.get("Pss_File", 0)) * 1024
    return rss, pss


def tcp_counters() -> Counter[str]:
    """The kernel's ListenOverflows and TCPSynRetrans (``/proc/net/netstat``, the whole host):
    a SYN dropped because a listener's accept queue was full is sent again 1 s later, a wait no
    broker CPU figure shows."""
    with open("/proc/net/netstat") as f:
        lines = f.read().splitlines()
    out: Counter[str] = Counter()
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            for name, value in zip(names.split()[1:], values.split()[1:], strict=True):
                if name in ("ListenOverflows", "TCPSynRetrans"):
                    out[name] = int(value)
    return out


def clients_of(pid: int, port: int) -> int:
    """The established connections to ``port`` this process holds (its clients: which worker
    took which, only the kernel knows)."""
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return 0
    return sum(1 for c in conns if c.laddr and c.laddr.port == port and c.raddr
               and c.status == psutil.CONN_ESTABLISHED)


def warning_lines(log: list[str]) -> list[str]:
    """The broker's log lines at WARNING or above, each with the traceback lines that follow it."""
    out: list[str] = []
    inside = False
    for line in log:
        if re.search(r"\b(WARNING|ERROR|CRITICAL)\b", line):
            inside = True
        elif re.match(r"\d{4}-\d\d-\d\d ", line):
            inside = False
        if inside:
            out.append(line)
    return out


@dataclass
class Run:
    storm_s: float
    broker_cpu_s: float
    connected: int
    rss: tuple[int, int]
    pss: tuple[int, int]
    idle_ms_per_s: float
    idle_empty_ms_per_s: float
    retries: int
    closed_before_connack: int
    refused: Counter[int]
    failed: int
    errors: Counter[str]
    lost_idle: int
    per_worker: list[int]
    generator_cpu_s: float
    log_warnings: list[str]
    tcp: Counter[str]

    @property
    def rate(self) -> float:
        return self.connected / self.storm_s if self.storm_s else 0.0

    @property
    def per_cpu(self) -> float:
        return self.connected / self.broker_cpu_s if self.broker_cpu_s else 0.0

    def per_connection(self, pair: tuple[int, int]) -> float:
        return (pair[1] - pair[0]) / self.connected if self.connected else 0.0


def one_run(args: argparse.Namespace) -> Run:
    kind = BrokerKind(args.broker, workers=args.workers)
    generators = args.generators or math.ceil(args.count / PER_GENERATOR)
    share = math.ceil(args.count / generators)
    if share > PER_GENERATOR:
        raise SystemExit(f"{share} devices a generator: more than {PER_GENERATOR}; use --generators")
    ctx = mp.get_context("fork")
    procs: list[tuple[Any, Connection]] = []
    broker = RunningBroker(kind, extra=tuple(args.broker_options))
    try:
        broker.start()
        for g in range(generators):
            first, n = g * share, min(share, args.count - g * share)
            ours, theirs = ctx.Pipe()
            p = ctx.Process(target=generator, daemon=True,
                            args=(f"{source_net()}.{10 + g}", broker.port, first, n, not args.persistent,
                                  args.keepalive, args.concurrency, args.timeout, theirs))
            p.start()
            procs.append((p, ours))
        for _, pipe in procs:
            if not pipe.poll(30) or pipe.recv() != "ready":
                raise SystemExit("a generator did not start")
        time.sleep(SETTLE_S)
        pids = [p.pid for p in broker.processes()]
        workers = pids[1:] if args.broker == "brokerd" else pids
        mem0 = node_memory(pids)
        cpu0 = broker.cpu_seconds()
        time.sleep(args.idle)  # the idle CPU of the node without clients, to set the fleet's against
        cpu0, idle_empty = broker.cpu_seconds(), broker.cpu_seconds() - cpu0
        tcp0 = tcp_counters()
        t0 = time.monotonic()
        for _, pipe in procs:
            pipe.send("go")
        storms: list[Storm] = []
        for _, pipe in procs:
            if not pipe.poll(args.timeout + CONNECT_TIMEOUT_S + 30):
                raise SystemExit("a generator did not finish its storm in time")
            storms.append(pipe.recv())
        cpu1 = broker.cpu_seconds()
        tcp = tcp_counters()
        tcp.subtract(tcp0)
        finished = max(s.finished for s in storms)
        storm_s = finished - t0 if finished else 0.0
        time.sleep(SETTLE_S)
        idle0 = broker.cpu_seconds()
        time.sleep(args.idle)
        idle1 = broker.cpu_seconds()
        mem1 = node_memory(pids)
        per_worker = [clients_of(pid, broker.port) for pid in workers]
        for _, pipe in procs:
            pipe.send("count")
        lost = 0
        for _, pipe in procs:
            if pipe.poll(60):
                lost += pipe.recv().lost_idle
        alive = broker.alive()
        log = (broker.dir / "broker.log").read_text(errors="replace").splitlines()
        warnings = warning_lines(log)
        if not alive:
            warnings.append(f"the broker exited: {broker.log_tail()}")
        return Run(
            storm_s=storm_s, broker_cpu_s=cpu1 - cpu0, connected=sum(s.connected for s in storms),
            rss=(mem0[0], mem1[0]), pss=(mem0[1], mem1[1]), idle_ms_per_s=(idle1 - idle0) / args.idle * 1000,
            idle_empty_ms_per_s=idle_empty / args.idle * 1000,
            retries=sum(s.retries for s in storms), closed_before_connack=sum(s.closed_before_connack for s in storms),
            refused=sum((s.refused for s in storms), Counter()), failed=sum(s.failed for s in storms),
            errors=sum((s.errors for s in storms), Counter()), lost_idle=lost, per_worker=per_worker,
            generator_cpu_s=sum(s.cpu for s in storms), log_warnings=warnings, tcp=tcp)
    finally:
        for _, pipe in procs:
            try:
                pipe.send("release")
            except OSError:
                pass
        for p, pipe in procs:
            if pipe.poll(30):
                pipe.recv()
            p.join(10)
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
                p.join(5)
        broker.stop()


def report(run: Run, label: str) -> None:
    mib = 1 << 20
    print(f"{label}: {run.connected:,} connected in {run.storm_s:.2f} s ({run.rate:,.0f}/s); broker CPU "
          f"{run.broker_cpu_s:.2f} s ({run.per_cpu:,.0f} connects per CPU-second); generators' CPU "
          f"{run.generator_cpu_s:.1f} s")
    print(f"  RSS {run.rss[0] / mib:.1f} -> {run.rss[1] / mib:.1f} MiB ({run.per_connection(run.rss):,.0f} B/conn); "
          f"PSS {run.pss[0] / mib:.1f} -> {run.pss[1] / mib:.1f} MiB ({run.per_connection(run.pss):,.0f} B/conn); "
          f"idle CPU {run.idle_ms_per_s:.1f} ms/s (without clients {run.idle_empty_ms_per_s:.1f})")
    refused = ", ".join(f"code {k}: {v}" for k, v in sorted(run.refused.items())) or "none"
    errors = ", ".join(f"{k}: {v}" for k, v in run.errors.most_common()) or "none"
    print(f"  tries again {run.retries:,} (closed before CONNACK {run.closed_before_connack:,}; refused {refused}; "
          f"errors {errors}); failed {run.failed:,}; lost while idle {run.lost_idle:,}")
    print(f"  during the storm, the host's listen queue overflows {run.tcp['ListenOverflows']:,}, "
          f"SYNs sent again {run.tcp['TCPSynRetrans']:,}")
    if len(run.per_worker) > 1:
        print(f"  clients per worker: {', '.join(f'{n:,}' for n in run.per_worker)}")
    for line in run.log_warnings[:SHOWN_LOG_LINES]:
        print(f"  log: {line[:200]}")
    if len(run.log_warnings) > SHOWN_LOG_LINES:
        print(f"  log: ... {len(run.log_warnings) - SHOWN_LOG_LINES} more lines of warnings and errors")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=100_000, help="devices")
    ap.add_argument("--broker", choices=("brokerd", "mosquitto"), default="brokerd")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                    help="brokerd's workers (default: this machine's CPUs, brokerd's own default)")
    ap.add_argument("--generators", type=int, default=0,
                    help=f"generator processes (default: one per {PER_GENERATOR:,} devices)")
    ap.add_argument("--concurrency", type=int, default=500, help="connects in flight per generator")
    ap.add_argument("--keepalive", type=int, default=300, help="the devices' keepalive, s (none is sent in a run)")
    ap.add_argument("--persistent", action="store_true", help="clean session 0 (persistent sessions)")
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of silence whose CPU is measured")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds the storm may take at most")
    ap.add_argument("--runs", type=int, default=1, help="runs, one after the other; medians printed")
    ap.add_argument("broker_options", nargs="*", help="more brokerd options (after --)")
    args = ap.parse_args(argv)
    if args.broker == "mosquitto" and args.broker_options:
        ap.error("broker options are brokerd's")
    if args.keepalive and args.keepalive * 1.5 < args.timeout + args.idle + 2 * SETTLE_S:
        ap.error("--keepalive too short: the broker would close devices that send no PINGREQ")
    label = (f"brokerd --workers {args.workers}" if args.broker == "brokerd" else "mosquitto") \
        + f", {args.count:,} {'persistent' if args.persistent else 'clean'} sessions"
    runs = []
    for i in range(args.runs):
        run = one_run(args)
        report(run, f"{label} (run {i + 1})")
        runs.append(run)
        sys.stdout.flush()
    if args.runs > 1:
        def med(f: Any) -> float:
            return float(statistics.median(f(r) for r in runs))
        print(f"medians of {args.runs}: storm {med(lambda r: r.storm_s):.2f} s, {med(lambda r: r.rate):,.0f} connects/s, "
              f"{med(lambda r: r.per_cpu):,.0f} per broker-CPU-second; RSS {med(lambda r: r.per_connection(r.rss)):,.0f} "
              f"B/conn, PSS {med(lambda r: r.per_connection(r.pss)):,.0f} B/conn, after "
              f"{med(lambda r: r.pss[1]) / (1 << 20):.1f} MiB PSS; idle CPU {med(lambda r: r.idle_ms_per_s):.1f} ms/s "
              f"(without clients {med(lambda r: r.idle_empty_ms_per_s):.1f})")
    return 0 if all(r.connected == args.count and not r.lost_idle for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
