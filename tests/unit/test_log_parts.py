"""The parts ``CommitLog`` is assembled from, each on its own: values in, values out, no writer.

``LogSegments`` (the state they share), ``ActiveSegment`` (placing batches), ``Durability`` (the
writer's reports), ``Handoff`` (requests to the writer), retention and the field checks. The log
as a whole is tested in ``test_log.py`` and beside it.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque

import msgpack
import pytest

from brokerd.router.log import fields
from brokerd.router.log.active import ActiveSegment
from brokerd.router.log.durability import Durability
from brokerd.router.log.errors import LogUnavailable
from brokerd.router.log.format import BATCH_HEADER_SIZE, FILE_HEADER_SIZE, INDEX_ENTRY_SIZE
from brokerd.router.log.handoff import Handoff
from brokerd.router.log.messages import Batch, Chunk, Report
from brokerd.router.log.retention import drop_past_retention
from brokerd.router.log.segments import LogSegments, Seg

T0 = 1_700_000_000_000


def seg(base: int, size: int = 1000, last: int | None = None, max_ts: int | None = T0,
        written: int | None = None) -> Seg:
    return Seg("d", base, size, size if written is None else written, last, max_ts)


def segments_of(*segs: Seg) -> LogSegments:
    out = LogSegments()
    for s in segs:
        out.add(s)
    return out


def record(i: int, payload: bytes = b"x" * 100) -> tuple:
    """A record's field tuple as ``append_fields`` keeps it."""
    return (T0 + i, "r1", i, "c", "t", 1, False, b"", payload)


def test_the_segments_stay_one_list_in_order_whatever_joins_or_leaves():
    segments = segments_of(seg(100, last=149), seg(150))
    kept = segments.all
    segments.prepend([seg(0, last=49), seg(50, last=99)])
    assert [s.base for s in segments.all] == segments.bases == [0, 50, 100, 150]
    assert all(segments.by_base[s.base] is s for s in segments.all)
    segments.drop_oldest(3)
    assert segments.bases == [150] and list(segments.by_base) == [150]
    assert segments.all is kept, "the list is changed in place: the parts keep a reference to it"


def test_a_read_starts_at_the_segment_that_holds_the_offset():
    segments = segments_of(seg(0), seg(50), seg(100))
    assert [s.base for s in segments.starting(75)] == [50, 100]
    assert [s.base for s in segments.starting(100)] == [100]
    assert [s.base for s in segments.starting(-5)] == [0, 50, 100]  # below the log: from its start


def test_the_active_segments_last_offset_counts_records_not_flushed_yet():
    segments = segments_of(seg(0, last=49), seg(50, last=60))
    states = segments.states(next_offset=70)
    assert [(s.base_offset, s.last_offset, s.active) for s in states] == [(0, 49, False), (50, 69, True)]
    assert segments_of(seg(50)).states(next_offset=50)[0].last_offset is None  # empty active segment


def test_retention_takes_the_oldest_segments_out_and_says_which():
    segments = segments_of(seg(0, last=9, max_ts=T0), seg(10, last=19, max_ts=T0 + 3_600_000),
                           seg(20, max_ts=T0 + 3_600_000))
    deleted = drop_past_retention(segments, None, 1.0, now_ms=T0 + 3_600_000 + 1)
    assert [(d.base_offset, d.last_offset, d.reason) for d in deleted] == [(0, 9, "age")]
    assert segments.bases == [10, 20]
    deleted = drop_past_retention(segments, 1000, None, now_ms=T0)
    assert [(d.base_offset, d.reason) for d in deleted] == [(10, "size")]
    assert segments.bases == [20], "never the active one"


def test_retention_keeps_a_segment_with_data_not_yet_written():
    segments = segments_of(seg(0, written=500), seg(10))
    assert drop_past_retention(segments, 0, None, now_ms=T0) == []
    assert segments.bases == [0, 10]


# ------------------------------------------------------------------------------------ ActiveSegment


def active_segment(segment_bytes: int = 4096, index_interval: int = 1) -> tuple[ActiveSegment, LogSegments]:
    segments = LogSegments()
    return ActiveSegment("d", segment_bytes, index_interval, segments, msgpack.Packer().pack), segments


def place(active: ActiveSegment, first: int, recs: list[tuple]) -> list[Chunk]:
    return active.place(first, recs, msgpack.packb(recs))


def test_the_first_batch_opens_a_segment_and_later_ones_continue_it():
    active, segments = active_segment()
    first = place(active, 0, [record(0), record(1)])
    assert [(c.base, c.file_pos, c.new_segment) for c in first] == [(0, FILE_HEADER_SIZE, True)]
    second = place(active, 2, [record(2)])
    assert [(c.base, c.new_segment) for c in second] == [(0, False)]
    assert second[0].file_pos == FILE_HEADER_SIZE + first[0].buf_end  # right after the first batch
    (only,) = segments.all
    assert only.size == active.size == second[0].file_pos + second[0].buf_end - second[0].buf_start
    assert only.last_offset == 2 and only.max_ts == T0 + 2


def test_a_batch_that_does_not_fit_is_cut_at_the_segment_boundary():
    active, segments = active_segment(segment_bytes=4096)
    recs = [record(i, b"y" * 1000) for i in range(10)]
    chunks = place(active, 0, recs)
    assert len(segments) > 1 and [c.base for c in chunks] == sorted(c.base for c in chunks)
    assert all(s.size <= 4096 for s in segments.all)
    assert segments.bases == sorted({c.base for c in chunks})
    assert segments.all[-1].last_offset == 9
    assert all(s.last_offset == nxt.base - 1 for s, nxt in itertools.pairwise(segments.all))


def test_a_record_bigger_than_a_segment_gets_a_segment_of_its_own():
    active, segments = active_segment(segment_bytes=4096)
    place(active, 0, [record(0)])
    chunks = place(active, 1, [record(1, b"z" * 10_000), record(2)])
    assert [c.base for c in chunks] == [1, 2]
    assert segments.bases == [0, 1, 2] and segments.all[1].size > 4096


def test_a_segment_of_the_other_version_is_never_appended_to():
    active, segments = active_segment()
    segments.add(seg(0, size=FILE_HEADER_SIZE + 100, last=4))
    active.resume(0, FILE_HEADER_SIZE + 100, FILE_HEADER_SIZE, FILE_HEADER_SIZE, T0)
    active.must_roll = True
    chunks = place(active, 5, [record(5)])
    assert [(c.base, c.new_segment) for c in chunks] == [(5, True)] and segments.bases == [0, 5]
    assert segments.all[0].last_offset == 4


def test_an_index_entry_per_interval_of_bytes():
    active, _ = active_segment(segment_bytes=1 << 20, index_interval=1000)
    entries = [c.index for i in range(20) for c in place(active, i, [record(i, b"w" * 300)])]
    assert entries[0] and len(entries[0]) == INDEX_ENTRY_SIZE  # the first batch is always indexed
    every = [i for i, e in enumerate(entries) if e]
    batch = BATCH_HEADER_SIZE + 300
    assert 1 < len(every) < 20 and all(b - a >= 1000 // batch for a, b in itertools.pairwise(every))


# --------------------------------------------------------------------------------------- Durability


class Hooks:
    """The log's side of ``Durability``: what refusing and accepting appends would do."""

    def __init__(self) -> None:
        self.calls: list[object] = []

    def failed(self, error: OSError) -> str:
        self.calls.append(error)
        return f"refused: {error}"

    def healthy(self) -> None:
        self.calls.append("healthy")


def durability(loop=None, last: int = -1) -> tuple[Durability, LogSegments, deque[Batch], Hooks]:
    segments, inflight, hooks = segments_of(Seg("d", 0, 0, FILE_HEADER_SIZE, None, None)), deque(), Hooks()
    return Durability("d", loop, segments, inflight, last, hooks.failed, hooks.healthy), segments, inflight, hooks


def test_a_written_report_retires_its_batches_and_moves_the_segments_written_end():
    d, segments, inflight, _ = durability()
    inflight.extend([Batch([Chunk(0, FILE_HEADER_SIZE, 0, 100, b"", 0, True, ())], 0, 4),
                     Batch([Chunk(0, FILE_HEADER_SIZE + 100, 100, 150, b"", 0, False, ())], 5, 9)])
    seen: list[tuple[str, int]] = []
    d.on_written(lambda o: seen.append(("written", o)))
    unregister = d.on_durable(lambda o: seen.append(("durable", o)))
    d.apply(Report(4, -1, None, False, round=1))
    assert [b.first_offset for b in inflight] == [5] and segments.all[0].written_end == FILE_HEADER_SIZE + 100
    d.apply(Report(9, 9, None, False, round=2))
    assert not inflight and segments.all[0].written_end == FILE_HEADER_SIZE + 150
    assert seen == [("written", 4), ("written", 9), ("durable", 9)]
    unregister()
    d.apply(Report(9, 9, None, False, round=3))  # nothing moved: nobody is called
    assert d.written_offset == d.durable_offset == 9 and len(seen) == 3


def test_a_failure_refuses_appends_once_and_a_newer_healthy_round_accepts_them_again():
    d, _, _, hooks = durability()
    errors: list[OSError | None] = []
    d.on_error(errors.append)
    err = OSError(28, "No space left on device")
    d.apply(Report(-1, -1, err, False, round=5))
    d.apply(Report(-1, -1, err, False, round=6))  # a retry that failed too: said once
    d.apply(Report(-1, -1, None, False, round=4))  # older than the failure: says nothing of now
    assert d.error is err and hooks.calls == [err] and errors == [err]
    d.apply(Report(0, 0, None, True, round=7))
    assert d.error is None and hooks.calls == [err, "healthy"] and errors == [err, None]


def test_waiters_that_fail_on_error_fail_and_the_patient_ones_wait_for_the_disk():
    async def run() -> None:
        d, _, _, _ = durability(asyncio.get_running_loop())
        failing = asyncio.ensure_future(d.wait(3, True, None))
        patient = asyncio.ensure_future(d.wait(3, False, None))
        await asyncio.sleep(0)
        d.fail(OSError(5, "EIO"))
        with pytest.raises(LogUnavailable, match="refused"):
            await asyncio.wait_for(failing, 1)
        assert not patient.done()
        d.apply(Report(3, 3, None, True, round=1))
        assert await asyncio.wait_for(patient, 1) == 3
        assert await d.wait(2, True, "refused: closed") == 3  # already durable: no refusal
        with pytest.raises(LogUnavailable):
            await d.wait(4, True, "refused: closed")
        late = asyncio.ensure_future(d.wait(4, False, None))
        await asyncio.sleep(0)
        d.close()
        with pytest.raises(LogUnavailable, match="closed"):
            await asyncio.wait_for(late, 1)

    asyncio.run(run())


def test_waiting_without_a_loop_is_refused():
    d, _, _, _ = durability()
    with pytest.raises(RuntimeError):
        asyncio.run(d.wait(0, True, None))


# ------------------------------------------------------------------------------------------ Handoff


class FakeCore:
    """Stands in for ``WriterCore`` in synchronous mode: records each round, reports ``error``."""

    def __init__(self) -> None:
        self.rounds: list[dict] = []
        self.error: OSError | None = None

    def process(self, batches, **kw) -> Report:
        self.rounds.append({"batches": [b.last_offset for b in batches], **kw})
        last = batches[-1].last_offset if batches else -1
        return Report(last, last, self.error, bool(kw.get("recover")), bool(kw.get("stop")), len(self.rounds))


def test_without_a_thread_each_request_is_a_round_of_the_core_applied_at_once():
    core, applied = FakeCore(), []
    handoff = Handoff("d", core, None, applied.append)  # type: ignore[arg-type]
    handoff.hand(Batch([], 0, 4), fsync=True)
    handoff.hand(None, fsync=True)
    handoff.delete([0, 10])
    assert handoff.recover() is True
    handoff.stop()
    handoff.join()
    final = handoff.final_report()
    assert core.rounds == [{"batches": [4], "force_sync": True}, {"batches": [], "force_sync": True},
                           {"batches": [], "deletes": [0, 10]}, {"batches": [], "recover": True},
                           {"batches": [], "recover": True, "stop": True}]
    assert [r.written_offset for r in applied] == [4, -1, -1] and final is not None and final.final


def test_without_a_thread_a_failed_write_raises_after_its_report_is_applied():
    core, applied = FakeCore(), []
    core.error = OSError(28, "No space left on device")
    handoff = Handoff("d", core, None, applied.append)  # type: ignore[arg-type]
    with pytest.raises(LogUnavailable, match="write failed"):
        handoff.hand(Batch([], 0, 0), fsync=False)
    assert [r.error for r in applied] == [core.error]


# ------------------------------------------------------------------------------------------- fields


def test_a_callers_fields_come_out_in_append_fields_order_as_str():
    got = fields.from_values(b"t", b"p", 1, True, "c", b"", b"o", 7, 123)
    assert got == (123, "o", 7, "c", "t", 1, True, b"", b"p")
    assert fields.from_bytes(b"t", b"p", 2, False, b"c", b"x", 5, None, None) == \
        (5, None, None, "c", "t", 2, False, b"x", b"p")


@pytest.mark.parametrize("bad", [dict(qos=3), dict(topic="é" * 0x8000), dict(client_id=b"c" * 0x10000)])
def test_fields_out_of_range_are_refused(bad):
    args = dict(topic="t", payload=b"", qos=0, retain=False, client_id="c", properties=b"",
                origin_router=None, origin_offset=None, timestamp_ms=None) | bad
    with pytest.raises(ValueError):
        fields.from_values(**args)
