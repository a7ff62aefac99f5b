"""A session that moves off a router that has just restarted: what the others send that router
again may reach it after the session left (chaos seeds 1135298849 and 1240224720 beside the CPU
hog, issue 41). Its last hand-on names the routers that answered its barrier as well as those
that did not, and the new owner asks the routers named neither way (not heard there yet).

One router's mesh, not started (no socket is used): its peers, the hand-on it waits for as a
session's new owner, and a replication that records what it is asked to read back."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from brokerd.cluster.config import Config
from brokerd.cluster.mesh import Mesh, Peer
from brokerd.cluster.mesh.limits import HANDON_YOUNG_S
from brokerd.connection.batching import EndOfTick
from brokerd.connection.packets import Subscription
from brokerd.router.mesh_format import SESSION_HANDON
from brokerd.router.router import Router, RouterConfig

SINCE_MS = 1_800_000_000_000  # the handon_from's time: when the session left its old router


def _read_back(asked: list[dict]) -> Any:
    """``Replication.read_back_unheard`` as far as these tests look: the routers it asks (those
    with a position or -1, never another value) are recorded, once per call that asks any."""
    def read_back_unheard(session: Any, since_ms: int, unheard: dict, marks: dict) -> list[str]:
        ask = {rid: mark for rid, mark in unheard.items() if mark.__class__ is int}
        if ask:
            asked.append(ask)
        return sorted(ask)
    return read_back_unheard


@pytest.fixture
def mesh(tmp_path, monkeypatch):
    """u/w0, to which session ``mover`` moved from u/w1 (or which hands ``mover`` on to u/w1);
    it knows x/w0 and x/w1 too, each with a log."""
    monkeypatch.setenv("BROKERD_RUN_DIR", str(tmp_path / "run"))
    loop = asyncio.new_event_loop()
    router = Router(RouterConfig(router_id="u/w0", node_id="u"))
    mesh = Mesh(Config(workers=2, node_id="u", listen=("127.0.0.1", 1), mesh_timeout=1.0), 0, router, loop,
                EndOfTick(loop))
    for rid, mark in (("u/w1", 10), ("x/w0", 500), ("x/w1", 700)):
        peer = Peer(rid, rid.split("/")[0], None, None)
        peer.alive, peer.origin_mark = True, mark
        mesh.peers[rid] = peer
    session = router.new_session("mover", True)
    router.subscribe(session, Subscription("t/#", 1))
    try:
        yield mesh
    finally:
        mesh.transport.close()
        loop.close()


@pytest.fixture
def asked(mesh) -> list[dict]:
    """The read-backs ``mesh`` asks for, as the new owner of ``mover``, taken from u/w1."""
    asked: list[dict] = []
    mesh.replication = SimpleNamespace(read_back_unheard=_read_back(asked))  # type: ignore[assignment]
    part = _handons(mesh)
    due = part._due if hasattr(part, "_due") else part._handons_due
    due["mover"] = ["u/w1", [SINCE_MS, {"u/w0": 20, "u/w1": 11}], {"x/w0": 520, "x/w1": 720},
                    time.monotonic() + 60, False]
    return asked


def _handons(mesh: Mesh) -> Any:
    """The mesh's hand-on part (``Mesh.handons``; the ``Mesh`` itself where it is a mixin)."""
    return getattr(mesh, "handons", mesh)


def test_the_routers_a_restarted_old_router_had_not_heard_are_asked_for_what_they_sent_it(mesh, asked):
    """u/w1 restarted and ended its hand-on before it heard x/w1: x/w1 answered none of its
    barrier, and what x/w1 sent again to it (frames its old incarnation never confirmed) came
    after the hand-on and matched nothing there: lost. u/w1 names x/w0, which answered; the new
    owner asks x/w1, from a time (-1), since u/w1 had seen nothing of its log."""
    _handons(mesh)._handed_on("mover", [], True, {"x/w0": None})
    assert asked == [{"x/w1": -1}], "the router the old router had not heard was not asked"


def test_a_router_that_did_not_answer_is_asked_from_where_the_old_router_had_seen_its_log(mesh, asked):
    _handons(mesh)._handed_on("mover", [], True, {"x/w0": 490, "x/w1": None})
    assert asked == [{"x/w0": 490}]


def test_a_hand_on_that_every_router_answered_asks_nobody(mesh, asked):
    """The usual move: every router answered the old router's barrier, after what it had sent
    there: nothing is read back."""
    _handons(mesh)._handed_on("mover", [], True, {"x/w0": None, "x/w1": None})
    assert asked == []


def test_a_last_hand_on_naming_nobody_asks_nobody(mesh, asked):
    """From a router that names no router (one before this change, every router having
    answered): nothing is read back, as before."""
    _handons(mesh)._handed_on("mover", [], True)
    assert asked == []


def test_a_fenced_copy_hands_on_as_before(mesh, asked):
    """A hand-on from a copy the agreement fenced follows a takeover from a replica, which asked
    every router already: only those that did not answer are asked."""
    _handons(mesh)._handed_on("mover", [], True, {"x/w0": 490}, True)
    assert asked == [{"x/w0": 490}]


def test_the_old_router_names_the_routers_that_answered_its_barrier_too(mesh):
    """u/w0, up for a while, hands ``mover`` on to u/w1: x/w0 answered its barrier (named,
    None), x/w1 did not (named with how far u/w0 had seen its log)."""
    sent: list = []
    part = _handons(mesh)
    part.young_until = 0.0  # (up for longer than a restart's moment, or a first start)
    part._send = lambda peer, kind, body: sent.append((peer.router_id, kind, body))
    part.hand_on("u/w1", "mover", [], {"u/w1": 3, "x/w0": 510})
    assert sent == [("u/w1", SESSION_HANDON, ["mover", [], True, {"x/w0": None, "x/w1": 700}])]


def test_a_router_just_restarted_names_every_router_from_a_time(mesh):
    """u/w0 has just restarted on its log (a worker SIGKILLed): what the others send its new
    incarnation again may come after a barrier's answer and below the marks of their first
    HELLOs, so every router is named with -1, asked from a time (chaos seed 1240224720 after the
    first fix)."""
    sent: list = []
    part = _handons(mesh)
    assert part.young_until == 0.0  # a first start (no log here): not young
    part.young_until = time.monotonic() + HANDON_YOUNG_S  # as a restart on a log makes it
    part._send = lambda peer, kind, body: sent.append((peer.router_id, kind, body))
    part.hand_on("u/w1", "mover", [], {"u/w1": 3, "x/w0": 510})
    assert sent == [("u/w1", SESSION_HANDON, ["mover", [], True, {"x/w0": -1, "x/w1": -1}])]
