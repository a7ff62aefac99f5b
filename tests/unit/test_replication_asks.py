"""A read-back asked of another router (SESSION_CATCHUP) is asked again should that router fall
silent, restart or come back before its last answer (``CatchupPart.ask_again``; issue 41,
partition seed 218: a node killed a second after a heal never answered a session that had just
moved, and nobody asked its next incarnation). A real ``Replication``, a recording mesh."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgpack

from brokerd.cluster.replication.catchup import ASK_KEEP_S
from tests.unit.test_replication_writes import LEADER, _follower

CLIENT = "moved"


def _body(start: int = 5) -> list:
    return [CLIENT, LEADER, start, 0, [["t/#", 1, False, False, 0]], None, -1, True]


def _asks(mesh: Any) -> list:
    return [body for rid, kind, body in mesh.sent if kind == "session_catchup" and rid == LEADER]


def test_an_unanswered_read_back_is_asked_again_and_an_answered_one_is_not(tmp_path):
    loop = asyncio.new_event_loop()
    repl, mesh = _follower(tmp_path, loop)
    try:
        peer = mesh.peers[LEADER]
        repl.router.sessions[CLIENT] = object()  # (only whether the session is still here counts)
        repl.catchups._send_ask(peer, _body())
        assert _asks(mesh) == [_body()]
        repl.rejoined(peer)  # back after a silence, or a new incarnation: no answer came
        assert _asks(mesh) == [_body(), _body()]
        held = repl.router.sessions.pop(CLIENT)  # (the copies themselves are not this test's)
        repl.frames.on_session_copies(peer, [CLIENT, [], True, LEADER], 0)  # its last answer
        repl.router.sessions[CLIENT] = held
        repl.rejoined(peer)
        assert len(_asks(mesh)) == 2, "answered: not asked again"
    finally:
        loop.run_until_complete(repl.close())
        loop.close()


def test_an_ask_older_than_its_keep_or_for_a_session_gone_is_let_go(tmp_path):
    loop = asyncio.new_event_loop()
    repl, mesh = _follower(tmp_path, loop)
    try:
        peer = mesh.peers[LEADER]
        repl.router.sessions[CLIENT] = object()
        repl.catchups._send_ask(peer, _body(), first=time.monotonic() - ASK_KEEP_S - 1)
        repl.rejoined(peer)
        assert len(_asks(mesh)) == 1 and not repl.catchups.open_asks
        repl.catchups._send_ask(peer, _body())
        del repl.router.sessions[CLIENT]
        repl.rejoined(peer)
        assert len(_asks(mesh)) == 2 and not repl.catchups.open_asks
    finally:
        loop.run_until_complete(repl.close())
        loop.close()


def test_a_read_back_a_replica_answered_for_a_silent_router_is_asked_of_it_once_it_is_heard_again(tmp_path):
    """Partition seed 315 (second run): a session taken from a replica while node c was cut off
    asked c/w0's replica (here) for c/w0's messages. The cut healed one way first: c/w0 went on
    logging messages for the session while the new owner's interest had not reached it, and
    the session's old copy on c/w1 had handed on and unsubscribed: three acknowledged messages
    reached nobody. What a replica answered for a silent router is asked of that router itself
    once it is heard again (after this router's interest), from the same offsets to its end."""
    loop = asyncio.new_event_loop()
    repl, mesh = _follower(tmp_path, loop)
    try:
        peer = mesh.peers[LEADER]
        repl.replicate(peer, LEADER, 0, 9, msgpack.packb([(1_000 + i, LEADER, i, "c", "t/x", 1, False, b"", b"p")
                                                          for i in range(10)]), -1)
        loop.run_until_complete(asyncio.sleep(0.05))
        repl.router.sessions[CLIENT] = repl.router.new_session(CLIENT, True)
        peer.alive = False  # silent: this router's replica of its log answers for it
        assert repl.catchups._ask_catchup(LEADER, _body())
        assert _asks(mesh) == [], "a silent router asked"
        peer.alive = True
        repl.rejoined(peer)
        assert _asks(mesh) == [_body()]
        repl.frames.on_session_copies(peer, [CLIENT, [], True, LEADER], 0)  # its last answer
        repl.rejoined(peer)
        assert len(_asks(mesh)) == 1, "asked of it again once answered"
    finally:
        loop.run_until_complete(repl.close())
        loop.close()
