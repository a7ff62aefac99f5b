"""The node's agreement service (cluster/agreement/service.py) and a worker's client of it
(cluster/agreement/client.py): three real brokerd nodes on 127.0.0.1, each with its Raft member
(``--agreement``, ``--agreement-peer``), reached from this test as a worker reaches its own, on the
node's run directory. A move proposed on one node is read on another and published on the third;
a killed service is restarted and commits again; a node cut off from the two others refuses
proposals within their timeout and says it has no majority, until they are back."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable

import pytest

pytest.importorskip("brokerd.cluster.agreement.raft")

from brokerd.cluster.agreement import state as S  # noqa: E402
from brokerd.cluster.agreement.client import AgreementClient, NoAgreement  # noqa: E402
from brokerd.cluster.agreement.service import ENTRY_COMMANDS, PROCESS_NAME, UNBOUND_GRACE_S, Service  # noqa: E402
from brokerd.cluster.agreement.state import OK, SESSION, STALE  # noqa: E402
from brokerd.cluster.config import Config, load  # noqa: E402
from tests.helpers import (  # noqa: E402
    BROKERD,
    WAIT,
    Broker,
    child_pids,
    free_port,
    freeze,
    in_parallel,
    mesh_key,
    mesh_key_file,
    wait_for,
)

COMMIT = 15.0  # bound on one commit, an election included
ROUNDS_BOUND = 60.0  # bound on 20,000 held requests' answers
# How late a request's refusal by timeout may come on a loaded box (its loop, PySyncObj's thread and
# the test's share two cores with other work) before it counts as a stall: a refusal that waited
# out COMMIT, or for ever, is far beyond. The lower bound (not before the timeout) stays exact.
LATE_S = 4.0


@pytest.fixture
def three(start_broker) -> list[Broker]:
    """Nodes a, b and c, meshed, each with an agreement member and the two others as its peers."""
    mesh = [free_port() for _ in range(3)]
    agree = [free_port() for _ in range(3)]

    def node(i: int) -> Broker:
        args = ["--mesh", f"127.0.0.1:{mesh[i]}", *mesh_key(), "--agreement", f"127.0.0.1:{agree[i]}"]
        for j in range(3):
            if j != i:
                args += ["--peer", f"127.0.0.1:{mesh[j]}", "--agreement-peer", f"127.0.0.1:{agree[j]}"]
        return start_broker(*args, node_id="abc"[i])

    return in_parallel(*(lambda i=i: node(i) for i in range(3)))


def config_of(broker: Broker) -> Config:
    """The node's options, as its workers have them: the run directory's sockets follow from them."""
    return load(broker.args, {})


def agreement_pid(broker: Broker) -> int | None:
    for pid in child_pids(broker.pid):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == PROCESS_NAME:
                    return pid
        except OSError:
            continue
    return None


async def until(predicate: Callable[[], object], timeout: float, what: str) -> None:
    """``wait_for`` on the loop: the clients' callbacks run meanwhile."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.02)


async def read_until(client: AgreementClient, key: str, expected: tuple[str | None, int]) -> None:
    """Read ``key`` on ``client``'s member until it shows ``expected``: a follower applies a commit
    a heartbeat after the leader, and ``read`` is that member's own view."""
    deadline = time.monotonic() + COMMIT
    while (seen := await client.read(SESSION, key)) != expected:
        if time.monotonic() > deadline:
            raise AssertionError(f"{key} read as {seen}, not {expected}, for {COMMIT} s")
        await asyncio.sleep(0.02)


async def clients(*brokers: Broker) -> list[AgreementClient]:
    made = []
    for b in brokers:
        c = AgreementClient(config_of(b), asyncio.get_running_loop())
        await c.start()
        made.append(c)
    await until(lambda: all(c.majority for c in made), COMMIT, "every service's majority")
    return made


def test_a_move_proposed_on_one_node_is_read_on_another_and_published_on_the_third(three):
    a, b, c = three

    async def main() -> None:
        ca, cb, cc = await clients(a, b, c)
        published: list[list] = []
        cc.on_owned = published.extend
        try:
            results = await ca.propose([S.move(SESSION, "c1", None, 0, "a/w0"), S.get(SESSION, "c1")])
            assert results[0][:2] == [OK, "a/w0"] and results[1] == results[0]
            epoch = results[0][2]
            await until(lambda: [SESSION, "c1", "a/w0", epoch] in published, COMMIT, "c's publication")
            # b's read is its member's local view: it shows the record once that member has applied it.
            await read_until(cb, "c1", ("a/w0", epoch))
            # b's claim from that record wins; a's, still on the old one, is fenced and told what holds.
            # (The epoch counter is the agreement's one: the routers' claims of their own logs, for
            # their in-sync sets' leader epochs, may take numbers between.)
            moved = await cb.propose([S.move(SESSION, "c1", "a/w0", epoch, "b/w0")])
            assert moved[0][:2] == [OK, "b/w0"] and moved[0][2] > epoch, moved
            newer = moved[0][2]
            assert await ca.propose([S.release(SESSION, "c1", "a/w0", epoch)]) == [[STALE, "b/w0", newer]]
            await until(lambda: [SESSION, "c1", "b/w0", newer] in published, COMMIT, "the move published")
            status = await cc.status()
            assert status["majority"] is True and status["leader"] is not None
            assert sorted(status["members"]) == ["a", "b", "c"]
        finally:
            for x in (ca, cb, cc):
                await x.close()

    asyncio.run(main())


def test_a_killed_agreement_service_is_restarted_by_the_supervisor_and_commits_again(three):
    a = three[0]

    async def main() -> None:
        (ca,) = await clients(a)
        try:
            old = agreement_pid(a)
            assert old is not None
            os.kill(old, signal.SIGKILL)
            await until(lambda: (p := agreement_pid(a)) is not None and p != old, COMMIT, "a new agreement service")
            results = await ca.propose([S.move(SESSION, "after-restart", None, 0, "a/w0")], COMMIT)
            assert results[0][:2] == [OK, "a/w0"]
            await until(lambda: ca.majority, COMMIT, "the majority, again")
        finally:
            await ca.close()
        assert f"{PROCESS_NAME} (pid {old}) died (signal SIGKILL); restarting it" in a.log_text()

    asyncio.run(main())


def test_a_node_cut_off_from_the_two_others_refuses_proposals_and_has_no_majority_until_they_are_back(three):
    a, b, c = three
    frozen = [p for n in (b, c) for p in (n.pid, *child_pids(n.pid))]

    async def main() -> None:
        (ca,) = await clients(a)
        seen: list[bool] = []
        ca.on_majority = seen.append
        try:
            for pid in frozen:
                freeze(pid)
            started = time.monotonic()
            with pytest.raises(NoAgreement):
                await ca.propose([S.move(SESSION, "cut", None, 0, "a/w0")], 2.0)
            assert 1.9 < time.monotonic() - started < 2.0 + LATE_S
            await until(lambda: not ca.majority, 5.0, "the majority lost")
            assert (await ca.status())["majority"] is False
        finally:
            for pid in frozen:
                os.kill(pid, signal.SIGCONT)
        try:
            await until(lambda: ca.majority, COMMIT, "the majority back")
            assert seen[-2:] == [False, True]
            results = await ca.propose([S.move(SESSION, "healed", None, 0, "a/w0")], COMMIT)
            assert results[0][:2] == [OK, "a/w0"]
        finally:
            await ca.close()
        wait_for(lambda: "agreement: majority lost" in a.log_text(), 5.0, "a's warning")

    asyncio.run(main())


def test_a_member_whose_port_a_socket_holds_on_another_address_listens_on_its_own_and_joins(start_broker):
    """A member listens on its --agreement address, not on every address at its port: a wildcard
    bind fails while any socket of the host holds the port on any address (a client's ephemeral
    port, as in chaos seed 1151369154), and PySyncObj, retrying without a word, then connects to
    nobody either. Nodes on 127.0.0.1, .2 and .3 (as the chaos suite runs them); c's port is held
    on 127.0.0.1 by a bound socket without SO_REUSEADDR, as a client's is, the whole test long."""
    hosts = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    mesh = [free_port(h) for h in hosts]
    agree = [free_port("0.0.0.0") for _ in hosts]  # free on every address: the holder below can take c's
    holder = socket.socket()
    holder.bind(("127.0.0.1", agree[2]))
    peers = [f"{h}:{p}" for h, p in zip(hosts, agree, strict=True)]

    def node(i: int) -> Broker:
        args = ["--mesh", f"{hosts[i]}:{mesh[i]}", *mesh_key(), "--agreement", peers[i],
                "--peer", f"{hosts[i - 1]}:{mesh[i - 1]}"]
        args += [a for j in range(3) if j != i for a in ("--agreement-peer", peers[j])]
        return start_broker(*args, host=hosts[i], node_id="abc"[i])

    try:
        nodes = in_parallel(*(lambda i=i: node(i) for i in range(3)))

        async def main() -> None:
            (cc,) = await clients(nodes[2])  # its majority: c's member commits
            try:
                # c commits with b alone; a's join is an entry of its own, a round later (a loaded
                # CI run read ["b", "c"] at once): every member, within a bound.
                deadline = time.monotonic() + 15
                status = await cc.status()
                while sorted(status["members"]) != ["a", "b", "c"] and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
                    status = await cc.status()
                assert status["joined"] is True and sorted(status["members"]) == ["a", "b", "c"], status
            finally:
                await cc.close()

        asyncio.run(main())
    finally:
        holder.close()


# -- the service in this process: one member (a cluster of one), its sockets and the client -------

class _Rounds(Service):
    """The service, noting the poll round of each entry it proposes for workers."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.round = 0
        self.entries: list[tuple[int, int]] = []  # (round, commands)

    def _requests(self, msgpack) -> None:
        self.round += 1
        super()._requests(msgpack)

    def _propose(self, kind: str, commands: list, timeout: float, requests=None) -> None:
        if kind == "requests":
            self.entries.append((self.round, len(commands)))
        super()._propose(kind, commands, timeout, requests)


def test_the_proposals_of_one_poll_round_are_one_entry_and_each_caller_gets_its_own_results(tmp_path, monkeypatch):
    monkeypatch.setenv("BROKERD_RUN_DIR", str(tmp_path / "run"))
    cfg = Config(node_id="solo", listen=("127.0.0.1", free_port()), mesh=("127.0.0.1", free_port()),
                 mesh_key=mesh_key_file(), agreement=("127.0.0.1", free_port()), data_dir=str(tmp_path / "data"))
    from brokerd.cluster.agreement.raft import Agreement

    stop, running, parked = threading.Event(), threading.Event(), threading.Event()
    running.set()

    def keep_going() -> bool:
        if not running.is_set():  # the test holds the loop while its requests pile up
            parked.set()
            running.wait(10)
        return not stop.is_set()

    service = _Rounds(cfg, Agreement)
    runner = threading.Thread(target=service.run, args=(None, keep_going), daemon=True)
    runner.start()
    n = 20000  # more than ZeroMQ queues by default (1,000): every CONNECT of a mass failover asks at once

    async def main() -> list:
        (client,) = await clients_of(cfg)
        try:
            await client.propose([S.get(SESSION, "warm-up")])
            running.clear()
            await until(parked.is_set, WAIT, "the service's loop held")
            service.entries.clear()
            # Each request's own bound starts when it is sent, and the last is sent seconds after
            # the first on a busy machine: this test counts rounds, the bound only ends a hang.
            asks = [asyncio.ensure_future(client.propose([S.move(SESSION, f"k{i}", None, 0, f"r{i}"),
                                                          S.get(SESSION, f"k{i}")], ROUNDS_BOUND))
                    for i in range(n)]
            await until(lambda: len(client._waiters) == n, COMMIT, "every request sent")
            running.set()
            return await asyncio.gather(*asks)
        finally:
            await client.close()

    try:
        answers = asyncio.run(main())
    finally:
        stop.set()
        running.set()
        runner.join(10)
    by_round: dict[int, list[int]] = {}
    for r, size in service.entries:
        by_round.setdefault(r, []).append(size)
    for sizes in by_round.values():  # one entry per round, or as few as ENTRY_COMMANDS allows
        assert all(size == ENTRY_COMMANDS for size in sizes[:-1]) and sizes[-1] <= ENTRY_COMMANDS, by_round
    assert sum(size for _, size in service.entries) == 2 * n
    assert len(by_round) < 10, by_round  # the held requests came in a few rounds
    for i, (moved, read) in enumerate(answers):
        assert moved[:2] == [OK, f"r{i}"] and read == moved


async def clients_of(cfg: Config) -> list[AgreementClient]:
    c = AgreementClient(cfg, asyncio.get_running_loop())
    await c.start()
    await until(lambda: c.majority, COMMIT, "the service's majority")
    return [c]


def test_a_client_started_before_its_service_refuses_by_timeout_then_uses_it_once_up(tmp_path, monkeypatch):
    """A worker may start while its node's service is not there yet (or restarting): its requests
    time out as NoAgreement, without blocking its loop, and the same client works once it is up."""
    monkeypatch.setenv("BROKERD_RUN_DIR", str(tmp_path / "run"))
    cfg = Config(node_id="late", listen=("127.0.0.1", free_port()), mesh=("127.0.0.1", free_port()),
                 mesh_key=mesh_key_file(), agreement=("127.0.0.1", free_port()), data_dir=str(tmp_path / "data"),
                 agreement_timeout=0.5)
    from brokerd.cluster.agreement.raft import Agreement

    stop = threading.Event()
    runner = threading.Thread(target=lambda: Service(cfg, Agreement).run(None, lambda: not stop.is_set()), daemon=True)

    async def main() -> None:
        client = AgreementClient(cfg, asyncio.get_running_loop())
        await client.start()
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.02)
                ticks += 1

        ticker = asyncio.create_task(tick())
        try:
            started = time.monotonic()
            with pytest.raises(NoAgreement):
                await client.propose([S.move(SESSION, "early", None, 0, "r")])  # --agreement-timeout 0.5
            # Its loop ran meanwhile: 3 ticks of 20 ms, not the 20 an idle box gives, where the
            # loop waits for a core (a blocked loop ticks once at most).
            assert 0.45 < time.monotonic() - started < 0.5 + LATE_S and ticks >= 3
            with pytest.raises(NoAgreement):
                await client.read(SESSION, "early", timeout=0.3)
            assert client.majority is False
            runner.start()
            await until(lambda: client.majority, COMMIT, "the service's majority")
            assert (await client.propose([S.move(SESSION, "late", None, 0, "r")], COMMIT))[0][:2] == [OK, "r"]
            assert (await client.read(SESSION, "late"))[0] == "r"
            assert await client.read(SESSION, "early") == (None, 0)  # it waited past its caller's deadline
        finally:
            ticker.cancel()
            await client.close()

    try:
        asyncio.run(main())
    finally:
        stop.set()
        if runner.is_alive():
            runner.join(10)


def test_a_member_whose_port_is_taken_says_so_and_commits_once_it_is_free(tmp_path, monkeypatch, caplog):
    """PySyncObj retries a failed bind every second without a word, and a member never bound
    reaches no peer: the service says so after ``UNBOUND_GRACE_S``, and again once it listens."""
    monkeypatch.setenv("BROKERD_RUN_DIR", str(tmp_path / "run"))
    port = free_port()
    cfg = Config(node_id="taken", listen=("127.0.0.1", free_port()), mesh=("127.0.0.1", free_port()),
                 mesh_key=mesh_key_file(), agreement=("127.0.0.1", port), data_dir=str(tmp_path / "data"))
    from brokerd.cluster.agreement.raft import Agreement

    holder = socket.socket()  # as a client connection holds its local port: no SO_REUSEADDR
    holder.bind(("127.0.0.1", port))
    stop = threading.Event()
    runner = threading.Thread(target=lambda: Service(cfg, Agreement).run(None, lambda: not stop.is_set()), daemon=True)
    caplog.set_level("INFO", logger="brokerd.cluster.agreement.service")
    runner.start()
    try:
        said = f"agreement: cannot listen on 127.0.0.1:{port} yet (its port taken on this host?)"
        wait_for(lambda: said in caplog.text, UNBOUND_GRACE_S + WAIT, "the warning")
        holder.close()
        wait_for(lambda: f"agreement: listening on 127.0.0.1:{port} now" in caplog.text, WAIT, "the member bound")

        async def main() -> None:
            (client,) = await clients_of(cfg)
            try:
                assert (await client.propose([S.move(SESSION, "bound", None, 0, "r")], COMMIT))[0][:2] == [OK, "r"]
            finally:
                await client.close()

        asyncio.run(main())
    finally:
        holder.close()
        stop.set()
        runner.join(10)


def test_a_node_whose_agreement_journal_cannot_be_written_stops_at_start_naming_it(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    argv = [BROKERD, "--workers", "1", "--listen", f"127.0.0.1:{free_port()}", "--node-id", "j", "--log", "off",
            "--data-dir", str(not_a_dir), "--mesh", f"127.0.0.1:{free_port()}", *mesh_key(),
            "--agreement", f"127.0.0.1:{free_port()}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30,
                          env={**os.environ, "BROKERD_RUN_DIR": str(tmp_path / "run")})
    assert done.returncode != 0
    assert f"--data-dir: cannot write {not_a_dir}/j/agreement (the agreement journal)" in done.stderr
