#!/usr/bin/env python3
"""Benchmark: records/s of a Spark batch read of the commit log (``brokerlog``, ``local[2]``) next
to a plain single-process Python scan of the same log, and their ratio.

    .venv/bin/python scripts/bench_pipeline.py                 # 1M records in a temp dir
    .venv/bin/python scripts/bench_pipeline.py --records 200000 --repeat 2
    .venv/bin/python scripts/bench_pipeline.py --data-dir ./data   # an existing broker --data-dir

What is measured:

* ``plain scan``: every segment of every router decoded with ``router.log.iter_record_batches``
  (the same decoder the data source uses), in one process: the floor any reader pays.
* ``spark count``: ``spark.read.format("brokerlog").load(dir).count()`` — planning, decoding in the
  Python workers, Arrow batches to the JVM, counting.
* ``spark group by topic``: the same plus an aggregation, closer to what the jobs do.

Spark figures are the best of ``--repeat`` runs after one warm-up (JVM and Python workers started,
pages cached). The log is written first (not timed) with ``CommitLog`` in synchronous mode.
Loopback only; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from brokerd.router.log import CommitLog, LogReader, iter_record_batches  # noqa: E402


def write_log(data_dir: str, records: int, routers: int, payload_bytes: int) -> None:
    """``records`` messages spread over ``routers`` logs under ``data_dir/bench/wN``."""
    rnd = random.Random(1)
    payloads = [rnd.randbytes(payload_bytes) for _ in range(64)]
    logs = []
    for r in range(routers):
        directory = os.path.join(data_dir, "bench", f"w{r}")
        os.makedirs(directory, exist_ok=True)
        logs.append(CommitLog(directory, router_id=f"bench/w{r}", loop=None, fsync="never"))
    ts = 1_767_225_600_000
    for i in range(records):
        logs[i % routers].append(f"sensors/dev{i % 1000}/temp", payloads[i % 64], client_id=f"client-{i % 1000}",
                                 qos=i % 2, timestamp_ms=ts + i)
        if i % 20_000 == 19_999:
            for log in logs:
                log.flush()
    for log in logs:
        log.close()


def router_dirs(data_dir: str) -> list[str]:
    out = []
    for node in sorted(os.listdir(data_dir)):
        for router in sorted(os.listdir(os.path.join(data_dir, node))):
            path = os.path.join(data_dir, node, router)
            if os.path.isdir(path):
                out.append(path)
    return out


def plain_scan(data_dir: str) -> int:
    n = 0
    for directory in router_dirs(data_dir):
        with LogReader(directory) as reader:
            for seg in reader.segments():
                for batch in iter_record_batches(seg.path):
                    n += len(batch)
    return n


def best(fn, repeat: int) -> tuple[float, int]:
    times = []
    n = 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        n = fn()
        times.append(time.perf_counter() - t0)
    return min(times), n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--routers", type=int, default=2, help="router logs to spread the records over (default 2)")
    p.add_argument("--payload-bytes", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--data-dir", help="benchmark an existing log directory instead of writing one")
    args = p.parse_args(argv)

    tmp = None
    data_dir = args.data_dir
    if data_dir is None:
        tmp = tempfile.mkdtemp(prefix="bench-pipeline-")
        data_dir = os.path.join(tmp, "data")
        t0 = time.perf_counter()
        write_log(data_dir, args.records, args.routers, args.payload_bytes)
        print(f"wrote {args.records} records over {args.routers} routers in {time.perf_counter() - t0:.1f} s")
    try:
        size = sum(os.path.getsize(os.path.join(d, f)) for d in router_dirs(data_dir) for f in os.listdir(d)
                   if f.endswith(".log"))
        plain_s, n = best(lambda: plain_scan(data_dir), args.repeat)

        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        from pyspark.sql import SparkSession

        from brokerd import pipeline

        t0 = time.perf_counter()
        spark = (SparkSession.builder.master(args.master).appName("bench_pipeline")
                 .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
                 .config("spark.driver.memory", "2g").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        pipeline.register(spark)
        start_s = time.perf_counter() - t0

        def load():
            return spark.read.format("brokerlog").load(data_dir)

        parts = load().rdd.getNumPartitions()
        warm = load().count()
        assert warm == n, f"spark read {warm} records, the plain scan {n}"
        count_s, count_n = best(lambda: load().count(), args.repeat)
        group_s, _ = best(lambda: sum(r["count"] for r in load().groupBy("topic").count().collect()), args.repeat)
        spark.stop()
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)

    print(f"log: {n} records, {size / 1e6:.1f} MB of segments; spark: {args.master}, {parts} input partitions, "
          f"session start {start_s:.1f} s (not counted)")
    print(f"{'reader':<28}{'seconds':>10}{'records/s':>14}{'vs plain':>10}")
    for name, secs in (("plain scan (1 process)", plain_s), (f"spark count ({args.master})", count_s),
                       (f"spark group by topic ({args.master})", group_s)):
        print(f"{name:<28}{secs:>10.2f}{n / secs:>14,.0f}{plain_s / secs:>9.2f}x")
    return 0 if count_n == n else 1


if __name__ == "__main__":
    sys.exit(main())
