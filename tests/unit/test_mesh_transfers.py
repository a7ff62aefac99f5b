"""Sessions moving between routers, the transfer part (cluster/mesh/transfer.py) on its own, with
a fake clock: a session arriving in chunks is an offer once its last chunk is in; one that stops
arriving, or whose old owner falls silent, fails, so the old owner keeps it and the CONNECT is
refused rather than given an empty session; on the old owner's side, a move never confirmed
stays in doubt until a late confirmation settles it. Fake router and peers; no sockets."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from brokerd.cluster.config import Config
from brokerd.cluster.mesh import Peer
from brokerd.cluster.mesh.limits import ACK_TIMEOUT_S
from brokerd.cluster.mesh.transfer import Transfers
from brokerd.cluster.mesh.waiter import Requests, Waiter
from brokerd.connection.batching import EndOfTick
from brokerd.router.mesh_format import MOVING, TAKEOVER_ANSWERS, TAKEOVER_DONE, TAKEOVER_RESP, check_body
from brokerd.router.ports import TAKEOVER_FAILED

OLD = "x/w0"


class FakeRouter:
    """What transfers ask of the router, the calls recorded."""

    router_id = "u/w0"
    commit_log = None

    def __init__(self) -> None:
        self.moving: set[str] = set()
        self.stats = SimpleNamespace(drop_queue_full=0)
        self.calls: list[tuple] = []

    def release_session(self, client_id: str, same_node: bool, limit: int | None):
        return {"client_id": client_id}, iter([[1, 2]])

    def moved(self, client_id: str, ok: bool, to: str | None, doubt: bool) -> None:
        self.calls.append(("moved", client_id, ok, to, doubt))

    def moved_after_all(self, client_id: str, router_id: str) -> None:
        self.calls.append(("moved_after_all", client_id, router_id))


class Part:
    def __init__(self) -> None:
        self.now = 100.0
        self.loop = asyncio.new_event_loop()
        self.sent: list[tuple] = []
        self.router = FakeRouter()
        self.old = Peer(OLD, "x", None, None)
        self.old.alive = True
        self.requests = Requests()
        self.transfers = Transfers(
            Config(workers=1, node_id="u", listen=("127.0.0.1", 1)), self.loop, self.router,  # type: ignore[arg-type]
            {OLD: self.old}, self.requests,
            send=lambda peer, kind, body: self.sent.append((peer.router_id, kind, body)),
            flush=lambda: None, silent_since=lambda peer: 0.0, tick=EndOfTick(self.loop), clock=lambda: self.now)

    def ask(self) -> tuple[int, Waiter]:
        """A takeover request waiting for the old owner's answer."""
        waiter = Waiter(self.loop, {OLD})
        return self.requests.open(waiter), waiter


@pytest.fixture
def part():
    p = Part()
    yield p
    p.loop.close()


def test_a_session_arriving_in_chunks_is_an_offer_once_its_last_chunk_is_in(part):
    req, waiter = part.ask()
    part.transfers.on_takeover_resp(part.old, [req, {"client_id": "c", "queue": [1, 2]}, True], 0)
    part.now += ACK_TIMEOUT_S * 0.75
    part.transfers.on_takeover_chunk(part.old, [req, [3], False], 0)
    part.now += ACK_TIMEOUT_S * 0.75
    assert part.transfers.arriving(req) and not waiter.future.done(), "a session still arriving gave up"
    part.transfers.on_takeover_chunk(part.old, [req, [4], True], 0)
    assert waiter.future.done() and waiter.future.result() is None
    [(rid, offered_req, state)] = waiter.offers
    assert (rid, offered_req, state["queue"]) == (OLD, req, [1, 2, 3, 4])
    assert not part.transfers.arriving(req) and part.sent == []


def test_a_session_that_stops_arriving_fails_its_old_owner_keeps_it_and_the_connect_is_refused(part):
    req, waiter = part.ask()
    part.transfers.on_takeover_resp(part.old, [req, {"client_id": "c", "queue": [1]}, True], 0)
    part.now += ACK_TIMEOUT_S + 0.1
    assert not part.transfers.arriving(req)
    assert part.sent == [(OLD, TAKEOVER_DONE, [req, False])], "the old owner not told to keep it"
    part.requests.expire(req, "takeover")
    assert waiter.future.result() is TAKEOVER_FAILED, "an empty session rather than a refusal"
    part.transfers.on_takeover_chunk(part.old, [req, [2], True], 0)  # its last chunk, late
    assert part.sent[1:] == [(OLD, TAKEOVER_DONE, [req, False])] and waiter.offers == []


def test_an_old_owner_that_falls_silent_fails_its_transfer_at_once(part):
    req, waiter = part.ask()
    part.transfers.on_takeover_resp(part.old, [req, {"client_id": "c", "queue": []}, True], 0)
    part.old.alive = False  # (parked first, then the parts are told)
    part.transfers.peer_gone(OLD, "silent for 3 s")
    assert waiter.result is TAKEOVER_FAILED and not part.transfers.arriving(req)
    assert part.sent == [], "a frame to a silent router"


def test_a_move_never_confirmed_stays_in_doubt_until_a_late_confirmation_settles_it(part):
    part.transfers.release(part.old, 5, "c")
    [(to, kind, [req, header, more])] = part.sent
    assert (to, kind, req, header["queue"], more) == (OLD, TAKEOVER_RESP, 5, [1, 2], False)
    part.old.alive = False
    part.transfers.peer_gone(OLD, "silent for 3 s")  # its new owner may never confirm
    assert part.router.calls == [("moved", "c", False, OLD, True)]
    part.transfers.on_takeover_done(part.old, [5, True], 0)  # heard again: it had taken it
    assert part.router.calls[1:] == [("moved_after_all", "c", OLD)]


def test_a_new_incarnation_settles_nothing_of_the_old_ones_moves(part):
    part.transfers.release(part.old, 5, "c")
    part.transfers.move_expired((OLD, 5))
    part.transfers.peer_restarted(OLD)  # its request numbers start again
    part.transfers.on_takeover_done(part.old, [5, True], 0)
    assert part.router.calls == [("moved", "c", False, OLD, True)]


def test_a_session_still_moving_elsewhere_is_answered_as_moving_and_the_asker_refuses(part):
    """Partition seed 378: the owner had exported the session to a router whose confirmation a
    slow link held back; a second asker, told "no session" once the owner's wait ran out, made a
    new, empty one while the session stayed with its owner."""
    part.router.moving.add("c")
    part.transfers.release(part.old, 7, "c")
    assert part.sent == [], "answered while its move may still settle"
    part.now += ACK_TIMEOUT_S + 0.1
    part.loop.run_until_complete(asyncio.sleep(0.05))  # its next look, past its wait
    [(to, kind, body)] = part.sent
    assert (to, kind, body) == (OLD, TAKEOVER_RESP, [7, None, False, None, MOVING])
    assert check_body(kind, body) is None, "the asker's check refuses the answer: it is dropped as a bad frame"
    assert check_body(TAKEOVER_ANSWERS, [[6, None, False], body]) is None
    req, waiter = part.ask()  # the asker's side: that answer refuses, it is no "no session"
    part.transfers.on_takeover_resp(part.old, [req, None, False, None, MOVING], 0)
    assert waiter.future.done() and waiter.future.result() is TAKEOVER_FAILED and waiter.offers == []


def test_no_session_and_another_identitys_session_are_answered_as_before(part):
    req, waiter = part.ask()
    part.transfers.on_takeover_resp(part.old, [req, None, False], 0)
    assert waiter.future.result() is None
    req, waiter = part.ask()
    part.transfers.on_takeover_resp(part.old, [req, None, False, ["alice"]], 0)
    assert waiter.future.result()["refused"] == ["alice", OLD]
