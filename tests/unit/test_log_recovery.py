"""Commit log crash recovery and ``check``: torn tails at every byte, bad CRCs, corrupt middle
segments, stale and missing indexes. Damage is done to real files, as a crash or a bad disk would."""

from __future__ import annotations

import logging
import os
import shutil

import pytest

from brokerd.router.log import (
    CommitLog,
    CorruptRecord,
    LogFormatError,
    LogReader,
    check,
    index_name,
    iter_records,
    segment_name,
)
from brokerd.router.log.format import FILE_HEADER_SIZE, INDEX_ENTRY, RECORD_HEADER, RECORD_HEADER_SIZE
from brokerd.router.log.scan import write_index
from tests.log_v1_fixture import V1LogWriter

T0 = 1_700_000_000_000


def write_log(path, n: int, **kw) -> None:
    """A log of ``n`` records in format version 1, as an older broker wrote it (one header and CRC
    per record: the tests below damage single records); opening it is the upgrade path. The version
    2 tests are in test_log_v2."""
    kw.setdefault("segment_bytes", 8192)
    kw.setdefault("index_interval_bytes", 512)
    with V1LogWriter(path, router_id="r1", **kw) as log:
        for i in range(n):
            log.append(f"t/{i}", bytes([i % 256]) * (40 + i % 60), client_id="c", timestamp_ms=T0 + i)


def record_positions(path) -> list[tuple[int, int, int]]:
    """(offset, position, size) of each record in a segment file, by walking the headers."""
    data = open(path, "rb").read()
    out = []
    pos = FILE_HEADER_SIZE
    while pos + RECORD_HEADER_SIZE <= len(data):
        length, _crc, off = RECORD_HEADER.unpack_from(data, pos)[:3]
        out.append((off, pos, 8 + length))
        pos += 8 + length
    return out


def last_segment(path) -> tuple[int, str]:
    bases = sorted(int(n[:20]) for n in os.listdir(path) if n.endswith(".log"))
    return bases[-1], os.path.join(path, segment_name(bases[-1]))


def flip(path, pos: int) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x5A]))


def assert_intact(records, upto: int) -> None:
    assert [r.offset for r in records] == list(range(upto))
    for r in records:
        assert r.topic == f"t/{r.offset}" and r.payload == bytes([r.offset % 256]) * (40 + r.offset % 60)


# ------------------------------------------------------------------------------------ torn tails

def test_tail_truncated_at_every_byte_of_the_last_record(ram_path, caplog):
    pristine = ram_path / "pristine"
    n = 60
    write_log(pristine, n)
    base, seg_path = last_segment(pristine)
    last_off, last_pos, last_size = record_positions(seg_path)[-1]
    assert last_off == n - 1
    work = ram_path / "work"
    for cut in range(last_pos, last_pos + last_size):
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(pristine, work)
        os.truncate(work / segment_name(base), cut)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="brokerd.router.log.commitlog"):
            log = CommitLog(work, router_id="r1", segment_bytes=8192, index_interval_bytes=512)
        try:
            assert log.next_offset == n - 1, cut
            assert os.path.getsize(work / segment_name(base)) == last_pos
            if cut > last_pos:
                msgs = [r.getMessage() for r in caplog.records]
                assert any(f"truncated at position {last_pos}, {cut - last_pos} bytes dropped" in m
                           and segment_name(base) in m for m in msgs), msgs
            assert_intact(log.read(0, max_records=1000, max_bytes=1 << 30), n - 1)
            # Appends continue at the right offset, in the same place.
            assert log.append("t/again", b"new", timestamp_ms=T0) == n - 1
            log.flush()
            recs = log.read(n - 2, 10)
            assert [r.offset for r in recs] == [n - 2, n - 1] and recs[1].payload == b"new"
        finally:
            log.close()
        report = check(work)
        assert report.ok, report.format_text()
        assert report.records == n


def test_partial_header_of_a_new_last_segment_is_rewritten(tmp_path):
    write_log(tmp_path, 100)
    base, _ = last_segment(tmp_path)
    new_base = 100
    with open(tmp_path / segment_name(new_base), "wb") as f:
        f.write(b"BKL")  # crashed while creating the segment
    with CommitLog(tmp_path, router_id="r1", segment_bytes=8192) as log:
        assert log.next_offset == new_base
        log.append("t/x", b"x")
    assert check(tmp_path).ok
    with LogReader(tmp_path) as reader:
        assert reader.end_offset == 101


def test_unknown_version_is_refused_not_truncated(tmp_path):
    write_log(tmp_path, 10)
    base, path = last_segment(tmp_path)
    with open(path, "r+b") as f:
        f.seek(4)
        f.write(b"\x63")
    size = os.path.getsize(path)
    with pytest.raises(LogFormatError):
        CommitLog(tmp_path)
    assert os.path.getsize(path) == size


def test_bad_crc_in_the_tail_truncates_there(tmp_path, caplog):
    write_log(tmp_path, 80)
    base, path = last_segment(tmp_path)
    recs = record_positions(path)
    bad_off, bad_pos, bad_size = recs[-3]
    flip(path, bad_pos + bad_size - 1)  # a payload byte: only the CRC notices
    size = os.path.getsize(path)
    with caplog.at_level(logging.WARNING, logger="brokerd.router.log.commitlog"):
        log = CommitLog(tmp_path, router_id="r1", segment_bytes=8192)
    with log:
        assert log.next_offset == bad_off
        assert os.path.getsize(path) == bad_pos
        assert any(f"truncated at position {bad_pos}, {size - bad_pos} bytes dropped (CRC mismatch)"
                   in r.getMessage() for r in caplog.records)
        assert_intact(log.read(0, 1000, 1 << 30), bad_off)
        assert log.append("t/n", b"n") == bad_off
    assert check(tmp_path).ok


# ------------------------------------------------------------------------ corrupt middle segments

def test_corrupt_record_in_a_middle_segment(tmp_path, caplog):
    n = 400
    write_log(tmp_path, n)
    bases = sorted(int(x[:20]) for x in os.listdir(tmp_path) if x.endswith(".log"))
    assert len(bases) >= 4
    mid, nxt = bases[1], bases[2]
    path = tmp_path / segment_name(mid)
    recs = record_positions(path)
    bad_off, bad_pos, bad_size = recs[len(recs) // 2]
    flip(path, bad_pos + bad_size - 1)

    report = check(tmp_path)
    assert not report.ok
    bad = [s for s in report.segments if not s.ok]
    assert [s.base_offset for s in bad] == [mid]
    assert bad[0].first_bad_position == bad_pos and bad[0].error == "CRC mismatch"
    assert bad[0].records == bad_off - mid and bad[0].last_offset == bad_off - 1
    assert bad[0].bytes_unreadable == os.path.getsize(path) - bad_pos
    assert all(s.ok for s in report.segments if s.base_offset != mid)
    assert any(f"offsets {bad_off}..{nxt - 1} missing" in p for p in report.problems)
    assert "BAD at position" in report.format_text()
    assert report.to_dict()["ok"] is False

    size_before = os.path.getsize(path)
    with caplog.at_level(logging.WARNING):
        log = CommitLog(tmp_path, router_id="r1", segment_bytes=8192)  # open does not fail
    with log:
        assert os.path.getsize(path) == size_before  # older segments are never truncated
        assert log.next_offset == n
        got = [r.offset for r in log.read(0, 10_000, 1 << 30)]
        assert got == list(range(bad_off)) + list(range(nxt, n))
        # Reading from inside the unreadable range resumes at the next segment.
        assert log.read(bad_off, 3)[0].offset in range(bad_off, nxt + 1)
        assert any("corrupt record" in r.getMessage() or "bad record" in r.getMessage()
                   for r in caplog.records)
    with LogReader(tmp_path) as reader:
        got = [r.offset for r in reader.read(0, 10_000, 1 << 30)]
        assert got == list(range(bad_off)) + list(range(nxt, n))
    assert [r.offset for r in iter_records(path)] == list(range(mid, bad_off))
    with pytest.raises(CorruptRecord) as info:
        list(iter_records(path, errors="raise"))
    assert info.value.position == bad_pos


def test_truncated_middle_segment_is_reported_and_skipped(tmp_path):
    write_log(tmp_path, 300)
    bases = sorted(int(x[:20]) for x in os.listdir(tmp_path) if x.endswith(".log"))
    path = tmp_path / segment_name(bases[1])
    _off, pos, size = record_positions(path)[-1]
    os.truncate(path, pos + size // 2)
    report = check(tmp_path)
    seg = next(s for s in report.segments if s.base_offset == bases[1])
    assert not seg.ok and seg.first_bad_position == pos
    with CommitLog(tmp_path, router_id="r1", segment_bytes=8192) as log:
        got = [r.offset for r in log.read(0, 10_000, 1 << 30)]
    assert got == [o for o in range(300) if o != bases[2] - 1]


# --------------------------------------------------------------------------------------- indexes

def _index_entries(path) -> list[tuple[int, int, int]]:
    data = open(path, "rb").read()
    return [INDEX_ENTRY.unpack_from(data, p) for p in range(FILE_HEADER_SIZE, len(data), 16)]


@pytest.mark.parametrize("damage", ["missing", "stale", "garbage", "partial", "wrong_base"])
def test_bad_index_of_an_older_segment_is_rebuilt(tmp_path, damage, caplog):
    write_log(tmp_path, 300)
    bases = sorted(int(x[:20]) for x in os.listdir(tmp_path) if x.endswith(".log"))
    target = bases[1]
    ipath = tmp_path / index_name(target)
    good = open(ipath, "rb").read()
    if damage == "missing":
        os.unlink(ipath)
    elif damage == "stale":  # entries point at the wrong records (another segment's index, rebased)
        entries = _index_entries(ipath)
        with open(ipath, "r+b") as f:
            f.seek(FILE_HEADER_SIZE + 16 * (len(entries) - 1))
            rel, pos, ts = entries[-1]
            f.write(INDEX_ENTRY.pack(rel + 3, pos, ts))
    elif damage == "garbage":
        with open(ipath, "r+b") as f:
            f.seek(FILE_HEADER_SIZE + 16)
            f.write(os.urandom(64))
    elif damage == "partial":
        os.truncate(ipath, len(good) - 5)
    elif damage == "wrong_base":
        with open(ipath, "r+b") as f:
            f.seek(8)
            f.write((12345).to_bytes(8, "little"))
    assert not check(tmp_path).ok
    # Another process can still read through a bad index (it falls back to scanning).
    with LogReader(tmp_path) as reader:
        for start in (target, target + 5, target + 17):
            assert reader.read(start, 2)[0].offset == start
    with caplog.at_level(logging.WARNING, logger="brokerd.router.log.commitlog"):
        log = CommitLog(tmp_path, router_id="r1", segment_bytes=8192, index_interval_bytes=512)
    with log:
        assert any(f"index of segment {target} rebuilt" in r.getMessage() for r in caplog.records), \
            [r.getMessage() for r in caplog.records]
        assert open(ipath, "rb").read() == good
        for start in (target, target + 5, target + 17):
            assert log.read(start, 2)[0].offset == start
    assert check(tmp_path).ok


@pytest.mark.parametrize("damage", ["missing", "behind", "garbage"])
def test_index_of_the_last_segment_is_rebuilt(tmp_path, damage):
    write_log(tmp_path, 100)
    base, path = last_segment(tmp_path)
    ipath = tmp_path / index_name(base)
    good = open(ipath, "rb").read()
    assert len(good) > FILE_HEADER_SIZE + 16
    if damage == "missing":
        os.unlink(ipath)
    elif damage == "behind":  # a crash after the data write, before the index write
        os.truncate(ipath, FILE_HEADER_SIZE + 16)
    else:
        with open(ipath, "r+b") as f:
            f.seek(FILE_HEADER_SIZE)
            f.write(b"\xff" * 32)
    with CommitLog(tmp_path, router_id="r1", segment_bytes=8192, index_interval_bytes=512) as log:
        assert open(ipath, "rb").read() == good
        assert log.read(base + 7, 1)[0].offset == base + 7
        log.append("t/next", b"x")
    assert check(tmp_path).ok


def test_orphan_index_is_removed_and_reported(tmp_path):
    write_log(tmp_path, 50)
    orphan = tmp_path / index_name(999_999)
    orphan.write_bytes(b"whatever")
    report = check(tmp_path)
    assert not report.ok and any("has no segment" in p for p in report.problems)
    CommitLog(tmp_path).close()
    assert not orphan.exists()
    assert check(tmp_path).ok


def test_check_reports_an_incomplete_tail_without_failing(tmp_path):
    write_log(tmp_path, 30)
    base, path = last_segment(tmp_path)
    size = os.path.getsize(path)
    with open(path, "ab") as f:
        f.write(b"\x10\x00")  # the start of a record header: a write in progress or a crash
    report = check(tmp_path)
    last = report.segments[-1]
    assert last.ok and last.tail_incomplete and last.first_bad_position == size
    assert report.records == 30
    assert "incomplete record at the end" in report.format_text()
    with LogReader(tmp_path) as reader:  # a live reader treats it as "not written yet"
        assert reader.end_offset == 30
        assert len(reader.read(0, 1000, 1 << 30)) == 30


def test_a_rebuilt_index_is_written_once_header_and_entries(tmp_path):
    """``write_index`` writes the header and the entries exactly once. Compiled with mypyc, a
    write inside a memoryview slice's start (``view[os.write(fd, view):]``) ran twice, and a
    rebuilt index held every entry twice."""
    entries = b"".join(INDEX_ENTRY.pack(i, FILE_HEADER_SIZE + 100 * i, T0 + i) for i in range(15))
    write_index(str(tmp_path), 67, entries, fsync=False)
    data = (tmp_path / index_name(67)).read_bytes()
    assert len(data) == FILE_HEADER_SIZE + len(entries) and data[FILE_HEADER_SIZE:] == entries
