"""What the jobs share: command-line options, reading the log, writing Parquet, running a stream.

Every job is a pure DataFrame transformation (``build``-style functions, testable on any DataFrame)
plus a ``run`` that wires options to the source and the sinks. Batch and ``--follow`` runs share the
transformation; only the reading (``read`` / ``readStream``) and writing (``write`` / file sink with
a checkpoint) differ, so both modes produce the same Parquet schema.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from brokerd.pipeline.source import NAME

log = logging.getLogger(__name__)

_UNITS = {"ms": ("milliseconds", 1), "s": ("seconds", 1000), "m": ("minutes", 60_000),
          "h": ("hours", 3_600_000), "d": ("days", 86_400_000)}
_SPARK_UNITS = {"millisecond": 1, "second": 1000, "minute": 60_000, "hour": 3_600_000, "day": 86_400_000,
                "week": 604_800_000}


@dataclass(frozen=True)
class Duration:
    """A length of time as the CLI takes it (``30s``, ``1m``, ``1h``) and as Spark wants it."""

    text: str
    ms: int

    @property
    def spark(self) -> str:
        """Spark interval syntax: ``window()``, ``withWatermark`` and triggers take it."""
        return f"{self.ms} milliseconds"


def parse_duration(text: str) -> Duration:
    """``500ms``, ``30s``, ``1m``, ``2h``, ``1d``, or Spark's own ``10 minutes``; must be positive."""
    t = text.strip().lower()
    m = re.fullmatch(r"(\d+)\s*(ms|s|m|h|d)", t)
    if m:
        ms = int(m.group(1)) * _UNITS[m.group(2)][1]
    else:
        m = re.fullmatch(r"(\d+)\s+(millisecond|second|minute|hour|day|week)s?", t)
        if not m:
            raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 30s, 1m, 1h or '10 minutes'")
        ms = int(m.group(1)) * _SPARK_UNITS[m.group(2)]
    if ms <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration must be positive")
    return Duration(text, ms)


def add_common_args(p: argparse.ArgumentParser, *, default_topic: str | None) -> None:
    """Options every job takes: where the log is, where reports go, how Spark and streaming run."""
    p.add_argument("--data-dir", default="./data",
                   help="the broker's --data-dir: the directory holding <node>/<router>/ logs (default ./data); "
                        "on a cluster it must be readable at this same path from the driver and every executor")
    p.add_argument("--out", default="./reports", help="where the Parquet reports go (default ./reports; any "
                                                      "Hadoop path Spark can write, e.g. hdfs:// or s3a://)")
    p.add_argument("--window", type=parse_duration, default=parse_duration("1m"),
                   help="aggregation window (tumbling, by record timestamp), e.g. 30s, 1m, 1h (default 1m)")
    p.add_argument("--master", default=None,
                   help="Spark master (default local[*]; under spark-submit, the one spark-submit was given)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="extra Spark configuration (repeatable)")
    p.add_argument("--topic", default=default_topic,
                   help="MQTT topic filter (+, #) selecting the records read" +
                        (f" (default {default_topic})" if default_topic else " (default: all)"))
    p.add_argument("--start-time", help="only records at or after this time (ISO 8601, UTC unless it has an "
                                        "offset, or epoch seconds)")
    p.add_argument("--end-time", help="only records before this time")
    p.add_argument("--routers", help="comma-separated routers to read: node/router or router-name patterns "
                                     "(t/w0, w1, t/*); default all")
    p.add_argument("--follow", action="store_true",
                   help="run as a streaming query that picks up new records as the broker appends them; a "
                        "window is written once the log has moved --watermark past its end")
    p.add_argument("--checkpoint", help="streaming checkpoint directory (default OUT/_checkpoints/JOB); "
                                        "restarting with the same one resumes without losing or repeating records")
    p.add_argument("--trigger", type=parse_duration, default=parse_duration("10s"),
                   help="with --follow: how often to look for new records (default 10s)")
    p.add_argument("--available-now", action="store_true",
                   help="with --follow: process what the log holds now (in micro-batches), then exit")
    p.add_argument("--max-records-per-trigger", type=int, default=None,
                   help="with --follow: at most this many records per micro-batch")
    p.add_argument("--watermark", type=parse_duration, default=None,
                   help="with --follow: how late (in record time) a record may be and still count; also how "
                        "long a window stays open (default: one window)")
    p.add_argument("--publish-to", metavar="HOST:PORT",
                   help="also publish the results to this MQTT broker (needs paho-mqtt)")
    p.add_argument("--publish-topic", help="topic prefix for published results (default pipeline/JOB)")
    p.add_argument("--publish-windows", type=int, default=1,
                   help="batch runs: publish the newest N windows (default 1); --follow publishes every "
                        "window as it is written")
    p.add_argument("--publish-qos", type=int, choices=(0, 1, 2), default=1, help="QoS of published results")


def spark_conf(args: argparse.Namespace) -> list[tuple[str, str]]:
    out = []
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"brokerd-pipeline: error: --conf: expected KEY=VALUE, not {item!r}")
        out.append((key.strip(), value))
    return out


def source_options(args: argparse.Namespace, **extra: Any) -> dict[str, str]:
    """The ``brokerlog`` options the command line asks for."""
    opts: dict[str, str] = {}
    if args.topic:
        opts["topic"] = args.topic
    if args.start_time:
        opts["startTime"] = args.start_time
    if args.end_time:
        opts["endTime"] = args.end_time
    if args.routers:
        opts["routers"] = args.routers
    if args.follow and args.max_records_per_trigger:
        opts["maxRecordsPerTrigger"] = str(args.max_records_per_trigger)
    opts.update({k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in extra.items()})
    return opts


def read_log(spark: SparkSession, args: argparse.Namespace, **extra: Any) -> DataFrame:
    """The log as a DataFrame: batch, or streaming with ``--follow``."""
    reader = spark.readStream if args.follow else spark.read
    reader = reader.format(NAME)
    for k, v in source_options(args, **extra).items():
        reader = reader.option(k, v)
    return reader.load(os.path.abspath(args.data_dir))


def out_path(args: argparse.Namespace, table: str) -> str:
    return join(args.out, table)


def join(base: str, name: str) -> str:
    """Join for local paths and URLs alike (``os.path.join`` would mangle nothing, but keep ``s3a://``)."""
    return base.rstrip("/") + "/" + name if "://" in base else os.path.join(base, name)


def checkpoint_path(args: argparse.Namespace, job: str, table: str) -> str:
    base = args.checkpoint or join(args.out, join("_checkpoints", job))
    return join(base, table)


def write_batch(df: DataFrame, path: str, partition_by: Sequence[str] = ()) -> None:
    """Replace a report (a batch run recomputes it from the whole selection)."""
    writer = df.write.mode("overwrite")
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    writer.parquet(path)


def start_stream(df: DataFrame, args: argparse.Namespace, path: str, checkpoint: str, name: str,
                 partition_by: Sequence[str] = ()) -> StreamingQuery:
    """A Parquet file sink with its checkpoint: each micro-batch's files are committed once, so the
    report holds every window exactly once even across restarts."""
    writer = (df.writeStream.format("parquet").outputMode("append").queryName(name)
              .option("path", path).option("checkpointLocation", checkpoint))
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    if args.available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=args.trigger.spark)
    return writer.start()


def watermark(args: argparse.Namespace) -> str:
    return (args.watermark or args.window).spark


def run_streams(queries: list[StreamingQuery]) -> int:
    """Wait for the queries: until they all finish (``--available-now``), one fails (the others are
    stopped: a report without its siblings would be misleading), or SIGINT/SIGTERM stops them cleanly
    (the checkpoint then says where to resume). Returns the exit status."""
    stopping = False

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        log.warning("signal %d: stopping %d streaming queries", signum, len(queries))

    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            failed = [q for q in queries if not q.isActive and q.exception() is not None]
            active = [q for q in queries if q.isActive]
            if failed or stopping:
                for q in active:
                    q.stop()
                for q in failed:
                    log.error("streaming query %s failed: %s", q.name, q.exception())
                return 1 if failed and not stopping else 0
            if not active:
                return 0
            active[0].awaitTermination(1.0)  # bounded, so a signal is noticed within a second
    except Exception as exc:
        if not stopping:
            raise
        # The signal reached the JVM too (a whole process group was signalled) and Spark shut down
        # under us; the checkpoint is consistent regardless: the next run resumes from it.
        log.warning("Spark shut down while stopping (%s); the checkpoint is intact", type(exc).__name__)
        return 0
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
