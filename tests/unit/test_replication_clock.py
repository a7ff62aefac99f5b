"""The replication's rules with a time in them, on one ``FakeClock`` given to its mesh: a
follower out of sync ``--replica-lag`` after the batch it lacks and back in once it holds it (the
leader's count, and the agreed in-sync set proposed again ``RETRY_S`` after a failure), and sent
the last record again after ``TAIL_AGAIN_S``; an acknowledgement refused ``--replica-timeout``
after it was held, by the followers or while cut off from the majority; the majority judged only
after the start's grace, counted again when the lease ends (on the tick, or before a hold), and a
pause of the loop that discounts the peers heard before it; a held will
published at its due time; a catch-up asked again within ``ASK_KEEP_S`` and ``--mesh-forget``;
a fetch asked again after ``FETCH_AGAIN_S``; the agreement service's restarts counted in
``CRASH_WINDOW_S``.

A real ``Replication`` on a real (idle) log; the mesh is a recording stand-in that notes its
peers' times on the same clock, as the mesh does. No broker, no sleeping: each check sits at
its boundary (times are exact binary fractions), so a changed comparison, or a rule that reads
``time`` instead of the clock it is given, fails it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from brokerd.cluster.agreement import service
from brokerd.cluster.agreement.state import OK, NoAgreement
from brokerd.cluster.config import Config
from brokerd.cluster.mesh.membership import silent_since
from brokerd.cluster.replication import Replication
from brokerd.cluster.replication.catchup import ASK_KEEP_S
from brokerd.cluster.replication.follower import FETCH_AGAIN_S
from brokerd.cluster.replication.insync import RETRY_S
from brokerd.cluster.replication.leader import TAIL_AGAIN_S
from brokerd.connection.codec import PUBACK, success_ack
from brokerd.router.client import Client
from brokerd.router.clock import FakeClock
from brokerd.router.log.commitlog import CommitLog
from brokerd.router.message import Message
from brokerd.router.router import Router, RouterConfig
from brokerd.router.session import Session

from .conftest import FakeConn

LAG, HOLD, TIMEOUT, FORGET = 2.0, 5.0, 3.0, 60.0  # --replica-lag, --replica-timeout, --mesh-timeout, --mesh-forget


class FakeLoop:
    """The replication's loop on a ``FakeClock`` (``clock``): its timers (the tick, a will's) run
    as the clock is advanced; what else it asks of a loop (a task: an in-sync proposal) goes to
    a real loop that the test turns (``settle``)."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.real = asyncio.new_event_loop()
        self.now, self.unix, self.time, self.advance = (self.clock.now, self.clock.unix, self.clock.time,
                                                        self.clock.advance)
        self.call_soon, self.call_later, self.call_at = self.clock.call_soon, self.clock.call_later, self.clock.call_at

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def at(self, when: float) -> None:
        """Advance to ``when`` exactly (the timers due meanwhile run)."""
        self.advance(when - self.now())

    def settle(self) -> None:
        for _ in range(3):
            self.real.run_until_complete(asyncio.sleep(0))


class RecordingMesh:
    """What replication reads of the mesh (``MeshAttributes``), on the loop's clock: its peers'
    ``last_seen`` and ``parked_at`` are noted on it, as the mesh's dispatch and members do."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock, self.wall = clock.now, clock.unix
        self.peers: dict[str, Any] = {}
        self.sent: list[tuple[str, str, Any]] = []
        self.pause_deadline = float("inf")
        self.lease: Any = None
        self.checked: list[float] = []  # when it was asked to look for a pause of its own (``check_paused``)

    def add(self, rid: str, **fields: Any) -> Any:
        peer = SimpleNamespace(router_id=rid, node_id=rid.split("/")[0], incarnation=1, claim_floor=-1, alive=True,
                               parked=False, parked_at=0.0, left=False, last_seen=self.clock(), replicas={},
                               hears=set(), seen_of_me=-1, origin_mark=-1)
        peer.__dict__.update(fields)
        self.peers[rid] = peer
        return peer

    def silence(self, rid: str) -> Any:
        """``rid`` parked: silent a mesh timeout."""
        peer = self.peers[rid]
        peer.alive, peer.parked, peer.parked_at = False, True, self.clock()
        return peer

    def hear(self, rid: str) -> Any:
        peer = self.peers[rid]
        peer.alive, peer.parked, peer.last_seen = True, False, self.clock()
        return peer

    def send_replication(self, peer: Any, what: str, body: Any) -> None:
        self.sent.append((peer.router_id, what, body))

    def silent_since(self, peer: Any) -> float:
        return silent_since(peer, self.clock(), self.wall(), TIMEOUT)

    def check_paused(self) -> None:
        self.checked.append(self.clock())

    def frames(self, what: str, to: str) -> list[Any]:
        return [body for rid, kind, body in self.sent if kind == what and rid == to]


class RefusableConn(FakeConn):
    """A connection that notes being closed (a refused acknowledgement closes it)."""

    def close(self, reason: int) -> None:
        self.closing = True
        self.refused = reason


@pytest.fixture
def loop() -> Iterator[FakeLoop]:
    loop = FakeLoop()
    yield loop
    loop.real.close()


@pytest.fixture
def make(tmp_path: Any, loop: FakeLoop) -> Iterator[Callable[..., tuple[Replication, RecordingMesh]]]:
    """``make(node, peers, factor=, min_insync=)``: the replication of router ``node``/w0 on
    ``loop``, its peers heard now."""
    made: list[Replication] = []

    def replication(node: str = "a", peers: tuple[str, ...] = ("b/w0",), factor: int = 2,
                    min_insync: int = 2) -> tuple[Replication, RecordingMesh]:
        config = Config(node_id=node, data_dir=str(tmp_path), replication_factor=factor, min_insync=min_insync,
                        replica_lag=LAG, replica_timeout=HOLD, mesh_timeout=TIMEOUT, mesh_forget=FORGET)
        rid = f"{node}/w0"
        router = Router(RouterConfig(router_id=rid, node_id=node), clock=loop.clock)
        router.attach_log(CommitLog(tmp_path / node / "w0", router_id=rid, loop=loop.real), False)
        mesh = RecordingMesh(loop.clock)
        for peer in peers:
            mesh.add(peer)
        repl = Replication(config, router, mesh, loop)  # type: ignore[arg-type]
        made.append(repl)
        return repl, mesh

    yield replication
    for repl in made:
        loop.real.run_until_complete(repl.close())
        repl.log.close()


def tick(repl: Replication) -> None:
    """The replication's tick now, as its timer runs it (the next one rescheduled from now)."""
    assert repl._timer is not None
    repl._timer.cancel()
    repl._tick()


def held_ack(repl: Replication, offset: int) -> Client:
    """A client whose QoS 1 PUBLISH, logged at ``offset``, has its PUBACK deferred."""
    client = Client(repl.router, RefusableConn())
    repl.router.defer_ack(offset, client, success_ack(PUBACK, offset + 1))
    return client


# -- the leader: in sync by lag, acknowledgements held and refused -------------------------------


def test_a_follower_is_out_of_sync_replica_lag_after_the_batch_it_lacks_and_back_once_it_holds_it(make, loop):
    repl, mesh = make()
    assert all(part.clock is mesh.clock and part.wall is mesh.wall  # one time: the mesh's
               for part in (repl, repl.lead, repl.follow, repl.quorum, repl.isr, repl.wills, repl.catchups))
    repl.heartbeat()
    assert repl.followers == ["b/w0"]
    repl.lead.on_batch(0, 0, b"")  # offset 0 went out to b/w0 ...
    client = held_ack(repl, 0)  # ... its PUBACK waits for it (--min-insync 2) ...
    repl.lead.leader_end(0)  # ... and the leader's log wrote it: the lag is counted from now
    written = loop.now()

    def in_sync() -> bool:
        return bool(repl.stats()["followers"]["b/w0"]["in_sync"])

    loop.at(written + LAG)
    assert in_sync()
    loop.at(written + LAG + 0.25)
    assert not in_sync()
    tick(repl)
    assert client.conn.chunks == [] and client.held_acks == 1  # the leader alone is not --min-insync 2
    repl.acknowledged("b/w0", "a/w0", 0)
    assert in_sync() and client.conn.chunks == [success_ack(PUBACK, 1)] and client.held_acks == 0


def test_a_follower_behind_is_sent_the_last_record_again_once_nothing_went_out_for_tail_again_s(make, loop):
    repl, mesh = make()
    repl.heartbeat()
    repl.log.append("t/x", b"m", qos=1)  # offset 0, in the log's current batch
    repl.lead.on_batch(0, 0, b"")  # ... gone out live to b/w0
    tick(repl)
    sent = loop.now()
    assert len(mesh.frames("replicate", "b/w0")) == 1
    loop.at(sent + TAIL_AGAIN_S - 0.25)
    tick(repl)
    assert len(mesh.frames("replicate", "b/w0")) == 1
    loop.at(sent + TAIL_AGAIN_S)
    tick(repl)
    assert [body[1:3] for body in mesh.frames("replicate", "b/w0")] == [[0, 0], [0, 0]]


def test_an_acknowledgement_no_follower_answers_is_refused_replica_timeout_after_it_was_held(make, loop):
    repl, mesh = make()
    repl.heartbeat()
    repl.lead.on_batch(0, 0, b"")
    client = held_ack(repl, 0)
    held = loop.now()
    repl.lead.leader_end(0)
    loop.at(held + HOLD - 0.25)
    tick(repl)
    assert not client.conn.closing and client.held_acks == 1
    loop.at(held + HOLD)
    tick(repl)
    assert client.conn.closing and client.held_acks == 0 and client.conn.chunks == []
    assert repl.stats()["refused_total"] == 1


def test_the_agreed_in_sync_set_drops_a_lagging_follower_and_is_proposed_again_retry_s_after_a_failure(make, loop):
    class Agreement:
        """The agreement client's calls the in-sync set makes; no majority while ``down``."""

        def __init__(self) -> None:
            self.asked: list[list] = []
            self.down = False

        async def read(self, kind: str, key: str) -> tuple[str | None, int]:
            return None, 0

        async def propose(self, commands: list, timeout: float | None = None) -> list:
            self.asked.append(commands)
            if self.down:
                raise NoAgreement("no majority")
            return [[OK, None, 7] for _ in commands]

    agreement = Agreement()
    repl, mesh = make()
    repl.agreed = SimpleNamespace(majority=True, client=agreement)
    repl.heartbeat()
    tick(repl)
    loop.settle()
    assert repl.lead.leader.agreed == {"b/w0"} and repl.isr.leader_epoch == 7
    repl.lead.on_batch(0, 0, b"")
    repl.lead.leader_end(0)
    agreement.down = True
    loop.at(loop.now() + LAG + 0.25)  # b/w0 lags: the set without it is proposed, and not agreed
    tick(repl)
    loop.settle()
    failed, asked = loop.now(), len(agreement.asked)
    assert repl.lead.leader.agreed == {"b/w0"}
    agreement.down = False
    loop.at(failed + RETRY_S - 0.25)
    tick(repl)
    loop.settle()
    assert len(agreement.asked) == asked  # not before RETRY_S
    loop.at(failed + RETRY_S)
    tick(repl)
    loop.settle()
    assert len(agreement.asked) == asked + 1 and repl.lead.leader.agreed == frozenset()
    repl.acknowledged("b/w0", "a/w0", 0)  # it holds the high-water mark again: back in
    tick(repl)
    loop.settle()
    assert repl.lead.leader.agreed == {"b/w0"}


# -- the majority: the start's grace, the lease's end, a pause, acknowledgements cut off ---------


def test_the_majority_is_judged_a_mesh_timeout_and_a_second_after_the_start_not_before(make, loop):
    repl, mesh = make(peers=("b/w0", "c/w0"))
    started = loop.now()
    repl.heartbeat()  # starting: the nodes heard are members at once
    assert repl.quorum.members.nodes == {"a", "b", "c"}
    mesh.silence("b/w0")
    mesh.silence("c/w0")
    loop.at(started + TIMEOUT + 0.75)
    repl.heartbeat()
    assert not repl.in_minority  # the others' HELLOs may still be on their way
    loop.at(started + TIMEOUT + 1.0)
    repl.heartbeat()
    assert repl.in_minority


def leased(make: Callable[..., tuple[Replication, RecordingMesh]],
           loop: FakeLoop) -> tuple[Replication, RecordingMesh, float]:
    """Router a/w0 of three nodes past its start, its lease backed by b until the time returned."""
    repl, mesh = make(peers=("b/w0", "c/w0"))
    repl.heartbeat()
    loop.at(loop.now() + 2 * TIMEOUT + 1.0)  # the lease rules now (its first one was awaited until here)
    lease = repl.quorum.lease
    lease.echoed("b", *lease.beat(loop.now()), loop.now())  # b/w0 answered this heartbeat's beat
    repl.heartbeat()
    end = loop.now() + lease.period
    assert not repl.in_minority and lease.until == end and repl.recount_at == end
    return repl, mesh, end


def test_the_majority_is_counted_again_on_the_tick_at_the_leases_end(make, loop):
    repl, mesh, end = leased(make, loop)
    loop.at(end - 0.25)  # nothing more echoed
    tick(repl)
    assert not repl.in_minority
    loop.at(end)
    tick(repl)
    assert repl.in_minority and repl.recount_at == float("inf")


def test_an_acknowledgement_from_the_leases_end_on_has_the_mesh_look_for_a_pause_first(make, loop):
    repl, mesh, end = leased(make, loop)
    loop.at(end - 0.25)
    held_ack(repl, 0)
    assert mesh.checked == []
    loop.at(end)
    held_ack(repl, 1)
    assert mesh.checked == [end]


def test_a_pause_of_the_loop_discounts_the_peers_heard_before_it_once_past_the_start(make, loop):
    repl, mesh = make(peers=("b/w0", "c/w0"))
    started = loop.now()
    repl.heartbeat()
    loop.at(started + TIMEOUT + 0.75)
    repl.paused(5.0)  # starting (a restore took the loop): not counted
    loop.at(started + TIMEOUT + 1.0)
    repl.heartbeat()
    assert not repl.in_minority  # b/w0 and c/w0, heard at the start, still count
    repl.paused(5.0)
    assert repl.in_minority  # heard before the pause: they count no more
    loop.at(loop.now() + 0.25)
    mesh.hear("b/w0")  # its next frame, noted on the mesh's clock
    repl.heartbeat()
    assert not repl.in_minority


def test_an_acknowledgement_held_while_cut_off_is_refused_replica_timeout_after_it_was_held(make, loop):
    repl, mesh = make(peers=("b/w0", "c/w0"), min_insync=1)
    started = loop.now()
    repl.heartbeat()
    mesh.silence("b/w0")
    mesh.silence("c/w0")
    loop.at(started + TIMEOUT + 1.0)
    repl.heartbeat()
    assert repl.in_minority
    repl.lead.leader_end(3)  # offset 3 is on --min-insync nodes (this one): the majority holds it
    client = held_ack(repl, 3)
    held = loop.now()
    assert len(repl.quorum.cut_off) == 1
    loop.at(held + HOLD - 0.25)
    tick(repl)
    assert not client.conn.closing and client.held_acks == 1
    loop.at(held + HOLD)
    tick(repl)
    assert client.conn.closing and client.held_acks == 0 and len(repl.quorum.cut_off) == 0


# -- a silent router's held wills ---------------------------------------------------------------


def will_state(loop: FakeLoop, due_in: float) -> dict:
    """A session held for another router, offline, with a delayed will due ``due_in`` from now."""
    will = Message("gone/x", b"bye", 1, False, "x", "a/w0").to_list()
    return {"subs": [], "epoch": 1, "arrived": 0, "will": [will, round((loop.unix() + due_in) * 1000)],
            "live_will": None}


def test_a_held_delayed_will_is_published_at_its_due_time_after_its_router_falls_silent(make, loop):
    repl, mesh = make(node="b", peers=("a/w0", "c/w0"), factor=1, min_insync=1)
    repl.session_state(mesh.peers["a/w0"], "a/w0", True, {"x": will_state(loop, 10.0)})
    silent = loop.now()
    repl.parked(mesh.silence("a/w0"))
    loop.at(silent + 9.75)
    assert repl.router.stats.wills_published == 0
    loop.at(silent + 10.0)
    assert repl.router.stats.wills_published == 1
    assert mesh.frames("gone", "c/w0") == [["a/w0", [], ["x"]]]  # the other holders are told


def test_a_will_due_goes_out_before_its_session_is_handed_over_from_the_replica(make, loop):
    repl, mesh = make(node="b", peers=("a/w0", "c/w0"), factor=1, min_insync=1)
    repl.session_state(mesh.peers["a/w0"], "a/w0", True, {"x": will_state(loop, 10.0), "y": will_state(loop, 10.25)})
    mesh.silence("a/w0")  # (no timer armed here: the session's new owner asks first)
    loop.at(loop.now() + 10.0)
    assert repl.release_replica("x") is not None and repl.release_replica("y") is not None
    assert repl.router.stats.wills_published == 1  # x's, due now; y's goes with its session
    assert mesh.frames("gone", "c/w0") == [["a/w0", [], ["x"]]]


# -- catch-ups asked again, a fetch asked again -------------------------------------------------


def session_here(repl: Replication, client_id: str = "roamer") -> Session:
    session = Session(client_id, True, repl.router.config.session, repl.router.stats)
    repl.router.sessions[client_id] = session
    return session


def test_a_catchup_not_answered_is_asked_again_within_ask_keep_s_of_the_first_ask(make, loop):
    repl, mesh = make(peers=("b/w0",))
    session = session_here(repl)
    asked = loop.now()
    assert repl.read_back_unheard(session, 0, {"b/w0": 5}, {}) == ["b/w0"]
    assert len(mesh.frames("session_catchup", "b/w0")) == 1
    loop.at(asked + ASK_KEEP_S)
    repl.rejoined(mesh.peers["b/w0"])  # restarted: what it was asked may be lost
    assert len(mesh.frames("session_catchup", "b/w0")) == 2
    loop.at(asked + ASK_KEEP_S + 0.25)
    repl.rejoined(mesh.peers["b/w0"])  # kept from the first ask, not the last: too old now
    assert len(mesh.frames("session_catchup", "b/w0")) == 2


def test_what_a_replica_answered_for_a_silent_router_is_asked_of_it_within_mesh_forget(make, loop):
    repl, mesh = make(peers=("b/w0", "c/w0"))
    mesh.peers["c/w0"].replicas = {"b/w0": 100}  # c/w0 holds b/w0's log
    mesh.silence("b/w0")
    session = session_here(repl)
    first = loop.now()
    repl.read_back_unheard(session, 0, {"b/w0": 5}, {})
    loop.at(first + 0.25)
    repl.read_back_unheard(session, 0, {"b/w0": 6}, {})
    assert [body[2] for body in mesh.frames("session_catchup", "c/w0")] == [5, 6]
    loop.at(first + 0.25 + FORGET)
    repl.rejoined(mesh.hear("b/w0"))
    assert [body[2] for body in mesh.frames("session_catchup", "b/w0")] == [6]  # 5 was asked too long ago


def test_a_session_moved_in_asks_a_router_back_from_a_silence_until_mesh_forget_after_it_came(make, loop):
    repl, mesh = make(peers=("b/w0",))
    session = session_here(repl)
    session.own_subscriptions()["t/#"] = SimpleNamespace(to_values=lambda: ["t/#", 1, False, False, 0])
    came = loop.unix()
    repl.router.moved_in["roamer"] = came
    loop.at(loop.now() + FORGET)
    repl.moved_in_catchup(mesh.peers["b/w0"], came)
    assert len(mesh.frames("session_catchup", "b/w0")) == 1
    loop.at(loop.now() + 0.25)
    repl.moved_in_catchup(mesh.peers["b/w0"], came)
    assert len(mesh.frames("session_catchup", "b/w0")) == 1 and "roamer" not in repl.router.moved_in


def test_a_fetch_not_answered_is_asked_again_once_fetch_again_s_has_passed(make, loop):
    repl, mesh = make(node="b", peers=("a/w0",), factor=1, min_insync=1)
    leader = mesh.peers["a/w0"]
    repl.replicate(leader, "a/w0", 10, 12, b"", -1)  # records before 10 missing: fetched
    fetched = loop.now()
    assert mesh.frames("fetch", "a/w0") == [["a/w0", 0]]
    loop.at(fetched + FETCH_AGAIN_S)
    tick(repl)
    repl.replicate(leader, "a/w0", 13, 13, b"", -1)
    assert len(mesh.frames("fetch", "a/w0")) == 1  # still waited for
    loop.at(fetched + FETCH_AGAIN_S + 0.25)
    tick(repl)
    repl.replicate(leader, "a/w0", 14, 14, b"", -1)
    assert mesh.frames("fetch", "a/w0") == [["a/w0", 0], ["a/w0", 0]]


# -- the agreement service's restarts ------------------------------------------------------------


def test_the_agreement_service_counts_its_starts_within_crash_window_s(monkeypatch):
    def fork_child(*args: Any) -> int:
        raise AssertionError("started past its crash limit")

    monkeypatch.setattr(service, "fork_child", fork_child)
    clock = FakeClock()
    process = service.AgreementProcess(Config(node_id="a"), clock=clock.now)
    first = clock.now()
    process.starts.extend([first] + [first + 1.0] * service.CRASH_LIMIT)
    clock.advance(service.CRASH_WINDOW_S)
    assert not process.start() and process.starts[0] == first  # a window ago: still counted
    clock.advance(0.25)
    assert not process.start() and process.starts[0] == first + 1.0  # older: forgotten


def test_with_agreement_a_node_heard_after_the_start_is_a_member_for_the_rule_on_silent_routers(make, loop):
    """With ``--agreement`` the agreement's member says whether this node has the majority, but
    the members (who votes on a silent router) are still the nodes met. They were met only while
    starting: a router that heard its peers 2.4 s late (a loaded machine) kept one member, the
    rule off, and took a silent router of c for gone although b still heard it: its will would
    go out, its sessions be served from a replica (the patterns' start found such a count)."""
    repl, mesh = make(peers=("b/w0", "c/w0"))
    repl.agreed = SimpleNamespace(majority=True, client=None)  # type: ignore[assignment]
    mesh.silence("b/w0")
    mesh.silence("c/w0")
    started = loop.now()
    repl.heartbeat()
    assert repl.quorum.members.nodes == {"a"}
    loop.at(started + TIMEOUT + 1.5)  # past the start: b and c are heard now
    mesh.hear("b/w0")
    mesh.hear("c/w0")
    repl.heartbeat()
    assert repl.quorum.members.nodes == {"a", "b", "c"}
    mesh.silence("c/w0")
    mesh.peers["b/w0"].hears = {"c/w0"}  # b still hears c's router: not gone for the majority
    assert not repl.quorum.gone_for_majority("c/w0")
    mesh.peers["b/w0"].hears = set()
    assert repl.quorum.gone_for_majority("c/w0")
