"""Edges of a session's move that lost what was acknowledged to its publishers: a session whose
expiry interval ran out while it moved (its spool removed under the export, the session ended
before the new owner had it). Real routers, a ``FakeClock`` for the expiry, the ``HandOnMesh``
recording what is handed on."""

from __future__ import annotations

import asyncio
import os

import pytest

from brokerd.connection.packets import Publish, Subscription
from brokerd.router.clock import FakeClock
from brokerd.router.log.commitlog import CommitLog
from brokerd.router.message import Message
from brokerd.router.router import Router, RouterConfig
from brokerd.router.spool import spooled
from tests.unit.conftest import HandOnMesh as Mesh
from tests.unit.conftest import online

pytestmark = pytest.mark.unit


def copy(payload: bytes) -> list:
    """A queue entry as a hand-on or a read-back brings it: a copy from another router's log."""
    return [1, False, Message("q/x", payload, 1, False, "p", "c/w0").to_list()]


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
            r.attach_log(log_, False)
            _, watcher = online(r, "watcher", ("will/#", 1))
            s = r.new_session("m", True)
            s.expiry_s = 5
            r.subscribe(s, Subscription("q/#", 1))
            s.cursor = log_.next_offset
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
