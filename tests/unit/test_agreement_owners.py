"""The router's side of agreed ownership (cluster.agreement.owners): the rules a claim applies to a
takeover's result, and which published moves fence a copy held here. The agreement itself is a
real ``State`` applied in order (the commands a Raft log would carry), behind a stand-in for the
node's service that answers at once or not at all (no majority)."""

from __future__ import annotations

import asyncio

import pytest

from brokerd.cluster.agreement.owners import SessionOwners
from brokerd.cluster.agreement.state import SESSION, State, move


class NoMajority(Exception):
    pass


class Member:
    """The node's agreement service as a worker sees it: ``read`` the local record, ``propose``
    commands that one State applies in order (or, without a majority, refuse them)."""

    def __init__(self) -> None:
        self.state = State()
        self.majority = True
        self.proposed: list[list] = []

    async def read(self, kind: str, key: str) -> tuple[str | None, int]:
        return self.state.owner(kind, key)

    async def propose(self, commands: list, timeout: float | None = None) -> list:
        if not self.majority:
            raise NoMajority("no majority")
        self.proposed.append(list(commands))
        return self.state.apply_batch(commands)


def run(coro):  # noqa: ANN001, ANN201
    return asyncio.run(coro)


def owners_at(member: Member, router_id: str) -> tuple[SessionOwners, list[tuple[str, str | None]]]:
    fenced: list[tuple[str, str | None]] = []
    owners = SessionOwners(router_id, member, 1.0)
    owners.fence = lambda cid, to: fenced.append((cid, to))
    return owners, fenced


def test_a_new_session_is_claimed_and_a_reconnect_raises_the_epoch() -> None:
    member = Member()
    owners, _ = owners_at(member, "n1/w0")
    assert run(owners.claim("dev1", None, set())) is None
    assert member.state.owner(SESSION, "dev1") == ("n1/w0", 1)
    assert run(owners.claim("dev1", "n1/w0", set())) is None  # a resume here is a move too (fences a stale reader)
    assert member.state.owner(SESSION, "dev1") == ("n1/w0", 2)
    assert owners.epochs["dev1"] == 2


def test_a_session_whose_owner_did_not_answer_is_refused_not_replaced() -> None:
    """Pattern D: nobody offered the session, its agreed owner is silent: refused, never empty."""
    member = Member()
    member.state.apply(move(SESSION, "dev1", None, 0, "n2/w1"))
    owners, _ = owners_at(member, "n3/w0")
    why = run(owners.claim("dev1", None, answered={"n1/w0", "n1/w1"}))
    assert why is not None and "n2/w1" in why and "did not answer" in why
    assert member.state.owner(SESSION, "dev1") == ("n2/w1", 1)  # unchanged
    assert member.proposed == []


def test_an_owner_that_answered_it_has_none_lets_a_new_session_start() -> None:
    member = Member()
    member.state.apply(move(SESSION, "dev1", None, 0, "n2/w1"))
    owners, _ = owners_at(member, "n3/w0")
    assert run(owners.claim("dev1", None, answered={"n2/w1"})) is None
    assert member.state.owner(SESSION, "dev1") == ("n3/w0", 2)


def test_a_copy_from_the_owners_replica_is_claimed() -> None:
    member = Member()
    member.state.apply(move(SESSION, "dev1", None, 0, "n1/w0"))
    owners, _ = owners_at(member, "n2/w0")
    assert run(owners.claim("dev1", "n1/w0", answered=set())) is None
    assert member.state.owner(SESSION, "dev1") == ("n2/w0", 2)


def test_without_a_majority_the_claim_is_refused_and_nothing_moves() -> None:
    member = Member()
    member.majority = False
    owners, _ = owners_at(member, "n1/w0")
    why = run(owners.claim("dev1", None, set()))
    assert why is not None and "no majority" in why
    assert member.state.owner(SESSION, "dev1") == (None, 0)
    assert "dev1" not in owners.epochs


def test_a_move_elsewhere_at_a_newer_epoch_fences_the_copy_here() -> None:
    """Pattern A: the copy on a router that was cut off learns of the move and hands on."""
    member = Member()
    owners, fenced = owners_at(member, "n1/w1")
    run(owners.claim("jp-s1", None, set()))  # epoch 1, here
    owners.on_owned([[SESSION, "jp-s1", "n1/w1", 1]])  # its own publication: nothing
    assert fenced == []
    owners.on_owned([[SESSION, "jp-s1", "n2/w0", 2]])
    assert fenced == [("jp-s1", "n2/w0")]
    assert not owners.owns("jp-s1")


def test_an_older_publication_than_the_claim_fences_nothing() -> None:
    """The claim's answer may come before the publication of the move it was conditional on."""
    member = Member()
    member.state.apply(move(SESSION, "dev1", None, 0, "n2/w0"))
    owners, fenced = owners_at(member, "n1/w0")
    run(owners.claim("dev1", "n2/w0", {"n2/w0"}))  # epoch 2
    owners.on_owned([[SESSION, "dev1", "n2/w0", 1], ["bridge", "dev1", "n3/w0", 9]])
    assert fenced == []
    assert owners.epochs["dev1"] == 2


def test_restored_sessions_owned_elsewhere_are_fenced_once_a_majority_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("brokerd.cluster.agreement.owners.CHECK_RETRY_S", 0.02)
    member = Member()
    member.state.apply(move(SESSION, "moved", None, 0, "n2/w0"))
    member.state.apply(move(SESSION, "mine", None, 0, "n1/w0"))
    owners, fenced = owners_at(member, "n1/w0")

    async def scenario() -> None:
        member.majority = False
        owners.check_restored(["moved", "mine", "unknown", "busy"], lambda cid: cid == "busy")
        await asyncio.sleep(0.05)
        assert fenced == []  # no majority: the check waits
        member.state.apply(move(SESSION, "busy", None, 0, "n3/w0"))
        member.majority = True
        for _ in range(40):
            if fenced:
                break
            await asyncio.sleep(0.05)

    run(scenario())
    assert fenced == [("moved", "n2/w0")]
    assert owners.epochs == {"mine": 2}


@pytest.mark.parametrize("recorded", [None, "n2/w0"])
def test_a_clean_start_releases_the_record(recorded: str | None) -> None:
    member = Member()
    if recorded:
        member.state.apply(move(SESSION, "dev1", None, 0, recorded))

    async def scenario() -> None:
        owners, _ = owners_at(member, "n1/w0")
        owners.forget("dev1")
        for _ in range(20):
            await asyncio.sleep(0.01)

    run(scenario())
    assert member.state.owner(SESSION, "dev1") == (None, 0)
