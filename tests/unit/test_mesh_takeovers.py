"""A CONNECT's takeover, the asking side (cluster/mesh/takeover.py) with the parts it is wired to
(transfer, hand-on), on a loop of its own: the session a live router offers is taken and its old
owner is told only at the confirmation; copies handed on before the session is imported here
are held until then, and dropped (the old owner told to keep it) if the move is aborted. Fake
router, peers and links; no sockets."""

from __future__ import annotations

import asyncio

from brokerd.cluster.config import Config
from brokerd.cluster.mesh import Peer
from brokerd.cluster.mesh.handon import Handons
from brokerd.cluster.mesh.takeover import Roster, Takeovers
from brokerd.cluster.mesh.transfer import Transfers
from brokerd.cluster.mesh.waiter import Requests
from brokerd.connection.batching import EndOfTick
from brokerd.router.mesh_format import TAKEOVER_DONE, TAKEOVER_REQ

OLD = "x/w0"
COPY = [1, False, ["t", b"p", 1, False, 0, "y/w0", 3]]


class FakeLink:
    def __init__(self, sent: list) -> None:
        self.sent = sent

    def send(self, frame, sources=None) -> None:
        self.sent.append(frame)


class FakeRouter:
    router_id = "u/w0"
    commit_log = None
    owners = None  # no --agreement

    def __init__(self) -> None:
        self.sessions: dict = {}
        self.taken: list[tuple] = []

    def take_copies(self, client_id: str, items: list, read_back: bool = False) -> None:
        self.taken.append((client_id, items))


async def _none() -> None:
    return None


async def _back(deadline: float) -> bool:
    return True


def parts(loop: asyncio.AbstractEventLoop) -> tuple[Takeovers, Handons, Transfers, FakeRouter, Peer, list]:
    """The three parts wired as the ``Mesh`` wires them, with one live old owner; what they
    send (to the old owner, as (kind, body)) is the list returned last."""
    sent: list = []
    config = Config(workers=1, node_id="u", listen=("127.0.0.1", 1))
    router = FakeRouter()
    old = Peer(OLD, "x", None, None)
    old.alive = True
    old.link = FakeLink(sent)  # type: ignore[assignment]
    peers = {OLD: old}
    requests = Requests()

    def send(peer: Peer, kind: int, body) -> None:
        sent.append((kind, body))

    tick = EndOfTick(loop)
    transfers = Transfers(config, loop, router, peers, requests, send, lambda: None,  # type: ignore[arg-type]
                          lambda peer: 0.0, tick)
    handons = Handons(config, router, peers, send, lambda peer, kind, body, n: None)  # type: ignore[arg-type]
    roster = Roster(local_down=set, local_back=_back, just_parked=list, gone=lambda routers: _none())
    takeovers = Takeovers(config, loop, router, peers, requests, roster, transfers, handons,  # type: ignore[arg-type]
                          send, lambda: None, tick)  # type: ignore[arg-type]
    handons.hold_early = takeovers.hold_early
    transfers.heard_answers = takeovers.heard_answers
    return takeovers, handons, transfers, router, old, sent


def take(confirm: bool) -> tuple[FakeRouter, list]:
    """A takeover of session "c" from the old owner, with one copy handed on before the session
    is imported here; then confirmed, or aborted."""

    async def main() -> tuple[FakeRouter, list]:
        takeovers, handons, transfers, router, old, sent = parts(asyncio.get_running_loop())
        asking = asyncio.ensure_future(takeovers.takeover("c"))
        await asyncio.sleep(0)
        [(kind, [req, client_id, _spools])] = sent
        assert (kind, client_id) == (TAKEOVER_REQ, "c")
        transfers.on_takeover_resp(old, [req, {"client_id": "c", "queue": []}, False], 0)
        state = await asyncio.wait_for(asking, 5)
        assert state is not None and state["offered_by"] == OLD
        handons.on_session_handon(old, ["c", [COPY], True], 0)  # before the session is imported
        assert router.taken == [] and sent[1:] == [], "delivered, or confirmed, before the move is settled"
        if confirm:
            router.sessions["c"] = object()
            takeovers.confirm("c")
        else:
            takeovers.abort("c")
        return router, [s for s in sent if s[0] == TAKEOVER_DONE]

    return asyncio.run(main())


def test_a_session_offered_is_taken_and_its_old_owner_told_only_at_the_confirmation_with_what_it_handed_on():
    router, done = take(confirm=True)
    assert router.taken == [("c", [COPY])], "what was handed on meanwhile not delivered"
    assert [ok for _, (_req, ok) in done] == [True]


def test_an_aborted_move_drops_what_was_handed_on_and_the_old_owner_keeps_the_session():
    router, done = take(confirm=False)
    assert router.taken == []
    assert [ok for _, (_req, ok) in done] == [False]


HOLDER = "z/w1"  # a live router holding a replica of silent router z/w0


class FakeReplication:
    def __init__(self) -> None:
        self.fenced: list[tuple[str, list]] = []

    def fence(self, client_id: str, partitions) -> None:
        self.fenced.append((client_id, list(partitions)))


def live_holder(takeovers: Takeovers, sent: list) -> list:
    """Router HOLDER live beside the old owner; the frames the takeover sends from now on (each
    numbered for its peer by ``_send``) land in the list returned, as (to whom, kind, body)."""
    holder = Peer(HOLDER, "z", None, None)
    holder.alive = True
    holder.link = FakeLink(sent)  # type: ignore[assignment]
    takeovers.peers[HOLDER] = holder
    to: list = []
    takeovers._send = lambda peer, kind, body: to.append((peer.router_id, kind, body))  # type: ignore[method-assign]
    return to


def asked(to: list) -> int:
    """The request number of the one takeover asked (in ``live_holder``'s list)."""
    [req] = {body[0] for _rid, kind, body in to if kind == TAKEOVER_REQ}
    return req


def take_beside_a_replica(confirm: bool) -> tuple[list, FakeReplication]:
    """A takeover of session "c" offered by two live routers: the old owner (a copy of its own)
    and a router holding a replica of silent router z/w0; the live copy is chosen. Then the move
    is confirmed, or aborted (the agreement refused the claim). Returns the TAKEOVER_DONE frames
    sent, as (to whom, ok), and the fences made."""

    async def main() -> tuple[list, FakeReplication]:
        takeovers, _handons, transfers, _router, old, sent = parts(asyncio.get_running_loop())
        to = live_holder(takeovers, sent)
        replication = FakeReplication()
        takeovers.replication = replication  # type: ignore[assignment]
        asking = asyncio.ensure_future(takeovers.takeover("c"))
        await asyncio.sleep(0)
        req = asked(to)
        transfers.on_takeover_resp(old, [req, {"client_id": "c", "queue": []}, False], 0)
        transfers.on_takeover_resp(takeovers.peers[HOLDER], [req, {"client_id": "c", "queue": [], "replica": "z/w0"}, False], 0)
        state = await asyncio.wait_for(asking, 5)
        assert state is not None and state["offered_by"] == OLD
        assert [t for t in to if t[1] == TAKEOVER_DONE] == [] and replication.fenced == [], \
            "an offer passed over dropped, or its replica fenced, before the move was settled"
        if confirm:
            takeovers.confirm("c")
        else:
            takeovers.abort("c")
        return sorted((rid, body[1]) for rid, kind, body in to if kind == TAKEOVER_DONE), replication

    return asyncio.run(main())


def test_a_replica_passed_over_is_dropped_and_fenced_only_once_the_move_is_confirmed():
    done, replication = take_beside_a_replica(confirm=True)
    assert done == [(OLD, True), (HOLDER, True)]
    assert replication.fenced == [("c", ["z/w0"])]


def test_a_move_the_agreement_refuses_leaves_the_replica_passed_over_where_it_was():
    """Partition seed 315: a stale live copy (its router not the agreed owner) was chosen over the
    replica of the agreed owner, which was cut off; the replica was told to drop its copy and
    fenced at once, then the claim was refused: nobody could serve the session for 20 s, until
    its owner was heard again. Now the replica is kept: the next CONNECT can take it."""
    done, replication = take_beside_a_replica(confirm=False)
    assert done == [(OLD, False), (HOLDER, False)]
    assert replication.fenced == []


def test_asks_answered_leave_no_deadline_and_one_unanswered_expires(monkeypatch):
    """Every CONNECT asks; an answer in time leaves nothing due (no timer per ask: a connection
    storm left thousands to fire after their answers), and an ask nobody answers is still
    bounded: its peer counts as missed once the deadline passes."""
    monkeypatch.setattr("brokerd.cluster.mesh.takeover.ACK_TIMEOUT_S", 0.05)

    async def main() -> tuple[int, dict | None, float]:
        takeovers, _handons, transfers, _router, old, sent = parts(asyncio.get_running_loop())
        for i in range(100):
            asking = asyncio.ensure_future(takeovers.takeover(f"c{i}"))
            await asyncio.sleep(0)
            transfers.on_takeover_resp(old, [sent[-1][1][0], None, False], 0)
            assert await asyncio.wait_for(asking, 5) is None
        pending = len(takeovers._deadlines)
        start = asyncio.get_running_loop().time()
        unanswered = await asyncio.wait_for(takeovers.takeover("lost"), 5)
        return pending, unanswered, asyncio.get_running_loop().time() - start

    pending, unanswered, waited = asyncio.run(main())
    assert pending == 0
    assert unanswered is None and 1.0 <= waited < 4.0, waited
