"""A second, independent load generator: Mosquitto's own command-line clients in bulk.

The bench's generator is ours (raw sockets, pre-encoded packets, pipelined writes); a figure that
holds only with it is not a result. Here the clients are ``mosquitto_pub -l`` (one PUBLISH per
line of its input, written as paho or a device writes: a packet per write, QoS 1 with its own
inflight window) and ``mosquitto_sub -C N`` (exits after N messages), P pairs of them on their own
topics, against brokerd and Mosquitto in turn. It measures the broker's CPU from the first
publisher's start to the last subscriber's exit, and reports messages per broker-CPU-second and
the ratio, medians of ``--reps`` rounds, in the same form as the bench, so the two can be put side
by side (README says how they agree).

Bounded: every run has a deadline (``--timeout``); a subscriber that has not got its N messages by
then is a loss, reported, never waited for.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from .brokers import HOST, BrokerKind, BrokerUnavailable, RunningBroker, check_brokerd, mosquitto_executable

SUBSCRIBED_TIMEOUT_S = 10.0


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise BrokerUnavailable(f"{name} not installed: apt-get install -y mosquitto-clients")
    return path


def _line_buffered() -> list[str]:
    """``stdbuf -oL`` where there is one: mosquitto_sub's stdio buffers a file fully otherwise."""
    path = shutil.which("stdbuf")
    return [path, "-oL"] if path else []


def _wait_subscribed(logs: list[Path], deadline: float) -> None:
    """Each ``mosquitto_sub -d`` says it got its SUBACK; wait (bounded) until all have."""
    pending = list(logs)
    while pending:
        pending = [p for p in pending if b"SUBACK" not in p.read_bytes()]
        if pending and time.monotonic() > deadline:
            raise RuntimeError(f"{len(pending)} subscriber(s) got no SUBACK in {SUBSCRIBED_TIMEOUT_S:.0f} s")
        if pending:
            time.sleep(0.02)


def _pace(pipes: list, data: bytes, rate: float, stop: threading.Event) -> None:
    """Feed each publisher's stdin ``rate`` lines a second (in 10 ms steps), as a fleet of
    devices publishes: a fixed load, not saturation."""
    chunks = data.splitlines(keepends=True)
    t0, sent = time.monotonic(), 0
    while sent < len(chunks) and not stop.is_set():
        due = min(len(chunks), int((time.monotonic() - t0) * rate) + 1)
        if due > sent:
            block = b"".join(chunks[sent:due])
            for pipe in pipes:
                try:
                    pipe.write(block)
                    pipe.flush()
                except (BrokenPipeError, ValueError):
                    pass
            sent = due
        stop.wait(0.01)
    for pipe in pipes:
        try:
            pipe.close()
        except (BrokenPipeError, ValueError):
            pass


def run_once(kind: BrokerKind, pairs: int, messages: int, qos: int, payload: int, timeout: float,
             rate: float = 0.0) -> dict:
    """One round on a fresh broker: P subscribers, then P publishers of ``messages`` lines each
    (``rate`` > 0: that many lines a second each, paced; else as fast as they read them)."""
    pub, sub = _tool("mosquitto_pub"), _tool("mosquitto_sub")
    work = Path(tempfile.mkdtemp(prefix="crosscheck-"))
    lines = work / "lines"
    body = (b"x" * max(1, payload - 8))
    lines.write_bytes(b"".join(b"%07d " % i + body + b"\n" for i in range(messages)))
    subs: list[subprocess.Popen] = []
    pubs: list[subprocess.Popen] = []
    try:
        with RunningBroker(kind) as broker:
            port = str(broker.port)
            logs = []
            for i in range(pairs):
                log = work / f"sub{i}.log"
                logs.append(log)
                with open(log, "wb") as out:
                    subs.append(subprocess.Popen(  # line-buffered: the SUBACK line must show at once
                        [*_line_buffered(), sub, "-h", HOST, "-p", port, "-t", f"bench/cc/{i}", "-q", str(qos), "-C", str(messages),
                         "-d", "-i", f"cc-sub-{i}-{os.getpid()}"], stdout=out, stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL))
            _wait_subscribed(logs, time.monotonic() + SUBSCRIBED_TIMEOUT_S)
            cpu0, t0 = broker.cpu_seconds(), time.monotonic()
            for i in range(pairs):
                with open(lines, "rb") as src:
                    pubs.append(subprocess.Popen(
                        [pub, "-h", HOST, "-p", port, "-t", f"bench/cc/{i}", "-q", str(qos), "-l",
                         "-i", f"cc-pub-{i}-{os.getpid()}"], stdin=subprocess.PIPE if rate else src,
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            stop = threading.Event()
            if rate:
                threading.Thread(target=_pace, args=([p.stdin for p in pubs], lines.read_bytes(), rate, stop),
                                 daemon=True).start()
            deadline = t0 + timeout
            finished = 0
            for s in subs:
                try:
                    s.wait(max(0.0, deadline - time.monotonic()))
                    finished += s.returncode == 0
                except subprocess.TimeoutExpired:
                    pass
            stop.set()
            cpu, wall = broker.cpu_seconds() - cpu0, time.monotonic() - t0
        delivered = sum(_received(log) for log in logs)
        return {"broker": kind.label, "qos": qos, "delivered": delivered, "expected": pairs * messages,
                "complete": finished == pairs, "cpu_s": cpu, "wall_s": wall,
                "msgs_per_cpu_s": delivered / cpu if cpu > 0 else 0.0, "msgs_per_s": delivered / wall}
    finally:
        for p in subs + pubs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(work, ignore_errors=True)


def _received(log: Path) -> int:
    """Messages a ``mosquitto_sub -d`` printed (a debug line per PUBLISH received)."""
    return log.read_bytes().count(b"received PUBLISH")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="./scripts/crosscheck", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--pairs", type=int, default=10, help="publisher/subscriber pairs, one topic each")
    ap.add_argument("--messages", type=int, default=20_000, help="messages per publisher")
    ap.add_argument("--qos", default="0,1", help="comma-separated QoS levels to run")
    ap.add_argument("--payload", type=int, default=16, help="payload bytes")
    ap.add_argument("--reps", type=int, default=3, help="rounds; the table shows medians")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds one run may take at most")
    ap.add_argument("--rate", type=float, default=0.0,
                    help="messages a second per publisher, paced (a fixed load); 0: as fast as they go")
    ap.add_argument("--workers", type=int, default=1,
                    help="brokerd's workers (a scaling run's cross-check; Mosquitto is one thread)")
    ap.add_argument("--log", default="on", choices=("on", "off", "on,off"),
                    help="brokerd's commit log: on (as shipped), off, or both side by side in one run")
    args = ap.parse_args(argv)
    qos_levels = [int(q) for q in args.qos.split(",")]
    if (args.pairs < 1 or args.messages < 1 or args.reps < 1 or args.payload < 1 or not 0 < args.timeout <= 600
            or any(q not in (0, 1, 2) for q in qos_levels) or args.rate < 0 or args.workers < 1):
        ap.error("need positive sizes and --workers, --qos of 0, 1, 2, --rate >= 0 and 0 < --timeout <= 600")
    try:
        reason = check_brokerd()
        if reason:
            raise BrokerUnavailable(reason)
        mosquitto_executable()
        _tool("mosquitto_pub")
        _tool("mosquitto_sub")
    except BrokerUnavailable as exc:
        print(f"crosscheck: {exc}", file=sys.stderr)
        return 2
    extra = os.environ.get("BROKERD_BENCH_ARGS", "")
    print(f"Command: `./scripts/crosscheck {' '.join(shlex.quote(a) for a in (argv or sys.argv[1:]))}`"
          + (f" with BROKERD_BENCH_ARGS={extra!r}" if extra else "") + "; clients: mosquitto_pub -l / mosquitto_sub -C")
    kinds = [*(BrokerKind("brokerd", args.workers, log=mode) for mode in args.log.split(",")),
             BrokerKind("mosquitto", 1)]
    rows = []
    for qos in qos_levels:
        runs: dict[str, list[dict]] = {k.label: [] for k in kinds}
        for rep in range(args.reps):
            for kind in kinds if rep % 2 == 0 else reversed(kinds):
                r = run_once(kind, args.pairs, args.messages, qos, args.payload, args.timeout, args.rate)
                runs[kind.label].append(r)
                print(f"[rep {rep + 1}/{args.reps}] qos{qos} {kind.label}: {r['delivered']}/{r['expected']} delivered, "
                      f"{r['msgs_per_s']:,.0f} msg/s, {r['msgs_per_cpu_s']:,.0f} msg/CPU-s", flush=True)
        med = {label: statistics.median(r["msgs_per_cpu_s"] for r in rs) for label, rs in runs.items()}
        lost = {label: sum(r["expected"] - r["delivered"] for r in rs) for label, rs in runs.items()}
        mq = med[kinds[-1].label]
        load = f"{args.rate:g} msg/s each" if args.rate else "as fast as they go"
        rows.append(f"| p2p x{args.pairs} QoS {qos}, {load} | {args.payload} B | "
                    + " | ".join(f"{med[k.label]:,.0f}" for k in kinds) + " | "
                    + " | ".join(f"{med[k.label] / mq if mq else float('nan'):.2f}" for k in kinds[:-1]) + " | "
                    + " / ".join(str(lost[k.label]) for k in kinds) + " |")
    print()
    names = [k.label for k in kinds]
    print("| scenario | payload | " + " | ".join(f"{n} msg/CPU-s" for n in names) + " | "
          + " | ".join(f"ratio {n}" for n in names[:-1]) + f" | not delivered ({' / '.join(names)}) |")
    print("|" + "---|" * (2 + 2 * len(kinds)))
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
