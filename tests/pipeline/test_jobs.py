"""The traffic and telemetry jobs, run through the CLI in-process (sharing the test SparkSession),
against logs whose contents the test knows: every total in the Parquet reports must equal what the
test computes from the messages it wrote."""

from __future__ import annotations

import json
import math
import random
from collections import defaultdict

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[pipeline]')")
pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install -e '.[pipeline]')")

from pyspark.sql import functions as F  # noqa: E402

from brokerd.pipeline import cli  # noqa: E402
from brokerd.pipeline.jobs.common import parse_duration  # noqa: E402
from brokerd.router.topics import filter_matches  # noqa: E402
from tests.helpers import Client, wait_for  # noqa: E402
from tests.pipeline.logsim import LogSim, Sent  # noqa: E402

BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z, a minute boundary
MINUTE = 60_000
TRAFFIC_TOPICS = ["sensors/kitchen/temp", "sensors/hall/temp", "sensors/t1", "sensors", "a/b/c/d", "/lead/x",
                  "$SYS/broker/load"]


def window_of(ts_ms: int, size_ms: int = MINUTE) -> int:
    return ts_ms - ts_ms % size_ms


def prefixes(topic: str, depth: int = 2) -> list[str]:
    levels = topic.split("/")
    return ["/".join(levels[:d] + ["+"] * (len(levels) - d)) for d in range(1, min(len(levels) - 1, depth) + 1)]


def expected_traffic(sim: LogSim) -> dict[tuple[int, str, str], tuple[int, int]]:
    """(window start ms, dimension, key) → (messages, bytes), from what the test wrote."""
    out: dict[tuple[int, str, str], list[int]] = defaultdict(lambda: [0, 0])

    def add(ts: int, dim: str, key: str, size: int) -> None:
        cell = out[(window_of(ts), dim, key)]
        cell[0] += 1
        cell[1] += size

    for s in sim.sent:
        size = len(s.payload)
        add(s.timestamp_ms, "topic", s.topic, size)
        add(s.timestamp_ms, "client", s.client_id, size)
        add(s.timestamp_ms, "router", s.router_id, size)
        for p in prefixes(s.topic):
            add(s.timestamp_ms, "prefix", p, size)
    for rid, _off, s in sim.logged:
        if rid != s.router_id:
            add(s.timestamp_ms, "router_forwarded", rid, len(s.payload))
    return {k: (v[0], v[1]) for k, v in out.items()}


def report(spark, path: str) -> dict[tuple[int, str, str], tuple[int, int]]:
    rows = spark.read.parquet(path).select(
        F.expr("unix_millis(window_start)").alias("ws"), F.expr("unix_millis(window_end)").alias("we"),
        "dimension", "key", "messages", "bytes").collect()
    out = {}
    for r in rows:
        assert r.we - r.ws == MINUTE
        assert (r.ws, r.dimension, r.key) not in out, f"duplicate row {r}"
        out[(r.ws, r.dimension, r.key)] = (r.messages, r.bytes)
    return out


def write_traffic(sim: LogSim, n: int, start_ms: int, seed: int, span_ms: int = 3 * MINUTE) -> None:
    rnd = random.Random(seed)
    for i in range(n):
        r = "w0" if rnd.random() < 0.6 else "w1"
        sim.publish(r, rnd.choice(TRAFFIC_TOPICS), rnd.randbytes(rnd.randrange(0, 64)),
                    client_id=f"c{rnd.randrange(4)}", timestamp_ms=start_ms + i * span_ms // n,
                    forward_to=("w1" if r == "w0" else "w0",) if rnd.random() < 0.3 else ())


# ------------------------------------------------------------------------------------- without Spark

def test_durations():
    assert parse_duration("1m").ms == MINUTE
    assert parse_duration("90s").spark == "90000 milliseconds"
    assert parse_duration("10 minutes").ms == 10 * MINUTE
    for bad in ("0s", "soon", "1x"):
        with pytest.raises(Exception, match="duration|positive"):
            parse_duration(bad)


def test_bad_options_fail_before_spark_starts(tmp_path, capsys):
    assert cli.main(["traffic", "--data-dir", str(tmp_path / "missing")]) == 2
    assert "--data-dir" in capsys.readouterr().err
    assert cli.main(["telemetry", "--data-dir", str(tmp_path), "--topic", "devices/#/x"]) == 2
    assert "topic filter" in capsys.readouterr().err
    assert cli.main(["traffic", "--data-dir", str(tmp_path), "--start-time", "noon"]) == 2
    assert "startTime" in capsys.readouterr().err


def test_package_writes_a_zip_and_a_launcher(tmp_path):
    import zipfile

    paths = cli.package(str(tmp_path))
    names = zipfile.ZipFile(paths[0]).namelist()
    assert "brokerd/pipeline/source.py" in names and "brokerd/router/log/format.py" in names
    assert "brokerd/__init__.py" in names and "cluster/config.py" not in names
    assert "from brokerd.pipeline.cli import main" in open(paths[1]).read()


# ---------------------------------------------------------------------------------------------- Spark

def test_traffic_totals_equal_what_was_sent(spark, tmp_path):
    sim = LogSim(tmp_path / "data", segment_bytes=8192)
    write_traffic(sim, 1500, BASE_MS, seed=1)
    sim.close()
    out = tmp_path / "reports"
    assert cli.main(["traffic", "--data-dir", sim.data_dir, "--out", str(out), "--window", "1m"]) == 0
    got = report(spark, str(out / "traffic"))
    want = expected_traffic(sim)
    assert got == want
    # Every prefix key is an MQTT filter that matches exactly the messages counted under it.
    for (ws, dim, key), (count, _bytes) in got.items():
        if dim == "prefix":
            assert count == sum(1 for s in sim.sent if window_of(s.timestamp_ms) == ws and filter_matches(key, s.topic))
    # Topic option: only the matching messages, each once.
    sel = tmp_path / "sel"
    assert cli.main(["traffic", "--data-dir", sim.data_dir, "--out", str(sel), "--topic", "sensors/#"]) == 0
    topics = {k: v for k, v in report(spark, str(sel / "traffic")).items() if k[1] == "topic"}
    assert sum(v[0] for v in topics.values()) == sum(1 for s in sim.sent if filter_matches("sensors/#", s.topic))


def test_traffic_follow_resumes_from_its_checkpoint(spark, tmp_path):
    """--follow --available-now twice, with new traffic in between: windows the watermark closed are
    written exactly once each, with the totals of everything sent in them."""
    sim = LogSim(tmp_path / "data")
    write_traffic(sim, 400, BASE_MS, seed=2)                           # minutes 0-2
    sim.publish("w0", "tick", b"", timestamp_ms=BASE_MS + 5 * MINUTE)   # moves the watermark past them
    sim.flush()
    out = tmp_path / "reports"
    argv = ["traffic", "--data-dir", sim.data_dir, "--out", str(out), "--window", "1m", "--follow",
            "--available-now", "--max-records-per-trigger", "150"]
    assert cli.main(argv) == 0
    first = report(spark, str(out / "traffic"))
    assert {k[0] for k in first} == {BASE_MS, BASE_MS + MINUTE, BASE_MS + 2 * MINUTE}
    write_traffic(sim, 300, BASE_MS + 6 * MINUTE, seed=3)              # minutes 6-8
    sim.publish("w1", "tick", b"", timestamp_ms=BASE_MS + 12 * MINUTE)
    sim.close()
    assert cli.main(argv) == 0
    got = report(spark, str(out / "traffic"))
    closed = {k: v for k, v in expected_traffic(sim).items() if k[0] < BASE_MS + 12 * MINUTE}
    assert got == closed
    assert {k: v for k, v in got.items() if k in first} == first


def telemetry_traffic(sim: LogSim, seed: int) -> tuple[dict, dict, list[Sent]]:
    """JSON telemetry from 3 devices over 2 minutes, some payloads not JSON, some other topics.
    Returns (fields: (window, device, field) → values, devices: (window, device) → [messages, invalid],
    the invalid messages)."""
    rnd = random.Random(seed)
    fields: dict[tuple[int, str, str], list[float]] = defaultdict(list)
    devices: dict[tuple[int, str], list[int]] = defaultdict(lambda: [0, 0])
    invalid = []
    for i in range(600):
        ts = BASE_MS + i * 200
        device = f"d{rnd.randrange(3)}"
        w = window_of(ts)
        kind = rnd.random()
        if kind < 0.1:
            payload, values = rnd.choice([b"not json", b"{broken", b"", b"\xff\xfe"]), None
        elif kind < 0.15:
            v = rnd.uniform(-5, 5)
            payload, values = json.dumps(v).encode(), {"value": v}
        else:
            t, h, p = round(rnd.uniform(15, 30), 2), rnd.randrange(20, 90), rnd.uniform(990, 1030)
            doc = {"temp": t, "hum": h, "env": {"p": p, "deep": {"x": i}}, "ok": True, "name": "n", "arr": [1, 2],
                   "none": None}
            if rnd.random() < 0.3:
                del doc["hum"]
            payload = json.dumps(doc).encode()
            values = {"temp": t, "env.p": p, "env.deep.x": i, **({"hum": h} if "hum" in doc else {})}
        sent = sim.publish("w0" if i % 2 else "w1", f"devices/{device}/telemetry", payload, timestamp_ms=ts,
                           client_id=f"client-{device}", forward_to=("w0",) if i % 7 == 0 and i % 2 == 0 else ())
        devices[(w, device)][0] += 1
        if values is None:
            devices[(w, device)][1] += 1
            invalid.append(sent)
        else:
            for name, v in values.items():
                fields[(w, device, name)].append(float(v))
        if i % 5 == 0:
            sim.publish("w0", f"devices/{device}/status", b'{"temp": 1000}', timestamp_ms=ts)
    return fields, devices, invalid


def test_telemetry_aggregates_equal_values_computed_here(spark, tmp_path):
    sim = LogSim(tmp_path / "data")
    fields, devices, invalid = telemetry_traffic(sim, seed=4)
    sim.close()
    out = tmp_path / "reports"
    assert cli.main(["telemetry", "--topic", "devices/+/telemetry", "--data-dir", sim.data_dir, "--out", str(out),
                     "--window", "1m"]) == 0
    rows = spark.read.parquet(str(out / "telemetry")).select(
        F.expr("unix_millis(window_start)").alias("ws"), "device", "field", "count", "min", "max", "avg").collect()
    got = {(r.ws, r.device, r.field): (r["count"], r["min"], r["max"], r["avg"]) for r in rows}
    assert len(got) == len(rows)
    assert set(got) == set(fields)
    for key, values in fields.items():
        count, lo, hi, avg = got[key]
        assert count == len(values)
        assert lo == pytest.approx(min(values)) and hi == pytest.approx(max(values))
        assert avg == pytest.approx(math.fsum(values) / len(values))
    counts = {(r.ws, r.device): [r.messages, r.invalid] for r in spark.read.parquet(str(out / "telemetry_devices"))
              .select(F.expr("unix_millis(window_start)").alias("ws"), "device", "messages", "invalid").collect()}
    assert counts == dict(devices)
    kept = spark.read.parquet(str(out / "telemetry_invalid")).collect()
    assert sorted((r.router, r.offset, bytes(r.payload)) for r in kept) == sorted(
        (s.router_id.split("/")[1], s.offset, s.payload) for s in invalid)


def test_results_are_published_into_the_broker(spark, tmp_path, start_broker):
    broker = start_broker("--sys-interval", "0", data_dir=str(tmp_path / "brokerdata"))
    sub = Client(broker.port, "dashboard").connect()
    sub.subscribe([("pipeline/#", 1), ("dash/#", 1)])
    sim = LogSim(tmp_path / "data")
    write_traffic(sim, 300, BASE_MS, seed=5)
    fields, devices, _invalid = telemetry_traffic(sim, seed=6)
    sim.close()
    out = tmp_path / "reports"
    assert cli.main(["traffic", "--data-dir", sim.data_dir, "--out", str(out), "--publish-to",
                     f"127.0.0.1:{broker.port}", "--publish-windows", "2"]) == 0
    newest = sorted({k[0] for k in expected_traffic(sim)})[-2:]
    want = {(w, dim) for (w, dim, _key) in expected_traffic(sim) if w in newest}
    msgs = sub.wait_messages(len(want))
    got = {}
    for m in msgs:
        body = json.loads(m.payload)
        assert m.topic == f"pipeline/traffic/{body['dimension']}"
        got[(body["window_start"], body["dimension"])] = {r["key"]: (r["messages"], r["bytes"]) for r in body["rows"]}
    exp = expected_traffic(sim)
    iso = {w: f"2026-01-01T00:{(w - BASE_MS) // MINUTE:02d}:00Z" for w in newest}
    assert got == {(iso[w], dim): {k: v for (ww, d, k), v in exp.items() if ww == w and d == dim} for w, dim in want}

    assert cli.main(["telemetry", "--data-dir", sim.data_dir, "--out", str(tmp_path / "t"), "--publish-to",
                     f"127.0.0.1:{broker.port}", "--publish-topic", "dash/tele"]) == 0
    newest_w = max(k[0] for k in fields)
    device_keys = {k[1] for k in fields if k[0] == newest_w}
    wait_for(lambda: {m.topic for m in sub.messages if m.topic.startswith("dash/tele/")} >= {
        f"dash/tele/{d}" for d in device_keys} | {f"dash/tele/{d}/counts" for d in device_keys},
             what=f"telemetry {device_keys} {sorted(m.topic for m in sub.messages)}")
    for m in sub.messages:
        if m.topic.startswith("dash/tele/") and not m.topic.endswith("/counts"):
            body = json.loads(m.payload)
            for name, stats in body["fields"].items():
                assert stats["count"] == len(fields[(newest_w, body["device"], name)])
        elif m.topic.endswith("/counts"):
            body = json.loads(m.payload)
            assert [body["messages"], body["invalid"]] == devices[(newest_w, body["device"])]
    sub.disconnect()


def test_telemetry_follow_writes_closed_windows_once(spark, tmp_path):
    sim = LogSim(tmp_path / "data")
    fields, devices, invalid = telemetry_traffic(sim, seed=7)          # minutes 0-1
    sim.publish("w0", "devices/d0/telemetry", b'{"tick": 1}', timestamp_ms=BASE_MS + 4 * MINUTE)
    sim.close()
    out = tmp_path / "reports"
    argv = ["telemetry", "--data-dir", sim.data_dir, "--out", str(out), "--follow", "--available-now"]
    assert cli.main(argv) == 0
    assert cli.main(argv) == 0  # nothing new: writes nothing twice
    rows = spark.read.parquet(str(out / "telemetry")).select(
        F.expr("unix_millis(window_start)").alias("ws"), "device", "field", "count", "max").collect()
    assert {(r.ws, r.device, r.field): (r["count"], r["max"]) for r in rows} == {
        k: (len(v), max(v)) for k, v in fields.items()}
    counts = spark.read.parquet(str(out / "telemetry_devices")).select(
        F.expr("unix_millis(window_start)").alias("ws"), "device", "messages", "invalid").collect()
    assert {(r.ws, r.device): [r.messages, r.invalid] for r in counts} == dict(devices)
    assert spark.read.parquet(str(out / "telemetry_invalid")).count() == len(invalid)
