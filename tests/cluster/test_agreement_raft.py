"""The agreement engine (cluster.agreement.raft): three real PySyncObj members on 127.0.0.1 in
this process, their frames over real sockets. A majority commits, a minority cannot, a stale
owner is refused, and the port answers nothing to a peer without the password."""

from __future__ import annotations

import asyncio
import os
import pickle
import socket
import struct
import time
import zlib

import pytest

pytest.importorskip("pysyncobj")

from brokerd.cluster.agreement import state as S  # noqa: E402
from brokerd.cluster.agreement.raft import Agreement, NoAgreement  # noqa: E402
from brokerd.cluster.agreement.state import OK, SESSION, STALE  # noqa: E402
from tests.helpers import free_port, wait_for  # noqa: E402

PASSWORD = "test-" + os.urandom(16).hex()
FAST = {"election_timeout": (0.2, 0.5), "heartbeat": 0.05, "connect_timeout": 1.0}
COMMIT = 15.0  # bound on one commit, elections included


@pytest.fixture
def members():
    started: list[Agreement] = []

    def start(n: int = 3, password: str = PASSWORD, addresses: list[str] | None = None,
              only: int | None = None, skip: int = 0) -> list[Agreement]:
        """Members at ``addresses`` (``only`` of them from ``skip`` on), each with the others as peers."""
        addresses = addresses or [f"127.0.0.1:{free_port()}" for _ in range(n)]
        mine = addresses[skip:skip + only] if only is not None else addresses
        group = [Agreement(a, [p for p in addresses if p != a], password, **FAST) for a in mine]
        started.extend(group)
        return group

    yield start
    for m in started:
        m.close()  # a stopped one again: a no-op


def _stop(group: list[Agreement], m: Agreement) -> None:
    m.close()
    group.remove(m)


def _leader_of(group: list[Agreement]) -> Agreement:
    wait_for(lambda: group[0].leader is not None, COMMIT, "a leader")
    return next(m for m in group if m.address == group[0].leader)


def test_a_proposal_commits_on_a_majority_and_every_member_applies_it(members):
    group = members()
    assert group[1].propose_wait([S.move(SESSION, "c1", None, 0, "a/0")], COMMIT) == [(OK, "a/0", 1)]
    wait_for(lambda: all(m.state.owner(SESSION, "c1") == ("a/0", 1) for m in group), COMMIT, "every replica")


def test_with_its_leader_stopped_two_of_three_still_commit(members):
    group = members()
    group[0].propose_wait([S.move(SESSION, "c1", None, 0, "a/0")], COMMIT)
    _stop(group, _leader_of(group))
    started = time.monotonic()
    assert group[0].propose_wait([S.move(SESSION, "c1", "a/0", 1, "b/0")], COMMIT) == [(OK, "b/0", 2)]
    assert time.monotonic() - started < COMMIT
    wait_for(lambda: group[1].state.owner(SESSION, "c1") == ("b/0", 2), COMMIT, "the other survivor")


def test_one_member_of_three_alone_commits_nothing_and_says_no_agreement(members):
    group = members()
    group[0].propose_wait([S.move(SESSION, "c1", None, 0, "a/0")], COMMIT)
    _stop(group, group[2])
    _stop(group, group[1])
    started = time.monotonic()
    with pytest.raises(NoAgreement):
        group[0].propose_wait([S.move(SESSION, "c1", "a/0", 1, "b/0")], 2.0)
    assert 1.9 < time.monotonic() - started < 5.0
    assert group[0].state.owner(SESSION, "c1") == ("a/0", 1)


def test_no_agreement_does_not_block_the_event_loop(members):
    group = members()
    group[0].propose_wait([S.get(SESSION, "c1")], COMMIT)
    _stop(group, group[2])
    _stop(group, group[1])
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.05)
            ticks += 1

    async def main() -> None:
        ticker = asyncio.create_task(tick())
        with pytest.raises(NoAgreement):
            await group[0].propose([S.move(SESSION, "c1", None, 0, "a/0")], 1.5)
        ticker.cancel()

    asyncio.run(main())
    assert ticks >= 15  # the loop ran all along (a blocking wait would leave it at 0)


def test_a_stale_owners_move_is_refused_after_a_newer_one_from_any_member(members):
    group = members()

    async def main() -> list:
        a, b, c = group
        first = await a.propose([S.move(SESSION, "c1", None, 0, "r1")], COMMIT)
        moved = await b.propose([S.move(SESSION, "c1", "r1", 1, "r2")], COMMIT)
        stale = await c.propose([S.move(SESSION, "c1", "r1", 1, "r1"), S.get(SESSION, "c1")], COMMIT)
        return [first, moved, stale]

    first, moved, stale = asyncio.run(main())
    assert first == [(OK, "r1", 1)] and moved == [(OK, "r2", 2)]
    assert stale == [(STALE, "r2", 2), (OK, "r2", 2)]


def test_a_batch_of_thousands_of_moves_is_one_entry(members):
    group = members()
    claims = [S.move(SESSION, f"c{i}", None, 0, "a/0") for i in range(5000)]
    results = group[1].propose_wait(claims, COMMIT)
    assert [r[0] for r in results] == [OK] * 5000
    wait_for(lambda: all(m.state.count(SESSION) == 5000 for m in group), COMMIT, "every replica")


def test_a_member_with_another_password_never_joins_the_agreement(members):
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    a, b = members(addresses=addresses, only=2)
    intruder = members(addresses=addresses, only=1, skip=2, password="guessed")[0]
    with pytest.raises(NoAgreement):
        intruder.propose_wait([S.move(SESSION, "c1", None, 0, "evil")], 3.0)
    assert a.propose_wait([S.get(SESSION, "c1")], COMMIT) == [(OK, None, 0)]  # the two agree without it
    assert intruder.state.count(SESSION) == 0


class _Plant:
    """A pickle that, once loaded, writes a file: what a peer could make an open port run."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_the_raft_port_unpickles_nothing_from_a_peer_without_the_password(members, tmp_path):
    group = members()
    host, port = group[0].address.split(":")
    planted = tmp_path / "planted"
    frame = zlib.compress(pickle.dumps(_Plant(str(planted))))
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(struct.pack("i", len(frame)) + frame)
        sock.settimeout(5)
        assert sock.recv(1) == b""  # dropped: the frame failed authentication
    assert not planted.exists()
    assert group[1].propose_wait([S.get(SESSION, "c1")], COMMIT) == [(OK, None, 0)]  # the others unharmed


def test_the_engine_refuses_to_start_without_a_password():
    with pytest.raises(ValueError, match="password"):
        Agreement(f"127.0.0.1:{free_port()}", [], "")
