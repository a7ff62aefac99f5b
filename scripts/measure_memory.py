#!/usr/bin/env python3
"""What a retained message and a subscription really cost in a worker's memory (not a test).

    .venv/bin/python scripts/measure_memory.py [--count 2000] [--levels 127] [--payload 16]

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
import sys
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=2000, help="retained messages per shape (and subscriptions)")
    ap.add_argument("--levels", type=int, default=127, help="levels of a deep topic or filter")
    ap.add_argument("--payload", type=int, default=16, help="payload bytes of a retained message")
    args = ap.parse_args()
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
