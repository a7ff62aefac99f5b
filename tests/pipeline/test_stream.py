"""The ``brokerlog`` streaming source: offsets in the checkpoint, exactly once across restarts.

Traffic is appended by a thread while the query runs; the query is stopped and restarted from its
checkpoint in the middle of it. The Parquet sink plus the checkpoint must end up with every record
exactly once. Progress is awaited with ``processAllAvailable`` and bounded polling, never a sleep.
"""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[pipeline]')")
pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install -e '.[pipeline]')")

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows  # noqa: E402

from brokerd.pipeline.source import BrokerLogStreamReader, ReadOptions, water_fill  # noqa: E402
from tests.helpers import wait_for  # noqa: E402
from tests.pipeline.logsim import LogSim  # noqa: E402


def stream(spark, sim: LogSim, **options):
    reader = spark.readStream.format("brokerlog")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load(sim.data_dir)


def keys(spark, path: str) -> list[tuple[str, str, int]]:
    return sorted((r.node, r.router, r.offset) for r in spark.read.parquet(path).select("node", "router", "offset")
                  .collect())


def all_keys(sim: LogSim) -> list[tuple[str, str, int]]:
    return sorted((*rid.split("/"), off) for rid, off, _ in sim.logged)


# ------------------------------------------------------------------------------------- without Spark

def test_water_fill_shares_the_limit_fairly():
    start = {"a": 0, "b": 10, "c": 5}
    latest = {"a": 1000, "b": 13, "c": 5}
    end = water_fill(start, latest, 100)
    assert end == {"a": 97, "b": 13, "c": 5}
    assert sum(end[k] - start[k] for k in start) == 100
    assert water_fill(start, latest, 10_000) == latest
    even = water_fill({"a": 0, "b": 0}, {"a": 50, "b": 50}, 10)
    assert even == {"a": 5, "b": 5}


def test_stream_reader_offsets(tmp_path):
    sim = LogSim(tmp_path / "data", routers=("w0", "w1"))
    for i in range(30):
        sim.publish(f"w{i % 2}", "a/b", b"x")
    sim.flush()
    reader = BrokerLogStreamReader(ReadOptions.parse({"path": sim.data_dir}))
    start = reader.initialOffset()
    assert start == {"t/w0": 0, "t/w1": 0}
    assert reader.latestOffset(start, ReadAllAvailable()) == {"t/w0": 15, "t/w1": 15}
    assert reader.latestOffset(start, ReadMaxRows(10)) == {"t/w0": 5, "t/w1": 5}
    parts = reader.partitions({"t/w0": 5, "t/w1": 15}, {"t/w0": 12, "t/w1": 15})
    assert [b.column("offset").to_pylist() for p in parts for b in reader.read(p)] == [list(range(5, 12))]
    latest = BrokerLogStreamReader(ReadOptions.parse({"path": sim.data_dir, "startingOffsets": "latest"}))
    assert latest.initialOffset() == {"t/w0": 15, "t/w1": 15}
    # Trigger.AvailableNow: the target is what is on disk now; later appends wait for the next run.
    reader.prepareForTriggerAvailableNow()
    sim.publish("w0", "a/b", b"late")
    sim.flush()
    assert reader.latestOffset(start, ReadAllAvailable()) == {"t/w0": 15, "t/w1": 15}
    # A router that appears later is read from its first record.
    sim.close()
    more = LogSim(tmp_path / "data", routers=("w2",))
    more.publish("w2", "a/b", b"y")
    more.close()
    fresh = BrokerLogStreamReader(ReadOptions.parse({"path": sim.data_dir}))
    assert fresh.latestOffset({"t/w0": 16, "t/w1": 15}, ReadAllAvailable()) == {"t/w0": 16, "t/w1": 15, "t/w2": 1}
    parts = fresh.partitions({"t/w0": 16, "t/w1": 15}, {"t/w0": 16, "t/w1": 15, "t/w2": 1})
    assert [(p.router, b.column("offset").to_pylist()) for p in parts for b in fresh.read(p)] == [("w2", [0])]


# ---------------------------------------------------------------------------------------------- Spark

def test_restart_from_checkpoint_while_traffic_continues_reads_every_record_once(spark, tmp_path):
    sim = LogSim(tmp_path / "data", routers=("w0", "w1"), segment_bytes=8192)
    for i in range(200):
        sim.publish(f"w{i % 2}", f"s/{i % 5}", b"%d" % i, forward_to=("w1",) if i % 4 == 0 else ())
    sim.flush()
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")

    def start():
        return (stream(spark, sim, maxRecordsPerTrigger="150").writeStream.format("parquet")
                .option("path", out).option("checkpointLocation", checkpoint)
                .trigger(processingTime="100 milliseconds").start())

    query = start()
    rounds = 30
    done = threading.Event()
    stopped = threading.Event()
    progressed = threading.Event()

    def traffic() -> None:
        """Keep publishing: a round of 40 messages after each progress of the query, and on through
        the time it is stopped (so records arrive while no query runs)."""
        for r in range(rounds):
            for i in range(40):
                sim.publish(f"w{i % 2}", f"s/{i % 5}", b"r%d-%d" % (r, i), forward_to=("w0",) if i % 8 == 0 else ())
            sim.flush()
            if not stopped.is_set():
                progressed.wait(10)
                progressed.clear()
        done.set()

    writer = threading.Thread(target=traffic, daemon=True)
    writer.start()
    seen = 0
    while seen < 4 and writer.is_alive():   # let the first query commit a few micro-batches
        wait_for(lambda n=seen: query.lastProgress is not None and query.lastProgress["batchId"] >= n, 60,
                 f"micro-batch {seen}")
        seen = query.lastProgress["batchId"] + 1
        progressed.set()
    query.stop()
    stopped.set()
    progressed.set()
    first_run = len(keys(spark, out))
    assert 0 < first_run

    query = start()
    assert done.wait(60), "traffic thread did not finish"
    writer.join(10)
    query.processAllAvailable()
    query.stop()
    sim.close()
    got = keys(spark, out)
    assert len(got) == len(set(got)), "a record was written twice"
    assert got == all_keys(sim)
    assert len(got) > first_run


def test_max_records_per_trigger_and_available_now(spark, tmp_path):
    sim = LogSim(tmp_path / "data", routers=("w0", "w1"))
    for i in range(1000):
        sim.publish(f"w{i % 2}", "x/y", b"%d" % i, forward_to=("w1",) if i % 10 == 0 else ())
    sim.close()
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    query = (stream(spark, sim, maxRecordsPerTrigger="300", originOnly="true").writeStream.format("parquet")
             .option("path", out).option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    assert query.awaitTermination(120), "an AvailableNow query must stop by itself"
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes and max(sizes) <= 300 and sum(sizes) == 1000
    assert keys(spark, out) == sorted((*s.router_id.split("/"), s.offset) for s in sim.sent)
