"""MQTT 5 PUBLISH properties as ``brokerlog`` columns.

The log keeps each record's properties as the broker packed them (``router.message``: a msgpack
map of property id → value, b"" for none). What must hold: every record reads back with exactly
the properties it was published with, in typed columns (``content_type``, ``user_properties`` as a
map whose repeated keys keep their last value, ``response_topic``, ``correlation_data``,
``message_expiry``, ``payload_format``); a record without properties has nulls and an empty map;
only records that have properties are unpacked; and the same holds through a real broker, for a
batch read and a streaming query.
"""

from __future__ import annotations

import logging
import os
import random

import msgpack
import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[pipeline]')")
pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install -e '.[pipeline]')")

import paho.mqtt.client as mqtt  # noqa: E402
from paho.mqtt.packettypes import PacketTypes  # noqa: E402
from paho.mqtt.properties import Properties  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from brokerd.connection.packets import Prop  # noqa: E402
from brokerd.pipeline import source  # noqa: E402
from brokerd.pipeline.source import ARROW_SCHEMA, SCHEMA, properties_to_arrow  # noqa: E402
from brokerd.router.message import Message  # noqa: E402
from tests.helpers import WAIT, Client  # noqa: E402
from tests.pipeline.logsim import LogSim  # noqa: E402

PROPERTY_COLUMNS = ["content_type", "user_properties", "response_topic", "correlation_data", "message_expiry",
                    "payload_format"]
ORIGINAL_COLUMNS = ["node", "router", "offset", "timestamp", "origin_router", "origin_offset", "client_id", "topic",
                    "qos", "retain", "payload"]
ABSENT = (None, {}, None, None, None, None)


def packed(props: dict | None) -> bytes:
    """Properties packed the way the broker logs them (its own encoder, not a copy of it)."""
    return Message("t", b"", properties=props).packed_properties()


def expected(raw: bytes) -> tuple:
    """What the columns must hold for one record's ``properties`` field, by a plain decode."""
    if not raw:
        return ABSENT
    p = msgpack.unpackb(raw, strict_map_key=False)
    user: dict[str, str] = {}
    for key, value in p.get(Prop.USER_PROPERTY, []):
        user[key] = value  # the last value of a repeated key wins
    return (p.get(Prop.CONTENT_TYPE), user, p.get(Prop.RESPONSE_TOPIC), p.get(Prop.CORRELATION_DATA),
            p.get(Prop.MESSAGE_EXPIRY_INTERVAL), p.get(Prop.PAYLOAD_FORMAT_INDICATOR))


def arrow_rows(columns) -> list[tuple]:
    """The property columns of an Arrow batch as one tuple per row (maps as dicts)."""
    lists = [c.to_pylist() for c in columns]
    lists[1] = [None if m is None else dict(m) for m in lists[1]]
    return list(zip(*lists, strict=True))


def spark_props(row) -> tuple:
    """The property columns of a Spark Row as a tuple like ``expected`` gives."""
    corr = row.correlation_data
    return (row.content_type, row.user_properties, row.response_topic, None if corr is None else bytes(corr),
            row.message_expiry, row.payload_format)


def random_properties(rnd: random.Random) -> dict:
    """Some of the forwarded PUBLISH properties, edge values included; sometimes a Subscription
    Identifier, which no column shows."""
    props: dict = {}
    if rnd.random() < 0.6:
        props[Prop.CONTENT_TYPE] = rnd.choice(["application/json", "text/plain; charset=utf-8", "", "ü/ß"])
    if rnd.random() < 0.6:
        props[Prop.USER_PROPERTY] = [(rnd.choice("abc") + "k", f"v{rnd.randrange(100)}")
                                     for _ in range(rnd.randrange(1, 5))]
    if rnd.random() < 0.3:
        props[Prop.RESPONSE_TOPIC] = f"reply/{rnd.randrange(10)}"
    if rnd.random() < 0.3:
        props[Prop.CORRELATION_DATA] = rnd.randbytes(rnd.randrange(0, 16))
    if rnd.random() < 0.4:
        props[Prop.MESSAGE_EXPIRY_INTERVAL] = rnd.choice([0, 1, 3600, 0xFFFFFFFF])
    if rnd.random() < 0.4:
        props[Prop.PAYLOAD_FORMAT_INDICATOR] = rnd.randrange(2)
    if rnd.random() < 0.1:
        props[Prop.SUBSCRIPTION_IDENTIFIER] = [7]
    return props or {Prop.CONTENT_TYPE: "x"}


# ------------------------------------------------------------------------------------- without Spark

def test_property_columns_are_appended_after_the_original_ones():
    assert SCHEMA.fieldNames() == ORIGINAL_COLUMNS + PROPERTY_COLUMNS
    assert ARROW_SCHEMA.names == SCHEMA.fieldNames()


@pytest.mark.parametrize("every", [0, 1, 2, 37, 500])
def test_columns_match_a_plain_decode_of_every_record(every):
    """Batches with no record that has properties (0), all (1), and mixes: each row gets its own
    record's properties, including in the sparse path that decodes a few and spreads them."""
    rnd = random.Random(every)
    n = 1000
    props = tuple(packed(random_properties(rnd)) if every and i % every == every // 2 else b""
                  for i in range(n))
    columns = properties_to_arrow(props)
    assert [c.type for c in columns] == [ARROW_SCHEMA.field(name).type for name in PROPERTY_COLUMNS]
    assert all(len(c) == n for c in columns)
    assert arrow_rows(columns) == [expected(p) for p in props]
    assert columns[1].null_count == 0  # no user property: an empty map, never null


def test_a_repeated_user_property_key_keeps_its_last_value():
    raw = packed({Prop.USER_PROPERTY: [("trace", "1"), ("unit", "C"), ("trace", "2"), ("trace", "3")]})
    (_, user, *_), = arrow_rows(properties_to_arrow((raw,)))
    assert user == {"trace": "3", "unit": "C"}
    assert properties_to_arrow((raw,))[1].to_pylist() == [[("trace", "3"), ("unit", "C")]]


def test_only_records_with_properties_are_unpacked(monkeypatch):
    calls = []
    real = msgpack.unpackb

    def counting(raw, **kw):
        calls.append(raw)
        return real(raw, **kw)

    monkeypatch.setattr(source.msgpack, "unpackb", counting)
    raw = packed({Prop.CONTENT_TYPE: "text/plain"})
    properties_to_arrow((b"",) * 5000)
    assert calls == []
    columns = properties_to_arrow(tuple(raw if i % 1000 == 0 else b"" for i in range(5000)))
    assert len(calls) == 5
    assert columns[0].to_pylist() == ["text/plain" if i % 1000 == 0 else None for i in range(5000)]


def test_properties_of_an_unknown_form_read_as_absent_with_a_warning(caplog):
    good = packed({Prop.CONTENT_TYPE: "a/b", Prop.USER_PROPERTY: [("k", "v")]})
    odd = [
        b"\xc1",                                                      # not msgpack
        msgpack.packb([1, 2]),                                        # not a map
        msgpack.packb({3: 5, 8: b"bytes", 9: "str", 2: -1, 1: 300}),  # every value of the wrong type
        msgpack.packb({0x26: "not pairs"}),
        msgpack.packb({0x26: [["k"], ["k2", "v2"], [1, "v"]]}),       # one good pair among bad ones
    ]
    with caplog.at_level(logging.WARNING, logger=source.__name__):
        rows = arrow_rows(properties_to_arrow((good, *odd, b"")))
    assert rows == [("a/b", {"k": "v"}, None, None, None, None), ABSENT, ABSENT, ABSENT, ABSENT,
                    (None, {"k2": "v2"}, None, None, None, None), ABSENT]
    assert any("unexpected form" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------------------------------------- Spark

def test_spark_reads_properties_from_many_partitions(spark, tmp_path):
    """Properties on about one record in eight, over many small segments and partitions: the Spark
    read gives every record its own properties, the others nulls and an empty map."""
    sim = LogSim(tmp_path / "data", routers=("w0", "w1"), segment_bytes=8192, index_interval_bytes=512)
    rnd = random.Random(16)
    for i in range(2000):
        props = packed(random_properties(rnd)) if rnd.random() < 0.125 else b""
        sim.publish(f"w{i % 2}", f"p/{i % 7}", b"%d" % i, properties=props,
                    forward_to=("w1",) if i % 2 == 0 and i % 5 == 0 else ())
    sim.close()
    df = spark.read.format("brokerlog").option("splitBytes", "4096").load(sim.data_dir)
    assert df.rdd.getNumPartitions() > 4
    got = sorted((r.router, r.offset, spark_props(r)) for r in df.collect())
    want = sorted((rid.split("/")[1], off, expected(s.properties)) for rid, off, s in sim.logged)
    assert got == want
    absent = sum(1 for _, _, s in sim.logged if expected(s.properties) == ABSENT)
    assert 0 < len(sim.logged) - absent < absent
    nothing = F.size("user_properties") == 0
    for name in ("content_type", "response_topic", "correlation_data", "message_expiry", "payload_format"):
        nothing = nothing & F.col(name).isNull()
    assert df.where(nothing).count() == absent


def _publish5(client: Client, topic: str, payload: bytes, props: Properties | None) -> None:
    """An MQTT 5 PUBLISH at QoS 1 with properties, awaited (bounded) until the broker acknowledged it."""
    info = client.c.publish(topic, payload, qos=1, properties=props)
    info.wait_for_publish(WAIT)
    assert info.is_published(), f"publish to {topic} not acknowledged"


def test_properties_published_through_the_broker_are_columns_batch_and_streaming(spark, start_broker, tmp_path):
    data = str(tmp_path / "data")
    broker = start_broker("--sys-interval", "0", workers=2, data_dir=data)
    sub = Client(broker.port, "props-watch", protocol=mqtt.MQTTv5).connect()
    sub.subscribe("props/#", qos=1)
    pub5 = Client(broker.port, "props-v5", protocol=mqtt.MQTTv5).connect()
    pub3 = Client(broker.port, "props-v311").connect()

    full = Properties(PacketTypes.PUBLISH)
    full.ContentType = "application/json"
    full.UserProperty = [("trace", "t-1"), ("unit", "°C"), ("trace", "t-2")]
    full.ResponseTopic = "props/reply/1"
    full.CorrelationData = b"\x00\xffcorr"
    full.MessageExpiryInterval = 3600
    full.PayloadFormatIndicator = 1
    users = Properties(PacketTypes.PUBLISH)
    users.UserProperty = [("site", "north")]
    users.MessageExpiryInterval = 0xFFFFFFFF  # beyond a 32-bit signed int
    text = Properties(PacketTypes.PUBLISH)
    text.ContentType = "text/plain"
    text.PayloadFormatIndicator = 0
    want = {
        "props/full": ("application/json", {"trace": "t-2", "unit": "°C"}, "props/reply/1", b"\x00\xffcorr",
                       3600, 1),
        "props/users": (None, {"site": "north"}, None, None, 0xFFFFFFFF, None),
        "props/text": ("text/plain", {}, None, None, None, 0),
        "props/v5-none": ABSENT,
        "props/v311": ABSENT,
    }
    _publish5(pub5, "props/full", b'{"t": 21.5}', full)
    _publish5(pub5, "props/users", b"u", users)
    _publish5(pub5, "props/text", b"hello", text)
    _publish5(pub5, "props/v5-none", b"plain", None)
    pub3.publish("props/v311", b"old", qos=1)
    received = {m.topic: m for m in sub.wait_messages(len(want))}
    # The broker forwarded them with their properties: the log is read against what it carried.
    assert received["props/full"].properties.ContentType == "application/json"
    for c in (sub, pub5, pub3):
        c.disconnect()
    assert broker.stop() == 0

    batch = spark.read.format("brokerlog").option("topic", "props/#").load(data)
    assert batch.columns == ORIGINAL_COLUMNS + PROPERTY_COLUMNS
    rows = batch.collect()
    # Every record (the origin, and a forwarded copy where the subscriber is on another router).
    assert {r.topic for r in rows} == set(want)
    assert {r.topic: spark_props(r) for r in rows} == want
    assert all(spark_props(r) == want[r.topic] for r in rows)
    once = batch.where(F.col("origin_router") == F.concat_ws("/", "node", "router"))
    assert once.count() == len(want)
    assert once.where(F.col("user_properties")["trace"] == "t-2").select("topic").collect()[0].topic == "props/full"

    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    query = (spark.readStream.format("brokerlog").option("topic", "props/#").load(data)
             .writeStream.format("parquet").option("path", out).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    assert query.awaitTermination(120), "an AvailableNow query must stop by itself"
    streamed = spark.read.parquet(out).collect()
    assert len(streamed) == len(rows) and os.listdir(out)
    assert sorted((r.router, r.offset, spark_props(r)) for r in streamed) == sorted(
        (r.router, r.offset, spark_props(r)) for r in rows)
