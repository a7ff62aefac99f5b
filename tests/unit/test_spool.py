"""The spool a session moved from another node keeps its backlog beyond --max-queued in."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from brokerd.connection.packets import Publish, Subscription
from brokerd.router.log import CommitLog
from brokerd.router.message import Message
from brokerd.router.router import Router, RouterConfig
from brokerd.router.session import LogRange, Session, SessionLimits
from brokerd.router.spool import SpoolRange, SpoolWriter, collect, spool_dir
from tests.unit.conftest import FakeConn


def _items(n: int, size: int = 1000) -> list[list]:
    """Queue entries of ``n`` messages published on router m/w0 (logged there at offset i)."""
    return [[1, False, Message(f"m/{i}", b"%05d" % i + b"x" * size, qos=1, origin_router="m/w0",
                               origin_offset=i).to_list()] for i in range(n)]


def _numbers(entries: list) -> list[int]:
    return [int(Message.from_list(values).payload[:5]) for _, (_, _, values) in entries]


def test_a_spool_reads_back_what_was_written_in_batches_and_goes_only_when_discarded(tmp_path):
    log_dir = tmp_path / "n" / "w0"
    log_dir.mkdir(parents=True)
    w = SpoolWriter(str(log_dir))
    w.add(_items(1500))  # ~1.5 MB: more than one read of the file
    w.add(_items(1500)[1000:])
    rng = w.finish()
    assert os.path.dirname(rng.directory) == spool_dir(str(log_dir)) and w.count == 2000
    assert oct(os.stat(rng.directory).st_mode & 0o777) == "0o600"
    got: list[int] = []
    positions: list[int] = []
    while (entries := rng.read(256)) is not None:
        assert 0 < len(entries) <= 256
        got += _numbers(entries)
        positions += [p for p, _ in entries]
    assert got == list(range(1500)) + list(range(1000, 1500))
    assert positions == sorted(positions) and rng.start == rng.end
    # A position read back names its entry: a range from there starts with it.
    again = SpoolRange(rng.directory, positions[700], rng.end, owned=False)
    assert _numbers(again.read(1)) == [700]
    assert os.path.exists(rng.directory)  # read to its end, but not let go yet
    rng.discard()
    assert not os.path.exists(rng.directory)


def test_a_spool_marks_the_newest_copy_of_each_origin_router(tmp_path):
    """A session taken from a replica asks every router for what it published after the copies
    it brought: with the copies spooled, not queued, the marks are taken as they are written
    (before, the new owner read them off its queue; with an empty queue it asked from a time
    ten seconds before its position, hit --max-queued and missed the newest: chaos seed
    912392808 lost 206)."""
    log_dir = tmp_path / "n" / "w0"
    log_dir.mkdir(parents=True)
    w = SpoolWriter(str(log_dir))
    w.add([[1, False, Message("t", b"x", 1, origin_router=r, origin_offset=o).to_list()]
           for r, o in (("c/w0", 5), ("c/w1", 9), ("c/w0", 7), ("c/w0", 6))])
    state: dict = {}
    w.finish_into(state)
    assert state["spool_marks"] == {"c/w0": 7, "c/w1": 9}
    # Where the copies lie in their origins' logs: c/w0's came out of order (7 before 6).
    assert state["spool"][3] == {"c/w0": [5, 7, False], "c/w1": [9, 9, True]}
    os.unlink(state["spool"][0])


def test_a_spool_s_spans_move_past_what_is_read_where_each_origin_came_in_order(tmp_path):
    """What a lost node's spool held is read back from the origins' logs (``Session.copy_spans``):
    from the first entry not read yet, where an origin's copies came in order; from its first
    one where they did not (the reader cannot tell what is still ahead); no span once read."""
    log_dir = tmp_path / "n" / "w0"
    log_dir.mkdir(parents=True)
    w = SpoolWriter(str(log_dir))
    w.add([[1, False, Message("t", b"x", 1, origin_router=r, origin_offset=o).to_list()]
           for r, o in (("a/w0", 10), ("b/w0", 4), ("a/w0", 11), ("b/w0", 2), ("a/w0", 12), ("b/w0", 3))])
    w.add([[1, False, Message("t", b"x", 1).to_list()]])  # no origin log: nothing to note
    rng = w.finish()
    assert rng.spans == {"a/w0": [10, 12, True], "b/w0": [2, 4, False]}
    assert len(rng.read(3)) == 3
    assert rng.spans == {"a/w0": [12, 12, True], "b/w0": [2, 4, False]}
    again = SpoolRange(*rng.to_list(), owned=False)  # as a snapshot names it: the spans go along
    assert again.spans == rng.spans and again.start == rng.start
    assert len(rng.read(10)) == 4
    assert rng.spans == {"b/w0": [2, 4, False]}
    rng.discard()


def test_a_cut_spool_gives_what_is_whole_then_gives_up(tmp_path, caplog):
    log_dir = tmp_path / "n" / "w0"
    log_dir.mkdir(parents=True)
    w = SpoolWriter(str(log_dir))
    w.add(_items(10))
    rng = w.finish()
    with open(rng.directory, "r+b") as f:
        f.truncate(rng.end - 10)  # the last entry cut
    got = _numbers(rng.read(100))
    assert got == list(range(9))
    assert rng.read(100) is None
    assert "unreadable" in caplog.text


def test_a_same_node_move_gives_the_spool_a_second_name_and_start_up_keeps_what_is_named(tmp_path):
    node = tmp_path / "n"
    w0, w1 = node / "w0", node / "w1"
    w0.mkdir(parents=True)
    w1.mkdir()
    rng = SpoolWriter(str(w0)).finish()
    left = SpoolWriter(str(w0)).finish()  # a transfer no session names: collected at start
    other = SpoolWriter(str(w1)).finish()  # another router's: not this one's to collect
    moved = SpoolRange(*rng.to_list())
    moved.adopt(str(w1))
    assert os.path.basename(moved.directory).startswith("w1-") and os.path.exists(rng.directory)
    rng.discard()  # the old router lets its copy go: the new name still reads
    assert os.path.exists(moved.directory)
    assert collect(str(w0), []) == 1 and not os.path.exists(left.directory)
    assert collect(str(w1), [moved.directory]) == 1  # ``other`` went, the named one stays
    assert os.path.exists(moved.directory) and not os.path.exists(other.directory)


def _router(tmp_path: Path) -> tuple[Router, CommitLog]:
    router = Router(RouterConfig(router_id="n/w0", session=SessionLimits(max_inflight=5, max_queued=10)))
    log_ = CommitLog(tmp_path / "n" / "w0", router_id="n/w0", loop=asyncio.get_running_loop())
    router.attach_log(log_, False)
    return router, log_


def _moved_header(spooled: SpoolRange) -> dict:
    """A session's takeover header as a transfer from another node leaves it, with a spool."""
    old = Router(RouterConfig(router_id="m/w0"))
    s = old.new_session("dev", True)
    old.subscribe(s, Subscription("m/#", 1))
    header = s.export_header(False)
    header["spool"] = spooled.to_list()
    return header


def _moved_here(tmp_path: Path, n: int, size: int) -> tuple[Router, CommitLog, Session, SpoolRange]:
    """A router with a log, and a session moved to it from another node with ``n`` messages
    spooled (in the running loop)."""
    router, log_ = _router(tmp_path)
    w = SpoolWriter(log_.directory)
    w.add(_items(n, size))
    spooled = w.finish()
    return router, log_, router.import_session("dev", _moved_header(spooled)), spooled


def test_a_moved_session_reads_its_spool_in_order_and_a_snapshot_names_what_is_unacknowledged(tmp_path):
    """2,000 messages spooled: delivered in order through a window of 5; while some are in flight
    unacknowledged, the range the snapshot names starts at the oldest of them (a restart gives
    them again, not loses them); once all are acknowledged the range goes, and its file."""

    async def run() -> None:
        router, log_, session, spooled = _moved_here(tmp_path, 2000, 100)
        assert [r.copies for r in session.ranges] == [True] and session.cursor == log_.next_offset
        conn = FakeConn()
        session.attach(conn)  # type: ignore[arg-type]
        got: list[int] = []
        seen = 0
        checked = False
        for _ in range(5000):
            packets = conn.packets()
            new = [p for p in packets[seen:] if isinstance(p, Publish)]
            seen = len(packets)
            for p in new:
                got.append(int(p.payload[:5]))
            if len(got) >= 700 and not checked:
                # Five in flight, unacknowledged: the snapshot's range starts at the oldest.
                assert len(session.inflight) == 5
                oldest = min(int(e.msg.payload[:5]) for e in session.inflight.values())
                path, start, end, spans = session.range_values()[0]
                assert (path, end) == (spooled.directory, spooled.end)
                assert _numbers(SpoolRange(path, start, end, owned=False).read(1)) == [oldest]
                # Where the copies not acknowledged yet lie in their origin's log (read back
                # from there if this node is lost): from the oldest in flight to the last.
                assert session.copy_spans() == {"m/w0": [oldest, 1999]}
                # A move to another worker of this node passes the range on from there too, and
                # copies none of what the queue holds from it (read there again instead).
                assert session.export_header(True)["log"][0] == [path, start, end, spans]
                assert session.queue and [i for c in session.export_copies(True) for i in c] == []
                checked = True
            for p in new:
                session.puback(p.packet_id)
            if len(got) == 2000 and not session.inflight:
                break
            await asyncio.sleep(0)
        assert got == list(range(2000)) and checked
        for _ in range(200):  # the range goes on the pump after the last acknowledgement
            if not session.ranges:
                break
            await asyncio.sleep(0.01)
        assert not session.ranges and not os.path.exists(spooled.directory)
        assert session.copy_spans() == {}  # all acknowledged: nothing to read back anywhere
        log_.close()

    asyncio.run(run())


def test_a_spooled_backlog_moves_on_to_another_node_whole_and_its_file_goes_with_the_session(tmp_path):
    async def run() -> None:
        router, log_, session, spooled = _moved_here(tmp_path, 50, 10)
        copies = [item for chunk in session.export_copies(False, limit=None) for item in chunk]
        assert [int(Message.from_list(v).payload[:5]) for _, _, v in copies] == list(range(50))
        capped = [item for chunk in session.export_copies(False) for item in chunk]
        assert len(capped) == 10  # to a router that cannot spool: max_queued, as before
        assert os.path.exists(spooled.directory)  # an export reads it, leaves it
        router.drop_session(session)
        assert not os.path.exists(spooled.directory)
        log_.close()

    asyncio.run(run())


def test_a_spool_outside_the_node_spool_directory_is_not_taken(tmp_path):
    """A header naming a file elsewhere (a peer that lies) is neither read nor deleted."""

    async def run() -> None:
        router, log_ = _router(tmp_path)
        victim = tmp_path / "precious.spool"
        victim.write_bytes(b"keep")
        header = _moved_header(SpoolRange(str(victim), 0, 4))
        header["spool"] = None
        header["log"] = [[str(victim), 0, 4]]
        session = router.import_session("dev", header)
        assert not session.ranges
        router.drop_session(session)
        assert victim.read_bytes() == b"keep"
        log_.close()

    asyncio.run(run())


@pytest.mark.parametrize("n", [0, 1])
def test_collect_with_no_spool_directory_is_nothing(tmp_path, n):
    (tmp_path / "n" / "w0").mkdir(parents=True)
    if n:
        os.makedirs(spool_dir(str(tmp_path / "n" / "w0")))
    assert collect(str(tmp_path / "n" / "w0"), []) == 0


def test_a_sessions_copy_spans_name_another_workers_log_range_and_held_copies(tmp_path):
    """What a session holds outside its own router's log, by origin: a range of another worker's
    log (a move between workers of this node) from its start, and copies held in memory (a
    read-back's); a copy with no origin log (published with the log off) is in none."""
    s = Session("dev", True, SessionLimits(), Router(RouterConfig(router_id="n/w0")).stats)
    s.ranges = [LogRange(str(tmp_path / "data" / "n" / "w1"), 5, 20)]
    s.deliver_copy(Message("t", b"x", 1, origin_router="m/w3", origin_offset=40), 1, False)
    s.deliver_copy(Message("t", b"x", 1, origin_router="m/w3", origin_offset=42), 1, False)
    s.deliver_copy(Message("t", b"x", 1), 1, False)
    assert s.copy_spans() == {"n/w1": [5, 19], "m/w3": [40, 42]}


def test_copies_read_back_for_a_session_are_spooled_beyond_max_queued_and_come_after_what_it_has(tmp_path):
    """A read-back (a session taken from a replica asks every router for what it may have
    missed) is not bounded by --max-queued where the session's router has a log: an answer that
    does not fit below it is spooled and read as a range, and so is the next while a range is
    pending (the order stays). 30 copies with --max-queued 10 all arrive, in order, through a
    window of 5; live messages published meanwhile wait in the log and come after them. A small
    read-back, and a hand-on, wait in memory."""

    async def run() -> None:
        router, log_ = _router(tmp_path)
        session = router.new_session("dev", True)
        router.subscribe(session, Subscription("m/#", 1))
        conn = FakeConn()
        session.attach(conn)  # type: ignore[arg-type]
        items = _items(30, 10)
        router.take_copies("dev", items[:20], read_back=True)
        router.take_copies("dev", items[20:], read_back=True)
        assert [r.copies for r in session.ranges] == [True, True] and len(os.listdir(spool_dir(log_.directory))) == 2
        assert session.copy_spans() == {"m/w0": [0, 29]}
        router.publish(Message("m/live", b"99999", 1, client_id="pub", origin_router="n/w0"))
        got: list[int] = []
        seen = 0
        for _ in range(2000):
            packets = conn.packets()
            new = [p for p in packets[seen:] if isinstance(p, Publish)]
            seen = len(packets)
            got += [int(p.payload[:5]) for p in new]
            for p in new:
                session.puback(p.packet_id)
            if len(got) == 31 and not session.inflight and not session.ranges:
                break
            await asyncio.sleep(0.01)
        assert got == list(range(30)) + [99999]
        assert not os.listdir(spool_dir(log_.directory))  # read and acknowledged: gone
        router.take_copies("dev", _items(3, 10), read_back=True)  # fits: from memory
        router.take_copies("dev", _items(3, 10))  # a hand-on: from memory
        assert not session.ranges and len(session.inflight) == 5 and len(session.queue) == 1
        assert not os.listdir(spool_dir(log_.directory))
        log_.close()

    asyncio.run(run())
