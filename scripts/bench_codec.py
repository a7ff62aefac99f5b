#!/usr/bin/env python3
"""Micro-benchmarks of the hot path's pure cores: the codec and the topic index (not a test).

    .venv/bin/python scripts/bench_codec.py [--reps 5] [--time 0.2] [--tree DIR] [--json]

Times each case in this process, nothing started: ``Decoder.feed`` of one packet (PUBLISH QoS 0
and 1 with 16 B and 1 KiB payloads, PUBACK, CONNECT, MQTT 3.1.1 and 5), ``encode`` of the same,
``publish_parts``, and ``TopicIndex`` with 10,000 filters (literal, '+' and '#'): a cached
``match`` and the uncached walk behind it. Each figure is µs per call, the median of ``--reps``
runs of about ``--time`` seconds of this thread's CPU time each.

Which implementation runs is printed first ("compiled" or "pure Python", as ``brokerd --version``
says). ``BROKERD_PURE=1`` forces the pure modules; ``--tree DIR`` imports ``brokerd`` from DIR
first (a scratch build, to compare compilers before one is chosen).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))


def _import_path(tree: str | None) -> None:
    """This checkout's brokerd (scripts/lib/pythonpath), or ``tree``'s before it."""
    sys.path.insert(0, os.path.join(HERE, "lib", "pythonpath"))
    if tree:
        sys.path.insert(0, os.path.abspath(tree))


def _per_call(fn: Callable[[], object], seconds: float) -> float:
    """CPU µs per call of ``fn`` over about ``seconds`` (the loop count found first, as timeit does).

    The thread's CPU time, not the wall clock: on a machine shared with other work, time spent
    waiting for a core is not the code's cost."""
    n = 1
    while True:
        start = time.thread_time()
        for _ in range(n):
            fn()
        took = time.thread_time() - start
        if took >= seconds / 10:
            break
        n *= 4
    n = max(1, int(n * seconds / took))
    start = time.thread_time()
    for _ in range(n):
        fn()
    return (time.thread_time() - start) / n * 1e6


def _codec_cases() -> dict[str, Callable[[], object]]:
    from brokerd.connection.codec import Decoder, encode, publish_parts
    from brokerd.connection.packets import MQTT_3_1_1, MQTT_5, Connect, Prop, Puback, Publish

    cases: dict[str, Callable[[], object]] = {}
    for level, name in ((MQTT_3_1_1, "3.1.1"), (MQTT_5, "5")):
        packets = {
            "PUBLISH q0 16B": Publish("sensors/site-1/device-42/temp", b"x" * 16),
            "PUBLISH q0 1KiB": Publish("sensors/site-1/device-42/temp", b"x" * 1024),
            "PUBLISH q1 16B": Publish("sensors/site-1/device-42/temp", b"x" * 16, qos=1, packet_id=7),
            "PUBLISH q1 1KiB": Publish("sensors/site-1/device-42/temp", b"x" * 1024, qos=1, packet_id=7),
            "PUBACK": Puback(7),
        }
        if level == MQTT_5:
            packets["PUBLISH q1 16B props"] = Publish(
                "sensors/site-1/device-42/temp", b"x" * 16, qos=1, packet_id=7,
                properties={Prop.MESSAGE_EXPIRY_INTERVAL: 60, Prop.CONTENT_TYPE: "text/plain"})
        for what, packet in packets.items():
            data = encode(packet, level)
            decoder = Decoder(protocol_level=level, from_client=True)
            cases[f"decode {what} v{name}"] = lambda d=decoder, b=data: d.feed(b)
            cases[f"encode {what} v{name}"] = lambda p=packet, lv=level: encode(p, lv)
        connect = Connect("bench-client-0001", protocol_level=level, username="user", password=b"secret")
        data = encode(connect, level)
        cases[f"decode CONNECT v{name}"] = lambda b=data: Decoder().feed(b)
        cases[f"encode CONNECT v{name}"] = lambda c=connect, lv=level: encode(c, lv)
        cases[f"publish_parts q1 16B v{name}"] = lambda lv=level: publish_parts(
            b"sensors/site-1/device-42/temp", b"x" * 16, 1, False, lv)
    return cases


def _topic_cases() -> dict[str, Callable[[], object]]:
    from brokerd.router.topics import TopicIndex

    index: TopicIndex[int, int] = TopicIndex()
    for i in range(10_000):  # 10,000 filters: literal, '+' at a level, '#' at the end
        site, dev = i % 100, i // 100
        shape = i % 4
        if shape == 0:
            f = f"sensors/site-{site}/device-{dev}/temp"
        elif shape == 1:
            f = f"sensors/site-{site}/+/temp"
        elif shape == 2:
            f = f"sensors/site-{site}/device-{dev}/#"
        else:
            f = f"sensors/+/device-{dev}/+"
        index.add(f, i, 1)
    topics = [f"sensors/site-{i % 100}/device-{i // 100}/temp" for i in range(0, 10_000, 97)]
    topic = topics[3]
    assert index.match(topic), "the benchmark's topic matches some filters"
    walk = index._walk
    it = iter(range(1 << 62))

    def uncached() -> object:
        return walk(topics[next(it) % len(topics)])

    return {
        "topics match (cached)": lambda: index.match(topic),
        "topics match (uncached walk)": uncached,
        "topics filter_matches": lambda: _filter_matches("sensors/+/device-7/#", topic),
    }


def _filter_matches(f: str, t: str) -> bool:
    from brokerd.router.topics import filter_matches
    return filter_matches(f, t)


def implementation() -> str:
    """"compiled" when the codec's decoder is an extension module, else "pure Python"."""
    import brokerd.connection.decode as decode
    return "pure Python" if (decode.__file__ or "").endswith(".py") else "compiled"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="runs per case; the median is shown")
    parser.add_argument("--time", type=float, default=0.2, help="seconds per run")
    parser.add_argument("--tree", help="import brokerd from this directory first (a scratch build)")
    parser.add_argument("--only", default="", help="run only cases whose name contains this")
    parser.add_argument("--json", action="store_true", help="one JSON object: case -> µs per call")
    args = parser.parse_args()
    _import_path(args.tree)
    cases = {**_codec_cases(), **_topic_cases()}
    impl = implementation()
    if not args.json:
        print(f"# {impl}; µs per call, median of {args.reps}")
    out: dict[str, float] = {}
    for name, fn in cases.items():
        if args.only not in name:
            continue
        out[name] = statistics.median(_per_call(fn, args.time) for _ in range(args.reps))
        if not args.json:
            print(f"{name:40s} {out[name]:9.3f}", flush=True)
    if args.json:
        print(json.dumps({"implementation": impl, "us_per_call": out}))


if __name__ == "__main__":
    main()
