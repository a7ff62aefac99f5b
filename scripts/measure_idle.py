#!/usr/bin/env python3
"""An idle brokerd node's CPU, by process and thread: what the node pays with no clients.

    .venv/bin/python scripts/measure_idle.py [--workers 1,2,8] [--reps 3] [--idle 10] [-- brokerd options]

Starts brokerd of this checkout (its default configuration, the commit log on) on a loopback
port with each worker count in turn (alternating, ``--reps`` times), waits ``--settle`` seconds,
then reads every process's and thread's CPU from ``/proc`` over ``--idle`` seconds of silence.
Prints the node's CPU per wall second (median of the reps) and, for the last rep of each count,
the busiest threads: the figures behind docs/benchmarks.md's "An idle node's CPU by its workers".
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHONPATH = os.path.join(HERE, "lib", "pythonpath")
sys.path.insert(0, PYTHONPATH)
os.environ["PYTHONPATH"] = PYTHONPATH + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")

from mqttbench.brokers import BrokerKind, RunningBroker  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def threads(pids: list[int]) -> dict[tuple[int, int, str], float]:
    """(pid, tid, thread name) -> CPU seconds so far (user + system), from /proc."""
    out: dict[tuple[int, int, str], float] = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            out[(pid, int(tid), name)] = (int(fields[11]) + int(fields[12])) / TICKS
    return out


def measure(workers: int, idle: float, settle: float, extra: tuple[str, ...]) -> tuple[float, list[str]]:
    """The node's CPU per wall second over ``idle`` seconds, and its busiest threads' lines."""
    with RunningBroker(BrokerKind("brokerd", workers=workers), extra=extra) as broker:
        time.sleep(settle)
        pids = [p.pid for p in broker.processes()]
        before, t0 = threads(pids), time.monotonic()
        time.sleep(idle)
        after, wall = threads(pids), time.monotonic() - t0
    used = {k: after[k] - before.get(k, 0.0) for k in after}
    lines = [f"    pid {k[0]:>7} {k[2]:<16} {v / wall * 1000:6.1f} ms/s"
             for k, v in sorted(used.items(), key=lambda kv: -kv[1])[:12]]  # (idle ones too: 0.0 is a figure)
    return sum(used.values()) / wall * 1000, lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", default="1,2,8", help="worker counts, comma-separated")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--idle", type=float, default=10.0, help="seconds measured")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds after the start, before measuring")
    ap.add_argument("broker_options", nargs="*", help="more brokerd options (after --)")
    args = ap.parse_args(argv)
    counts = [int(w) for w in args.workers.split(",")]
    figures: dict[int, list[float]] = {n: [] for n in counts}
    detail: dict[int, list[str]] = {}
    for rep in range(args.reps):
        for n in counts:
            ms, detail[n] = measure(n, args.idle, args.settle, tuple(args.broker_options))
            figures[n].append(ms)
            print(f"rep {rep + 1}: {n} worker(s): {ms:.1f} ms/s", flush=True)
    for n in counts:
        runs = ", ".join(f"{x:.1f}" for x in figures[n])
        print(f"{n} worker(s): {statistics.median(figures[n]):.1f} ms/s of CPU idle (median; runs {runs})")
        print("\n".join(detail[n]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
