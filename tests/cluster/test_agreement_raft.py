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

# Through the project's module, which keeps the process's socket.inet_ntop (PySyncObj replaces it).
pytest.importorskip("brokerd.cluster.agreement.raft")

from brokerd.cluster.agreement import state as S  # noqa: E402
from brokerd.cluster.agreement.pysyncobj_fixes import PatchedSyncObj  # noqa: E402
from brokerd.cluster.agreement.raft import Agreement, NoAgreement  # noqa: E402
from brokerd.cluster.agreement.state import OK, SESSION, STALE  # noqa: E402
from tests.helpers import free_port, wait_for  # noqa: E402

PASSWORD = "test-" + os.urandom(16).hex()
FAST = {"election_timeout": (0.2, 0.5), "heartbeat": 0.05, "connect_timeout": 1.0}
COMMIT = 15.0  # bound on one commit, elections included
LATE_S = 4.0  # how late a refusal by timeout may come on a loaded box (test_agreement_service.py's)


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
    assert 1.9 < time.monotonic() - started < 2.0 + LATE_S
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
    # The loop ran all along (a blocking wait would leave it at 0): 3 ticks of 50 ms, not the 30
    # of an idle box, where the members' threads and the loop share two loaded cores.
    assert ticks >= 3


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



def test_a_member_restarted_alone_on_its_data_dir_holds_what_it_had_applied(tmp_path):
    """Its journal keeps the log and the commit index (PySyncObj writes the index once a second),
    so a member back after a crash applies the agreed state before it hears anyone."""
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]

    def start(a: str) -> Agreement:
        return Agreement(a, [p for p in addresses if p != a], PASSWORD, data_dir=str(tmp_path / a), **FAST)

    group = [start(a) for a in addresses]
    try:
        group[0].propose_wait([S.move(SESSION, "c1", None, 0, "r1")], COMMIT)
        wait_for(lambda: all(m.state.owner(SESSION, "c1") == ("r1", 1) for m in group), COMMIT, "every replica")
        time.sleep(1.5)  # past PySyncObj's once-a-second write of the commit index
        for m in group:
            m.close()
        group = [start(addresses[1])]
        wait_for(lambda: group[0].state.owner(SESSION, "c1") == ("r1", 1), COMMIT, "the journal replayed")
    finally:
        for m in group:
            m.close()


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




def test_after_a_quiet_spell_the_first_candidate_is_elected_in_its_first_term():
    """Followers send each other nothing while a leader lives, and PySyncObj closes a connection
    idle past its timeout at its next send, dropping the message: the first vote request after the
    leader died was lost, and the candidate won only a term later, after another election timeout.
    It now asks again: elected in its first term. The third member's timeout is long, so the
    fastest survivor is the only candidate."""
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    timeouts = [(0.2, 0.3), (0.6, 0.7), (3.0, 3.5)]  # a connection's timeout is at least the longest
    group = [Agreement(a, [p for p in addresses if p != a], PASSWORD, election_timeout=t, heartbeat=0.05,
                       connect_timeout=max(1.0, t[1])) for a, t in zip(addresses, timeouts, strict=True)]
    try:
        group[0].propose_wait([S.move(SESSION, "c1", None, 0, "r1")], COMMIT)
        old = _leader_of(group)
        assert old is not group[2]  # its timeout is the longest: the others ask first
        term = old._replica._getTerm()
        time.sleep(1.5)  # past connect_timeout: the followers' connection is idle
        _stop(group, old)
        wait_for(lambda: group[0].leader not in (None, old.address), COMMIT, "a new leader")
        assert group[0]._replica._getTerm() == term + 1
        assert group[1].propose_wait([S.move(SESSION, "c1", "r1", 1, "r2")], COMMIT) == [(OK, "r2", 2)]
    finally:
        for m in group:
            m.close()


class _Partition:
    """Which pairs of members cannot reach each other: their messages are dropped both ways, on
    open connections, as a network that drops packets would."""

    def __init__(self) -> None:
        self.cut: set[frozenset[str]] = set()

    def isolate(self, member: str, others: list[str]) -> None:
        self.cut = {frozenset((member, o)) for o in others}

    def heal(self) -> None:
        self.cut = set()

    def transport(self) -> type:
        from pysyncobj.transport import TCPTransport

        partition = self

        class Dropping(TCPTransport):
            def send(self, node, message) -> bool:
                if frozenset((self._selfNode.address, node.address)) in partition.cut:
                    return True  # sent, and lost on the way
                return super().send(node, message)

            def _onMessageReceived(self, node, message) -> None:
                if frozenset((self._selfNode.address, node.address)) not in partition.cut:
                    super()._onMessageReceived(node, message)

        return Dropping


def test_a_leader_cut_off_commits_nothing_the_majority_moves_on_and_it_follows_when_healed():
    """The partition case in the engine: the old leader's claim is refused (no agreement), the
    two others elect a leader and move the session, and once healed the old leader's replica
    holds the majority's record and its stale claim is refused."""
    partition = _Partition()
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    group = [Agreement(a, [p for p in addresses if p != a], PASSWORD, transport=partition.transport(), **FAST)
             for a in addresses]
    try:
        group[0].propose_wait([S.move(SESSION, "c1", None, 0, "r1")], COMMIT)
        old = _leader_of(group)
        rest = [m for m in group if m is not old]
        partition.isolate(old.address, [m.address for m in rest])
        with pytest.raises(NoAgreement):
            old.propose_wait([S.move(SESSION, "c1", "r1", 1, "r-old")], 2.0)
        assert rest[0].propose_wait([S.move(SESSION, "c1", "r1", 1, "r2")], COMMIT) == [(OK, "r2", 2)]
        assert old.state.owner(SESSION, "c1") == ("r1", 1)  # cut off: it has not seen the move
        partition.heal()
        wait_for(lambda: old.state.owner(SESSION, "c1") == ("r2", 2), COMMIT, "the old leader to follow")
        assert old.propose_wait([S.move(SESSION, "c1", "r1", 1, "r-old")], COMMIT) == [(STALE, "r2", 2)]
        assert all(m.state.owner(SESSION, "c1") == ("r2", 2) for m in group)
    finally:
        for m in group:
            m.close()


class _Net:
    """Messages between PySyncObj members held in a list, delivered when the test says."""

    def __init__(self) -> None:
        self.transports: dict = {}
        self.pending: list[tuple[str, str, dict]] = []
        self.events: list[tuple] = []  # ("send", source, message), and what a test adds

    def deliver(self, to: str | None = None) -> None:
        go = [m for m in self.pending if to in (None, m[1])]
        self.pending = [m for m in self.pending if m not in go]
        for source, dest, message in go:
            t = self.transports[dest]
            t._onMessageReceived(t.peers[source], message)

    def cut(self, node: str) -> None:
        self.pending = [m for m in self.pending if node not in m[:2]]

    def transport(self) -> type:
        from pysyncobj.transport import Transport

        net = self

        class Held(Transport):
            def __init__(self, sync_obj, self_node, other_nodes) -> None:
                super().__init__(sync_obj, self_node, other_nodes)
                self.me, self.peers = self_node.address, {n.address: n for n in other_nodes}
                net.transports[self.me] = self

            def send(self, node, message) -> bool:
                net.pending.append((self.me, node.address, pickle.loads(pickle.dumps(message))))
                net.events.append(("send", self.me, message))
                return True

        return Held


def _ticked_member(net: _Net, me: str, members: tuple[str, ...], leads: bool, engine: type = PatchedSyncObj,
                   journal: str | None = None):
    from pysyncobj import SyncObjConf, replicated

    class Items(engine):
        def __init__(self) -> None:
            self.items: list[str] = []
            conf = SyncObjConf(autoTick=False, appendEntriesUseBatch=False, appendEntriesPeriod=0.001,
                               connectionTimeout=300, raftMinTimeout=0.01 if leads else 100,
                               raftMaxTimeout=0.02 if leads else 200, journalFile=journal)
            super().__init__(me, [p for p in members if p != me], conf, transportClass=net.transport())

        @replicated
        def add(self, item: str) -> None:
            self.items.append(item)

    return Items()


def test_a_follower_handed_an_old_append_again_keeps_the_entries_it_acknowledged(caplog):
    """Raft tolerates late and repeated messages: a follower deletes entries only from the first
    that conflicts with the leader's. Over TCP a late append follows a repeated reset answer;
    here one is replayed. A follower that drops an acknowledged entry can leave a committed
    entry on the leader alone, lost with it. Nor does it log the truncation it no longer makes
    (PySyncObj's CRITICAL "may have diverged")."""
    net = _Net()
    members = a, b, c = "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"
    la, lb, lc = (_ticked_member(net, m, members, m == a) for m in members)
    for t in net.transports.values():
        for peer in t.peers.values():
            t._onNodeConnected(peer)

    def round_trip(*followers) -> None:
        la.doTick(0)
        net.deliver()
        for f in followers:
            f.doTick(0)
        net.deliver()
        la.doTick(0)

    time.sleep(0.05)  # past a's election timeout (the others' is 100 s)
    round_trip(lb, lc)
    assert la._getLeader().address == a
    la.add("e1")
    round_trip(lb, lc)
    round_trip(lb, lc)
    net.cut(c)  # c hears nothing from here on
    la.add("e2")
    la.doTick(0)
    replayed = [m for m in net.pending if m[1] == b]  # the append carrying e2
    net.cut(c)
    la.add("e3")
    round_trip(lb)
    net.cut(c)
    net.deliver(b)
    lb.doTick(0)
    acknowledged = lb.getStatus()["log_len"]
    assert lb.items == ["e1", "e2", "e3"]
    assert la.getStatus()[f"match_idx_server_{b}"] == acknowledged  # e3 is committed on a and b
    net.pending.extend(replayed)
    net.deliver(b)
    lb.doTick(0)
    assert lb.getStatus()["log_len"] == acknowledged  # PySyncObj drops e3 here: then only a holds it
    assert not [r for r in caplog.records if "truncating" in r.getMessage()]


def test_a_follower_keeps_a_tail_no_entry_conflicts_with_but_commits_no_further_than_the_append():
    """Raft's AppendEntries rules 3 to 5 on one follower, its leaders played by hand: an append
    whose entries it holds deletes nothing after them (nothing conflicts), but the commit index
    stops at the append's last entry, since the tail may be an old term's that the leader's log
    does not hold (here c's, term 2, under a leading term 3). A conflicting entry replaces it."""
    from pysyncobj import pickle as sync_pickle
    from pysyncobj.syncobj import _COMMAND_TYPE

    net = _Net()
    members = a, b, c = "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"
    lb = _ticked_member(net, b, members, leads=False)
    into = net.transports[b]

    def entry(item: str, idx: int, term: int) -> tuple:
        command = sync_pickle.dumps((lb._methodToID[lb._getFuncName("add")], (item,)))
        return bytes([_COMMAND_TYPE.REGULAR]) + command, idx, term

    def append(source: str, term: int, prev: tuple[int, int], entries: list, commit: int) -> None:
        into._onMessageReceived(into.peers[source], {
            "type": "append_entries", "term": term, "commit_index": commit,
            "prevLogIdx": prev[0], "prevLogTerm": prev[1], "entries": entries})
        lb.doTick(0)

    append(a, 1, (1, 0), [entry("x", 2, 1), entry("y", 3, 1)], 1)
    append(c, 2, (3, 1), [entry("stale", 4, 2)], 1)  # c led term 2: its entry reached b alone
    append(a, 3, (2, 1), [entry("y", 3, 1)], 4)  # a leads term 3, its 4th entry committed: a late resend
    assert lb.getStatus()["log_len"] == 4  # upstream deleted the tail here
    assert lb.items == ["x", "y"]  # and the stale entry is not applied
    append(a, 3, (3, 1), [entry("z", 4, 3)], 4)
    assert lb.items == ["x", "y", "z"]


def test_a_member_syncs_its_vote_before_granting_it_and_its_journal_before_acknowledging(tmp_path, monkeypatch):
    """Raft: term, vote and log are on stable storage before a member answers for them. Reading
    the journal back proves nothing (mmap writes are in the page cache at once, synced or not), so
    the order is observed: b's syncs (an fsync of its meta file, an msync of its journal, as
    ``flush``) and its answers, in one list of events."""
    net = _Net()
    members = a, b, c = "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"
    journal = str(tmp_path / "raft.journal")
    fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (net.events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))),
                                                 fsync(fd))[1])
    la, lb, lc = (_ticked_member(net, m, members, m == a, journal=journal if m == b else None) for m in members)
    log = lb._SyncObj__raftLog
    msync = log.flush
    log.flush = lambda: (net.events.append(("flush", len(log))), msync())[1]
    for t in net.transports.values():
        for peer in t.peers.values():
            t._onNodeConnected(peer)
    time.sleep(0.05)  # past a's election timeout (the others' is 100 s)
    for _ in range(3):
        la.doTick(0)
        net.deliver()
        lb.doTick(0)
        lc.doTick(0)
        net.deliver()
    la.add("e1")
    la.doTick(0)
    net.deliver()
    lb.doTick(0)

    def before(**answer) -> list[tuple]:
        """The events before b's first message that holds ``answer``."""
        at = next(i for i, e in enumerate(net.events)
                  if e[:2] == ("send", b) and answer.items() <= e[2].items())
        return net.events[:at]

    assert any(e[0] == "fsync" and e[1] == journal + ".meta.tmp" for e in before(type="response_vote"))
    assert len(log) == 3  # the first entry, the leader's no-op, e1
    assert ("flush", 3) in before(type="next_node_idx", next_node_idx=4, success=True)


def test_importing_the_engine_leaves_the_process_its_inet_ntop():
    """PySyncObj replaces socket.inet_ntop with a Windows-only function when imported; every
    test after it that formatted an address failed (paho, the chaos harness)."""
    assert socket.inet_ntop(socket.AF_INET, b"\x7f\x00\x00\x01") == "127.0.0.1"
    assert socket.inet_ntop(socket.AF_INET6, b"\x00" * 15 + b"\x01") == "::1"

