"""Commit log write path: the positional append the broker uses, batches written together with
pwritev, fsync by size under ``interval``, and the page cache released behind the writer.

Real files in tmp_path; the page cache is observed with mincore(2) on a mapping of the segment.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import mmap
import os
from collections.abc import Iterator

import pytest

from brokerd.router.log import CommitLog, LogReader, check
from brokerd.router.log.writer import DROP_STEP, INLINE_MAX_BYTES, Report, _pwritev_all

T0 = 1_700_000_000_000


def fields(i: int) -> tuple:
    """Positional ``append_bytes`` arguments for offset i, sizes varied so chunks straddle pages."""
    return (f"t/{i % 5}/x".encode(), bytes([i % 251]) * (i * 53 % 900), i % 3, i % 4 == 0,
            f"client-{i % 7}".encode(), b"" if i % 3 else b"\x01p", T0 + i)


def files(directory) -> dict[str, bytes]:
    return {name: open(os.path.join(directory, name), "rb").read() for name in sorted(os.listdir(directory))}


def test_append_bytes_writes_what_append_writes(tmp_path):
    a = CommitLog(tmp_path / "a", router_id="r1", segment_bytes=8192, index_interval_bytes=512)
    b = CommitLog(tmp_path / "b", router_id="r1", segment_bytes=8192, index_interval_bytes=512)
    for i in range(200):
        topic, payload, qos, retain, client, props, ts = fields(i)
        assert a.append(topic.decode(), payload, qos=qos, retain=retain, client_id=client.decode(),
                        properties=props, timestamp_ms=ts) == i
        assert b.append_bytes(topic, payload, qos, retain, client, props, ts) == i
    assert a.append("fw", b"x", client_id="c", origin_router="r9", origin_offset=77, timestamp_ms=T0) == 200
    assert b.append_bytes(b"fw", b"x", 0, False, b"c", b"", T0, b"r9", 77) == 200
    a.close()
    b.close()
    assert files(tmp_path / "a") == files(tmp_path / "b")
    with LogReader(tmp_path / "b") as reader:
        last = reader.read(200)[0]
    assert (last.origin_router, last.origin_offset) == ("r9", 77)


def test_append_bytes_validation_leaves_the_batch_untouched(tmp_path):
    log = CommitLog(tmp_path, router_id="r1")
    log.append_bytes(b"t", b"ok", 0, False, b"c", b"", T0)
    with pytest.raises(ValueError):
        log.append_bytes(b"t", b"bad", 3, False, b"c", b"", T0)
    with pytest.raises(ValueError):
        log.append_bytes(b"t" * 70_000, b"bad", 0, False, b"c", b"", T0)
    assert log.append_bytes(b"t", b"ok2", 1, False, b"c", b"", T0) == 1
    log.close()
    with LogReader(tmp_path) as reader:
        assert [r.payload for r in reader.read(0)] == [b"ok", b"ok2"]


class _Collect:
    """Stands in for the writer core so that several flushed batches reach it in one round."""

    def __init__(self) -> None:
        self.batches: list = []

    def process(self, batches, **_kw) -> Report:
        self.batches += batches
        return Report(-1, -1, None, False)


def test_batches_written_together_equal_batches_written_one_by_one(tmp_path, monkeypatch):
    """A busy writer finds many batches queued and writes each run of them with one pwritev; the
    files must be byte for byte what writing them one at a time gives, across segment rolls."""
    kw = dict(router_id="r1", segment_bytes=48 << 10, index_interval_bytes=700, fsync="never")
    one = CommitLog(tmp_path / "one", **kw)
    grouped = CommitLog(tmp_path / "grouped", **kw)
    core = grouped._core
    collect = grouped._handoff._core = _Collect()  # type: ignore[assignment]  # the flushes reach it
    for i in range(400):
        one.append_bytes(*fields(i))
        grouped.append_bytes(*fields(i))
        if i % 9 == 8:
            one.flush()
            grouped.flush()
    one.flush()
    grouped.flush()
    batches = collect.batches
    assert len(batches) > 40
    # The views of each write of records or index entries, counted at the system calls: the
    # compiled writer calls its own functions directly. At 0 a write is a file's header.
    calls = []
    real_pwritev, real_pwrite = os.pwritev, os.pwrite

    def counting_pwritev(fd, views, pos):
        calls.append(len(views))
        return real_pwritev(fd, views, pos)

    def counting_pwrite(fd, data, pos):
        if pos:
            calls.append(1)
        return real_pwrite(fd, data, pos)

    monkeypatch.setattr(os, "pwritev", counting_pwritev)
    monkeypatch.setattr(os, "pwrite", counting_pwrite)
    grouped._handoff._core = core
    grouped._apply_report(core.process(batches))
    assert grouped.written_offset == 399
    chunks = sum(len(b.chunks) for b in batches)
    assert len(grouped.segments()) >= 3
    assert len(calls) <= 2 * len(grouped.segments())  # one pwritev of data, one of index, per segment
    assert sum(calls) >= chunks
    one.close()
    grouped.close()
    assert files(tmp_path / "one") == files(tmp_path / "grouped")
    assert check(tmp_path / "grouped").ok


def test_pwritev_all_finishes_a_short_write(tmp_path, monkeypatch):
    path = tmp_path / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        real = os.pwritev
        monkeypatch.setattr(os, "pwritev", lambda fd_, views, pos: real(fd_, [bytes(views[0][:3])], pos))
        _pwritev_all(fd, [memoryview(b"abcdef"), memoryview(b"ghij"), b"klm"], 10)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"\0" * 10 + b"abcdefghijklm"


def test_interval_fsyncs_once_max_unsynced_bytes_are_written(tmp_path):
    log = CommitLog(tmp_path, router_id="r1", fsync="interval", fsync_interval_ms=3_600_000,
                    max_unsynced_bytes=64 << 10)
    for _ in range(50):
        log.append_bytes(b"t", b"x" * 1000, 1, False, b"c", b"", T0)
    log.flush()
    assert log.durable_offset == -1  # 50 KiB: below the threshold, the hour has not passed
    for _ in range(50):
        log.append_bytes(b"t", b"x" * 1000, 1, False, b"c", b"", T0)
        log.flush()
    # fsynced as soon as 64 KiB (62 records of 1052 B) were waiting, without a request
    assert 61 <= log.durable_offset < 99
    log.close()
    with pytest.raises(ValueError):
        CommitLog(tmp_path, max_unsynced_bytes=0)
    with pytest.raises(ValueError):
        CommitLog(tmp_path, page_cache_bytes=-1)


# ------------------------------------------------------------------------------ page cache release

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def resident(path) -> list[bool]:
    """Which pages of ``path`` are in the page cache (mincore over a private read mapping)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as mm:
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = (ctypes.c_ubyte * pages)()
        addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
        try:
            if _libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore")
        finally:
            del addr
        return [bool(v & 1) for v in vec]


def _release_works(directory) -> bool:
    """DONTNEED drops clean pages on disk file systems, not on tmpfs (its pages are the file)."""
    path = os.path.join(directory, "probe")
    with open(path, "wb") as f:
        f.write(b"x" * (1 << 20))
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    try:
        return not any(resident(path))
    finally:
        os.unlink(path)


@pytest.fixture
def cache_dir(tmp_path) -> Iterator[str]:
    if not hasattr(os, "posix_fadvise"):
        pytest.skip("no posix_fadvise")
    if not _release_works(tmp_path):
        pytest.skip("this file system keeps pages after POSIX_FADV_DONTNEED (tmpfs?)")
    yield str(tmp_path / "log")


@pytest.fixture
def advice(monkeypatch) -> list[tuple[int, int]]:
    """The ranges (start, length; 0: to the end) the writer asks the kernel to drop, recorded on
    the way to the real ``posix_fadvise(DONTNEED)``: what the log decides, apart from what the
    kernel does besides. A machine's own reclaim pages out young pages the log left alone (DAMON's
    ``pageout`` on a cloud VM: a region cold for a minute, with this test's new pages in it), so
    that the newest pages are still cached is asked of the log's requests, not of ``mincore``."""
    from brokerd.router.log import writer

    calls: list[tuple[int, int]] = []
    real = writer._FADVISE

    def spy(fd: int, start: int, length: int, how: int) -> None:
        calls.append((start, length))
        real(fd, start, length, how)

    monkeypatch.setattr(writer, "_FADVISE", spy)
    return calls


@pytest.mark.parametrize("fsync", ["always", "interval", "never"])
def test_page_cache_is_released_behind_the_writer(cache_dir, advice, fsync):
    keep = 1 << 20
    log = CommitLog(cache_dir, router_id="r1", fsync=fsync, page_cache_bytes=keep,
                    max_unsynced_bytes=256 << 10)
    payload = os.urandom(4000)
    for i in range(1600):  # ~6.3 MiB in 64 KiB batches
        log.append_bytes(b"t", payload, 1, False, b"c", b"", T0)
        if i % 16 == 15:
            log.flush(fsync=fsync == "never" and i % 512 == 511)
    log.flush()
    seg = log.segments()[-1]
    pages = resident(seg.path)
    size = seg.written_size
    assert advice, "nothing released"
    assert all(0 < length and start + length <= size - keep for start, length in advice), (
        f"the newest page_cache_bytes stay cached for readers: {advice}")
    released = pages[:(size - keep - DROP_STEP) // mmap.PAGESIZE]
    if fsync == "never":
        # Without fsync a range is dropped once its writeback, started by the first request, is
        # done: most of it is, by the next request a MiB later.
        assert released.count(True) < len(released) // 2
    else:
        assert not any(released), "written-back pages older than the window are released"
    # Reading released records goes to the disk and gives the same bytes.
    recs = log.read(0, max_records=2000, max_bytes=64 << 20)
    assert len(recs) == 1600 and all(r.payload == payload for r in recs)
    log.close()


def test_page_cache_left_alone_when_disabled(cache_dir, advice):
    log = CommitLog(cache_dir, router_id="r1", fsync="always", page_cache_bytes=None,
                    segment_bytes=1 << 20)
    for _ in range(1000):  # ~4 MiB: three segments retired, the fourth closed
        log.append_bytes(b"t", b"y" * 4000, 1, False, b"c", b"", T0)
        log.flush()
    assert len(log.segments()) >= 4
    log.close()
    assert advice == [], "pages released with page_cache_bytes=None"


def test_small_batches_are_written_by_the_loop_and_fsynced_by_the_thread(tmp_path):
    """A quiet broker's batch is a message or two: the loop writes it itself (the records are in
    the file when ``flush`` returns: no hand-off to the thread and no report back), and the thread
    still fsyncs it within the interval although nothing was queued for it. A big batch, and every
    batch under ``always``, still goes to the thread."""
    async def main():
        log = await CommitLog.open_async(tmp_path / "interval", fsync="interval", fsync_interval_ms=30)
        for _ in range(3):
            off = log.append("t", b"quiet")
            log.flush()
            assert log.written_offset == off and log.durable_offset < off
            assert await asyncio.wait_for(log.wait_durable(off), 5) >= off
            assert log.durable_offset == off
        big = log.append("t", bytes(INLINE_MAX_BYTES))
        log.flush()
        assert log.written_offset < big  # the thread writes it and reports on a later iteration
        assert await asyncio.wait_for(log.wait_durable(big), 5) >= big
        await log.aclose()
        always = await CommitLog.open_async(tmp_path / "always", fsync="always")
        off = always.append("t", b"x")
        always.flush()
        assert always.written_offset < off
        assert await asyncio.wait_for(always.wait_durable(off), 5) == off
        await always.aclose()

    asyncio.run(main())
    assert check(tmp_path / "interval").ok and check(tmp_path / "always").ok


def test_the_loops_short_write_gives_the_general_paths_files_and_falls_back_on_a_failure(tmp_path, monkeypatch):
    """``WriterCore.write_one``, the loop's write of a one-chunk batch at the end of the active
    segment, leaves the files byte for byte as ``process`` does (index entries and segment rolls
    included: those batches take the general path), reports the same offsets, and a write that
    fails there goes the general way, which fails the log."""
    kw = dict(router_id="r1", segment_bytes=16 << 10, index_interval_bytes=700, fsync="interval")
    short = CommitLog(tmp_path / "short", **kw)
    general = CommitLog(tmp_path / "general", **kw)
    took = 0
    for i in range(300):
        for log in (short, general):
            log.append_bytes(*fields(i))
            log.flush() if log is general else None
        before = short._core.rounds
        batch = short._flush_v2()
        short._inflight.append(batch)
        backlog_before = len(short._core._backlog)
        report = short._core.write_one(batch)
        took += len(batch.chunks) == 1 and not batch.chunks[0].new_segment and backlog_before == 0
        short._apply_report(report)
        assert short._core.rounds == before + 1 and report.error is None
        assert short.written_offset == general.written_offset == i
    assert took > 250 and len(short.segments()) >= 3
    short.close()
    general.close()
    assert files(tmp_path / "short") == files(tmp_path / "general")
    assert check(tmp_path / "short").ok

    log = CommitLog(tmp_path / "failing", **kw)
    log.append_bytes(*fields(0))
    log.flush()  # the segment exists and is the active one: the next batch can take the short path
    log.append_bytes(*fields(1))
    batch = log._flush_v2()
    log._inflight.append(batch)

    def full(fd, views, pos):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "pwritev", full)
    monkeypatch.setattr(os, "pwrite", full)
    report = log._core.write_one(batch)
    assert isinstance(report.error, OSError) and report.written_offset == 0
    # Held, to be written again on recovery, with everything written but not yet fsynced.
    assert [b.last_offset for b in log._core._backlog] == [0, 1] and log._core._backlog[-1] is batch
    monkeypatch.undo()
    log._apply_report(report)
    assert log.error is report.error
    log.close()


def test_an_older_report_does_not_undo_a_newer_failure(tmp_path):
    """Reports reach the log from the thread (through the loop's queue, later) and from the loop's
    own writes (at once): one from an earlier round arriving after a failure must not clear it."""
    log = CommitLog(tmp_path, router_id="r1")
    log.append("t", b"x")
    log.flush()
    err = OSError(28, "No space left on device")
    log._apply_report(Report(0, 0, err, False, round=7))
    assert log.error is err
    log._apply_report(Report(0, 0, None, False, round=6))  # stale: says nothing of now
    assert log.error is err
    log._apply_report(Report(0, 0, None, True, round=8))  # a newer healthy round clears it
    assert log.error is None
    log.close()
