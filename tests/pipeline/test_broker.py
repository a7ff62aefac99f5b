"""The pipeline against a real ``brokerd --workers 2``: known traffic through MQTT, then Spark.

The broker logs every publish it carries: the origin record on the publisher's router, a forwarded
copy on each other router with subscribers. After a graceful stop (everything flushed) a batch read
with ``originOnly`` must return exactly the published messages, and the jobs' totals must equal
what the test sent. A streaming query follows the live log while clients publish, is stopped and
restarted from its checkpoint, and must end with every record exactly once.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections import Counter, defaultdict

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[pipeline]')")
pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install -e '.[pipeline]')")

from pyspark.sql import functions as F  # noqa: E402

from brokerd.pipeline import cli  # noqa: E402
from brokerd.router.log import LogReader  # noqa: E402
from tests.helpers import Client, wait_for  # noqa: E402

PUBLISHERS = 4
MESSAGES = 240


def segments(data_dir: str) -> int:
    n = 0
    for node in os.listdir(data_dir) if os.path.isdir(data_dir) else ():
        for router in os.listdir(os.path.join(data_dir, node)):
            path = os.path.join(data_dir, node, router)
            if os.path.isdir(path):
                with LogReader(path) as reader:
                    n += len(reader.segments())
    return n


def skip_without_log(data_dir: str) -> None:
    if segments(data_dir) == 0:
        pytest.skip("brokerd wrote no commit log segment under --data-dir after a graceful stop "
                    "(the broker's log integration is not there yet)")


@pytest.fixture
def fleet(start_broker, tmp_path):
    """Run known traffic through a 2-worker broker, stop it; returns (data dir, sent messages)."""
    data = str(tmp_path / "data")
    broker = start_broker("--sys-interval", "0", workers=2, data_dir=data)
    subs = [Client(broker.port, f"dash-{i}").connect() for i in range(2)]
    for s in subs:
        s.subscribe("fleet/#", qos=1)
    ids = [f"dev-client-{i}" for i in range(PUBLISHERS)]
    pubs = [Client(broker.port, cid).connect() for cid in ids]
    sent = []
    for i in range(MESSAGES):
        c = pubs[i % PUBLISHERS]
        device = f"dev{i % 5}"
        if i % 17 == 0:
            payload = b"not json at all"
        else:
            payload = json.dumps({"v": i, "temp": 20 + (i % 7) * 0.5, "meta": {"seq": i}}).encode()
        topic = f"fleet/{device}/telemetry" if i % 4 else f"fleet/{device}/status"
        c.publish(topic, payload, qos=1)
        sent.append((ids[i % PUBLISHERS], topic, payload, 1))
    for s in subs:
        s.wait_messages(MESSAGES)
    for c in pubs + subs:
        c.disconnect()
    assert broker.stop() == 0
    skip_without_log(data)
    return data, sent


def test_batch_read_returns_exactly_the_published_messages(spark, fleet):
    data, sent = fleet
    df = spark.read.format("brokerlog").load(data).where(F.col("topic").startswith("fleet/"))
    origin = df.where(F.col("origin_router") == F.concat_ws("/", "node", "router"))
    once = spark.read.format("brokerlog").option("originOnly", "true").option("topic", "fleet/#").load(data)
    got = Counter((r.client_id, r.topic, bytes(r.payload), r.qos) for r in once.collect())
    assert got == Counter(sent)
    assert origin.count() == len(sent)
    # Every forwarded copy points at an origin record with the same message.
    copies = df.where(F.col("origin_router") != F.concat_ws("/", "node", "router")).alias("c")
    joined = copies.join(origin.alias("o"), (F.col("c.origin_router") == F.concat_ws("/", "o.node", "o.router"))
                         & (F.col("c.origin_offset") == F.col("o.offset")), "left")
    assert joined.where(F.col("o.offset").isNull() | (F.col("c.payload") != F.col("o.payload"))).count() == 0
    assert {r.node for r in df.select("node").distinct().collect()} == {"t"}


def test_jobs_totals_equal_what_was_sent(spark, fleet, tmp_path):
    data, sent = fleet
    out = str(tmp_path / "reports")
    assert cli.main(["traffic", "--data-dir", data, "--out", out, "--topic", "fleet/#"]) == 0
    rows = spark.read.parquet(os.path.join(out, "traffic")).where("dimension = 'topic'").groupBy("key").agg(
        F.sum("messages").alias("m"), F.sum("bytes").alias("b")).collect()
    want: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for _client, topic, payload, _qos in sent:
        want[topic][0] += 1
        want[topic][1] += len(payload)
    assert {r.key: [r.m, r.b] for r in rows} == dict(want)
    clients = spark.read.parquet(os.path.join(out, "traffic")).where("dimension = 'client'").groupBy("key").agg(
        F.sum("messages").alias("m")).collect()
    assert {r.key: r.m for r in clients} == dict(Counter(c for c, *_ in sent))

    assert cli.main(["telemetry", "--topic", "fleet/+/telemetry", "--data-dir", data, "--out", out]) == 0
    values: dict[tuple[str, str], list[float]] = defaultdict(list)
    invalid = 0
    for _client, topic, payload, _qos in sent:
        if not topic.endswith("/telemetry"):
            continue
        device = topic.split("/")[1]
        try:
            doc = json.loads(payload)
        except ValueError:
            invalid += 1
            continue
        values[(device, "v")].append(doc["v"])
        values[(device, "temp")].append(doc["temp"])
        values[(device, "meta.seq")].append(doc["meta"]["seq"])
    stats = spark.read.parquet(os.path.join(out, "telemetry")).groupBy("device", "field").agg(
        F.sum("count").alias("n"), F.min("min").alias("lo"), F.max("max").alias("hi"),
        F.sum(F.col("avg") * F.col("count")).alias("total")).collect()
    assert {(r.device, r.field) for r in stats} == set(values)
    for r in stats:
        v = values[(r.device, r.field)]
        assert (r.n, r.lo, r.hi) == (len(v), min(v), max(v))
        assert r.total == pytest.approx(math.fsum(v))
    kept = spark.read.parquet(os.path.join(out, "telemetry_invalid")).count()
    assert kept == invalid > 0


def test_streaming_query_follows_the_live_log_across_a_restart(spark, start_broker, tmp_path):
    data = str(tmp_path / "data")
    broker = start_broker("--sys-interval", "0", workers=2, data_dir=data)
    sub = Client(broker.port, "watcher").connect()
    sub.subscribe("live/#", qos=1)
    pubs = [Client(broker.port, f"live-{i}").connect() for i in range(2)]
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")

    def start():
        return (spark.readStream.format("brokerlog").option("topic", "live/#").load(data)
                .writeStream.format("parquet").option("path", out).option("checkpointLocation", checkpoint)
                .trigger(processingTime="200 milliseconds").start())

    sent = threading.Event()
    progress = threading.Semaphore(0)
    total = 300

    def traffic() -> None:
        for i in range(total):
            pubs[i % 2].publish(f"live/{i % 3}", b"m%d" % i, qos=1)
            if i % 50 == 49:
                progress.acquire(timeout=10)  # keep publishing in step with the query (bounded)
        sent.set()

    first = start()
    writer = threading.Thread(target=traffic, daemon=True)
    writer.start()
    wait_for(lambda: segments(data) > 0, 10, "a log segment")
    for _ in range(2):
        batch = first.lastProgress["batchId"] if first.lastProgress else -1
        wait_for(lambda b=batch: first.lastProgress is not None and first.lastProgress["batchId"] > b, 60,
                 "a micro-batch")
        progress.release()
    first.stop()
    for _ in range(6):
        progress.release()
    second = start()
    assert sent.wait(60)
    writer.join(10)
    sub.wait_messages(total, timeout=30)
    for c in pubs + [sub]:
        c.disconnect()
    assert broker.stop() == 0
    second.processAllAvailable()
    second.stop()
    got = sorted((r.router, r.offset) for r in spark.read.parquet(out).select("router", "offset").collect())
    assert len(got) == len(set(got)), "a record was written twice"
    logged = sorted((r.router, r.offset) for r in spark.read.format("brokerlog").option("topic", "live/#")
                    .load(data).select("router", "offset").collect())
    assert got == logged
    assert spark.read.parquet(out).where(F.col("origin_router") == F.concat_ws("/", "node", "router")).count() == total
