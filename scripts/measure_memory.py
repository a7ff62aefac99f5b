#!/usr/bin/env python3
"""What a retained message, a subscription and an idle node really cost in memory (not a test).

    .venv/bin/python scripts/measure_memory.py [--count 2000] [--levels 127] [--payload 16]
    .venv/bin/python scripts/measure_memory.py --node [--runs 3] [--settle 5] [-- BROKERD OPTIONS]

``--node``: an idle node of this checkout (one worker, no client unless the options say otherwise)
is started, given ``--settle`` seconds after its ready line, and each of its processes read from
``/proc/<pid>/smaps_rollup``: PSS (anonymous and file-backed apart: the file-backed part is the
shared libraries' pages, divided among every process that maps them, so it moves with whatever
else runs on the machine; the anonymous part is the node's own), USS and threads. Medians of
``--runs`` nodes started one after the other.

Builds the router's own structures in this process, nothing else started: a ``RetainedStore``
with N retained messages, a ``TopicIndex`` with one client's subscriptions (and the session's own
map of them, as ``Router.subscribe`` keeps both). tracemalloc counts the bytes each allocation
took, so the figure is what the worker holds, the ``Message`` objects included. Shapes:

* retained, short topics: ``sensors/<i>/temp``;
* retained, deep topics: ``<i>/l1/.../l<levels-1>`` (distinct at the first level, the worst case
  for a trie);
* subscriptions of one client, deep: ``<i>/l1/.../l<levels-1>``, as many as --max-subscriptions.

Each is also set against what ``router.limits.retained_size`` charges, so the two can be compared.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable

# This checkout's brokerd (scripts/lib/pythonpath), not whichever the virtualenv's install points at.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib", "pythonpath"))

from brokerd.connection.codec import encode  # noqa: E402
from brokerd.connection.packets import Publish, Subscription  # noqa: E402
from brokerd.router.limits import retained_size  # noqa: E402
from brokerd.router.message import Message  # noqa: E402
from brokerd.router.retained import RetainedStore  # noqa: E402
from brokerd.router.topics import TopicIndex  # noqa: E402


def deep_topic(i: int, levels: int) -> str:
    return "/".join([str(i)] + [f"l{j}" for j in range(1, levels)])


def measure(build: Callable[[], object]) -> tuple[int, object]:
    """Bytes still allocated after ``build()`` returns, with what it built kept alive."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    held = build()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return after - before, held


def retained(topics: list[str], payload: bytes) -> tuple[int, int]:
    """(bytes held per message, bytes charged per message) for a store of these topics. Each
    message is as a worker holds it: its topic a string of its own (the decoder makes one per
    packet), published from its packet (kept as an encoding), and sent once to a subscriber
    with RETAIN set (a second encoding)."""
    packets = [encode(Publish(t, payload, 0, retain=True), 4) for t in topics]

    def build() -> object:
        store = RetainedStore()
        for t, packet in zip(topics, packets, strict=True):
            raw = bytes(bytearray(packet))  # as read, and its payload cut out of it (a copy)
            msg = Message.published("".join(t), raw[len(raw) - len(payload):], 0, True, "c", "r0", None, raw, 4)
            msg.encoded(4, 0, True)
            store.set(msg)
        return store

    held, store = measure(build)
    charged = sum(retained_size(m) for m in store)  # type: ignore[attr-defined]
    return held // len(topics), charged // len(topics)


def subscriptions(filters: list[str]) -> int:
    """Bytes per subscription of one session: the index's path plus the session's own entry."""
    def build() -> object:
        index: TopicIndex[object, Subscription] = TopicIndex()
        session = object()
        mine: dict[str, Subscription] = {}
        for f in filters:
            f = "".join(f)  # a string of its own, as the decoder makes one per packet
            sub = Subscription(f, 1)
            mine[f] = sub
            index.add(f, session, sub)
        return index, mine

    held, _ = measure(build)
    return held // len(filters)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROLLUP = ("Pss_Anon", "Pss_File", "Private_Clean", "Private_Dirty", "Rss")


def rollup(pid: int) -> dict[str, int]:
    """A process's memory in kB, from ``/proc/<pid>/smaps_rollup``, and its thread count."""
    out = {"threads": len(os.listdir(f"/proc/{pid}/task"))}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            m = re.match(r"(\w+):\s+(\d+) kB", line)
            if m and m[1] in ROLLUP:
                out[m[1]] = int(m[2])
    return out


def children(pid: int) -> list[int]:
    kids: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            kids += [int(k) for k in f.read().split()]
    return kids


def one_node(options: list[str], settle: float) -> list[dict[str, int]]:
    """Start a node of this checkout, wait for its ready line and ``settle`` s, read each process
    (the supervisor first), stop it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "scripts", "lib", "pythonpath"))
    with tempfile.TemporaryDirectory(prefix="brokerd-mem") as tmp:
        cmd = [sys.executable, "-c", "from brokerd.cluster.cli import main; main()", "--workers", "1",
               "--port", str(port), "--data-dir", os.path.join(tmp, "data"), *options]
        node = subprocess.Popen(cmd, env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            assert node.stdout is not None
            for line in node.stdout:
                if "brokerd ready" in line:
                    break
            else:
                raise SystemExit(f"the node exited ({node.wait()}) before its ready line")
            time.sleep(settle)
            return [rollup(pid) for pid in [node.pid, *children(node.pid)]]
        finally:
            node.send_signal(signal.SIGTERM)
            node.wait(30)


def node_memory(options: list[str], runs: int, settle: float) -> None:
    """Medians over ``runs`` nodes of each process's figures and of the node's PSS, in MB."""
    samples = [one_node(options, settle) for _ in range(runs)]
    names = ["supervisor"] + [f"child {i}" for i in range(1, len(samples[0]))]

    def med(values: list[float]) -> float:
        return statistics.median(values) / 1024

    print(f"{'process':<12} {'PSS':>6} {'anon':>6} {'file':>6} {'USS':>6} {'RSS':>6} {'threads':>7}   (MB, medians of {runs})")
    for i, name in enumerate(names):
        rows = [s[i] for s in samples if len(s) > i]
        print(f"{name:<12} {med([r['Pss_Anon'] + r['Pss_File'] for r in rows]):>6.1f} "
              f"{med([r['Pss_Anon'] for r in rows]):>6.1f} {med([r['Pss_File'] for r in rows]):>6.1f} "
              f"{med([r['Private_Clean'] + r['Private_Dirty'] for r in rows]):>6.1f} "
              f"{med([r['Rss'] for r in rows]):>6.1f} {rows[0]['threads']:>7}")
    total = [sum(r["Pss_Anon"] + r["Pss_File"] for r in s) for s in samples]
    anon = [sum(r["Pss_Anon"] for r in s) for s in samples]
    print(f"{'node':<12} {med(total):>6.1f} {med(anon):>6.1f}   (PSS, each run: "
          + ", ".join(f"{t / 1024:.1f}" for t in total) + ")")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=2000, help="retained messages per shape (and subscriptions)")
    ap.add_argument("--levels", type=int, default=127, help="levels of a deep topic or filter")
    ap.add_argument("--payload", type=int, default=16, help="payload bytes of a retained message")
    ap.add_argument("--node", action="store_true", help="instead: an idle node's memory, process by process")
    ap.add_argument("--runs", type=int, default=3, help="--node: nodes started, medians taken")
    ap.add_argument("--settle", type=float, default=5.0, help="--node: seconds after the ready line")
    ap.add_argument("broker", nargs="*", help="--node: more brokerd options (after --)")
    args = ap.parse_args()
    if args.node:
        node_memory(args.broker, args.runs, args.settle)
        return
    payload = b"x" * args.payload
    n = args.count
    short = [f"sensors/{i}/temp" for i in range(n)]
    deep = [deep_topic(i, args.levels) for i in range(n)]
    print(f"{'shape':<34} {'held B/msg':>11} {'charged B/msg':>14} {'ratio':>6}")
    for name, topics in (("retained, short topic", short), (f"retained, {args.levels}-level topic", deep)):
        held, charged = retained(topics, payload)
        print(f"{name:<34} {held:>11} {charged:>14} {held / charged:>6.1f}")
    per_sub = subscriptions(deep[:n])
    print(f"{'subscription, ' + str(args.levels) + '-level filter':<34} {per_sub:>11} "
          f"  ({per_sub * n / 2**20:.1f} MiB for {n})")
    per_sub = subscriptions(short)
    print(f"{'subscription, short filter':<34} {per_sub:>11}")


if __name__ == "__main__":
    main()
