"""``brokerd-pipeline traffic``: messages and bytes per window — per topic, per topic-level prefix,
per client id, per router.

One report, ``OUT/traffic/``, partitioned by ``dimension``::

    window_start, window_end   the tumbling window (record timestamps, UTC)
    dimension                  topic | prefix | client | router | router_forwarded
    key                        the topic, prefix filter, client id or router id (node/router)
    messages, bytes            count and payload bytes

* ``topic``, ``prefix`` and ``client`` count each message once (the record on the router it was
  published to; the copies forwarded to routers with subscribers are not counted again).
* ``prefix`` keys are MQTT filters: the first N levels of a topic, the rest ``+`` — ``sensors/t1``
  gives ``sensors/+``, ``sensors/kitchen/temp`` gives ``sensors/+/+`` and ``sensors/kitchen/+``
  (``--prefix-depth``, default 2). Each key counts exactly the messages that filter matches
  among those published, so a dashboard can subscribe with the very same filter.
* ``router`` is what clients published through that router; ``router_forwarded`` what it received
  from other routers for its subscribers: together, the load each router carried.

Why one long table built with one ``explode`` instead of four aggregations: the log is read once
and shuffled once, in batch and in ``--follow`` mode alike (a streaming run is a single query with a
single checkpoint), and readers still get one directory per dimension to read on its own.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterator
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from brokerd.pipeline.jobs import common
from brokerd.pipeline.publish import Publisher, topic_level

log = logging.getLogger(__name__)

JOB = "traffic"
TABLE = "traffic"
DIMENSIONS = ("topic", "prefix", "client", "router", "router_forwarded")


def add_args(p: argparse.ArgumentParser) -> None:
    common.add_common_args(p, default_topic=None)
    p.add_argument("--prefix-depth", type=int, default=2,
                   help="topic-level prefixes up to this many leading levels (default 2; 0: none)")


def _entry(dimension: Column, key: Column) -> Column:
    return F.struct(dimension.alias("dimension"), key.alias("key"))


def prefixes(topic: Column, depth: int) -> Column:
    """The prefix filters of a topic: for d in 1..min(levels-1, depth), the first d levels followed
    by one ``+`` per remaining level. Spark expressions only (no Python per record)."""
    if depth <= 0:
        return F.array().cast("array<string>")
    levels = F.split(topic, "/", -1)
    n = F.size(levels)
    top = F.least(n - 1, F.lit(depth))
    return F.when(n > 1, F.transform(
        F.sequence(F.lit(1), top),
        lambda d: F.concat_ws("/", F.slice(levels, F.lit(1), d), F.array_repeat(F.lit("+"), (n - d).cast("int"))),
    )).otherwise(F.array().cast("array<string>"))


def build(df: DataFrame, window: str, prefix_depth: int = 2, watermark: str | None = None) -> DataFrame:
    """The traffic report from a ``brokerlog`` DataFrame (batch or streaming)."""
    router_id = F.concat_ws("/", "node", "router")
    origin = F.col("origin_router") == router_id
    own = F.array(_entry(F.when(origin, F.lit("router")).otherwise(F.lit("router_forwarded")), router_id))
    counted_once = F.concat(
        F.array(_entry(F.lit("topic"), F.col("topic")), _entry(F.lit("client"), F.col("client_id"))),
        F.transform(prefixes(F.col("topic"), prefix_depth), lambda p: _entry(F.lit("prefix"), p)),
    )
    if watermark is not None:
        df = df.withWatermark("timestamp", watermark)
    rows = df.select(
        F.window("timestamp", window).alias("w"),
        F.length("payload").alias("size"),
        F.explode(F.when(origin, F.concat(counted_once, own)).otherwise(own)).alias("d"),
    )
    return (rows.groupBy("w", "d.dimension", "d.key")
            .agg(F.count(F.lit(1)).alias("messages"), F.sum("size").alias("bytes"))
            .select(F.col("w.start").alias("window_start"), F.col("w.end").alias("window_end"),
                    "dimension", "key", "messages", "bytes"))


def messages(rows: list[Any], prefix: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """One MQTT message per (window, dimension), windows oldest first (so the retained message is
    the newest window), keys by messages, descending."""
    groups: dict[tuple[Any, Any, str], list[Any]] = {}
    for r in rows:
        groups.setdefault((r.window_start, r.window_end, r.dimension), []).append(r)
    for (start, end, dim), group in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][2])):
        group.sort(key=lambda r: (-r.messages, r.key))
        yield f"{prefix}/{topic_level(dim)}", {
            "window_start": start, "window_end": end, "dimension": dim,
            "rows": [{"key": r.key, "messages": r.messages, "bytes": r.bytes} for r in group],
        }


def publish_rows(args: argparse.Namespace, rows: list[Any]) -> int:
    prefix = args.publish_topic or f"pipeline/{JOB}"
    with Publisher(args.publish_to, qos=args.publish_qos) as pub:
        return pub.publish_all(messages(rows, prefix))


def newest_windows(df: DataFrame, n: int) -> list[Any]:
    starts = [r.window_start for r in df.select("window_start").distinct()
              .orderBy(F.col("window_start").desc()).limit(max(n, 0)).collect()]
    return df.where(F.col("window_start").isin(starts)).collect() if starts else []


def run(spark: SparkSession, args: argparse.Namespace) -> int:
    path = common.out_path(args, TABLE)
    if not args.follow:
        report = build(common.read_log(spark, args), args.window.spark, args.prefix_depth)
        common.write_batch(report, path, ["dimension"])
        written = spark.read.parquet(path)
        totals = {r.dimension: (r.m, r.b) for r in written.groupBy("dimension")
                  .agg(F.sum("messages").alias("m"), F.sum("bytes").alias("b")).collect()}
        topic = totals.get("topic", (0, 0))
        print(f"traffic: {topic[0]} messages, {topic[1]} payload bytes -> {path}")
        if args.publish_to:
            n = publish_rows(args, newest_windows(written, args.publish_windows))
            print(f"traffic: published {n} messages to {args.publish_to}")
        return 0
    report = build(common.read_log(spark, args), args.window.spark, args.prefix_depth, common.watermark(args))
    queries = [common.start_stream(report, args, path, common.checkpoint_path(args, JOB, TABLE), "traffic",
                                   ["dimension"])]
    if args.publish_to and not args.available_now:
        queries.append(follow_publish(spark, args, path, report.schema))
    print(f"traffic: following {args.data_dir} -> {path}")
    status = common.run_streams(queries)
    if status == 0 and args.publish_to and args.available_now:
        # Publish what this run committed, after it committed it.
        status = common.run_streams([follow_publish(spark, args, path, report.schema)])
    return status


def follow_publish(spark: SparkSession, args: argparse.Namespace, path: str, schema: Any) -> Any:
    """Publish windows as the report query commits them: a second query reads the report directory
    as a file stream (only committed files: the sink's own log) and publishes each new batch. The
    Parquet report stays exactly once; publishing is at least once (a restart may repeat a batch)."""
    source = spark.readStream.schema(schema).parquet(path)
    writer = (source.writeStream.queryName("traffic-publish")
              .option("checkpointLocation", common.checkpoint_path(args, JOB, "publish"))
              .foreachBatch(lambda batch, _id: publish_rows(args, batch.collect())))
    writer = writer.trigger(availableNow=True) if args.available_now else writer.trigger(
        processingTime=args.trigger.spark)
    return writer.start()
