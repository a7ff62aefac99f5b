"""Takeover asks and answers batched per loop turn (mesh version 22): the asks of one turn go at
its end in one frame a peer (TAKEOVER_REQ for one, TAKEOVER_ASKS for more), after what the tick
collected; the asked router answers the asks it read in a turn at that turn's end in one frame
(TAKEOVER_RESP for one, TAKEOVER_ANSWERS for more), after what it collected, an answer that
carries copies closing its frame (its chunks follow it). The parts as the ``Mesh`` wires them
(tests.unit.test_mesh_takeovers), fake router, peers and links; the answering part on a loop of
its own with a fake clock; no sockets."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from brokerd.cluster.config import Config
from brokerd.cluster.mesh import Peer
from brokerd.cluster.mesh.transfer import Transfers
from brokerd.cluster.mesh.waiter import Requests, Waiter
from brokerd.connection.batching import EndOfTick
from brokerd.router.mesh_format import (
    TAKEOVER_ANSWERS,
    TAKEOVER_ASKS,
    TAKEOVER_CHUNK,
    TAKEOVER_REQ,
    TAKEOVER_RESP,
    check_body,
)
from tests.unit.test_mesh_takeovers import HOLDER, OLD, live_holder, parts

FLUSH = "flush"  # what this tick collected, sent (the mesh's ``_flush``), in the list of frames


def test_the_asks_of_one_turn_go_in_one_frame_at_its_end_after_what_the_tick_collected():
    async def main() -> list:
        takeovers, _handons, transfers, _router, old, sent = parts(asyncio.get_running_loop())
        takeovers._flush = lambda: sent.append(FLUSH)  # type: ignore[method-assign]
        asking = [asyncio.ensure_future(takeovers.takeover(f"c{i}")) for i in range(4)]
        assert sent == [], "an ask sent before the turn's end"
        await asyncio.sleep(0)  # the turn's end
        [_flush, (kind, asks)] = sent
        assert kind == TAKEOVER_ASKS
        transfers.on_takeover_answers(old, [[req, None, False] for req, *_ in asks], 0)
        assert await asyncio.wait_for(asyncio.gather(*asking), 5) == [None] * 4
        return sent

    sent = asyncio.run(main())
    assert sent[0] == FLUSH, "the asks went before what the tick collected"
    assert [(kind, [ask[1] for ask in body]) for kind, body in sent[1:]] == [(TAKEOVER_ASKS, ["c0", "c1", "c2", "c3"])]


def test_a_peer_silent_by_the_turns_end_is_not_asked_and_a_turns_one_ask_goes_as_a_request():
    async def main() -> list:
        takeovers, _handons, _transfers, _router, old, sent = parts(asyncio.get_running_loop())
        to = live_holder(takeovers, sent)  # two live peers: each frame lands in ``to``, with its peer
        task = asyncio.ensure_future(takeovers.takeover("c"))
        takeovers.peers[HOLDER].alive = False  # parked before the turn's end (its ask counts as missed)
        await asyncio.sleep(0)
        task.cancel()
        return to

    [(rid, kind, body)] = asyncio.run(main())
    assert (rid, kind, body[1]) == (OLD, TAKEOVER_REQ, "c"), "a silent peer asked, or one ask sent as a batch"


def test_a_batched_ask_nobody_answers_is_still_bounded(monkeypatch):
    monkeypatch.setattr("brokerd.cluster.mesh.takeover.ACK_TIMEOUT_S", 0.05)

    async def main() -> tuple[list, float]:
        takeovers, _handons, transfers, _router, old, sent = parts(asyncio.get_running_loop())
        start = asyncio.get_running_loop().time()
        answered = asyncio.ensure_future(takeovers.takeover("answered"))
        lost = asyncio.ensure_future(takeovers.takeover("lost"))  # in the same frame
        await asyncio.sleep(0)  # the turn's end: both asked
        transfers.on_takeover_resp(old, [sent[0][1][0][0], None, False], 0)
        results = await asyncio.wait_for(asyncio.gather(answered, lost), 5)
        return results, asyncio.get_running_loop().time() - start

    results, waited = asyncio.run(main())
    assert results == [None, None] and 1.0 <= waited < 4.0, waited


# -- the asked router -------------------------------------------------------------------------------

class FakeRouter:
    """Sessions held here: client id -> (header, chunks of copies); the others are unknown."""

    router_id = "u/w0"
    commit_log = None

    def __init__(self, held: dict[str, list[list]]) -> None:
        self.held = held
        self.moving: set[str] = set()
        self.stats = SimpleNamespace(drop_queue_full=0)

    def release_session(self, client_id: str, same_node: bool, limit: int | None):
        if client_id == "broken":
            raise ValueError("a session that cannot be exported")
        chunks = self.held.get(client_id)
        header = {"client_id": client_id, "persistent": True, "subs": [], "inflight": []}
        return None if chunks is None else (header, iter(chunks))

    def claim_refused(self, client_id: str, user: str | None, refuse: bool) -> list | None:
        return ["alice"] if refuse else None

    def moved(self, client_id: str, ok: bool, to: str | None, doubt: bool) -> None:
        pass


def answering(held: dict[str, list[list]]) -> tuple[Transfers, Peer, list, asyncio.AbstractEventLoop]:
    """The answering part with sessions ``held``; what it sends (to the asker, as (kind, body),
    FLUSH where it flushed what the tick collected) is the list returned. ``turn_end(loop)``
    runs the loop's turn (the answers of the asks read in it go)."""
    sent: list = []
    loop = asyncio.new_event_loop()
    asker = Peer(OLD, "x", None, None)
    asker.alive = True
    asker.link = SimpleNamespace(pending=[])  # type: ignore[assignment]  # (drained: chunks go at once)
    transfers = Transfers(Config(workers=1, node_id="u", listen=("127.0.0.1", 1)), loop,
                          FakeRouter(held), {OLD: asker}, Requests(),  # type: ignore[arg-type]
                          send=lambda peer, kind, body: sent.append((kind, body)),
                          flush=lambda: sent.append(FLUSH), silent_since=lambda peer: 0.0, tick=EndOfTick(loop),
                          clock=lambda: 100.0)
    return transfers, asker, sent, loop


def turn_end(loop: asyncio.AbstractEventLoop) -> None:
    loop.run_until_complete(asyncio.sleep(0))


@pytest.fixture
def closing():
    loops: list[asyncio.AbstractEventLoop] = []
    yield loops
    for loop in loops:
        loop.close()


def test_the_asks_of_one_turn_are_answered_in_one_frame_at_its_end_after_what_was_collected(closing):
    transfers, asker, sent, loop = answering({"kept": [[]]})
    closing.append(loop)
    transfers.on_takeover_asks(asker, [[1, "a", False], [2, "kept", False]], 0)
    transfers.on_takeover_req(asker, [3, "b", True, ["bob", True]], 0)  # a frame of one, in the same turn
    assert sent == [], "answered before the turn's end"
    turn_end(loop)
    assert sent[0] == FLUSH and len(sent) == 2, "not one frame after what was collected"
    kind, answers = sent[1]
    assert kind == TAKEOVER_ANSWERS and check_body(kind, answers) is None
    assert [(req, header if header is None else header["client_id"], more) for req, header, more, *_ in answers] \
        == [(1, None, False), (2, "kept", False), (3, None, False)]
    assert answers[2][3] == ["alice"], "a refused claim not answered as such"


def test_an_answer_with_copies_closes_its_frame_and_its_chunks_follow_it(closing):
    transfers, asker, sent, loop = answering({"big": [[[1, False, []]], [[1, False, []]]]})
    closing.append(loop)
    transfers.on_takeover_asks(asker, [[1, "a", False], [2, "big", False], [3, "b", False], [4, "c", False]], 0)
    turn_end(loop)
    frames = [(kind, [answer[0] for answer in body] if kind == TAKEOVER_ANSWERS else body[0])
              for kind, body in (s for s in sent if s != FLUSH)]
    assert frames == [(TAKEOVER_ANSWERS, [1, 2]), (TAKEOVER_CHUNK, 2), (TAKEOVER_ANSWERS, [3, 4])]
    assert sent.index(FLUSH) == 0 and sent[3] == FLUSH, "a frame of answers before what was collected"


def test_a_turns_one_answer_is_a_takeover_response_and_a_release_asked_for_directly_goes_at_once(closing):
    transfers, asker, sent, loop = answering({})
    closing.append(loop)
    transfers.on_takeover_asks(asker, [[1, "a", False]], 0)
    turn_end(loop)
    transfers.release(asker, 2, "b")  # (a session that was moving, asked again)
    assert sent == [FLUSH, (TAKEOVER_RESP, [1, None, False]), FLUSH, (TAKEOVER_RESP, [2, None, False])]


def test_an_ask_that_cannot_be_handled_leaves_the_others_answered(closing):
    transfers, asker, sent, loop = answering({})
    closing.append(loop)
    with pytest.raises(ValueError):
        transfers.on_takeover_asks(asker, [[1, "a", False], [2, "broken", False], [3, "b", False]], 0)
    transfers.release(asker, 4, "c")  # not read from a frame: at once, as before
    turn_end(loop)
    assert sent == [FLUSH, (TAKEOVER_RESP, [4, None, False]), FLUSH,
                    (TAKEOVER_ANSWERS, [[1, None, False], [3, None, False]])]


def test_the_answers_of_one_frame_each_settle_their_request(closing):
    transfers, asker, _sent, loop = answering({})
    closing.append(loop)
    waiters = [Waiter(loop, {OLD}) for _ in range(3)]
    reqs = [transfers.requests.open(w) for w in waiters]
    transfers.on_takeover_answers(asker, [[reqs[0], None, False], [reqs[1], None, False, ["alice"]],
                                          [reqs[2], {"client_id": "c", "queue": []}, False]], 0)
    assert all(w.future.done() for w in waiters)
    assert waiters[0].future.result() is None and waiters[1].future.result()["refused"] == ["alice", OLD]
    assert [(rid, req) for rid, req, _state in waiters[2].offers] == [(OLD, reqs[2])]


@pytest.mark.parametrize(("kind", "body", "ok"), [
    (TAKEOVER_ASKS, [[1, "a"], [2, "b", True, ["bob", True]]], True),
    (TAKEOVER_ASKS, [], False),
    (TAKEOVER_ASKS, [[1, "a"], [2, 7]], False),
    (TAKEOVER_ASKS, [1, "a"], False),
    (TAKEOVER_ANSWERS, [[1, None, False], [2, None, False, ["alice"]]], True),
    (TAKEOVER_ANSWERS, [[1, None, False], [2, {"client_id": "c"}, False]], False),  # a header lacking keys
    (TAKEOVER_ANSWERS, [], False),
])
def test_a_batch_is_checked_ask_by_ask_and_answer_by_answer(kind, body, ok):
    assert (check_body(kind, body) is None) is ok
