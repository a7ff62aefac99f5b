"""Two edges of a session's move that lost what was acknowledged to its publishers: a move
confirmed after it was given up (with a log, the copies in no log that reached the session while
the move was in doubt), and a session whose expiry interval ran out while it moved (its spool
removed under the export, the session ended before the new owner had it). Real routers, a
``FakeClock`` for the expiry, the ``HandOnMesh`` recording what is handed on."""

from __future__ import annotations

import asyncio
import os

import pytest

from brokerd.connection.packets import Publish, Subscription
from brokerd.router.clock import FakeClock
from brokerd.router.log.commitlog import CommitLog
from brokerd.router.message import Message
from brokerd.router.router import Router, RouterConfig
from brokerd.router.session import Session, SessionLimits
from brokerd.router.spool import spooled
from tests.unit.conftest import HandOnMesh as Mesh
from tests.unit.conftest import online

pytestmark = pytest.mark.unit


def copy(payload: bytes) -> list:
    """A queue entry as a hand-on or a read-back brings it: a copy from another router's log."""
    return [1, False, Message("q/x", payload, 1, False, "p", "c/w0").to_list()]


def offline(r: Router, log_: CommitLog) -> Session:
    """A persistent session ``m`` on ``q/#`` of router ``r`` with ``log_``, offline: what is
    published for it waits in the log."""
    r.attach_log(log_, False)
    s = r.new_session("m", True)
    r.subscribe(s, Subscription("q/#", 1))
    s.cursor = log_.next_offset
    return s


def test_a_move_confirmed_late_hands_on_the_copies_in_no_log_it_got_while_in_doubt(tmp_path):
    """With a log, a move settled late (``moved_after_all``) reads what reached the session from
    this log (from its end at the export). Copies in no log of this router joined its queue (a
    hand-on from the router it came from, say) while it moved, and while in doubt, behind the
    backlog a move brought it (a spool, exported), a spool file of their own: both were dropped,
    with the queue and the ranges, at the late confirmation (acknowledged to their publishers,
    lost). Now they are handed on with the logged ones, once; the exported spool is not."""
    async def run() -> list[bytes]:
        log_ = CommitLog(tmp_path, router_id="a/w0", loop=asyncio.get_running_loop())
        try:
            mesh = Mesh()
            r = Router(RouterConfig(router_id="a/w0"), mesh)
            s = offline(r, log_)
            r.take_copies("m", [copy(b"exported")])  # (in its queue: exported)
            s.add_range(spooled(log_.directory, [copy(b"spooled-before")], False))  # (exported)
            r.publish(Message("q/x", b"logged-before", 1, False, "p", "a/w0"))  # (exported)
            assert r.release_session("m", False, None) is not None
            r.take_copies("m", [copy(b"handed-on-while-moving")])
            r.moved("m", False, "b/w0", doubt=True)
            assert r.sessions.get("m") is s and "m" in r.in_doubt
            r.publish(Message("q/x", b"logged-in-doubt", 1, False, "p", "a/w0"))
            r.take_copies("m", [copy(b"handed-on-in-doubt")])  # (spooled behind the backlog)
            r.take_copies("m", [copy(b"read-back-in-doubt%d" % i) for i in range(3)], read_back=True)
            assert len(s.ranges) == 3, "not spooled behind the backlog: the test misses that path"
            spools = [rng.directory for rng in s.ranges]
            r.moved_after_all("m", "b/w0")
            assert "m" not in r.sessions
            assert not any(os.path.exists(p) for p in spools), "a spool stays behind"
            [(to, cid, items)] = mesh.handed
            assert (to, cid) == ("b/w0", "m")
            return [values[1] for _, _, values in items]
        finally:
            log_.close()

    handed = asyncio.run(run())
    assert handed[0] == b"handed-on-while-moving", "what came first is not handed on first"
    assert sorted(handed) == sorted([b"handed-on-while-moving", b"handed-on-in-doubt", b"logged-in-doubt",
                                     *(b"read-back-in-doubt%d" % i for i in range(3))]), \
        "lost, or handed on twice: what reached the session after its export"


def test_a_move_confirmed_late_hands_on_all_that_waited_in_the_log_not_max_queued(tmp_path):
    """What a move in doubt got meanwhile waits in the log; the late hand-on read it bounded
    by ``--max-queued`` (as an export to a node without a log is) and dropped the rest, counted
    as ``queue_full``: acknowledged messages lost after a cut of a minute or more. The new
    owner takes a hand-on unbounded and the mesh frames it: all of it goes now."""
    async def run() -> tuple[list[bytes], int]:
        log_ = CommitLog(tmp_path, router_id="a/w0", loop=asyncio.get_running_loop())
        try:
            mesh = Mesh()
            r = Router(RouterConfig(router_id="a/w0", session=SessionLimits(max_queued=10)), mesh)
            offline(r, log_)
            assert r.release_session("m", False, None) is not None
            r.moved("m", False, "b/w0", doubt=True)
            for i in range(25):
                r.publish(Message("q/x", b"in-doubt%d" % i, 1, False, "p", "a/w0"))
            r.moved_after_all("m", "b/w0")
            [(_, _, items)] = mesh.handed
            return [values[1] for _, _, values in items], r.stats.drop_queue_full
        finally:
            log_.close()

    handed, dropped = asyncio.run(run())
    assert (handed, dropped) == ([b"in-doubt%d" % i for i in range(25)], 0)


@pytest.mark.parametrize("same_node", [False, True])
def test_a_session_whose_expiry_runs_out_while_it_moves_is_not_ended_under_the_move(tmp_path, same_node):
    """An offline session's expiry timer ran on while a client took the session over elsewhere.
    Firing before the new owner confirmed, it ended the session here: its spool was deleted
    while the export had still to read it (to another node: ``spool ... is gone``; on this
    node: the new owner links it at its import), its delayed will went out although the will
    had gone with the session, and the confirmation then found no session here, so nothing
    that reached it during the move was handed on. The move stops the timer now (a failed
    move starts it again: next test)."""
    clock = FakeClock()

    async def run() -> tuple[list[bytes], list, list[bytes]]:
        log_ = CommitLog(tmp_path, router_id="a/w0", loop=asyncio.get_running_loop())
        try:
            mesh = Mesh()
            r = Router(RouterConfig(router_id="a/w0"), mesh, clock=clock)
            _, watcher = online(r, "watcher", ("will/#", 1))
            s = offline(r, log_)
            s.expiry_s = 5
            s.add_range(spooled(log_.directory, [copy(b"spooled%d" % i) for i in range(3)], False))
            spool = s.ranges[0].directory
            s.will = Message("will/m", b"gone", 1, False, "m", "a/w0")  # (a delayed one: it goes with the session)
            r.schedule_expiry(s)
            released = r.release_session("m", same_node, None)
            assert released is not None
            header, chunks = released
            clock.advance(6)  # its interval runs out while the new owner takes it in
            assert os.path.exists(spool), "the spool the move is still reading was deleted"
            exported = [values[1] for chunk in chunks for _, _, values in chunk]
            r.publish(Message("q/x", b"published-while-moving", 1, False, "p", "a/w0"))
            r.moved("m", True, "b/w0")
            wills = [p.payload for p in watcher.packets() if isinstance(p, Publish)]
            return exported, header["log"], [values[1] for _, _, items in mesh.handed for _, _, values in items] + \
                [b"will:" + w for w in wills]
        finally:
            log_.close()

    exported, positions, after = asyncio.run(run())
    if same_node:
        assert [p[0] for p in positions if str(p[0]).endswith(".spool")], "the spool's position was not exported"
    else:
        assert exported == [b"spooled%d" % i for i in range(3)], "the spool's copies were not exported"
    assert after == [b"published-while-moving"], "not handed on, or a will published for a session that moved"


def test_a_move_that_fails_after_the_expiry_interval_ran_out_starts_it_again():
    """The move stopped the timer; a move that fails leaves the session here, offline, as if its
    client had just gone: its interval runs again from then, in full."""
    clock = FakeClock()
    r = Router(RouterConfig(router_id="a/w0"), Mesh(), clock=clock)
    s = r.new_session("m", True)
    s.expiry_s = 5
    r.subscribe(s, Subscription("q/#", 1))
    r.schedule_expiry(s)
    assert r.release_session("m", False, None) is not None
    clock.advance(6)
    assert r.sessions.get("m") is s, "ended while it moved"
    r.moved("m", False, "b/w0")
    clock.advance(4.9)
    assert r.sessions.get("m") is s and len(r.subs) == 1
    clock.advance(0.2)
    assert "m" not in r.sessions and len(r.subs) == 0
