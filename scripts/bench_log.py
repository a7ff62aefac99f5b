#!/usr/bin/env python3
"""Commit log throughput figures (not a test): append, sequential read, decode.

    .venv/bin/python scripts/bench_log.py [--seconds 3] [--dir /path/on/the/disk/to/measure]

* append: records appended from an asyncio loop the way the broker does (bursts of appends per loop
  iteration, autoflush, fsync=interval), for 100 B and 1 KiB payloads. "append" is the loop's own cost
  (time spent inside ``append``); "to disk" runs until the writer thread reports everything written.
* read: ``LogReader.read`` from offset 0 to the end (another process's view), then
  ``iter_record_batches`` over the segment files (what the Spark data source does).
* decode: ``decode_records`` over one in-memory buffer, with and without CRC verification.
* fixed (``--fixed``, alone): the loop's cost at a fixed rate, where each loop wake-up carries a
  message or a few: per wake-up, ``--per-wakeup`` appends through ``append_fields`` (what the
  router calls) and the flush an acknowledgement waiting for them makes (``_WriteSoon``: written
  at the end of the iteration), with a callback on ``on_written`` as the broker has, then a
  sleep of ``--gap-ms`` (at 5,000 msg/s a worker wakes about every 1-1.5 ms). Thread CPU of
  the appends and the flush, median over the wake-ups: after a sleep the code runs from cold
  caches, which is what a quiet broker pays and a burst of appends does not show.

Every loop is bounded by --seconds and --max-records. Figures depend on the disk and the CPU; the
directory defaults to a fresh temporary one (on /tmp).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from brokerd.router.log import CommitLog, LogReader, decode_records, iter_record_batches  # noqa: E402

BURST = 256  # appends per loop iteration (a busy connection's read yields dozens of PUBLISHes)


async def bench_append(directory: str, payload_size: int, seconds: float, max_records: int) -> dict:
    log = await CommitLog.open_async(directory, router_id="bench-router", fsync="interval",
                                     fsync_interval_ms=1000)
    payload = os.urandom(payload_size)
    topics = [f"sensors/building-{i % 10}/floor-{i % 7}/temperature".encode() for i in range(64)]
    client = b"bench-client-0001"
    append = log.append
    n = 0
    in_append = 0.0
    start = time.perf_counter()
    deadline = start + seconds
    record_bytes = 0
    while n < max_records and time.perf_counter() < deadline:
        t = time.perf_counter()
        for i in range(BURST):
            append(topics[i & 63], payload, qos=1, client_id=client)
        in_append += time.perf_counter() - t
        n += BURST
        await asyncio.sleep(0)  # the loop iteration ends: autoflush hands the batch to the writer
    last = log.next_offset - 1
    while log.written_offset < last:
        await asyncio.sleep(0.001)
    elapsed = time.perf_counter() - start
    record_bytes = sum(s.size for s in log.segments())
    await log.aclose()
    return {"records": n, "bytes": record_bytes, "append_s": in_append, "disk_s": elapsed}


async def bench_fixed(directory: str, payload_size: int, per_wakeup: int, gap_s: float,
                      wakeups: int) -> tuple[float, float]:
    """``--fixed``: (median, mean) thread CPU in microseconds of one wake-up's appends and flush."""
    log = await CommitLog.open_async(directory, router_id="bench-router", fsync="interval",
                                     fsync_interval_ms=1000)
    written: list[int] = []
    log.on_written(written.append)
    payload = os.urandom(payload_size)
    now_ms = time.time_ns() // 1_000_000
    clock = time.thread_time_ns
    append = log.append_fields
    samples = []
    for _ in range(wakeups):
        t = clock()
        for _ in range(per_wakeup):
            append(now_ms, None, None, "device-00017", "fleet/devices/00017/telemetry", 1, False, b"",
                   payload)
        log.flush()
        samples.append(clock() - t)
        await asyncio.sleep(gap_s)
    await log.aclose()
    samples.sort()
    return samples[len(samples) // 2] / 1000, sum(samples) / len(samples) / 1000


def run_fixed(parent: str, args: argparse.Namespace) -> None:
    """``--fixed``: the loop's cost per wake-up at a fixed rate, for 16 B and 1 KiB payloads."""
    try:
        import uvloop  # the broker's loop
        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a dependency of the broker
        pass
    print(f"fixed rate: {args.per_wakeup} append(s) and a flush per wake-up, {args.gap_ms} ms apart, "
          f"{args.wakeups} wake-ups")
    for size in (16, 1024):
        d = os.path.join(parent, f"fixed{size}")
        median, mean = asyncio.run(bench_fixed(d, size, args.per_wakeup, args.gap_ms / 1000, args.wakeups))
        print(f"  {size:>5} B payload: loop CPU per wake-up {median:6.1f} us median, {mean:6.1f} us mean;"
              f" per message {mean / args.per_wakeup:6.2f} us")


def bench_read(directory: str, seconds: float) -> dict:
    with LogReader(directory) as reader:
        segs = reader.segments()
        total_records = reader.end_offset - (reader.start_offset or 0)
        avg = sum(s.size for s in segs) / max(total_records, 1)  # all records have one size here
        n = 0
        offset = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            recs = reader.read(offset, max_records=100_000, max_bytes=8 << 20)
            if not recs:
                break
            n += len(recs)
            offset = recs[-1].offset + 1
        elapsed = time.perf_counter() - start
    # Per-file iteration (the Spark data source's shape: one partition per segment).
    m = 0
    t = time.perf_counter()
    for s in segs:
        for batch in iter_record_batches(s.path):
            m += len(batch)
        if time.perf_counter() - t > seconds:
            break
    return {"records": n, "bytes": n * avg, "s": elapsed, "iter_records": m, "iter_bytes": m * avg,
            "iter_s": time.perf_counter() - t}


def bench_decode(directory: str, seconds: float) -> dict:
    """decode_records over an in-memory segment, in 4 MiB slices as iter_record_batches feeds it."""
    with LogReader(directory) as reader:
        seg = reader.segments()[0]
    with open(seg.path, "rb") as f:
        data = f.read()
    out = {}
    for verify in (True, False):
        n = nbytes = 0
        t = time.perf_counter()
        while time.perf_counter() - t < seconds:
            pos = 16
            while pos < len(data):
                recs, consumed = decode_records(data[pos:pos + (4 << 20)], verify=verify, version=data[4])
                if not recs:
                    break
                n += len(recs)
                nbytes += consumed
                pos += consumed
        elapsed = time.perf_counter() - t
        out[verify] = (n / elapsed, nbytes / elapsed)
    return out


def fmt_rate(records: float, nbytes: float, s: float) -> str:
    return f"{records / s:>12,.0f} rec/s  {nbytes / s / 1e6:>8.1f} MB/s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0, help="time budget per case (default 3)")
    ap.add_argument("--max-records", type=int, default=3_000_000, help="cap per append case")
    ap.add_argument("--dir", default=None, help="parent directory for the logs (default: a temp dir)")
    ap.add_argument("--fixed", action="store_true", help="only the fixed-rate case (see above)")
    ap.add_argument("--per-wakeup", type=int, default=1, help="--fixed: appends per wake-up (default 1)")
    ap.add_argument("--gap-ms", type=float, default=1.0, help="--fixed: sleep between wake-ups (default 1)")
    ap.add_argument("--wakeups", type=int, default=3000, help="--fixed: wake-ups per payload size")
    args = ap.parse_args()
    parent = tempfile.mkdtemp(prefix="bench_log.", dir=args.dir)
    try:
        if args.fixed:
            run_fixed(parent, args)
            return
        print(f"python {sys.version.split()[0]}, logs under {parent}")
        for size in (100, 1024):
            d = os.path.join(parent, f"p{size}")
            r = asyncio.run(bench_append(d, size, args.seconds, args.max_records))
            print(f"append {size:>5} B payload: {r['records']:,} records, {r['bytes'] / 1e6:.1f} MB")
            print(f"  append (loop cost)  {fmt_rate(r['records'], r['bytes'], r['append_s'])}"
                  f"  {r['append_s'] / r['records'] * 1e6:.2f} us/record")
            print(f"  to disk (end to end){fmt_rate(r['records'], r['bytes'], r['disk_s'])}")
            rd = bench_read(d, args.seconds)
            print(f"  LogReader.read      {fmt_rate(rd['records'], rd['bytes'], rd['s'])}")
            print(f"  iter_record_batches {fmt_rate(rd['iter_records'], rd['iter_bytes'], rd['iter_s'])}")
            dec = bench_decode(d, args.seconds)
            for verify, (rps, bps) in dec.items():
                print(f"  decode_records {'crc' if verify else 'no crc'}{' ' * (5 if verify else 2)}"
                      f"{rps:>12,.0f} rec/s  {bps / 1e6:>8.1f} MB/s")
    finally:
        shutil.rmtree(parent, ignore_errors=True)


if __name__ == "__main__":
    main()
