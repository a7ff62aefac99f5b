"""One takeover ask frame a peer out at a time (cluster/mesh/takeover.py ``_send_asks``): while a
peer has not answered the last frame it was sent, for ``ACK_HOLD_S`` at most, the asks of later
loop turns wait and go together in one frame when its answers come; a lone ask waits for
nothing. The parts as the ``Mesh`` wires them (tests.unit.test_mesh_takeovers), fake router,
peers and links, on a loop whose clock moves only when the test says; no sockets."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from brokerd.cluster.mesh.limits import ACK_HOLD_S
from brokerd.router.mesh_format import TAKEOVER_ASKS, TAKEOVER_REQ
from tests.unit.test_mesh_takeovers import parts


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """A loop whose clock stands still until ``advance``: its timers run when the clock passes
    them, at a turn's end."""
    loop = asyncio.new_event_loop()
    clock = [1000.0]
    loop.time = lambda: clock[0]  # type: ignore[method-assign]
    loop.advance = lambda seconds: clock.__setitem__(0, clock[0] + seconds)  # type: ignore[attr-defined]
    yield loop
    loop.close()


def turn(loop: asyncio.AbstractEventLoop) -> None:
    """One loop turn and its end (the end-of-iteration pass, which sends the turn's asks)."""
    loop.run_until_complete(asyncio.sleep(0))


def asked(sent: list) -> list[tuple[int, list[str]]]:
    """The ask frames sent, as (kind, the client ids asked for), emptied."""
    frames = [(kind, [body[1]] if kind == TAKEOVER_REQ else [ask[1] for ask in body]) for kind, body in sent]
    sent.clear()
    return frames


def test_the_asks_of_later_turns_wait_for_the_peers_answer_and_go_together(loop):
    takeovers, _handons, transfers, _router, old, sent = parts(loop)
    first = loop.create_task(takeovers.takeover("c0"))
    turn(loop)
    [(_kind, [req0, *_])] = sent
    assert asked(sent) == [(TAKEOVER_REQ, ["c0"])], "a lone ask waited"
    later = [loop.create_task(takeovers.takeover(f"c{i}")) for i in (1, 2)]
    turn(loop)
    later.append(loop.create_task(takeovers.takeover("c3")))
    turn(loop)
    assert sent == [], "an ask went while the peer had not answered the frame it has"
    transfers.on_takeover_resp(old, [req0, None, False], 0)  # its answer frame
    assert sent == [], "the held asks went before the turn's end"
    turn(loop)
    [(kind, asks)] = sent
    assert asked(sent) == [(TAKEOVER_ASKS, ["c1", "c2", "c3"])], "held asks not in one frame, in order"
    transfers.on_takeover_answers(old, [[ask[0], None, False] for ask in asks], 0)
    assert loop.run_until_complete(asyncio.wait_for(asyncio.gather(first, *later), 5)) == [None] * 4
    late = loop.create_task(takeovers.takeover("c4"))  # every frame answered: nothing to wait for
    turn(loop)
    assert asked(sent) == [(TAKEOVER_REQ, ["c4"])]
    late.cancel()


def test_a_peer_that_does_not_answer_holds_the_asks_for_ack_hold_s_at_most(loop):
    takeovers, _handons, _transfers, _router, _old, sent = parts(loop)
    tasks = [loop.create_task(takeovers.takeover("c0"))]
    turn(loop)
    loop.advance(ACK_HOLD_S / 2)
    tasks.append(loop.create_task(takeovers.takeover("c1")))
    turn(loop)
    assert asked(sent) == [(TAKEOVER_REQ, ["c0"])]
    loop.advance(ACK_HOLD_S / 2)  # the first frame's hold is over: its timer sends what waited
    turn(loop)
    turn(loop)
    assert asked(sent) == [(TAKEOVER_REQ, ["c1"])], "held past ACK_HOLD_S"
    loop.advance(ACK_HOLD_S)  # unanswered, but older than ACK_HOLD_S: a new ask waits for nothing
    tasks.append(loop.create_task(takeovers.takeover("c2")))
    turn(loop)
    assert asked(sent) == [(TAKEOVER_REQ, ["c2"])]
    for task in tasks:
        task.cancel()
    turn(loop)


def test_an_ask_held_for_a_peer_gone_silent_meanwhile_is_not_sent(loop):
    takeovers, _handons, _transfers, _router, old, sent = parts(loop)
    tasks = [loop.create_task(takeovers.takeover("c0"))]
    turn(loop)
    tasks.append(loop.create_task(takeovers.takeover("c1")))
    turn(loop)
    old.alive = False  # parked while c1's ask waited (``Requests.peer_gone`` counts it missed)
    loop.advance(ACK_HOLD_S)
    turn(loop)
    turn(loop)
    assert asked(sent) == [(TAKEOVER_REQ, ["c0"])], "a silent peer asked"
    for task in tasks:
        task.cancel()
    turn(loop)
