"""A takeover offered a stale live copy and a replica's copy of the agreed owner's session
(cluster/mesh/takeover.py with ``offer.choose``), on a loop of its own: with ``--agreement`` the
router asks its node's member who owns the session and takes the owner's copy; the live router
that offered the stale one drops it once the move is confirmed. Without an answer, the rule
without the owner (a live router's copy). Fake router, peers, links and agreement client."""

from __future__ import annotations

import asyncio

from brokerd.cluster.agreement.owners import SessionOwners
from brokerd.router.mesh_format import TAKEOVER_DONE
from tests.unit.test_mesh_takeovers import HOLDER, OLD, FakeReplication, asked, live_holder, parts

OWNER = "z/w0"  # silent: HOLDER offers its replica's copy


class FakeAgreement:
    """The node's agreement client: the record it reads, or no answer (``owner`` None)."""

    majority = True

    def __init__(self, owner: str | None) -> None:
        self.owner = owner
        self.reads: list[tuple[str, str]] = []

    async def read(self, kind: str, key: str) -> tuple[str | None, int]:
        self.reads.append((kind, key))
        if self.owner is None:
            await asyncio.sleep(60)  # no answer: the takeover stops waiting
        return self.owner, 7

    async def propose(self, commands: list, timeout: float | None = None) -> list:
        raise AssertionError("a takeover proposes nothing")


def take(owner: str | None) -> tuple[dict, list, FakeAgreement]:
    """Session "c" offered by OLD (live, stale) and by HOLDER (a replica of OWNER's session),
    the agreement naming ``owner`` (None: not answering); the move then confirmed. Returns the
    state taken, the TAKEOVER_DONE frames sent (to whom, ok) and the agreement client."""

    async def main() -> tuple[dict, list, FakeAgreement]:
        takeovers, _handons, transfers, router, old, sent = parts(asyncio.get_running_loop())
        agreement = FakeAgreement(owner)
        router.owners = SessionOwners(router.router_id, agreement, 1.0)  # type: ignore[attr-defined]
        to = live_holder(takeovers, sent)
        takeovers.replication = FakeReplication()  # type: ignore[assignment]
        asking = asyncio.ensure_future(takeovers.takeover("c"))
        await asyncio.sleep(0)
        req = asked(to)
        transfers.on_takeover_resp(old, [req, {"client_id": "c", "queue": [], "epoch": 3}, False], 0)
        transfers.on_takeover_resp(takeovers.peers[HOLDER], [req, {"client_id": "c", "queue": [], "epoch": 4, "replica": OWNER}, False], 0)
        state = await asyncio.wait_for(asking, 5)
        assert [t for t in to if t[1] == TAKEOVER_DONE] == [], "an offer dropped before the move was settled"
        takeovers.confirm("c")
        return state, sorted((rid, body[1]) for rid, kind, body in to if kind == TAKEOVER_DONE), agreement

    return asyncio.run(main())


def test_the_agreed_owners_replica_copy_is_taken_and_the_stale_live_one_dropped():
    """Partition seed 315: the live copy was taken, the agreement then refused the claim (its
    router not the owner), and the CONNECT was refused until the owner was heard again."""
    state, done, agreement = take(OWNER)
    assert agreement.reads == [("session", "c")]
    assert state["replica"] == OWNER and state["offered_by"] == HOLDER
    assert done == [(OLD, True), (HOLDER, True)], "the stale live copy kept, or the replica's not dropped"


def test_without_an_answer_from_the_agreement_the_live_copy_is_taken_as_before():
    state, done, _ = take(None)
    assert "replica" not in state and state["offered_by"] == OLD
    assert done == [(OLD, True), (HOLDER, True)]
