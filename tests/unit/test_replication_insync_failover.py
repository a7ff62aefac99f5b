"""A failover and the agreed in-sync set (``cluster.replication.insync``; issue 41): a router that
holds a silent router's session replicas but is not among the followers the agreement names in
sync with that router's log does not hand a session over (its replica may lack what was
acknowledged last); one in the set does. A real ``Replication`` on a real log, a recording mesh."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from tests.unit.test_replication_writes import LEADER, _follower

CLIENT = "roamer"
REFUSED = "not handed over from its replica here: the log of a/w0 is in sync on c/w0"


def _held_for_a_silent_leader(tmp_path: Any, loop: asyncio.AbstractEventLoop) -> Any:
    repl, mesh = _follower(tmp_path, loop)
    peer = mesh.peers[LEADER]
    state = {"subs": [["t/#", 1, False, False, 0]], "epoch": 1, "arrived": 0, "will": None, "live_will": None}
    repl.session_state(peer, LEADER, True, {CLIENT: state})
    peer.alive = False  # a/w0 fell silent (node a lost): its sessions are served from replicas
    peer.parked = True
    mesh.silent_since = lambda _peer: time.time() - 5.0  # (what the mesh tells of a silent peer)
    return repl


def test_a_holder_outside_the_agreed_set_does_not_hand_a_session_over(tmp_path, caplog):
    loop = asyncio.new_event_loop()
    try:
        repl = _held_for_a_silent_leader(tmp_path, loop)
        repl.insync_published(LEADER, 3, ["c/w0"])  # the agreement: c/w0, not this b/w0, holds it all
        with caplog.at_level(logging.WARNING):
            assert repl.release_replica(CLIENT) is None
        assert REFUSED in caplog.text
        assert repl.session_part.store.holds(CLIENT)  # kept: c/w0 (or a/w0 back) serves it
        repl.insync_published(LEADER, 2, ["b/w0"])  # an older leader epoch's set: ignored
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert repl.release_replica(CLIENT) is None
        assert REFUSED in caplog.text
    finally:
        loop.run_until_complete(repl.close())
        loop.close()


def test_a_holder_in_the_agreed_set_is_not_refused_by_it(tmp_path, caplog):
    loop = asyncio.new_event_loop()
    try:
        repl = _held_for_a_silent_leader(tmp_path, loop)
        repl.insync_published(LEADER, 3, ["b/w0"])
        with caplog.at_level(logging.WARNING):
            repl.release_replica(CLIENT)
        assert "in sync on" not in caplog.text
        assert "handed over from its replica here" in caplog.text  # served from here
    finally:
        loop.run_until_complete(repl.close())
        loop.close()
