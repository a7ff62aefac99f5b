"""Commit log format version 2 (one CRC and one msgpack body per batch): round trips, reading
inside batches, version 1 segments still read (and a log going from one version to the other),
torn and corrupt batches cut by recovery and reported by ``check`` / ``brokerd log check``, and
nothing acknowledged under ``fsync always`` lost by a crash. Real files in tmp_path."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brokerd.cluster import log_cli
from brokerd.router.log import (
    CommitLog,
    CorruptRecord,
    LogReader,
    Record,
    check,
    decode_records,
    iter_records,
    segment_name,
)
from brokerd.router.log.format import (
    BATCH_HEADER,
    BATCH_HEADER_SIZE,
    FILE_HEADER_SIZE,
    batch_header_at,
    encode_batch_bytes,
    nominal_size,
    record_fields,
)
from tests.log_v1_fixture import V1LogWriter
from tests.unit.test_log_recovery import flip

T0 = 1_700_000_000_000


def fields(i: int) -> tuple:
    """``append_fields`` arguments for offset i: varied sizes, QoS, retain, properties, origins."""
    forwarded = i % 6 == 5
    return (T0 + i * 3 % 17, "r9" if forwarded else None, 1000 + i if forwarded else None,
            f"client-{i % 11}", f"sensors/{i % 7}/é/{i}", i % 3, i % 4 == 0,
            b"" if i % 5 else b"\x01props", bytes([i % 251]) * (i * 37 % 700))


def expected(i: int, router: str = "r1") -> Record:
    ts, origin, oofs, client, topic, qos, retain, props, payload = fields(i)
    return Record(i, ts, router if origin is None else origin, i if oofs is None else oofs, client, topic,
                  qos, retain, props, payload)


def write(log: CommitLog, start: int, stop: int, per_batch: int) -> None:
    for i in range(start, stop):
        assert log.append_fields(*fields(i)) == i
        if (i + 1) % per_batch == 0:
            log.flush()
    log.flush()


def batch_positions(path) -> list[tuple[int, int, int, int]]:
    """(first offset, count, position, size) of each batch of a version 2 segment file."""
    data = open(path, "rb").read()
    assert data[4] == 2
    out = []
    pos = FILE_HEADER_SIZE
    while pos + BATCH_HEADER_SIZE <= len(data):
        length, _crc, base, _f, _m, count, _h = BATCH_HEADER.unpack_from(data, pos)
        out.append((base, count, pos, 8 + length))
        pos += 8 + length
    return out


def open_log(path, **kw) -> CommitLog:
    kw.setdefault("router_id", "r1")
    kw.setdefault("segment_bytes", 8192)
    kw.setdefault("index_interval_bytes", 512)
    return CommitLog(path, **kw)


# ------------------------------------------------------------------------------------ round trips

record_st = st.tuples(
    st.integers(-(1 << 63), (1 << 63) - 1), st.text(max_size=20), st.integers(-1, (1 << 63) - 1),
    st.text(max_size=30), st.text(min_size=1, max_size=60), st.integers(0, 2), st.booleans(),
    st.binary(max_size=40), st.binary(max_size=300))


@settings(max_examples=200, deadline=None)
@given(st.integers(0, (1 << 40)), st.lists(record_st, min_size=1, max_size=30))
def test_batch_round_trip(base, recs):
    data = encode_batch_bytes(base, recs)
    h = batch_header_at(data, 0)
    assert not isinstance(h, str) and h is not None
    assert (h.base, h.count, h.size) == (base, len(recs), len(data))
    assert h.first_ts == recs[0][0] and h.max_ts == max(r[0] for r in recs)
    got, consumed = decode_records(b"xx" + data + data[:-1], 2, version=2)
    assert consumed == len(data)  # the incomplete second copy is left for later, not an error
    assert got == [Record(base + i, *r) for i, r in enumerate(recs)]
    assert [record_fields(r) for r in got] == recs


def test_a_flipped_bit_anywhere_in_a_batch_is_caught():
    data = encode_batch_bytes(7, [fields(i)[:1] + ("r1", i) + fields(i)[3:] for i in range(3)])
    for pos in range(len(data)):
        bad = bytearray(data)
        bad[pos] ^= 0x01
        if pos < 4:  # the length: the header CRC covers it
            with pytest.raises(CorruptRecord, match="header CRC"):
                decode_records(bytes(bad), version=2)
            continue
        with pytest.raises(CorruptRecord):
            decode_records(bytes(bad), version=2)
    assert decode_records(data, version=2)[0][0].offset == 7


def test_round_trip_across_segments_and_readers(tmp_path):
    log = open_log(tmp_path)
    write(log, 0, 300, per_batch=7)
    want = [expected(i) for i in range(300)]
    assert log.read(0, 10_000, 1 << 30) == want
    log.close()
    names = sorted(n for n in os.listdir(tmp_path) if n.endswith(".log"))
    assert len(names) > 5
    for name in names:
        head = open(tmp_path / name, "rb").read(FILE_HEADER_SIZE)
        assert head[:5] == b"BKLG\x02"
        assert open(tmp_path / name.replace(".log", ".index"), "rb").read(5) == b"BKIX\x02"
        assert os.path.getsize(tmp_path / name) <= 8192
    with LogReader(tmp_path) as reader:
        assert reader.read(0, 10_000, 1 << 30) == want
        assert reader.end_offset == 300
        segs = reader.segments()
        assert [s.base_offset for s in segs] == [int(n[:20]) for n in names]
        assert all(s.first_timestamp is not None for s in segs)
        assert reader.offset_for_time(T0 + 16) == next(i for i in range(300) if fields(i)[0] >= T0 + 16)
        assert reader.offset_for_time(T0 + 99) is None
        for start in (0, 1, 5, 6, 7, 100, 183, 299):
            path, pos = reader.locate(start)
            got = [r for r in iter_records(path, pos) if r.offset >= start][:3]
            assert got == want[start:start + 3][:len(got)] and got
    report = check(tmp_path)
    assert report.ok and report.records == 300, report.format_text()
    with CommitLog(tmp_path, router_id="r1", segment_bytes=8192, index_interval_bytes=512) as log:
        assert log.next_offset == 300
        assert log.read(0, 10_000, 1 << 30) == want


def test_reads_stop_and_continue_inside_a_batch(tmp_path):
    """Limits are per record even though a batch is read whole: consecutive reads give every record
    once, whatever the limits, from disk and from batches still in memory."""
    log = open_log(tmp_path, segment_bytes=1 << 20)
    write(log, 0, 60, per_batch=20)
    for i in range(60, 75):
        log.append_fields(*fields(i))  # pending, not flushed
    want = [expected(i) for i in range(75)]
    with LogReader(tmp_path) as reader:
        for max_records, max_bytes in ((1, 1 << 30), (3, 1 << 30), (7, 1 << 30), (1000, 1), (1000, 900),
                                       (1000, 5000)):
            for src, total in ((log, 75), (reader, 60)):
                got: list[Record] = []
                while len(got) < total:
                    recs = src.read(len(got), max_records, max_bytes)
                    assert recs and len(recs) <= max_records
                    assert len(recs) == 1 or sum(map(nominal_size, recs)) <= max_bytes
                    got += recs
                assert got == want[:total]
    log.close()


def test_append_fields_writes_what_append_writes(tmp_path):
    a = open_log(tmp_path / "a")
    b = open_log(tmp_path / "b")
    for i in range(120):
        ts, origin, oofs, client, topic, qos, retain, props, payload = fields(i)
        a.append(topic, payload, qos=qos, retain=retain, client_id=client, properties=props,
                 origin_router=origin, origin_offset=oofs, timestamp_ms=ts)
        b.append_fields(*fields(i))
        if i % 10 == 9:
            a.flush()
            b.flush()
    a.close()
    b.close()
    for name in os.listdir(tmp_path / "a"):
        assert open(tmp_path / "a" / name, "rb").read() == open(tmp_path / "b" / name, "rb").read()


def test_append_checks_fields_without_appending(tmp_path):
    with open_log(tmp_path) as log:
        assert log.append("t", b"ok", timestamp_ms=T0) == 0
        for bad in (dict(qos=3), dict(client_id="c" * 70_000), dict(origin_router=b"r" * 65_536)):
            with pytest.raises(ValueError):
                log.append("t", b"bad", **bad)
        with pytest.raises(ValueError):
            log.append("é" * 40_000, b"bad")  # 80,000 bytes of UTF-8 in 40,000 characters
        assert log.append("é" * 30_000, b"ok", timestamp_ms=T0) == 1  # 60,000 bytes: fine
        assert [r.payload for r in log.read(0)] == [b"ok", b"ok"]


# ------------------------------------------------------------------------ version 1 still readable

def test_version_1_segments_are_read_and_the_log_goes_on_in_version_2(tmp_path):
    with V1LogWriter(tmp_path, router_id="r1", segment_bytes=8192, index_interval_bytes=512) as old:
        for i in range(100):
            old.append_fields(*fields(i))
    v1 = sorted(n for n in os.listdir(tmp_path) if n.endswith(".log"))
    assert all(open(tmp_path / n, "rb").read(5) == b"BKLG\x01" for n in v1)
    with open_log(tmp_path) as log:  # version 2: the version 1 tail is closed, a new segment starts
        assert log.next_offset == 100
        write(log, 100, 200, per_batch=9)
        assert log.read(0, 10_000, 1 << 30) == [expected(i) for i in range(200)]
    names = sorted(n for n in os.listdir(tmp_path) if n.endswith(".log"))
    assert names[:len(v1)] == v1 and len(names) > len(v1)
    assert int(names[len(v1)][:20]) == 100
    assert all(open(tmp_path / n, "rb").read(5) == b"BKLG\x02" for n in names[len(v1):])
    report = check(tmp_path)
    assert report.ok and report.records == 200, report.format_text()
    with LogReader(tmp_path) as reader:
        assert reader.read(0, 10_000, 1 << 30) == [expected(i) for i in range(200)]
        assert reader.read(95, 10) == [expected(i) for i in range(95, 105)]
    # Version 1 is read, never written.
    with pytest.raises(ValueError, match="format_version must be 2"):
        open_log(tmp_path, format_version=1)


# ------------------------------------------------------------------------------ recovery and check

def test_tail_truncated_at_every_byte_of_the_last_batch(ram_path, caplog):
    pristine = ram_path / "pristine"
    with open_log(pristine) as log:
        write(log, 0, 40, per_batch=4)
    seg = sorted(n for n in os.listdir(pristine) if n.endswith(".log"))[-1]
    first, count, pos, size = batch_positions(pristine / seg)[-1]
    assert first + count == 40 and count == 4
    work = ram_path / "work"
    for cut in range(pos, pos + size):
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(pristine, work)
        os.truncate(work / seg, cut)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="brokerd.router.log.commitlog"):
            log = open_log(work)
        try:
            assert log.next_offset == first, cut
            assert os.path.getsize(work / seg) == pos
            if cut > pos:
                assert any(f"truncated at position {pos}, {cut - pos} bytes dropped" in r.getMessage()
                           for r in caplog.records)
            assert log.read(0, 1000, 1 << 30) == [expected(i) for i in range(first)]
            write(log, first, first + 2, per_batch=1000)  # appends continue in the same segment
            assert batch_positions(work / seg)[-1][:3] == (first, 2, pos)
        finally:
            log.close()
        report = check(work)
        assert report.ok and report.records == first + 2, report.format_text()


@pytest.mark.parametrize("where", ["body", "header"])
def test_corrupt_batch_in_the_tail_is_cut_there(tmp_path, caplog, where):
    with open_log(tmp_path, segment_bytes=1 << 20) as log:
        write(log, 0, 50, per_batch=5)
    seg = sorted(n for n in os.listdir(tmp_path) if n.endswith(".log"))[-1]
    first, _count, pos, size = batch_positions(tmp_path / seg)[-3]
    flip(tmp_path / seg, pos + size - 1 if where == "body" else pos + 1)  # a payload byte / the length
    reason = "CRC mismatch" if where == "body" else "batch header CRC mismatch"
    report = check(tmp_path)
    assert not report.ok
    bad = report.segments[-1]
    assert (bad.first_bad_position, bad.error, bad.tail_incomplete) == (pos, reason, False)
    file_size = os.path.getsize(tmp_path / seg)
    with caplog.at_level(logging.WARNING, logger="brokerd.router.log.commitlog"):
        log = open_log(tmp_path, segment_bytes=1 << 20)
    with log:
        assert log.next_offset == first
        assert os.path.getsize(tmp_path / seg) == pos
        assert any(f"truncated at position {pos}, {file_size - pos} bytes dropped ({reason})"
                   in r.getMessage() for r in caplog.records)
        assert log.read(0, 1000, 1 << 30) == [expected(i) for i in range(first)]
    assert check(tmp_path).ok


def test_brokerd_log_check_reports_a_crc_mismatch_in_a_middle_segment(tmp_path, capsys):
    directory = tmp_path / "data" / "n1" / "w0"
    with open_log(directory) as log:
        write(log, 0, 200, per_batch=6)
    segs = sorted(n for n in os.listdir(directory) if n.endswith(".log"))
    assert len(segs) >= 3
    _first, _count, pos, size = batch_positions(directory / segs[1])[2]
    assert log_cli.main(["check", "--data-dir", str(tmp_path / "data")]) == 0
    capsys.readouterr()
    flip(directory / segs[1], pos + size // 2)
    assert log_cli.main(["check", "--data-dir", str(tmp_path / "data")]) == 1
    out = capsys.readouterr().out
    assert f"BAD at position {pos}: CRC mismatch" in out and "PROBLEMS FOUND" in out
    # Readers skip the rest of that segment and go on with the next one; nothing is truncated.
    size_before = os.path.getsize(directory / segs[1])
    with open_log(directory) as log:
        offsets = [r.offset for r in log.read(0, 10_000, 1 << 30)]
    assert os.path.getsize(directory / segs[1]) == size_before
    assert int(segs[2][:20]) in offsets and _first not in offsets


def test_nothing_acknowledged_under_fsync_always_is_lost_in_a_crash(tmp_path):
    """A crash is the files as they are at some moment: copied while the writer runs. Everything
    reported durable before the copy started is there after recovery of the copy."""
    crash = tmp_path / "crash"

    async def main() -> int:
        log = await CommitLog.open_async(tmp_path / "log", router_id="r1", fsync="always",
                                         segment_bytes=8192)
        acked = -1
        for i in range(400):
            log.append_fields(*fields(i))
            if i % 13 == 12:
                acked = await log.wait_durable(i)
        for i in range(400, 420):
            log.append_fields(*fields(i))  # in flight while the "crash" happens
        await asyncio.sleep(0)
        shutil.copytree(tmp_path / "log", crash)
        await log.aclose()
        return acked

    acked = asyncio.run(main())
    with open_log(crash) as log:
        assert log.next_offset > acked
        assert log.read(0, 10_000, 1 << 30) == [expected(i) for i in range(log.next_offset)]
    assert check(crash).ok


# ----------------------------------------------------------------------------------------- linger

def test_linger_makes_one_batch_of_several_loop_iterations(tmp_path):
    """With a loop and fsync interval, the appends of several loop iterations are flushed together
    linger_ms after the first; reads see them meanwhile; an explicit flush and close do not wait."""

    async def until(cond) -> None:
        for _ in range(5000):
            if cond():
                return
            await asyncio.sleep(0.001)
        raise AssertionError("timed out")

    async def main() -> None:
        log = await CommitLog.open_async(tmp_path, router_id="r1", linger_ms=300)
        for i in range(30):
            log.append_fields(*fields(i))
            if i % 10 == 9:
                await asyncio.sleep(0)  # a loop iteration ends
        assert log.pending_records == 30 and not log._inflight  # not even flushed yet
        assert log.read(0, 100) == [expected(i) for i in range(30)]
        with LogReader(tmp_path) as reader:
            assert reader.read(0) == []  # not written yet
        await until(lambda: log.written_offset == 29)
        assert len(batch_positions(tmp_path / segment_name(0))) == 1  # one batch for the 30
        log.append_fields(*fields(30))
        log.flush(fsync=True)  # an explicit flush does not linger
        assert await asyncio.wait_for(log.wait_durable(30), 5) == 30
        log.append_fields(*fields(31))
        await asyncio.sleep(0)
        assert log.pending_records == 1
        await log.aclose()  # close writes what lingers
        assert log.written_offset == 31

    asyncio.run(main())
    with LogReader(tmp_path) as reader:
        assert reader.read(0, 100) == [expected(i) for i in range(32)]
    with CommitLog(tmp_path, router_id="r1", fsync="always", linger_ms=300) as log:
        assert log._linger_s == 0  # acknowledgements wait for the write: never linger


@pytest.mark.parametrize("live", [0, 40])
def test_a_history_fetched_below_the_start_joins_the_log(tmp_path, live):
    """A replica placed at its leader's high-water mark (or a log continued after a lost disk)
    starts at an offset of its own; the records below it, fetched into a log of their own inside
    its directory, join it as its oldest segments: read in one pass (across a gap: records no
    node held), kept across a reopen, which goes on at the log's own end, not the history's,
    whether or not a record was written after the start."""
    main = open_log(tmp_path / "main")
    main.start_at(300)
    write(main, 300, 300 + live, per_batch=5)
    history_dir = tmp_path / "main" / "_history"
    hist = open_log(history_dir)
    hist.start_at(20)  # the source's log begins at 20 (retention); 250..299 were never held
    write(hist, 20, 250, per_batch=7)
    hist.close()
    with pytest.raises(ValueError):
        main.join_history(str(history_dir), 300)  # an offset never names two records
    assert main.join_history(str(history_dir), 249) > 1
    assert not [n for n in os.listdir(history_dir) if n.endswith((".log", ".index"))]
    want = [expected(i) for i in range(20, 250)] + [expected(i) for i in range(300, 300 + live)]
    assert main.start_offset == 20 and main.next_offset == 300 + live
    assert main.read(0, 10_000, 1 << 30) == want
    assert main.read(240, 20, 1 << 30) == want[220:240]
    main.close()
    with open_log(tmp_path / "main") as again:
        assert again.start_offset == 20 and again.next_offset == 300 + live
        write(again, 300 + live, 310 + live, per_batch=3)
        want += [expected(i) for i in range(300 + live, 310 + live)]
        assert again.read(0, 10_000, 1 << 30) == want
    # ``brokerd log check`` says what no node held, and finds nothing else wrong.
    report = check(tmp_path / "main")
    assert report.records == len(want) and all(s.ok and s.index_ok for s in report.segments)
    assert len(report.problems) == 1 and report.problems[0].startswith("offsets 250..299 missing"), \
        report.format_text()
