"""The router's side of agreed ownership (cluster.agreement.owners): the rules a claim applies to a
takeover's result, and which published moves fence a copy held here. The agreement itself is a
real ``State`` applied in order (the commands a Raft log would carry), behind a stand-in for the
node's service that answers at once or not at all (no majority)."""

from __future__ import annotations

import asyncio
import logging

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


class LateMember(Member):
    """A member whose leader was cut off: a proposal without a majority stays in its log
    (``late``) and may commit once the leader is heard again (``commit_late``)."""

    def __init__(self) -> None:
        super().__init__()
        self.late: list[list] = []

    async def propose(self, commands: list, timeout: float | None = None) -> list:
        if not self.majority:
            self.late.append(list(commands))
            raise NoMajority("no majority")
        return await super().propose(commands, timeout)

    def commit_late(self) -> list[list]:
        """Apply what waited; the changes the members publish ([kind, key, owner, epoch])."""
        published = []
        for commands in self.late:
            for result, command in zip(self.state.apply_batch(commands), commands, strict=True):
                if result[0] == "ok" and command[0] == "move":
                    published.append([command[1], command[2], result[1], result[2]])
        self.late = []
        return published


@pytest.mark.parametrize("holds", [False, True])
def test_a_claim_that_timed_out_and_committed_later_goes_back_to_the_owner_it_was_claimed_from(holds: bool) -> None:
    """Partition seed 15: a CONNECT's claim timed out (the client was refused, the takeover
    undone: the old owner kept the session), then committed when the cut healed. The record named
    a router without the session; its old owner fenced the real copy and handed it to nobody,
    and the client's next CONNECT got an empty session. Now the claimant, which holds no session,
    moves the record back as soon as it is published; one that holds it (a CONNECT claiming it
    again) keeps it."""
    async def go() -> tuple[LateMember, SessionOwners]:
        member = LateMember()
        member.state.apply(move(SESSION, "jp-s1", None, 0, "n1/w0"))  # epoch 1, the old owner's
        owners, fenced = owners_at(member, "n2/w0")
        owners.holds = lambda cid: holds
        member.majority = False
        why = await owners.claim("jp-s1", "n1/w0", {"n1/w0"})
        assert why is not None and "no majority" in why
        member.majority = True
        published = member.commit_late()
        assert published == [[SESSION, "jp-s1", "n2/w0", 2]]
        owners.on_owned(published)
        for _ in range(3):
            await asyncio.sleep(0)
        assert fenced == []
        return member, owners

    member, owners = run(go())
    if holds:
        assert member.state.owner(SESSION, "jp-s1") == ("n2/w0", 2) and owners.owns("jp-s1")
    else:
        assert member.state.owner(SESSION, "jp-s1") == ("n1/w0", 3) and not owners.owns("jp-s1")


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


def test_a_restored_session_a_takeover_moved_away_meanwhile_is_neither_fenced_nor_counted(
        caplog: pytest.LogCaptureFixture) -> None:
    member = Member()
    member.state.apply(move(SESSION, "gone", None, 0, "n2/w0"))
    member.state.apply(move(SESSION, "stale", None, 0, "n3/w0"))
    owners, fenced = owners_at(member, "n1/w0")
    owners.holds = lambda cid: cid != "gone"  # a CONNECT elsewhere took "gone" from here already

    async def scenario() -> None:
        owners.check_restored(["gone", "stale"], lambda cid: False)
        for _ in range(40):
            if fenced:
                break
            await asyncio.sleep(0.05)

    with caplog.at_level(logging.WARNING):
        run(scenario())
    assert fenced == [("stale", "n3/w0")]
    assert "1 session(s) restored here moved to other routers" in caplog.text


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
