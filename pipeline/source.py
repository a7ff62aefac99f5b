"""``brokerlog``: a Spark Python data source over the broker's commit log, batch and streaming.

    pipeline.register(spark)
    df = spark.read.format("brokerlog").option("topic", "sensors/#").load("./data")

Why it is built this way:

* **One copy of the format.** Records are decoded by ``router.log`` (``LogReader`` to list segments
  and find positions, ``iter_record_batches`` to decode); this module never parses log bytes.
* **Arrow, not tuples.** ``read`` yields ``pyarrow.RecordBatch`` objects — one per decoded chunk of
  a segment — which Spark hands to the JVM as they are; yielding tuples would cost a Python-side
  conversion per row. Filters given as options (``topic``, ``startTime``/``endTime``, ``originOnly``)
  are evaluated on those batches with Arrow compute kernels, not per record in Python.
* **Parallel and prunable.** Planning lists each router's segments and produces one input partition
  per segment, a large segment split at index positions into ranges, small ones packed together
  (``splitBytes``). Segments outside the wanted offset or time range are never opened: the segment
  summaries (last offset, newest timestamp) and the sparse index say where to start.
* **Picklable, file-free objects.** Readers and partitions hold only paths and numbers; files are
  opened inside ``read`` (on the executor) and during planning (on the driver), never kept open in
  an object Spark serializes. The data directory must therefore be reachable at the same path from
  the driver and from every executor.
* **Streaming offsets are per router.** A streaming offset is ``{"<node>/<router>": next offset}``;
  Spark keeps it in the query checkpoint, so a restarted query resumes exactly where the last
  committed micro-batch ended. A micro-batch ``[start, end)`` always reads the same records because
  the log is append-only.

* **MQTT 5 properties as columns, decoded only where there are any.** The log keeps a record's
  PUBLISH properties as one opaque msgpack map (``router.message``); the source turns the ones a
  query is likely to want into typed columns (``content_type``, ``user_properties`` ...). Most
  traffic carries no properties, so a batch in which no record has any gets constant null/empty
  columns without a per-record step, and in a mixed batch only the records that have properties
  are unpacked. The raw msgpack is not a column: it is the broker's internal encoding, not a
  format to promise readers.

Layout read: ``<path>/<node>/<router>/`` (router names ``w0``, ``w1``, ...), each a commit log
directory. Columns ``node`` and ``router`` come from that path; ``origin_router`` from the record.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import json
import logging
import math
import os
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import compress
from typing import Any

import msgpack
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from brokerd.connection.packets import Prop
from brokerd.pipeline.topics import filter_regex
from brokerd.router.log import LogReader, Record, iter_record_batches

log = logging.getLogger(__name__)

NAME = "brokerlog"

SCHEMA = StructType([
    StructField("node", StringType()),
    StructField("router", StringType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("origin_router", StringType()),
    StructField("origin_offset", LongType()),
    StructField("client_id", StringType()),
    StructField("topic", StringType()),
    StructField("qos", IntegerType()),
    StructField("retain", BooleanType()),
    StructField("payload", BinaryType()),
    # MQTT 5 PUBLISH properties (appended after the original columns so positions stay stable).
    StructField("content_type", StringType()),
    StructField("user_properties", MapType(StringType(), StringType())),
    StructField("response_topic", StringType()),
    StructField("correlation_data", BinaryType()),
    StructField("message_expiry", LongType()),    # seconds, a u32 on the wire: int would overflow
    StructField("payload_format", IntegerType()),
])

# What Spark expects a batch to be for SCHEMA (pyspark's to_arrow_schema(SCHEMA, timezone="UTC");
# a unit test keeps the two equal). Spark checks it on the first batch of every partition.
_TS = pa.timestamp("us", tz="UTC")
ARROW_SCHEMA = pa.schema([
    ("node", pa.string()),
    ("router", pa.string()),
    ("offset", pa.int64()),
    ("timestamp", _TS),
    ("origin_router", pa.string()),
    ("origin_offset", pa.int64()),
    ("client_id", pa.string()),
    ("topic", pa.string()),
    ("qos", pa.int32()),
    ("retain", pa.bool_()),
    ("payload", pa.binary()),
    ("content_type", pa.string()),
    ("user_properties", pa.map_(pa.string(), pa.string())),
    ("response_topic", pa.string()),
    ("correlation_data", pa.binary()),
    ("message_expiry", pa.int64()),
    ("payload_format", pa.int32()),
])
_PROPERTY_SCHEMA = pa.schema(list(ARROW_SCHEMA)[-6:])  # the property columns, decoded together
_USER_PROPERTIES = ARROW_SCHEMA.field("user_properties").type

# Property identifiers as the log's msgpack map keys them (plain ints once unpacked).
_PAYLOAD_FORMAT = int(Prop.PAYLOAD_FORMAT_INDICATOR)
_MESSAGE_EXPIRY = int(Prop.MESSAGE_EXPIRY_INTERVAL)
_CONTENT_TYPE = int(Prop.CONTENT_TYPE)
_RESPONSE_TOPIC = int(Prop.RESPONSE_TOPIC)
_CORRELATION_DATA = int(Prop.CORRELATION_DATA)
_USER_PROPERTY = int(Prop.USER_PROPERTY)

DEFAULT_SPLIT_BYTES = 32 << 20
DEFAULT_CLOCK_SKEW_MS = 60_000


class OptionError(ValueError):
    """A ``brokerlog`` option with a value that cannot be used; the message names the option."""


# ------------------------------------------------------------------------------------------- options

def parse_time_ms(value: str, option: str = "time") -> int:
    """ISO 8601 (UTC unless it carries an offset) or epoch seconds (as ``brokerd log tail`` takes)
    → epoch milliseconds."""
    text = str(value).strip()
    try:
        return int(round(float(text) * 1000))
    except ValueError:
        pass
    try:
        t = dt.datetime.fromisoformat(text)
    except ValueError:
        raise OptionError(f"{option}: {value!r} is neither ISO 8601 nor epoch seconds") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return int(round(t.timestamp() * 1000))


def _bool(value: str | None, option: str, default: bool) -> bool:
    if value is None or value == "":
        return default
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise OptionError(f"{option}: expected true or false, not {value!r}")


def _int(value: str | None, option: str, default: int | None, minimum: int | None = None) -> int | None:
    if value is None or value == "":
        return default
    try:
        n = int(str(value).strip())
    except ValueError:
        raise OptionError(f"{option}: expected an integer, not {value!r}") from None
    if minimum is not None and n < minimum:
        raise OptionError(f"{option}: must be at least {minimum}, not {n}")
    return n


def _offsets_option(value: Any, option: str, words: tuple[str, ...]) -> tuple[str, dict[str, int] | None]:
    """``earliest`` / ``latest`` or a JSON object of router id → offset, as Kafka's source takes."""
    text = str(value or words[0]).strip()
    if text.lower() in words:
        return text.lower(), None
    try:
        loaded = json.loads(text)
    except ValueError:
        loaded = None
    if (not isinstance(loaded, dict)
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in loaded.values())):
        raise OptionError(f"{option}: {' or '.join(words)}, or a JSON object of router id to offset "
                          f"like {{\"t/w0\": 100}}; not {text!r}")
    return "offsets", {str(k): int(v) for k, v in loaded.items()}


@dataclass(frozen=True)
class ReadOptions:
    """The options of one ``brokerlog`` read, validated once on the driver (a bad option fails the
    query at planning with a message naming it, not inside a task)."""

    path: str
    topic: str | None = None
    topic_regex: str | None = None
    start_ms: int | None = None
    end_ms: int | None = None
    routers: tuple[str, ...] = ()
    origin_only: bool = False
    split_bytes: int = DEFAULT_SPLIT_BYTES
    clock_skew_ms: int = DEFAULT_CLOCK_SKEW_MS
    fail_on_data_loss: bool = True
    max_records_per_trigger: int | None = None
    starting: str = "earliest"                      # earliest | latest | offsets
    start_offsets: dict[str, int] | None = None     # router id → first offset (inclusive)
    end_offsets: dict[str, int] | None = None       # router id → end offset (exclusive), batch only

    @classmethod
    def parse(cls, options: Any) -> ReadOptions:
        """From the reader's options (a case-insensitive mapping of strings)."""
        opts = {str(k).lower(): v for k, v in dict(options).items()}
        path = opts.get("path")
        if not path:
            paths = opts.get("paths")
            if paths:
                loaded = json.loads(paths) if isinstance(paths, str) else list(paths)
                if len(loaded) != 1:
                    raise OptionError("path: brokerlog reads one data directory; give one path")
                path = loaded[0]
        if not path:
            raise OptionError('path: give the broker\'s data directory: .load("./data")')
        topic = opts.get("topic") or None
        regex = filter_regex(topic) if topic else None
        start = parse_time_ms(opts["starttime"], "startTime") if opts.get("starttime") else None
        end = parse_time_ms(opts["endtime"], "endTime") if opts.get("endtime") else None
        if start is not None and end is not None and end < start:
            raise OptionError(f"endTime ({opts['endtime']}) is before startTime ({opts['starttime']})")
        routers = tuple(r.strip() for r in str(opts.get("routers") or "").split(",") if r.strip())
        starting, start_offsets = _offsets_option(opts.get("startingoffsets"), "startingOffsets",
                                                  ("earliest", "latest"))
        _, end_offsets = _offsets_option(opts.get("endingoffsets"), "endingOffsets", ("latest",))
        return cls(
            path=os.path.abspath(os.path.expanduser(str(path))),
            topic=topic,
            topic_regex=regex,
            start_ms=start,
            end_ms=end,
            routers=routers,
            origin_only=_bool(opts.get("originonly"), "originOnly", False),
            split_bytes=_int(opts.get("splitbytes"), "splitBytes", DEFAULT_SPLIT_BYTES, 4096) or 0,
            clock_skew_ms=_int(opts.get("clockskewms"), "clockSkewMs", DEFAULT_CLOCK_SKEW_MS) or 0,
            fail_on_data_loss=_bool(opts.get("failondataloss"), "failOnDataLoss", True),
            max_records_per_trigger=_int(opts.get("maxrecordspertrigger"), "maxRecordsPerTrigger", None, 1),
            starting=starting,
            start_offsets=start_offsets,
            end_offsets=end_offsets,
        )


# ------------------------------------------------------------------------------------------ discovery

@dataclass(frozen=True)
class RouterLog:
    """One router's log directory, named by the path it was found at."""

    node: str
    router: str
    directory: str

    @property
    def router_id(self) -> str:
        return f"{self.node}/{self.router}"


def _selected(node: str, router: str, patterns: Sequence[str]) -> bool:
    """``routers`` entries are shell patterns over ``node/router`` (``t/w0``, ``t/*``) or, without a
    slash, over the router name alone (``w0`` on every node)."""
    if not patterns:
        return True
    rid = f"{node}/{router}"
    for p in patterns:
        if fnmatch.fnmatchcase(rid, p) or ("/" not in p and fnmatch.fnmatchcase(router, p)):
            return True
    return False


def discover(path: str, patterns: Sequence[str] = ()) -> list[RouterLog]:
    """Every router log directory ``<path>/<node>/<router>/`` selected by ``patterns``, sorted."""
    if not os.path.isdir(path):
        raise OptionError(f"path: {path} is not a directory (the broker's --data-dir)")
    out = []
    for node in sorted(os.listdir(path)):
        node_dir = os.path.join(path, node)
        if node.startswith((".", "_")) or not os.path.isdir(node_dir):
            continue
        for router in sorted(os.listdir(node_dir)):
            directory = os.path.join(node_dir, router)
            if router.startswith((".", "_")) or not os.path.isdir(directory):
                continue
            if _selected(node, router, patterns):
                out.append(RouterLog(node, router, directory))
    return out


# ------------------------------------------------------------------------------------------ partitions

@dataclass(frozen=True)
class Slice:
    """Bytes ``[start_pos, end_pos)`` of one segment file; both ends are record boundaries, except
    that ``end_pos`` may cut a record still being written (the decoder stops before it)."""

    path: str
    start_pos: int
    end_pos: int

    @property
    def nbytes(self) -> int:
        return self.end_pos - self.start_pos


class LogPartition(InputPartition):
    """The unit of one Spark task: consecutive slices of one router's log and the offsets wanted
    (``lo`` inclusive, ``hi`` exclusive, None: unbounded). ``contiguous``: every offset from ``lo``
    must be there (a streaming micro-batch); a missing one is data loss."""

    def __init__(self, node: str, router: str, slices: Sequence[Slice], lo: int = 0,
                 hi: int | None = None, contiguous: bool = False) -> None:
        super().__init__((node, router, lo, hi))
        self.node = node
        self.router = router
        self.slices = tuple(slices)
        self.lo = lo
        self.hi = hi
        self.contiguous = contiguous

    def __repr__(self) -> str:
        return (f"LogPartition({self.node}/{self.router}, offsets [{self.lo}, {self.hi}), "
                f"{len(self.slices)} slice(s))")


def _split_segment(reader: LogReader, path: str, last: int, size: int, start_pos: int, first: int,
                   split_bytes: int) -> list[Slice]:
    """Cut ``[start_pos, size)`` of one segment into slices of about ``split_bytes`` at positions the
    index gives (``LogReader.locate``: an indexed record at or before an offset), so each slice
    starts on a record boundary without scanning the segment."""
    if size - start_pos <= split_bytes or last <= first:
        return [Slice(path, start_pos, size)]
    parts = math.ceil((size - start_pos) / split_bytes)
    cuts = set()
    for k in range(1, parts):
        found = reader.locate(first + (last - first + 1) * k // parts)
        if found is not None and found[0] == path and found[1] > start_pos:
            cuts.add(found[1])
    edges = [start_pos, *sorted(cuts), size]
    return [Slice(path, a, b) for a, b in zip(edges, edges[1:], strict=False) if b > a]


def _pack(rl: RouterLog, slices: list[Slice], lo: int, hi: int | None, split_bytes: int,
          contiguous: bool) -> list[LogPartition]:
    """Group consecutive small slices so that a log of many small segments is not one task each."""
    groups: list[list[Slice]] = []
    size = 0
    for s in slices:
        if not groups or size + s.nbytes > split_bytes:
            groups.append([])
            size = 0
        groups[-1].append(s)
        size += s.nbytes
    # Only the first partition starts at ``lo``; the others start where their slices start.
    return [LogPartition(rl.node, rl.router, g, lo, hi, contiguous and i == 0) for i, g in enumerate(groups)]


def read_planned(opts: ReadOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """Read one partition of a plan. A plan with no partition at all (nothing in the window, no
    log yet) still gets one read: Spark substitutes a placeholder ``InputPartition(None)`` of its
    own, which reads as nothing."""
    if isinstance(partition, LogPartition):
        return read_partition(opts, partition)
    assert type(partition) is InputPartition and partition.value is None, partition
    return iter(())


def plan_router(reader: LogReader, rl: RouterLog, opts: ReadOptions, lo: int, hi: int | None,
                start_ms: int | None, end_ms: int | None, contiguous: bool = False) -> list[LogPartition]:
    """Partitions for offsets ``[lo, hi)`` of one router's log, skipping segments that cannot hold
    a record in ``[start_ms, end_ms)``. Segment ends are fixed here (their size now), so a batch read
    of a live log is a consistent snapshot and a micro-batch never reads past what it planned."""
    if start_ms is not None:
        # The first record at or after start_ms by the index's running-max timestamps: every record
        # before it is older, so everything before it is skipped exactly.
        t = reader.offset_for_time(start_ms)
        if t is None:
            return []
        if t > lo:
            lo, contiguous = t, False
    slices: list[Slice] = []
    for seg in reader.segments():
        if seg.last_offset is None or seg.last_offset < lo or (hi is not None and seg.base_offset >= hi):
            continue
        if (end_ms is not None and opts.clock_skew_ms >= 0 and seg.first_timestamp is not None
                and seg.first_timestamp >= end_ms + opts.clock_skew_ms):
            continue
        start_pos, first = 0, seg.base_offset
        if lo > seg.base_offset:
            found = reader.locate(lo)
            if found is not None and found[0] == seg.path:
                start_pos, first = found[1], lo
        slices += _split_segment(reader, seg.path, seg.last_offset, seg.size, start_pos, first,
                                 opts.split_bytes)
    return _pack(rl, slices, lo, hi, opts.split_bytes, contiguous)


def plan_batch(opts: ReadOptions) -> list[LogPartition]:
    """The input partitions of a batch read: what every router's log holds now, minus the segments
    that cannot contain a wanted record."""
    if opts.starting == "latest":
        raise OptionError("startingOffsets: latest only makes sense for a streaming read")
    out: list[LogPartition] = []
    for rl in discover(opts.path, opts.routers):
        rid = rl.router_id
        lo = opts.start_offsets.get(rid, 0) if opts.start_offsets else 0
        hi = opts.end_offsets.get(rid) if opts.end_offsets else None
        with LogReader(rl.directory) as reader:
            out += plan_router(reader, rl, opts, lo, hi, opts.start_ms, opts.end_ms)
    return out


# --------------------------------------------------------------------------------------------- reading

def records_to_arrow(records: Sequence[Record], node: str, router: str) -> pa.RecordBatch:
    """One Arrow batch (ARROW_SCHEMA) from decoded records: one transpose, then one C-level
    conversion per column (the property columns: see ``properties_to_arrow``)."""
    n = len(records)
    offset, ts, origin, origin_offset, client, topic, qos, retain, props, payload = zip(*records, strict=True)
    return pa.RecordBatch.from_arrays([
        pa.repeat(pa.scalar(node, pa.string()), n),
        pa.repeat(pa.scalar(router, pa.string()), n),
        pa.array(offset, pa.int64()),
        pa.array(ts, pa.timestamp("ms", tz="UTC")).cast(_TS),
        pa.array(origin, pa.string()),
        pa.array(origin_offset, pa.int64()),
        pa.array(client, pa.string()),
        pa.array(topic, pa.string()),
        pa.array(qos, pa.int32()),
        pa.array(retain, pa.bool_()),
        pa.array(payload, pa.binary()),
        *properties_to_arrow(props),
    ], schema=ARROW_SCHEMA)


_NO_STRINGS = pa.array([], pa.string())


def _empty_maps(n: int) -> pa.MapArray:
    """``n`` empty (not null) ``user_properties`` maps: offsets all 0 (a zeroed buffer, no Python
    list of n zeros), no entries."""
    offsets = pa.Array.from_buffers(pa.int32(), n + 1, [None, pa.py_buffer(bytes(4 * (n + 1)))])
    return pa.MapArray.from_arrays(offsets, _NO_STRINGS, _NO_STRINGS, type=_USER_PROPERTIES)


def properties_to_arrow(props: Sequence[bytes]) -> list[pa.Array]:
    """The property columns (``content_type`` .. ``payload_format``, in ARROW_SCHEMA order) from
    the records' ``properties`` fields.

    Empty bytes (no properties: the common case, and every MQTT 3 message) cost no Python work per
    record: a batch without any is answered with constant arrays after one C-level scan; in a mixed
    batch only the records with properties are unpacked, into short arrays that one Arrow ``take``
    spreads over the batch (rows without properties point at one extra absent row).
    """
    n = len(props)
    if props.count(b"") == n:  # the common case stops here (C-level; b"" is one shared object)
        return _absent(n)
    wanted = list(compress(range(n), props))  # C-level: the indices of the non-empty fields
    k = len(wanted)
    if k == n:
        return decode_properties(props)
    decoded = decode_properties([*(props[i] for i in wanted), b""])
    where = array("i", [k]) * n  # row i of the batch is row where[i] of the decoded columns
    for j, i in enumerate(wanted):
        where[i] = j
    indices = pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(where)])
    # A property no record of the batch has stays a constant column: no take for it.
    return [absent if _all_absent(column) else column.take(indices)
            for column, absent in zip(decoded, _absent(n), strict=True)]


def _absent(n: int) -> list[pa.Array]:
    """The property columns of ``n`` records without properties."""
    return [pa.nulls(n, pa.string()), _empty_maps(n), pa.nulls(n, pa.string()), pa.nulls(n, pa.binary()),
            pa.nulls(n, pa.int64()), pa.nulls(n, pa.int32())]


def _all_absent(column: pa.Array) -> bool:
    """Whether a decoded column holds nothing: all null, or (``user_properties``) all empty."""
    if isinstance(column, pa.MapArray):
        return len(column.keys) == 0
    return column.null_count == len(column)


def decode_properties(props: Sequence[bytes]) -> list[pa.Array]:
    """The property columns for every record of ``props``, each unpacked in Python (empty bytes:
    all absent).

    A property of an unexpected type, or a properties field that is not a msgpack map (a format
    this reader does not know), reads as absent, with one warning per batch, rather than failing
    the query over metadata. ``user_properties`` is never null: no user property is an empty map.
    MQTT 5 lets a key repeat; a map holds one value per key, so the last value given wins (as
    ``dict(pairs)`` and Spark's ``LAST_WIN`` map-key policy decide), keeping the key's first place.
    """
    n = len(props)
    content_type: list[str | None] = [None] * n
    response_topic: list[str | None] = [None] * n
    correlation: list[bytes | None] = [None] * n
    expiry: list[int | None] = [None] * n
    payload_format: list[int | None] = [None] * n
    offsets = array("i", bytes(4 * (n + 1)))
    keys: list[str] = []
    values: list[str] = []
    bad = 0
    unpackb = msgpack.unpackb
    for i, raw in enumerate(props):
        offsets[i + 1] = len(keys)
        if not raw:
            continue
        try:
            p = unpackb(raw, strict_map_key=False)
        except (ValueError, TypeError, msgpack.UnpackException):
            bad += 1
            continue
        if p.__class__ is not dict:
            bad += 1
            continue
        v = p.get(_CONTENT_TYPE)
        if v is not None:
            if v.__class__ is str:
                content_type[i] = v
            else:
                bad += 1
        v = p.get(_RESPONSE_TOPIC)
        if v is not None:
            if v.__class__ is str:
                response_topic[i] = v
            else:
                bad += 1
        v = p.get(_CORRELATION_DATA)
        if v is not None:
            if v.__class__ is bytes:
                correlation[i] = v
            else:
                bad += 1
        v = p.get(_MESSAGE_EXPIRY)
        if v is not None:
            if v.__class__ is int and 0 <= v <= 0xFFFFFFFF:
                expiry[i] = v
            else:
                bad += 1
        v = p.get(_PAYLOAD_FORMAT)
        if v is not None:
            if v.__class__ is int and 0 <= v <= 0xFF:
                payload_format[i] = v
            else:
                bad += 1
        pairs = p.get(_USER_PROPERTY)
        if pairs is not None:
            kept: dict[str, str] = {}
            for pair in pairs if pairs.__class__ is list else (None,):
                if (pair.__class__ is list and len(pair) == 2 and pair[0].__class__ is str
                        and pair[1].__class__ is str):
                    kept[pair[0]] = pair[1]  # a repeated key: the later value replaces the earlier
                else:
                    bad += 1
            keys += kept
            values += kept.values()
            offsets[i + 1] = len(keys)
    if bad:
        log.warning("brokerlog: %d MQTT 5 propert(ies) of an unexpected form read as absent", bad)
    return [
        pa.array(content_type, pa.string()),
        pa.MapArray.from_arrays(pa.Array.from_buffers(pa.int32(), n + 1, [None, pa.py_buffer(offsets)]),
                                pa.array(keys, pa.string()), pa.array(values, pa.string()),
                                type=_USER_PROPERTIES),
        pa.array(response_topic, pa.string()),
        pa.array(correlation, pa.binary()),
        pa.array(expiry, pa.int64()),
        pa.array(payload_format, pa.int32()),
    ]


def _row_mask(batch: pa.RecordBatch, opts: ReadOptions, lo: int, hi: int | None,
              first: int, last: int, router_id: str) -> pa.Array | None:
    """The rows of a batch the options keep (None: all), computed by Arrow kernels."""
    masks = []
    if first < lo:
        masks.append(pc.greater_equal(batch.column("offset"), lo))
    if hi is not None and last >= hi:
        masks.append(pc.less(batch.column("offset"), hi))
    if opts.topic_regex is not None:
        masks.append(pc.match_substring_regex(batch.column("topic"), opts.topic_regex))
    if opts.start_ms is not None or opts.end_ms is not None:
        ms = batch.column("timestamp").cast(pa.int64())
        if opts.start_ms is not None:
            masks.append(pc.greater_equal(ms, opts.start_ms * 1000))
        if opts.end_ms is not None:
            masks.append(pc.less(ms, opts.end_ms * 1000))
    if opts.origin_only:
        masks.append(pc.equal(batch.column("origin_router"), router_id))
    if not masks:
        return None
    mask = masks[0]
    for m in masks[1:]:
        mask = pc.and_(mask, m)
    return mask


def read_partition(opts: ReadOptions, part: LogPartition) -> Iterator[pa.RecordBatch]:
    """Decode a partition's slices with ``router.log.iter_record_batches`` and yield Arrow batches.

    A record cut off at the end of the last segment (a live writer, or a crash before recovery ran)
    ends the read there; a corrupt record ends its segment (the library logs it). A segment deleted
    by retention after planning is data loss: an error with ``failOnDataLoss`` (the default), else a
    warning.
    """
    router_id = f"{part.node}/{part.router}"
    check_start = part.contiguous
    for sl in part.slices:
        try:
            for records in iter_record_batches(sl.path, sl.start_pos, sl.end_pos):
                first, last = records[0].offset, records[-1].offset
                if check_start:
                    check_start = False
                    if first > part.lo:
                        _data_loss(opts, f"{router_id}: offsets {part.lo}..{first - 1} are no longer in "
                                         f"the log (deleted by retention?)")
                if part.hi is not None and first >= part.hi:
                    return
                if last < part.lo:
                    continue
                batch = records_to_arrow(records, part.node, part.router)
                mask = _row_mask(batch, opts, part.lo, part.hi, first, last, router_id)
                if mask is not None:
                    batch = batch.filter(mask)
                if batch.num_rows:
                    yield batch
        except FileNotFoundError:
            _data_loss(opts, f"{router_id}: segment {sl.path} was deleted (by retention?) before it was read")


def _data_loss(opts: ReadOptions, message: str) -> None:
    if opts.fail_on_data_loss:
        raise RuntimeError(f"brokerlog: {message}; set the option failOnDataLoss=false to read on")
    log.warning("brokerlog: %s; records skipped", message)


class BrokerLogReader(DataSourceReader):
    """Batch reader: plans partitions from the segments on disk.

    It deliberately does not implement ``pushFilters``: Spark 4.3 keeps the partitions planned with
    pushed-down filters on the loaded DataFrame and reuses them for a later query on the same
    DataFrame that has no pushable filter, which would silently drop rows. Pruning comes from the
    options instead (``startTime``/``endTime``, ``startingOffsets``/``endingOffsets``, ``routers``).
    """

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        return plan_batch(self.opts)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_planned(self.opts, partition)


# ------------------------------------------------------------------------------------------- streaming

Offsets = dict[str, int]


def log_extents(opts: ReadOptions) -> dict[str, tuple[RouterLog, int, int]]:
    """router id → (log, first offset on disk, one past the last whole record on disk)."""
    out = {}
    for rl in discover(opts.path, opts.routers):
        with LogReader(rl.directory) as reader:
            end = reader.end_offset
            start = reader.start_offset
        out[rl.router_id] = (rl, end if start is None else start, end)
    return out


def water_fill(start: Offsets, latest: Offsets, limit: int) -> Offsets:
    """Advance each router from ``start`` towards ``latest`` so that at most ``limit`` records are
    read in all, shared fairly: a router with little new data leaves its share to the others."""
    want = {k: max(0, latest[k] - start[k]) for k in latest}
    grant = dict.fromkeys(want, 0)
    left = limit
    pending = sorted((k for k in want if want[k] > 0), key=lambda k: (want[k], k))
    while pending and left > 0:
        share = max(1, left // len(pending))
        nxt = []
        for k in pending:
            take = min(share, want[k] - grant[k], left)
            grant[k] += take
            left -= take
            if grant[k] < want[k]:
                nxt.append(k)
        pending = nxt
    return {k: start[k] + grant[k] for k in latest}


class BrokerLogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader. Offsets are ``{"node/router": next offset}``; a router that appears later
    starts from its first record. ``maxRecordsPerTrigger`` bounds a micro-batch (shared fairly
    between routers); ``Trigger.AvailableNow`` reads up to what was on disk when the query started."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self._target: Offsets | None = None

    def initialOffset(self) -> dict:
        ends = log_extents(self.opts)
        if self.opts.starting == "latest":
            return {rid: info[2] for rid, info in ends.items()}
        given = self.opts.start_offsets or {}
        # A listed offset below the first one on disk starts at the first one (nothing to lose yet).
        return {rid: max(info[1], min(given.get(rid, info[1]), info[2])) for rid, info in ends.items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_records_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the target: the end of every log now. Routers appearing later are not read."""
        self._target = {rid: info[2] for rid, info in log_extents(self.opts).items()}

    def latestOffset(self, start: dict | None = None, limit: ReadLimit | None = None) -> dict:
        begin: Offsets = {k: int(v) for k, v in (start or {}).items()}
        latest = dict(begin)
        for rid, (_rl, first, end) in log_extents(self.opts).items():
            if rid not in begin:
                begin[rid] = first  # a new router: read it from its first record
            if self._target is not None:
                end = min(end, self._target.get(rid, begin[rid]))
            if end < begin[rid]:
                log.warning("brokerlog: log %s ends at %d, before the checkpointed offset %d (was it "
                            "recreated?); waiting for it to pass that offset", rid, end, begin[rid])
                end = begin[rid]
            latest[rid] = end
        if isinstance(limit, ReadMaxRows):
            return water_fill({k: begin.get(k, v) for k, v in latest.items()}, latest, limit.max_rows)
        return latest

    def reportLatestOffset(self) -> dict | None:
        return {rid: info[2] for rid, info in log_extents(self.opts).items()}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        out: list[LogPartition] = []
        logs = {rl.router_id: rl for rl in discover(self.opts.path, self.opts.routers)}
        for rid, hi in sorted(end.items()):
            hi = int(hi)
            rl = logs.get(rid)
            if rl is None:
                if hi > int(start.get(rid, hi)):
                    _data_loss(self.opts, f"log {rid} disappeared before offsets {start[rid]}..{hi - 1} "
                                          f"were read")
                continue
            with LogReader(rl.directory) as reader:
                new = rid not in start
                lo = (reader.start_offset or 0) if new else int(start[rid])
                if hi <= lo:
                    continue
                out += plan_router(reader, rl, self.opts, lo, hi, self.opts.start_ms, self.opts.end_ms,
                                   contiguous=not new)
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_planned(self.opts, partition)

    def commit(self, end: dict) -> None:
        """Nothing to release: the broker's retention, not the reader, decides what the log keeps."""


# ------------------------------------------------------------------------------------------ the source

class BrokerLogDataSource(DataSource):
    """``spark.read.format("brokerlog")`` / ``spark.readStream.format("brokerlog")``.

    Options: ``topic`` (MQTT filter, ``+``/``#``), ``startTime`` / ``endTime`` (ISO 8601 or epoch
    seconds; endTime exclusive), ``routers`` (comma-separated ``node/router`` or router-name patterns),
    ``originOnly`` (keep each message once: the copy on the router it was published to),
    ``splitBytes`` (target bytes per input partition), ``clockSkewMs`` (how far timestamps may go
    backwards within a log, for endTime pruning; -1 disables it), ``failOnDataLoss``; streaming:
    ``startingOffsets`` (``earliest``, ``latest`` (streaming), or JSON ``{"t/w0": 100}``),
    ``endingOffsets`` (batch: ``latest`` or JSON, exclusive); streaming: ``maxRecordsPerTrigger``.
    """

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return SCHEMA

    def _opts(self) -> ReadOptions:
        return ReadOptions.parse(self.options)

    def reader(self, schema: StructType) -> DataSourceReader:
        return BrokerLogReader(self._opts())

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return BrokerLogStreamReader(self._opts())
