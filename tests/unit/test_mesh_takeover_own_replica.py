"""A takeover offered one stale live copy while the asking router itself holds the replica of the
agreed owner's session (cluster/mesh/takeover.py, ``offer.takes_own_replica``): that replica
counts as an offer, so the agreement is asked and the owner's copy taken, not the stale one the
agreement would refuse; it is taken only where it is the one chosen. Fake router, peers, links,
replication and agreement client, on a loop of its own."""

from __future__ import annotations

import asyncio

from brokerd.cluster.agreement.owners import SessionOwners
from brokerd.cluster.mesh import offer
from brokerd.router.mesh_format import TAKEOVER_DONE
from tests.unit.test_mesh_offer_agreed import OWNER, FakeAgreement
from tests.unit.test_mesh_takeovers import OLD, asked, parts


class FakeRestorer:
    def __init__(self, held: list[str]) -> None:
        self.held = held
        self.asked: list[str] = []

    def replicas_of(self, client_id: str) -> list[str]:
        self.asked.append(client_id)
        return self.held


class HoldingReplication:
    """This router's replication, holding silent ``OWNER``'s copy of session "c" (or nothing)."""

    def __init__(self, held: list[str]) -> None:
        self.restorer = FakeRestorer(held)
        self.taken: list[str] = []
        self.moved: list[tuple[str, bool]] = []
        self.fenced: list[tuple[str, list]] = []

    def take_replica(self, client_id: str) -> dict | None:
        if not self.restorer.held:
            return None
        self.taken.append(client_id)
        return {"client_id": client_id, "queue": [], "epoch": 4, "replica": OWNER}

    def replica_moved(self, client_id: str, ok: bool) -> None:
        self.moved.append((client_id, ok))

    def fence(self, client_id: str, partitions) -> None:
        self.fenced.append((client_id, list(partitions)))


def take(owner: str | None, held: list[str]) -> tuple[dict, list, FakeAgreement, HoldingReplication]:
    """Session "c" offered by OLD alone (live, stale), this router holding ``held`` replicas, the
    agreement naming ``owner`` (None: not answering); the move then confirmed."""

    async def main() -> tuple[dict, list, FakeAgreement, HoldingReplication]:
        takeovers, _handons, transfers, router, old, sent = parts(asyncio.get_running_loop())
        agreement = FakeAgreement(owner)
        router.owners = SessionOwners(router.router_id, agreement, 1.0)  # type: ignore[attr-defined]
        to: list = []
        takeovers._send = lambda peer, kind, body: to.append((peer.router_id, kind, body))  # type: ignore[method-assign]
        replication = HoldingReplication(held)
        takeovers.replication = replication  # type: ignore[assignment]
        takeovers.handons.moved_here = lambda *args: None  # type: ignore[method-assign]
        asking = asyncio.ensure_future(takeovers.takeover("c"))
        await asyncio.sleep(0)
        req = asked(to)
        transfers.on_takeover_resp(old, [req, {"client_id": "c", "queue": [], "epoch": 3}, False], 0)
        state = await asyncio.wait_for(asking, 5)
        assert [t for t in to if t[1] == TAKEOVER_DONE] == [], "an offer dropped before the move was settled"
        takeovers.confirm("c")
        return state, sorted((rid, body[1]) for rid, kind, body in to if kind == TAKEOVER_DONE), agreement, replication

    return asyncio.run(main())


def test_the_askers_own_replica_of_the_agreed_owner_is_taken_beside_one_stale_live_copy():
    state, done, agreement, replication = take(OWNER, [OWNER])
    assert agreement.reads == [("session", "c")], "one live offer: the agreement was not asked"
    assert state["replica"] == OWNER, "the stale live copy was taken (the agreement refuses its claim)"
    assert replication.taken == ["c"] and replication.moved == [("c", True)]
    assert done == [(OLD, True)], "the stale live copy kept once the owner's was taken"


def test_the_askers_replica_is_not_taken_where_the_live_router_is_the_agreed_owner():
    state, done, agreement, replication = take(OLD, [OWNER])
    assert agreement.reads == [("session", "c")]
    assert state["offered_by"] == OLD and "replica" not in state
    assert replication.taken == [] and replication.moved == [], "the replica here taken though not chosen"
    assert done == [(OLD, True)]


def test_holding_no_replica_one_live_offer_asks_no_agreement_as_before():
    state, done, agreement, replication = take(OWNER, [])
    assert agreement.reads == [] and replication.taken == []
    assert state["offered_by"] == OLD and done == [(OLD, True)]


def test_the_own_replica_joins_the_offers_only_where_it_would_be_chosen():
    live = ("x/w0", 1, {"epoch": 3})
    replica = ("z/w1", 2, {"epoch": 4, "replica": OWNER})
    asked: list[int] = []

    def held(*routers: str):
        def ask() -> list[str]:
            asked.append(1)
            return list(routers)
        return ask

    assert offer.takes_own_replica([], None, held())  # nobody offered: as before
    assert offer.takes_own_replica([replica], None, held())  # only replicas' copies: as before
    assert not offer.takes_own_replica([live], None, held(OWNER))  # the owner not known
    assert not offer.takes_own_replica([live], "x/w0", held(OWNER))  # the live one is the owner's
    assert not offer.takes_own_replica([live, replica], OWNER, held(OWNER))  # offered by its holder already
    assert asked == [], "the replication asked where the offers decide"
    assert offer.takes_own_replica([live], OWNER, held(OWNER))
    assert not offer.takes_own_replica([live], OWNER, held())  # not held here
