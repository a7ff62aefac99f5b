"""A session's move while deliveries go on reaching it: its export is read in chunks, one per loop
turn (``cluster.mesh.transfer``), and the session stays subscribed on the old router until its
new owner confirms. Every message it got before the confirmation goes to the new owner, once
exported or handed on, in order; nothing between two chunks breaks the export."""

from __future__ import annotations

import asyncio

import pytest

from brokerd.connection.packets import Subscription
from brokerd.router.message import Message
from brokerd.router.router import Router, RouterConfig
from brokerd.router.session import SessionLimits
from tests.unit.conftest import HandOnMesh as Mesh

PAD = b"x" * 1024


def name_of(payload: bytes) -> bytes:
    return payload.split(b":", 1)[0]


@pytest.mark.parametrize("same_node", [False, True])
@pytest.mark.parametrize("fill", [10, 2500])
def test_deliveries_while_a_session_moves_without_a_log_are_exported_or_handed_on(same_node, fill):
    """Without a log an offline session's queue holds its backlog, and deliveries join it while
    it moves. Before, the export read the queue itself: over two chunks (2 MiB) a delivery
    between two chunks raised "deque mutated during iteration" (the transfer failed, the CONNECT
    was refused, again on each retry while publishers kept on), and what joined the queue after
    the last chunk was dropped with the queue at the confirmation, before the new owner's
    interest was known here (lost: the publishers had their PUBACKs; ``fill`` 10: one chunk).
    Published here and on a third router."""
    async def run() -> tuple[list[bytes], list[bytes], list[str]]:
        mesh = Mesh()
        r = Router(RouterConfig(router_id="a/w0", session=SessionLimits(max_queued=10_000)), mesh)
        s = r.new_session("m", True)
        r.subscribe(s, Subscription("q/#", 1))
        for i in range(fill):  # 2500: 2.5 MiB, three chunks and a half
            r.publish(Message("q/x", b"fill%d:" % i + PAD, 1, False, "p", "a/w0"))
        released = r.release_session("m", same_node, None)
        assert released is not None
        _, chunks = released
        exported: list[bytes] = []
        n = 0
        for chunk in chunks:  # as the mesh reads them: a delivery or two between each
            exported += [values[1] for _, _, values in chunk]
            for origin in ("a/w0", "c/w0"):
                r.publish(Message("q/x", b"during%d:" % n, 1, False, "p", origin))
                n += 1
        r.publish(Message("q/x", b"after-the-last-chunk:", 1, False, "p", "c/w0"))
        r.moved("m", True, "b/w0")
        r.publish(Message("q/x", b"after-the-hand-on:", 1, False, "p", "c/w0"))  # (b/w0's now)
        [(to, cid, items)] = mesh.handed
        return exported, [values[1] for _, _, values in items], [to, cid]

    exported, handed, where = asyncio.run(run())
    assert where == ["b/w0", "m"]
    assert [name_of(p) for p in exported] == [b"fill%d" % i for i in range(fill)]
    assert len(handed) >= (4 if fill > 1000 else 2), "lost: what reached it while it moved"
    assert [name_of(p) for p in handed] == [b"during%d" % i for i in range(len(handed) - 1)] + \
        [b"after-the-last-chunk"]


def test_copies_not_in_the_log_that_reach_a_moving_session_are_handed_on(tmp_path):
    """With a log, what is logged for a moving session is read from the log after the move
    (from its end at the export). A copy that is in no log of this router (a hand-on or a
    read-back for the session, which had just arrived here, taken while it moves on) joins its
    queue: it was dropped with the queue at the confirmation; it is handed on now, with the
    logged ones."""
    from brokerd.router.log.commitlog import CommitLog

    async def run() -> list[bytes]:
        log_ = CommitLog(tmp_path, router_id="a/w0", loop=asyncio.get_running_loop())
        try:
            mesh = Mesh()
            r = Router(RouterConfig(router_id="a/w0"), mesh)
            r.attach_log(log_, False)
            s = r.new_session("m", True)
            r.subscribe(s, Subscription("q/#", 1))
            s.cursor = log_.next_offset  # offline: its backlog waits in the log
            r.publish(Message("q/x", b"before", 1, False, "p", "a/w0"))
            assert r.release_session("m", False, None) is not None
            r.publish(Message("q/x", b"logged-while-moving", 1, False, "p", "a/w0"))
            copy = Message("q/x", b"handed-on-here-while-moving", 1, False, "p", "c/w0")
            r.take_copies("m", [(1, False, copy.to_list())], read_back=True)
            r.moved("m", True, "b/w0")
            [(_, _, items)] = mesh.handed
            return [values[1] for _, _, values in items]
        finally:
            log_.close()

    assert sorted(asyncio.run(run())) == [b"handed-on-here-while-moving", b"logged-while-moving"]


def test_a_hand_on_while_a_moved_backlog_is_read_comes_after_that_backlog(tmp_path):
    """A session arrived with its backlog as a range (here a spool of 300 copies), read 256 at a
    time as the client drains it; the old router then hands on what reached it during the move,
    newer messages of the same publishers. Delivered as it came, the hand-on went out ahead of
    the rest of the backlog (seen in tests/cluster/test_move_under_load.py: about 670 of each
    publisher's 800 came after newer ones); spooled after the backlog, it comes in order."""
    from brokerd.connection.packets import Publish
    from brokerd.router.log.commitlog import CommitLog
    from brokerd.router.spool import spooled
    from tests.unit.conftest import FakeConn

    async def run() -> list[bytes]:
        log_ = CommitLog(tmp_path, router_id="b/w0", loop=asyncio.get_running_loop())
        try:
            r = Router(RouterConfig(router_id="b/w0", session=SessionLimits(max_inflight=2)))
            r.attach_log(log_, False)
            s = r.new_session("m", True)
            r.subscribe(s, Subscription("q/#", 1))
            backlog = [[1, False, Message("q/x", b"old%d" % i, 1, False, "p", "a/w0").to_list()] for i in range(300)]
            s.add_range(spooled(log_.directory, backlog, False))
            conn = FakeConn()
            s.attach(conn)  # type: ignore[arg-type]
            newer = Message("q/x", b"new", 1, False, "p", "a/w0")
            r.take_copies("m", [(1, False, newer.to_list())])  # (a hand-on: not read back)
            acked: set[int] = set()
            for _ in range(1000):  # the client acknowledges all it gets
                pids = [p.packet_id for p in conn.packets() if isinstance(p, Publish) and p.packet_id not in acked]
                if not pids:
                    break
                for pid in pids:
                    acked.add(pid)
                    s.puback(pid)
            return [p.payload for p in conn.packets() if isinstance(p, Publish)]
        finally:
            log_.close()

    got = asyncio.run(run())
    assert got == [b"old%d" % i for i in range(300)] + [b"new"]
