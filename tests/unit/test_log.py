"""Commit log: round trips, index lookups, pending reads, the standalone reader, retention,
durability callbacks on the loop, and the failed state. Real files in tmp_path, no mocks."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest

from brokerd.router.log import (
    FORMAT_VERSION,
    CommitLog,
    CorruptRecord,
    LogReader,
    LogUnavailable,
    Record,
    check,
    decode_records,
    index_name,
    iter_record_batches,
    iter_records,
    segment_name,
)
from brokerd.router.log.format import (
    FILE_HEADER_SIZE,
    INDEX_ENTRY_SIZE,
    RECORD_HEADER_SIZE,
    encode_batch_bytes,
)
from tests.log_v1_fixture import V1LogWriter, encode_record

T0 = 1_700_000_000_000


def rec_args(i: int) -> dict:
    """Deterministic, varied record fields for offset i (sizes vary so records straddle chunks)."""
    return dict(
        topic=f"sensors/{i % 7}/temp/{i}",
        payload=bytes([i % 251]) * (i * 37 % 700),
        qos=i % 3,
        retain=i % 5 == 0,
        client_id=f"client-{i % 11}",
        properties=b"" if i % 4 else b"\x01\x02props" + bytes([i % 256]),
        timestamp_ms=T0 + i,
    )


def fill(log: CommitLog, start: int, stop: int, *, flush_every: int | None = None) -> None:
    """Append records ``start..stop-1``; ``flush_every``: flush after every that many (a version 2
    log writes one batch per flush, and its index and its readers work batch by batch)."""
    for i in range(start, stop):
        assert log.append(**rec_args(i)) == i
        if flush_every and (i + 1) % flush_every == 0:
            log.flush()


def assert_record(rec: Record, i: int, router: str = "r1") -> None:
    a = rec_args(i)
    assert rec.offset == i
    assert rec.timestamp_ms == a["timestamp_ms"]
    assert rec.origin_router == router
    assert rec.origin_offset == i
    assert rec.client_id == a["client_id"]
    assert rec.topic == a["topic"]
    assert rec.qos == a["qos"]
    assert rec.retain is a["retain"]
    assert rec.properties == a["properties"]
    assert rec.payload == a["payload"]


def open_log(path, **kw) -> CommitLog:
    kw.setdefault("router_id", "r1")
    kw.setdefault("segment_bytes", 8192)
    kw.setdefault("index_interval_bytes", 512)
    return CommitLog(path, **kw)


def open_filled(path, version: int, stop: int, *, flush_every: int | None = None, **kw) -> CommitLog:
    """A log holding records ``0..stop-1`` in format ``version``, open: version 1 as an older broker
    wrote it (``V1LogWriter``), then opened by this one, which reads it."""
    if version == 2:
        log = open_log(path, **kw)
        fill(log, 0, stop, flush_every=flush_every)
        return log
    with V1LogWriter(path, router_id="r1", **kw) as writer:
        for i in range(stop):
            assert writer.append(**rec_args(i)) == i
    return open_log(path, **kw)


# ------------------------------------------------------------------------------------ round trips

def test_round_trip_across_segments(tmp_path):
    log = open_log(tmp_path)
    fill(log, 0, 300)
    log.flush()
    recs = log.read(0, max_records=10_000, max_bytes=1 << 30)
    assert [r.offset for r in recs] == list(range(300))
    for r in recs:
        assert_record(r, r.offset)
    names = sorted(os.listdir(tmp_path))
    logs = [n for n in names if n.endswith(".log")]
    assert len(logs) > 5
    assert logs[0] == "0" * 20 + ".log"
    for name in logs:
        assert len(name) == 24 and name[:20].isdigit()
        assert name.replace(".log", ".index") in names
        with open(tmp_path / name, "rb") as f:
            head = f.read(FILE_HEADER_SIZE)
        assert head[:4] == b"BKLG" and head[4] == FORMAT_VERSION
        assert int.from_bytes(head[8:16], "little") == int(name[:20])
        assert os.path.getsize(tmp_path / name) <= 8192
    # Reopen: everything is still there and appends continue at the right offset.
    log.close()
    log = open_log(tmp_path)
    assert log.next_offset == 300 and log.durable_offset == 299
    fill(log, 300, 320)
    log.close()
    with LogReader(tmp_path) as reader:
        recs = reader.read(0, max_records=10_000, max_bytes=1 << 30)
    assert [r.offset for r in recs] == list(range(320))
    assert check(tmp_path).ok


@pytest.mark.parametrize("version", [1, 2])
def test_read_by_offset_in_the_middle_uses_the_index(tmp_path, version):
    log = open_filled(tmp_path, version, 400, flush_every=3, segment_bytes=64 * 1024, index_interval_bytes=1024)
    log.flush()
    segs = log.segments()
    assert len(segs) >= 3
    # The index is sparse: several entries per segment, far fewer than records.
    entries = (os.path.getsize(tmp_path / index_name(segs[0].base_offset)) - FILE_HEADER_SIZE) // INDEX_ENTRY_SIZE
    assert 3 < entries < (segs[0].last_offset + 1)
    for start in (1, 7, 55, segs[1].base_offset, segs[1].base_offset + 13, 250, 399):
        recs = log.read(start, max_records=5)
        assert [r.offset for r in recs] == list(range(start, min(start + 5, 400)))
        for r in recs:
            assert_record(r, r.offset)
    with LogReader(tmp_path) as reader:
        for start in (3, 101, 333):
            recs = reader.read(start, max_records=3)
            assert [r.offset for r in recs] == [start, start + 1, start + 2]
        path, pos = reader.locate(333)
        assert pos > FILE_HEADER_SIZE  # an index entry, not the start of the segment
        assert next(iter(iter_records(path, pos))).offset <= 333
        assert any(r.offset == 333 for r in iter_records(path, pos))
    log.close()


def test_read_limits(tmp_path):
    log = open_log(tmp_path, segment_bytes=1 << 20)
    for _ in range(50):
        log.append("t", b"p" * 100, timestamp_ms=T0)
    log.flush()
    size = RECORD_HEADER_SIZE + 2 + 1 + 100  # origin "r1", topic "t", client ""
    assert len(log.read(0, max_records=7)) == 7
    assert len(log.read(0, max_bytes=size * 3)) == 3
    assert len(log.read(0, max_bytes=size * 3 + size - 1)) == 3
    assert len(log.read(0, max_bytes=1)) == 1  # at least one record
    assert log.read(50) == []
    log.close()


def test_pending_records_are_read_from_memory_and_reader_sees_only_flushed(tmp_path):
    log = open_log(tmp_path, max_batch_bytes=1 << 30)
    fill(log, 0, 100)
    log.flush()
    fill(log, 100, 150)  # still in the in-memory batch
    assert log.written_offset == 99 and log.next_offset == 150
    recs = log.read(90, max_records=100, max_bytes=1 << 30)
    assert [r.offset for r in recs] == list(range(90, 150))
    for r in recs:
        assert_record(r, r.offset)
    recs = log.read(120, max_records=5)  # entirely from memory
    assert [r.offset for r in recs] == list(range(120, 125))
    with LogReader(tmp_path) as reader:
        assert reader.end_offset == 100
        assert [r.offset for r in reader.read(95, 1000, 1 << 30)] == list(range(95, 100))
        assert reader.read(100) == []
        log.flush()
        assert reader.end_offset == 150
        assert [r.offset for r in reader.read(95, 1000, 1 << 30)] == list(range(95, 150))
    log.close()


def test_segments_are_created_lazily(tmp_path):
    log = open_log(tmp_path)
    assert os.listdir(tmp_path) == []
    log.append("a", b"1")
    assert os.listdir(tmp_path) == []  # append is buffer-only
    log.flush()
    assert sorted(os.listdir(tmp_path)) == [index_name(0), segment_name(0)]
    log.close()
    # Reopen an existing log: no new file until a roll is needed.
    log = open_log(tmp_path)
    log.append("b", b"2")
    log.flush()
    assert sorted(os.listdir(tmp_path)) == [index_name(0), segment_name(0)]
    log.close()


def test_append_accepts_bytes_and_keeps_forwarded_origin(tmp_path):
    log = open_log(tmp_path)
    log.append(b"t/bytes", b"p", client_id=b"c1", origin_router=b"r9", origin_offset=77)
    log.append("t/\u00e9", b"", origin_router="r8", origin_offset=-1)
    log.flush()
    a, b = log.read(0)
    assert (a.topic, a.client_id, a.origin_router, a.origin_offset) == ("t/bytes", "c1", "r9", 77)
    assert (b.topic, b.origin_router, b.origin_offset) == ("t/\u00e9", "r8", -1)
    log.append_record(a)
    log.flush()
    c = log.read(2)[0]
    assert c._replace(offset=0) == a
    log.close()


def test_append_validation_leaves_the_log_usable(tmp_path):
    log = open_log(tmp_path)
    with pytest.raises(ValueError):
        log.append("t", b"", qos=3)
    with pytest.raises(ValueError):
        log.append("t" * 70_000, b"")
    assert log.append("t", b"ok") == 0
    log.flush()
    assert log.read(0)[0].payload == b"ok"
    log.close()


# ---------------------------------------------------------------------------------------- decode

def test_decode_records_round_trip_incomplete_and_corrupt():
    raw = b"".join(encode_record(i, T0 + i, "r", i, "c", f"t/{i}", i % 3, i % 2 == 1, b"pp" * i,
                                 b"x" * i) for i in range(10))
    recs, consumed = decode_records(raw)
    assert consumed == len(raw) and [r.offset for r in recs] == list(range(10))
    assert recs[3] == Record(3, T0 + 3, "r", 3, "c", "t/3", 0, True, b"pppppp", b"xxx")
    # An incomplete record at the end is not an error: it is left unconsumed.
    for cut in (1, RECORD_HEADER_SIZE - 1, RECORD_HEADER_SIZE + 1):
        recs, consumed = decode_records(raw[:-cut])
        assert len(recs) == 9 and consumed == len(raw) - len(encode_record(9, T0 + 9, "r", 9, "c", "t/9",
                                                                             0, True, b"pp" * 9, b"x" * 9))
    # Limits.
    recs, consumed = decode_records(raw, max_records=4)
    assert len(recs) == 4
    recs2, _ = decode_records(raw, consumed, max_records=100)
    assert recs2[0].offset == 4
    # A flipped payload byte is a CRC error; the records before it are kept in the exception.
    bad = bytearray(raw)
    size4 = len(encode_record(4, T0 + 4, "r", 4, "c", "t/4", 1, False, b"pp" * 4, b"x" * 4))
    bad[consumed + size4 - 1] ^= 0xFF  # the last payload byte
    with pytest.raises(CorruptRecord) as info:
        decode_records(bytes(bad))
    assert info.value.position == consumed and len(info.value.records) == 4
    assert info.value.consumed == consumed
    recs, _ = decode_records(bytes(bad), verify=False, max_records=5)  # verification can be skipped
    assert len(recs) == 5


@pytest.mark.parametrize("version", [1, 2])
def test_iter_records_over_segment_files(tmp_path, version):
    open_filled(tmp_path, version, 200, flush_every=1, segment_bytes=1 << 20).close()
    path = tmp_path / segment_name(0)
    recs = list(iter_records(path, chunk_size=4096))  # records larger than a chunk are read whole
    assert [r.offset for r in recs] == list(range(200))
    batches = list(iter_record_batches(path, chunk_size=64 * 1024))
    assert sum(len(b) for b in batches) == 200
    # A reader bounded at end_pos sees only the records that fit.
    size = os.path.getsize(path)
    assert len(list(iter_records(path, end_pos=size - 1))) == 199


# ----------------------------------------------------------------------------------- time lookups

def test_offset_for_time_and_segment_timestamps(tmp_path):
    log = open_log(tmp_path, segment_bytes=16 * 1024, index_interval_bytes=256)
    for i in range(300):
        log.append("t", b"y" * 50, timestamp_ms=T0 + 10 * i)
    log.close()
    with LogReader(tmp_path) as reader:
        segs = reader.segments()
        assert len(segs) > 1
        for s in segs:
            assert s.first_timestamp == T0 + 10 * s.base_offset
            assert s.last_timestamp == T0 + 10 * s.last_offset
        assert reader.offset_for_time(0) == 0
        assert reader.offset_for_time(T0 + 10 * 123) == 123
        assert reader.offset_for_time(T0 + 10 * 123 - 3) == 123
        assert reader.offset_for_time(T0 + 10 * segs[1].base_offset) == segs[1].base_offset
        assert reader.offset_for_time(T0 + 10 * 299) == 299
        assert reader.offset_for_time(T0 + 10 * 299 + 1) is None


# -------------------------------------------------------------------------------------- retention

def test_retention_by_size_deletes_whole_segments_never_the_active_one(tmp_path):
    log = open_log(tmp_path, segment_bytes=4096, retention_bytes=10_000)
    for i in range(200):
        log.append("t", b"z" * 200, timestamp_ms=T0 + i)
    log.flush()
    before = log.segments()
    assert len(before) > 5
    deleted = log.enforce_retention()
    after = log.segments()
    assert deleted and [d.base_offset for d in deleted] == [s.base_offset for s in before[:len(deleted)]]
    assert all(d.reason == "size" for d in deleted)
    assert after == before[len(deleted):]
    assert sum(s.size for s in after) <= 10_000
    assert sum(s.size for s in after) + deleted[-1].size > 10_000  # deleted no more than needed
    assert log.start_offset == after[0].base_offset
    for d in deleted:
        assert not (tmp_path / segment_name(d.base_offset)).exists()
        assert not (tmp_path / index_name(d.base_offset)).exists()
    recs = log.read(0, max_records=5)
    assert recs[0].offset == log.start_offset  # reads below start_offset start at it
    # A zero budget still keeps the active segment.
    log.retention_bytes = 0
    log.enforce_retention()
    assert len(log.segments()) == 1 and log.segments()[0].active
    assert log.start_offset == log.segments()[0].base_offset
    assert log.read(log.start_offset)[0].offset == log.start_offset
    log.close()
    with LogReader(tmp_path) as reader:
        assert len(reader.segments()) == 1
    assert check(tmp_path).ok


def test_retention_by_age_uses_the_newest_record_of_a_segment(tmp_path):
    hour = 3_600_000
    now = T0 + 100 * hour
    log = open_log(tmp_path, segment_bytes=4096, retention_hours=24)
    for i in range(60):  # old records
        log.append("t", b"o" * 200, timestamp_ms=now - 48 * hour + i)
    log.flush()
    old_segments = log.segments()
    # One more old record and then a fresh one in the same segment: that segment must be kept.
    log.append("t", b"o" * 200, timestamp_ms=now - 48 * hour)
    log.flush()
    mixed_base = log.segments()[-1].base_offset
    log.append("t", b"n" * 10, timestamp_ms=now)
    for i in range(40):
        log.append("t", b"n" * 200, timestamp_ms=now + i)
    log.flush()
    deleted = log.enforce_retention(now_ms=now)
    assert deleted and all(d.reason == "age" for d in deleted)
    kept = log.segments()
    assert kept[0].base_offset <= mixed_base
    assert all(d.base_offset < mixed_base for d in deleted)
    assert {d.base_offset for d in deleted} <= {s.base_offset for s in old_segments}
    # Everything old but the active segment: with no fresh records at all, the active one stays.
    log.close()
    log = open_log(tmp_path, segment_bytes=4096, retention_hours=1)
    deleted = log.enforce_retention(now_ms=now + 100 * hour)
    assert len(log.segments()) == 1 and deleted
    log.close()


# ------------------------------------------------------------------------------ loop & durability

def test_fsync_always_reports_durable_on_the_loop(tmp_path):
    async def main():
        log = await CommitLog.open_async(tmp_path, router_id="r1", fsync="always", segment_bytes=8192)
        seen: list[tuple[int, bool]] = []
        loop_thread = threading.get_ident()
        log.on_durable(lambda off: seen.append((off, threading.get_ident() == loop_thread)))
        offsets = []
        for burst in range(20):
            for i in range(10):
                offsets.append(log.append(**rec_args(burst * 10 + i)))
            await asyncio.sleep(0)  # let the autoflush run: one batch per loop iteration
        assert await asyncio.wait_for(log.wait_durable(offsets[-1]), 10) >= offsets[-1]
        assert log.durable_offset == log.written_offset == offsets[-1]
        assert seen and all(on_loop for _, on_loop in seen)
        values = [off for off, _ in seen]
        assert values == sorted(set(values)) and values[-1] == offsets[-1]
        assert await log.wait_durable(5) == log.durable_offset  # already durable: immediate
        # Concurrent waiters for different offsets all resolve.
        more = [log.append("t", b"w") for _ in range(5)]
        got = await asyncio.wait_for(asyncio.gather(*(log.wait_durable(o) for o in more)), 10)
        assert all(g >= o for g, o in zip(got, more, strict=True))
        recs = log.read(0, max_records=1000, max_bytes=1 << 30)
        assert [r.offset for r in recs] == list(range(205))
        await log.aclose()
        assert log.closed
        with pytest.raises(LogUnavailable):
            log.append("t", b"")

    asyncio.run(main())
    assert check(tmp_path).ok


def test_fsync_interval_becomes_durable_without_more_appends(tmp_path):
    async def main():
        log = await CommitLog.open_async(tmp_path, fsync="interval", fsync_interval_ms=50)
        t = time.monotonic()
        off = log.append("t", b"x")
        await asyncio.sleep(0)
        assert await asyncio.wait_for(log.wait_durable(off), 5) == off
        assert time.monotonic() - t < 3
        await log.aclose()

    asyncio.run(main())


def test_fsync_never_moves_durable_only_on_request(tmp_path):
    log = open_log(tmp_path, fsync="never")
    fill(log, 0, 10)
    log.flush()
    assert log.written_offset == 9 and log.durable_offset == -1
    log.flush(fsync=True)
    assert log.durable_offset == 9
    log.close()


# ----------------------------------------------------------------------------------- failed state

def _next_roll_base(tmp_path, log: CommitLog, payload: bytes) -> int:
    """Append until the next append would roll; return the offset the new segment will start at."""
    size = log.segments()[-1].size
    # The log rolls at flush, by batch: fill the segment with one-record batches of ``payload``,
    # then of a 1-byte payload, until not even that fits.
    for p in (payload, b"a"):
        while True:
            off = log.next_offset
            n = len(encode_batch_bytes(off, [(T0, log.router_id, off, "", "t", 0, False, b"", p)]))
            if size + n > 8192:
                break
            log.append("t", p, timestamp_ms=T0)
            log.flush()
            size += n
    return log.next_offset


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_failed_write_enters_failed_state_and_recovers(tmp_path, caplog):
    async def main():
        log = await CommitLog.open_async(tmp_path, router_id="r1", fsync="always", segment_bytes=8192)
        durable_seen: list[int] = []
        errors: list[object] = []
        log.on_durable(durable_seen.append)
        log.on_error(errors.append)
        for _ in range(10):
            log.append("t", b"a" * 100)
        await log.wait_durable(9)
        base = _next_roll_base(tmp_path, log, b"a" * 100)
        await log.wait_durable(base - 1)
        # The next segment's file is /dev/full: its first write fails with ENOSPC.
        os.symlink("/dev/full", tmp_path / segment_name(base))
        failed = [log.append("t", b"b" * 100) for _ in range(5)]
        assert failed[0] == base
        waiter = asyncio.ensure_future(log.wait_durable(failed[-1]))
        patient = asyncio.ensure_future(log.wait_durable(failed[-1], fail_on_error=False))
        with pytest.raises(LogUnavailable):
            await asyncio.wait_for(waiter, 10)
        assert isinstance(log.error, OSError)
        assert errors == [log.error]
        with pytest.raises(LogUnavailable) as info:
            log.append("t", b"refused")
        assert info.value.cause is log.error
        assert log.durable_offset == base - 1
        assert max(durable_seen) == base - 1  # nothing of the failed batch reported durable
        # The failed records are kept (and readable) in memory.
        assert [r.offset for r in log.read(base, 100)] == failed
        assert not patient.done()
        # Still failing: a retry changes nothing.
        assert await log.recover() is False
        assert log.durable_offset == base - 1
        # The disk "frees up": retry writes the pending batch.
        os.unlink(tmp_path / segment_name(base))
        assert await log.recover() is True
        assert log.error is None and errors[-1] is None
        assert await asyncio.wait_for(patient, 5) >= failed[-1]
        assert log.durable_offset == failed[-1] and max(durable_seen) == failed[-1]
        assert log.append("t", b"after") == failed[-1] + 1
        await log.wait_durable(failed[-1] + 1)
        await log.aclose()

    with caplog.at_level("ERROR", logger="brokerd.router.log.commitlog"):
        asyncio.run(main())
    assert len([r for r in caplog.records if r.levelname == "ERROR"]) == 1  # logged once
    assert check(tmp_path).ok
    with LogReader(tmp_path) as reader:
        assert reader.end_offset == reader.read(0, 10_000, 1 << 30)[-1].offset + 1


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_failed_write_by_the_loop_fails_the_log_at_once_and_the_thread_recovers_it(tmp_path):
    """With ``interval`` the loop writes small batches itself: a write that fails there puts the
    log in the failed state before ``flush`` returns (the next append is refused, nothing more is
    acknowledged), and the writer thread's retry writes the held batch once the disk is back."""
    async def main():
        log = await CommitLog.open_async(tmp_path, router_id="r1", fsync="interval", fsync_interval_ms=20,
                                         segment_bytes=8192)
        log.append("t", b"a" * 100)
        log.flush()
        base = _next_roll_base(tmp_path, log, b"a" * 100)
        log.flush()
        # Everything so far durable: the thread is idle, so the next small batch is the loop's.
        assert await asyncio.wait_for(log.wait_durable(base - 1), 5) == base - 1
        os.symlink("/dev/full", tmp_path / segment_name(base))
        assert log.append("t", b"b" * 100) == base
        log.flush()
        assert isinstance(log.error, OSError)
        with pytest.raises(LogUnavailable):
            log.append("t", b"refused")
        assert [r.offset for r in log.read(base, 10)] == [base]  # held in memory, readable
        os.unlink(tmp_path / segment_name(base))
        assert await asyncio.wait_for(log.recover(), 5) is True
        assert await asyncio.wait_for(log.wait_durable(base), 5) >= base
        await log.aclose()

    asyncio.run(main())
    assert check(tmp_path).ok
    with LogReader(tmp_path) as reader:
        assert reader.read(0, 10_000, 1 << 30)[-1].offset == reader.end_offset - 1


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_failed_write_synchronous_mode(tmp_path):
    log = open_log(tmp_path, fsync="always")
    log.append("t", b"a")
    log.flush()
    base = _next_roll_base(tmp_path, log, b"a" * 50)
    log.flush()
    os.symlink("/dev/full", tmp_path / segment_name(base))
    log.append("t", b"b")
    with pytest.raises(LogUnavailable) as info:
        log.flush()
    assert isinstance(info.value.cause, OSError)
    assert log.durable_offset == base - 1 and log.written_offset == base - 1
    with pytest.raises(LogUnavailable):
        log.append("t", b"c")
    assert log.try_recover() is False
    os.unlink(tmp_path / segment_name(base))
    assert log.try_recover() is True
    assert log.durable_offset == base
    log.close()
    assert check(tmp_path).ok


def test_read_only_directory_fails_the_roll(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("running as root: permissions are not enforced (the /dev/full tests cover this)")
    d = tmp_path / "log"
    log = open_log(d, fsync="always")
    log.append("t", b"a")
    log.flush()
    base = _next_roll_base(d, log, b"a" * 50)
    log.flush()
    os.chmod(d, 0o555)
    try:
        log.append("t", b"b")
        with pytest.raises(LogUnavailable):
            log.flush()
        assert log.durable_offset == base - 1
    finally:
        os.chmod(d, 0o755)
    assert log.try_recover() is True
    assert log.durable_offset == base
    log.close()


def test_retention_with_a_loop_deletes_on_the_writer_thread(tmp_path):
    async def main():
        log = await CommitLog.open_async(tmp_path, router_id="r1", segment_bytes=4096,
                                         retention_bytes=8192)
        for i in range(100):
            log.append("t", b"q" * 200, timestamp_ms=T0 + i)
        await asyncio.sleep(0)
        await asyncio.wait_for(_until(lambda: log.written_offset == 99), 5)
        deleted = log.enforce_retention()
        assert deleted
        log.append("t", b"after")
        log.flush(fsync=True)
        await asyncio.wait_for(log.wait_durable(100), 5)  # the delete was queued before this fsync
        for d in deleted:
            assert not (tmp_path / segment_name(d.base_offset)).exists()
        assert log.read(0)[0].offset == log.start_offset == deleted[-1].last_offset + 1
        log.close()  # the blocking close works from a coroutine too (shutdown)

    asyncio.run(main())
    assert check(tmp_path).ok


async def _until(cond) -> None:
    while not cond():
        await asyncio.sleep(0.001)


def test_max_bytes_is_respected_across_segments_and_memory(tmp_path):
    log = open_log(tmp_path, segment_bytes=4096, max_batch_bytes=1 << 30)
    for _ in range(60):
        log.append("t", b"m" * 200, timestamp_ms=T0)
    log.flush()
    for _ in range(10):
        log.append("t", b"m" * 200, timestamp_ms=T0)  # pending, in memory
    size = RECORD_HEADER_SIZE + 2 + 1 + 200
    for k in (1, 2, 5, 17, 18, 19, 40, 69):
        for start in (0, 3, 50, 55):
            recs = log.read(start, max_records=1000, max_bytes=size * k)
            assert [r.offset for r in recs] == list(range(start, min(start + k, 70)))
    with LogReader(tmp_path) as reader:
        for k in (1, 17, 18, 19, 40):
            recs = reader.read(0, max_records=1000, max_bytes=size * k)
            assert [r.offset for r in recs] == list(range(min(k, 60)))
    log.close()


def test_random_interleaving_matches_a_model(tmp_path):
    """Appends, flushes, loop iterations and reads in random order: every read returns exactly the
    expected records, whether they are on disk, handed to the writer, or still in the buffer."""
    import random

    rng = random.Random(20240611)

    async def main() -> list[bytes]:
        log = await CommitLog.open_async(tmp_path, router_id="r1", segment_bytes=4096,
                                         index_interval_bytes=300, max_batch_bytes=2000)
        expected: list[bytes] = []
        reader = LogReader(tmp_path)
        for _ in range(1500):
            op = rng.random()
            if op < 0.6:
                payload = rng.randbytes(rng.choice((0, 1, 50, 300, 900, 5000)))
                assert log.append(f"t/{len(expected)}", payload, timestamp_ms=T0) == len(expected)
                expected.append(payload)
            elif op < 0.7:
                await asyncio.sleep(0)
            elif op < 0.73:
                log.flush()
            elif op < 0.78:  # another process's view: a prefix of what the loop appended
                start = rng.randrange(len(expected) + 1)
                recs = reader.read(start, max_records=rng.randint(1, 40), max_bytes=rng.randint(1, 30_000))
                assert [r.offset for r in recs] == list(range(start, start + len(recs)))
                assert not recs or recs[-1].offset <= log.next_offset - 1
                assert start > log.written_offset or recs or start >= len(expected)
                for r in recs:
                    assert r.payload == expected[r.offset]
            else:
                start = rng.randrange(len(expected) + 1)
                max_records = rng.randint(1, 40)
                recs = log.read(start, max_records=max_records, max_bytes=rng.randint(1, 30_000))
                want = list(range(start, min(start + max_records, len(expected))))
                assert [r.offset for r in recs] == want[:len(recs)]
                assert recs or not want
                for r in recs:
                    assert r.payload == expected[r.offset] and r.topic == f"t/{r.offset}"
        reader.close()
        await log.aclose()
        return expected

    expected = asyncio.run(main())
    with CommitLog(tmp_path) as log:
        recs = log.read(0, max_records=10_000, max_bytes=1 << 30)
    assert [r.payload for r in recs] == expected
    assert check(tmp_path).ok


def test_open_descriptors_stay_bounded_however_many_segments(tmp_path):
    """Recovery opens every segment and closes it again; reads keep at most MAX_OPEN_READERS
    segments open (two descriptors each), reopening the others when they are read again."""
    from brokerd.router.log.segment import MAX_OPEN_READERS

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    log = open_log(tmp_path, segment_bytes=4096)
    fill(log, 0, 2000)
    log.close()
    segments = len([n for n in os.listdir(tmp_path) if n.endswith(".log")])
    assert segments > 4 * MAX_OPEN_READERS
    before = open_fds()
    log = open_log(tmp_path, segment_bytes=4096)
    after_open = open_fds()
    assert after_open - before <= 8  # the active segment, the directory, the writer's
    for _ in range(2):  # twice over: closed readers reopen
        recs = []
        while len(recs) < 2000:
            recs += log.read(len(recs), max_records=37)
        assert [r.offset for r in recs] == list(range(2000))
        assert open_fds() - after_open <= 2 * MAX_OPEN_READERS
    log.close()
    with LogReader(tmp_path) as reader:  # the reader of other processes (pipeline, brokerd log)
        infos = reader.segments()
        assert len(infos) == segments and open_fds() - before <= 2 * MAX_OPEN_READERS
        recs = reader.read(0, max_records=10_000, max_bytes=1 << 30)
        assert [r.offset for r in recs] == list(range(2000))
        assert reader.offset_for_time(recs[1500].timestamp_ms) is not None
        assert open_fds() - before <= 2 * MAX_OPEN_READERS
    assert open_fds() == before


def test_a_replica_takes_the_leaders_batches_as_they_were_packed(tmp_path):
    """``on_batch`` hands each batch's packed records out as the log flushes; ``append_batch``
    on a log started at the first batch's offset (``start_at``) writes them with the same offsets
    and contents, across segment rolls, and the copy reopens as a plain log."""
    import msgpack

    leader = open_log(tmp_path / "leader")
    batches = []
    leader.on_batch = lambda first, last, body: batches.append((first, last, body))
    fill(leader, 0, 40)
    leader.flush()
    fill(leader, 40, 300)
    leader.flush()
    replica = open_log(tmp_path / "replica")
    replica.start_at(batches[1][0])  # a follower chosen after the first batch
    for first, last, body in batches[1:]:
        records = msgpack.unpackb(body, raw=False)
        assert len(records) == last - first + 1
        replica.append_batch(first, records, body)
    with pytest.raises(ValueError):
        replica.append_batch(5, [], b"")  # not where the replica ends
    replica.flush()
    want = leader.read(batches[1][0], max_records=10_000, max_bytes=1 << 30)
    got = replica.read(0, max_records=10_000, max_bytes=1 << 30)
    assert [tuple(r) for r in got] == [tuple(r) for r in want] and got[-1].offset == 299
    replica.close()
    reopened = open_log(tmp_path / "replica")
    assert (reopened.start_offset, reopened.next_offset) == (batches[1][0], 300)
    reopened.close()
    leader.close()
    assert check(tmp_path / "replica").ok
