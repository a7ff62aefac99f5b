"""The ``brokerlog`` batch source against logs with known contents (written with CommitLog directly).

What must hold: a read returns exactly the records in the logs (each message once with
``originOnly``), the topic and time options select exactly what the broker's matcher and the
timestamps say, partitions follow segments, and a torn tail is read up to the last whole record.
"""

from __future__ import annotations

import os
import pickle
import random

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[pipeline]')")
pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install -e '.[pipeline]')")

from pyspark.sql import functions as F  # noqa: E402

from brokerd.pipeline.source import (  # noqa: E402
    ARROW_SCHEMA,
    SCHEMA,
    LogPartition,
    OptionError,
    ReadOptions,
    plan_batch,
    read_partition,
)
from brokerd.router.log import LogReader  # noqa: E402
from brokerd.router.topics import filter_matches  # noqa: E402
from tests.pipeline.logsim import LogSim  # noqa: E402

BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
STEP_MS = 100
TOPICS = [
    "sensors/kitchen/temp", "sensors/kitchen/hum", "sensors/hall/temp", "sensors/t1", "sensors",
    "devices/d1/telemetry", "devices/d2/telemetry", "$SYS/broker/load", "/leading/slash", "a/b/c/d",
]
COLUMNS = ["node", "router", "offset", "ts_ms", "origin_router", "origin_offset", "client_id", "topic", "qos",
           "retain", "payload"]


def rows(df) -> list[tuple]:
    """A DataFrame of the brokerlog schema as sorted plain tuples (timestamp as epoch ms)."""
    out = df.select("node", "router", "offset", F.expr("unix_millis(timestamp)").alias("ts_ms"), "origin_router",
                    "origin_offset", "client_id", "topic", "qos", "retain", "payload").collect()
    return sorted((*r[:10], bytes(r[10])) for r in out)


def expected(sim: LogSim, keep=lambda rid, sent: True) -> list[tuple]:
    out = []
    for rid, off, s in sim.logged:
        if keep(rid, s):
            node, router = rid.split("/")
            out.append((node, router, off, s.timestamp_ms, s.router_id, s.offset, s.client_id, s.topic, s.qos,
                        s.retain, s.payload))
    return sorted(out)


@pytest.fixture(scope="module")
def traffic(tmp_path_factory) -> LogSim:
    """3 routers, small segments (many per log), 3000 messages, about a third forwarded."""
    data = tmp_path_factory.mktemp("brokerlog") / "data"
    sim = LogSim(data, routers=("w0", "w1", "w2"), segment_bytes=16384, index_interval_bytes=512)
    rnd = random.Random(7)
    routers = ["w0", "w1", "w2"]
    for i in range(3000):
        r = routers[i % 3]
        others = tuple(o for o in routers if o != r and rnd.random() < 0.2)
        sim.publish(r, TOPICS[rnd.randrange(len(TOPICS))], rnd.randbytes(rnd.randrange(0, 200)),
                    client_id=f"client-{rnd.randrange(5)}", qos=rnd.randrange(3), retain=rnd.random() < 0.1,
                    timestamp_ms=BASE_MS + i * STEP_MS, forward_to=others)
    sim.close()
    return sim


def load(spark, sim: LogSim, **options):
    reader = spark.read.format("brokerlog")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load(sim.data_dir)


# ------------------------------------------------------------------------------------- without Spark

def test_arrow_schema_is_what_spark_expects():
    from pyspark.sql.pandas.types import to_arrow_schema

    assert to_arrow_schema(SCHEMA, timezone="UTC").equals(ARROW_SCHEMA)


def test_options_are_validated_with_the_option_named(tmp_path):
    with pytest.raises(OptionError, match="path"):
        ReadOptions.parse({})
    with pytest.raises(ValueError, match="topic filter"):
        ReadOptions.parse({"path": str(tmp_path), "topic": "a/#/b"})
    with pytest.raises(OptionError, match="startTime"):
        ReadOptions.parse({"path": str(tmp_path), "startTime": "yesterday"})
    with pytest.raises(OptionError, match="endTime"):
        ReadOptions.parse({"path": str(tmp_path), "startTime": "2026-01-02", "endTime": "2026-01-01"})
    with pytest.raises(OptionError, match="originOnly"):
        ReadOptions.parse({"path": str(tmp_path), "originOnly": "perhaps"})
    with pytest.raises(OptionError, match="startingOffsets"):
        ReadOptions.parse({"path": str(tmp_path), "startingOffsets": '{"t/w0": -3}'})
    opts = ReadOptions.parse({"PATH": str(tmp_path), "StartTime": "2026-01-01T00:00:01Z", "endtime": "1767225602.5",
                              "originonly": "TRUE", "routers": "w0, t/w1"})
    assert (opts.start_ms, opts.end_ms) == (BASE_MS + 1000, BASE_MS + 2500)
    assert opts.origin_only and opts.routers == ("w0", "t/w1")


def test_one_partition_per_segment_and_reading_them_covers_the_log_once(traffic):
    opts = ReadOptions.parse({"path": traffic.data_dir, "splitBytes": "4096"})
    parts = plan_batch(opts)
    segments = 0
    for r in ("w0", "w1", "w2"):
        with LogReader(os.path.join(traffic.data_dir, "t", r)) as reader:
            segments += len(reader.segments())
    assert segments > 9
    assert len(parts) >= segments  # segments of 16 KiB split at index positions into ~4 KiB ranges
    got = sorted((p.node, p.router, off) for p in parts for b in read_partition(opts, p)
                 for off in b.column("offset").to_pylist())
    assert got == sorted((rid.split("/")[0], rid.split("/")[1], off) for rid, off, _ in traffic.logged)

    # Small segments are packed together rather than one task each; still every record once.
    packed = plan_batch(ReadOptions.parse({"path": traffic.data_dir, "splitBytes": str(1 << 20)}))
    assert len(packed) == 3
    assert sum(b.num_rows for p in packed for b in read_partition(opts, p)) == len(traffic.logged)


def test_partitions_pickle_and_hold_no_open_files(traffic):
    fds_before = set(os.listdir("/proc/self/fd"))
    opts = ReadOptions.parse({"path": traffic.data_dir})
    parts = plan_batch(opts)
    assert set(os.listdir("/proc/self/fd")) == fds_before
    copy = pickle.loads(pickle.dumps(parts))
    assert all(isinstance(p, LogPartition) for p in copy)
    assert sum(b.num_rows for b in read_partition(opts, copy[0])) > 0
    assert set(os.listdir("/proc/self/fd")) == fds_before


def test_time_options_skip_whole_segments(traffic):
    start = BASE_MS + 1000 * STEP_MS
    end = BASE_MS + 1300 * STEP_MS
    everything = plan_batch(ReadOptions.parse({"path": traffic.data_dir}))
    window = plan_batch(ReadOptions.parse({"path": traffic.data_dir, "startTime": str(start / 1000),
                                           "endTime": str(end / 1000), "clockSkewMs": "0"}))
    slices = sum(len(p.slices) for p in window)
    assert 0 < slices < sum(len(p.slices) for p in everything) / 3


# ---------------------------------------------------------------------------------------------- Spark

def test_batch_read_returns_every_record(spark, traffic):
    df = load(spark, traffic)
    assert df.schema == SCHEMA
    assert rows(df) == expected(traffic)


def test_origin_only_counts_each_message_once(spark, traffic):
    got = rows(load(spark, traffic, originOnly="true"))
    assert len(got) == len(traffic.sent) < len(traffic.logged)
    assert got == expected(traffic, lambda rid, s: rid == s.router_id)


@pytest.mark.parametrize("topic_filter", ["sensors/+/temp", "sensors/#", "+/+", "#", "$SYS/#", "/+/slash",
                                          "devices/d1/telemetry"])
def test_topic_filter_is_exact(spark, traffic, topic_filter):
    got = rows(load(spark, traffic, topic=topic_filter, originOnly="true"))
    want = expected(traffic, lambda rid, s: rid == s.router_id and filter_matches(topic_filter, s.topic))
    assert got == want and want


def test_time_range_is_exact(spark, traffic):
    start = BASE_MS + 1000 * STEP_MS + 50   # between two records
    end = BASE_MS + 1300 * STEP_MS          # exactly on one: excluded
    got = rows(load(spark, traffic, startTime=f"{start / 1000:.3f}", endTime="2026-01-01T00:02:10Z"))
    assert end == BASE_MS + 130_000
    assert got == expected(traffic, lambda rid, s: start <= s.timestamp_ms < end)


def test_a_read_with_nothing_to_read_is_empty(spark, traffic, tmp_path):
    """No partition planned (a time window after the last record, or no log at all): Spark hands
    the reader a placeholder partition of its own, which reads as nothing."""
    assert plan_batch(ReadOptions.parse({"path": traffic.data_dir, "startTime": "2030-01-01"})) == []
    assert load(spark, traffic, startTime="2030-01-01").count() == 0
    (tmp_path / "empty").mkdir()
    assert spark.read.format("brokerlog").load(str(tmp_path / "empty")).count() == 0


def test_routers_and_offsets_options(spark, traffic):
    got = rows(load(spark, traffic, routers="w1,t/w2", startingOffsets='{"t/w1": 100}',
                    endingOffsets='{"t/w2": 50}'))
    want = [r for r in expected(traffic) if (r[1] == "w1" and r[2] >= 100) or (r[1] == "w2" and r[2] < 50)]
    assert got == want


def test_dataframe_filters_on_the_same_load_stay_exact(spark, traffic):
    """Spark 4.3 would reuse a pushed-down plan for a later unfiltered query of the same DataFrame;
    the source does not push filters down, so both queries see everything they should."""
    df = load(spark, traffic)
    assert df.where((F.col("offset") >= 500) & (F.col("router") == "w0")).count() == sum(
        1 for rid, off, _ in traffic.logged if rid == "t/w0" and off >= 500)
    assert df.count() == len(traffic.logged)


def test_truncated_tail_is_read_up_to_the_last_whole_record(spark, tmp_path):
    sim = LogSim(tmp_path / "data", routers=("w0",))
    for i in range(50):
        sim.publish("w0", "t/x", b"payload-%d" % i, timestamp_ms=BASE_MS + i)
    sim.close()
    directory = os.path.join(sim.data_dir, "t", "w0")
    segment = sorted(f for f in os.listdir(directory) if f.endswith(".log"))[-1]
    path = os.path.join(directory, segment)
    os.truncate(path, os.path.getsize(path) - 5)  # the last record loses its last 5 bytes
    got = rows(load(spark, sim))
    assert [r[2] for r in got] == list(range(49))
    assert got == expected(sim, lambda rid, s: s.offset < 49)
