"""``brokerd-pipeline telemetry``: per device and window, count/min/max/avg of every numeric field of
JSON payloads.

Reports (``OUT/...``):

* ``telemetry/``: window_start, window_end, device, field, count, min, max, avg — one row per
  numeric field seen. Nested objects are flattened with dots (``{"env": {"t": 1}}`` → ``env.t``,
  up to ``--max-depth`` levels); a payload that is a bare number is the field ``value``. Booleans,
  strings, arrays and nulls are not numeric and are skipped.
* ``telemetry_devices/``: window_start, window_end, device, messages, invalid — every message,
  and how many were not JSON.
* ``telemetry_invalid/``: the records whose payload is not JSON (node, router, offset, timestamp,
  client_id, topic, device, payload), kept aside for inspection. They never fail the job.

The device is the topic level(s) the filter's ``+`` stands for (``devices/+/telemetry`` →
``devices/<device>/telemetry``), or ``--device-level N`` (0-based), or the client id when the
filter has no ``+``. Each message is counted once (``originOnly``).

Why Spark's VARIANT functions rather than a Python function per payload: ``try_parse_json`` and
``try_variant_get`` parse and walk JSON in the JVM without a Python round trip (and without pandas,
which Python UDFs over Arrow would need); a payload that is not JSON gives NULL instead of an
error, which is exactly the "count it and keep it aside" rule.
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
from brokerd.pipeline.topics import check_filter, wildcard_levels

log = logging.getLogger(__name__)

JOB = "telemetry"
FIELDS, DEVICES, INVALID = "telemetry", "telemetry_devices", "telemetry_invalid"
DEFAULT_TOPIC = "devices/+/telemetry"
NUMERIC = r"^(TINYINT|SMALLINT|INT|BIGINT|FLOAT|DOUBLE|DECIMAL\(.*\))$"
_ENTRIES = "array<struct<key:string,value:variant>>"


def add_args(p: argparse.ArgumentParser) -> None:
    common.add_common_args(p, default_topic=DEFAULT_TOPIC)
    p.add_argument("--device-level", type=int, default=None,
                   help="0-based topic level holding the device id (default: the filter's + levels)")
    p.add_argument("--max-depth", type=int, default=4,
                   help="how many levels of nested JSON objects to flatten (default 4)")


def device_column(topic_filter: str | None, device_level: int | None) -> Column:
    """The device id of a record, from its topic (or its client id)."""
    if device_level is not None:
        return F.element_at(F.split("topic", "/", -1), device_level + 1)
    plus = wildcard_levels(check_filter(topic_filter)) if topic_filter else []
    if not plus:
        return F.col("client_id")
    levels = F.split("topic", "/", -1)
    return F.concat_ws("/", *[F.element_at(levels, i + 1) for i in plus])


def _as_object(v: Column) -> Column:
    return F.try_variant_get(v, "$", "map<string,variant>")


def _is_object(v: Column) -> Column:
    return F.schema_of_variant(v).startswith("OBJECT")


def _is_number(v: Column) -> Column:
    return F.schema_of_variant(v).rlike(NUMERIC)


def numeric_fields(v: Column, max_depth: int) -> Column:
    """array<struct<key, value: variant>> of the numeric leaves of a parsed payload, keys dotted."""
    entries = (F.when(_is_object(v), F.map_entries(_as_object(v)))
               .when(_is_number(v), F.array(F.struct(F.lit("value").alias("key"), v.alias("value"))))
               .otherwise(F.array().cast(_ENTRIES)))
    for _ in range(max(max_depth - 1, 0)):
        entries = F.flatten(F.transform(entries, lambda e: F.when(
            _is_object(e["value"]),
            F.transform(F.map_entries(_as_object(e["value"])), lambda x: F.struct(
                F.concat(e["key"], F.lit("."), x["key"]).alias("key"), x["value"].alias("value"))),
        ).otherwise(F.array(e))))
    return F.filter(entries, lambda e: _is_number(e["value"]))


def parse(df: DataFrame, topic_filter: str | None, device_level: int | None) -> DataFrame:
    """The records with ``device`` and ``json`` (VARIANT; NULL when the payload is not JSON)."""
    return df.select(
        "node", "router", "offset", "timestamp", "client_id", "topic", "payload",
        device_column(topic_filter, device_level).alias("device"),
        F.try_parse_json(F.col("payload").cast("string")).alias("json"),
    )


def build_fields(parsed: DataFrame, window: str, max_depth: int = 4) -> DataFrame:
    rows = parsed.where(F.col("json").isNotNull()).select(
        F.window("timestamp", window).alias("w"), "device",
        F.explode(numeric_fields(F.col("json"), max_depth)).alias("f"))
    rows = rows.select("w", "device", F.col("f.key").alias("field"),
                       F.try_variant_get("f.value", "$", "double").alias("value"))
    return (rows.groupBy("w", "device", "field")
            .agg(F.count("value").alias("count"), F.min("value").alias("min"), F.max("value").alias("max"),
                 F.avg("value").alias("avg"))
            .select(F.col("w.start").alias("window_start"), F.col("w.end").alias("window_end"),
                    "device", "field", "count", "min", "max", "avg"))


def build_devices(parsed: DataFrame, window: str) -> DataFrame:
    return (parsed.groupBy(F.window("timestamp", window).alias("w"), "device")
            .agg(F.count(F.lit(1)).alias("messages"), F.count_if(F.col("json").isNull()).alias("invalid"))
            .select(F.col("w.start").alias("window_start"), F.col("w.end").alias("window_end"),
                    "device", "messages", "invalid"))


def build_invalid(parsed: DataFrame) -> DataFrame:
    return parsed.where(F.col("json").isNull()).select(
        "node", "router", "offset", "timestamp", "client_id", "topic", "device", "payload")


def build(df: DataFrame, window: str, topic_filter: str | None = DEFAULT_TOPIC, device_level: int | None = None,
          max_depth: int = 4, watermark: str | None = None) -> tuple[DataFrame, DataFrame, DataFrame]:
    """(fields, devices, invalid) reports from a ``brokerlog`` DataFrame (batch or streaming)."""
    if watermark is not None:
        df = df.withWatermark("timestamp", watermark)
    parsed = parse(df, topic_filter, device_level)
    return build_fields(parsed, window, max_depth), build_devices(parsed, window), build_invalid(parsed)


def messages(fields: list[Any], devices: list[Any], prefix: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Per (window, device): ``PREFIX/<device>`` with the field statistics and
    ``PREFIX/<device>/counts`` with messages and invalid; windows oldest first."""
    by_key: dict[tuple[Any, Any, str], dict[str, Any]] = {}
    for r in fields:
        body = by_key.setdefault((r.window_start, r.window_end, r.device), {
            "window_start": r.window_start, "window_end": r.window_end, "device": r.device, "fields": {}})
        body["fields"][r.field] = {"count": r["count"], "min": r["min"], "max": r["max"], "avg": r["avg"]}
    counts = {(r.window_start, r.window_end, r.device): r for r in devices}
    for key in sorted(set(by_key) | set(counts), key=lambda k: (k[0], str(k[2]))):
        device = topic_level(key[2] if key[2] is not None else "_")
        if key in by_key:
            yield f"{prefix}/{device}", by_key[key]
        if key in counts:
            c = counts[key]
            yield f"{prefix}/{device}/counts", {"window_start": key[0], "window_end": key[1], "device": key[2],
                                                "messages": c.messages, "invalid": c.invalid}


def publish_rows(args: argparse.Namespace, fields: list[Any], devices: list[Any]) -> int:
    prefix = args.publish_topic or f"pipeline/{JOB}"
    with Publisher(args.publish_to, qos=args.publish_qos) as pub:
        return pub.publish_all(messages(fields, devices, prefix))


def run(spark: SparkSession, args: argparse.Namespace) -> int:
    if args.topic:
        check_filter(args.topic)
    paths = {t: common.out_path(args, t) for t in (FIELDS, DEVICES, INVALID)}
    if not args.follow:
        source = common.read_log(spark, args, originOnly=True).persist()
        try:
            fields, devices, invalid = build(source, args.window.spark, args.topic, args.device_level,
                                             args.max_depth)
            for table, df in ((FIELDS, fields), (DEVICES, devices), (INVALID, invalid)):
                common.write_batch(df, paths[table])
        finally:
            source.unpersist()
        counts = spark.read.parquet(paths[DEVICES]).agg(F.sum("messages").alias("m"),
                                                       F.sum("invalid").alias("i")).first()
        m, i = (counts.m or 0, counts.i or 0) if counts else (0, 0)
        print(f"telemetry: {m} messages, {i} not JSON (kept in {paths[INVALID]}) -> {paths[FIELDS]}")
        if args.publish_to:
            from brokerd.pipeline.jobs.traffic import newest_windows

            f_rows = newest_windows(spark.read.parquet(paths[FIELDS]), args.publish_windows)
            d_rows = newest_windows(spark.read.parquet(paths[DEVICES]), args.publish_windows)
            print(f"telemetry: published {publish_rows(args, f_rows, d_rows)} messages to {args.publish_to}")
        return 0
    fields, devices, invalid = build(common.read_log(spark, args, originOnly=True), args.window.spark, args.topic,
                                     args.device_level, args.max_depth, common.watermark(args))
    queries = [common.start_stream(df, args, paths[t], common.checkpoint_path(args, JOB, t), f"telemetry-{t}")
               for t, df in ((FIELDS, fields), (DEVICES, devices), (INVALID, invalid))]
    if args.publish_to and not args.available_now:
        queries.append(follow_publish(spark, args, paths, fields.schema, devices.schema))
    print(f"telemetry: following {args.data_dir} ({args.topic}) -> {args.out}")
    status = common.run_streams(queries)
    if status == 0 and args.publish_to and args.available_now:
        status = common.run_streams([follow_publish(spark, args, paths, fields.schema, devices.schema)])
    return status


def follow_publish(spark: SparkSession, args: argparse.Namespace, paths: dict[str, str], fields_schema: Any,
                   devices_schema: Any) -> Any:
    """Publish field statistics as their windows are committed (see ``traffic.follow_publish``); the
    per-device counts are published with the same batch when present."""
    source = spark.readStream.schema(fields_schema).parquet(paths[FIELDS])

    def publish_batch(batch: DataFrame, _batch_id: int) -> None:
        rows = batch.collect()
        if not rows:
            return
        starts = sorted({r.window_start for r in rows})
        devices = (spark.read.schema(devices_schema).parquet(paths[DEVICES])
                   .where(F.col("window_start").isin(starts)).collect())
        publish_rows(args, rows, devices)

    writer = (source.writeStream.queryName("telemetry-publish")
              .option("checkpointLocation", common.checkpoint_path(args, JOB, "publish"))
              .foreachBatch(publish_batch))
    writer = writer.trigger(availableNow=True) if args.available_now else writer.trigger(
        processingTime=args.trigger.spark)
    return writer.start()
