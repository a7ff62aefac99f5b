"""Every read-back a replica answered for a silent router is asked of that router once it is heard
again, however many one session made of it (``CatchupPart.via_replica``; issue 41, partition
seed 851). A session taken over from a replica asks each other router from where its copies
end to the router's log's end, and asks the routers whose logs held copies its old router had
still to read for that span (``read_back_copies``): the same router twice, two ranges. Kept under
one key, the span replaced the first ask, and when the router was heard again only the span was
asked of it: what it had logged after its replica's end, for the session, in the moment between
its old copy's last hand-on and this router's interest reaching it, reached nobody (seed 851:
c/w0's offset 197, one acknowledged message). A real ``Replication``, a recording mesh."""

from __future__ import annotations

import asyncio

from tests.unit.test_replication_asks import CLIENT, _asks
from tests.unit.test_replication_writes import LEADER, _batch, _follower


def _body(start: int, end: int = -1) -> list:
    return [CLIENT, LEADER, start, 0, [["t/#", 1, False, False, 0]], None, end, True]


def test_both_ranges_a_replica_answered_for_a_silent_router_are_asked_of_it_once_heard_again(tmp_path):
    loop = asyncio.new_event_loop()
    repl, mesh = _follower(tmp_path, loop)
    peer = mesh.peers[LEADER]
    try:
        repl.replicate(peer, LEADER, 0, 9, _batch(0, 10), -1)  # this router holds its replica
        loop.run_until_complete(asyncio.sleep(0.05))
        repl.router.sessions[CLIENT] = repl.router.new_session(CLIENT, True)
        peer.alive = False  # silent: the replica answers for it
        to_its_end, span = _body(10), _body(2, 6)  # (as ``adopted`` asks, then ``read_back_copies``)
        assert repl.catchups._ask_catchup(LEADER, to_its_end)
        assert repl.catchups._ask_catchup(LEADER, span)
        assert _asks(mesh) == [], "a silent router asked"
        peer.alive = True
        repl.rejoined(peer)
        assert sorted(_asks(mesh)) == sorted([to_its_end, span]), "an ask of the silent router was forgotten"
        assert not repl.catchups.via_replica, "kept to be asked of it again"
    finally:
        loop.run_until_complete(repl.close())
        loop.close()
