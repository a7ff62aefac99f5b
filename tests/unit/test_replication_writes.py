"""Replication against a real commit log: what a follower's acknowledgement means, when a
replicated batch leaves, and that the replication path leaves the disk work off the loop.

The mesh is a recording fake (these tests are about the log and the event loop, not the
transport); the logs are real ``CommitLog`` directories under ``tmp_path``."""

from __future__ import annotations

import asyncio
import os
import time
from types import SimpleNamespace
from typing import Any

import msgpack
import pytest

from brokerd.cluster.config import Config
from brokerd.cluster.replication import Replication
from brokerd.router.client import Client
from brokerd.router.log.commitlog import CommitLog
from brokerd.router.router import Router, RouterConfig

LEADER = "a/w0"


class RecordingMesh:
    """The part of ``cluster.mesh.Mesh`` that replication uses, keeping the frames it sends."""

    def __init__(self) -> None:
        self.peers: dict[str, Any] = {}
        self.sent: list[tuple[str, str, Any]] = []
        self.pause_deadline = float("inf")
        self.lease: Any = None
        self.clock, self.wall = time.monotonic, time.time  # (a broker's mesh's)

    def send_replication(self, peer: Any, kind: str, body: Any) -> None:
        self.sent.append((peer.router_id, kind, body))

    def check_paused(self) -> None:
        pass

    def acks(self) -> list[int]:
        return [body[1] for _, kind, body in self.sent if kind == "ack"]


def _follower(tmp_path: Any, loop: asyncio.AbstractEventLoop, fsync: str = "interval",
              segment_bytes: int = 64 << 20) -> tuple[Replication, RecordingMesh]:
    """Router b/w0 of node b (a follower only: R = 1 for its own log), its leader a/w0 heard."""
    config = Config(node_id="b", data_dir=str(tmp_path), fsync=fsync, replication_factor=1, min_insync=1,
                    segment_bytes=segment_bytes)
    router = Router(RouterConfig(router_id="b/w0", node_id="b"))
    own = CommitLog(tmp_path / "b" / "w0", router_id="b/w0", loop=loop, fsync=fsync)
    router.attach_log(own, fsync == "always")
    mesh = RecordingMesh()
    mesh.peers[LEADER] = SimpleNamespace(router_id=LEADER, node_id="a", incarnation=1, claim_floor=-1,
                                         alive=True, replicas={}, seen_of_me=-1)
    return Replication(config, router, mesh, loop), mesh


def _batch(first: int, n: int) -> bytes:
    """A leader's batch of ``n`` records from ``first``, packed as its log packs one."""
    return msgpack.packb([(1_000 + i, LEADER, first + i, "c", "t/x", 1, False, b"", b"p" * 100)
                          for i in range(n)])


async def _close(repl: Replication) -> None:
    await repl.close()
    await repl.log.aclose()


def test_a_follower_acknowledges_a_batch_only_once_its_log_wrote_it(tmp_path):
    """With --fsync interval a follower's REPLICA_ACK means what the leader's own copy means:
    the batch is written into the kernel. Held in memory (the writer busy), it is not
    acknowledged; once the writer is done, it is (before: acknowledged as it was queued)."""

    async def run() -> None:
        loop = asyncio.get_running_loop()
        repl, mesh = _follower(tmp_path, loop)
        try:
            peer = mesh.peers[LEADER]
            repl.replicate(peer, LEADER, 0, 9, _batch(0, 10), -1)  # the first batch: written at once
            await asyncio.sleep(0)
            rep = repl.replicas[LEADER]
            assert rep.log.written_offset == 9 and mesh.acks() == [9]
            writer = rep.log._thread
            with writer._lock:  # the writer thread is busy (an fsync under way): batches wait
                repl.replicate(peer, LEADER, 10, 19, _batch(10, 10), -1)
                for _ in range(3):
                    await asyncio.sleep(0.01)
                assert rep.log.written_offset == 9, "the writer wrote while held"
                assert mesh.acks() == [9], "acknowledged a batch its log had not written"
                # A repeat of it (the leader's fetch answer crossing the live batch) neither.
                repl.replicate(peer, LEADER, 10, 19, _batch(10, 10), -1)
                await asyncio.sleep(0)
                assert max(mesh.acks()) == 9
            for _ in range(200):
                if max(mesh.acks()) == 19:
                    break
                await asyncio.sleep(0.005)
            assert rep.log.written_offset == 19 and max(mesh.acks()) == 19
        finally:
            await _close(repl)

    asyncio.run(run())


def test_a_replicated_batch_leaves_in_the_iteration_that_read_it(tmp_path):
    """A QoS 1 acknowledgement held for the follower marks the log's batch for the end of the
    loop iteration, as an unreplicated one does: its REPLICATE frame leaves then, not after the
    log's linger (before: at the linger), and the acknowledgement goes once the follower and the
    leader's own log hold the record."""
    from brokerd.connection.batching import EndOfTick
    from brokerd.connection.codec import PUBACK, success_ack
    from brokerd.router.message import Message

    from .conftest import FakeConn

    async def run() -> None:
        loop = asyncio.get_running_loop()
        config = Config(node_id="a", data_dir=str(tmp_path), replication_factor=2, min_insync=2)
        router = Router(RouterConfig(router_id=LEADER, node_id="a"))
        log_ = CommitLog(tmp_path / "a" / "w0", router_id=LEADER, loop=loop, linger_ms=50.0)  # no test waits it out
        router.attach_log(log_, False, EndOfTick(loop))
        mesh = RecordingMesh()
        mesh.peers["b/w0"] = SimpleNamespace(router_id="b/w0", node_id="b", incarnation=1, claim_floor=-1,
                                             alive=True, parked=False, last_seen=time.monotonic(), replicas={},
                                             seen_of_me=-1)
        repl = Replication(config, router, mesh, loop)
        try:
            repl.heartbeat()
            assert repl.followers == ["b/w0"]

            def publish(packet_id: int) -> tuple[Client, bytes]:
                client = Client(router, FakeConn())  # (compiled, a Client is checked as one)
                msg = Message("e/x", b"m", 1, False, "p", LEADER)
                router.publish(msg)
                ack = success_ack(PUBACK, packet_id)
                router.defer_ack(msg.log_offset, client, ack)
                return client, ack

            def batches() -> list[tuple[int, int]]:
                return [(body[1], body[2]) for _, kind, body in mesh.sent if kind == "replicate"]

            first, ack1 = publish(1)
            await asyncio.sleep(0)  # the end of this iteration
            assert batches() == [(0, 0)], "the batch waited for the log's linger"
            assert first.conn.chunks == [] and first.held_acks == 1  # held for the follower
            second, ack2 = publish(2)
            await asyncio.sleep(0)
            assert batches() == [(0, 0), (1, 1)]
            repl.acknowledged("b/w0", LEADER, 0)
            assert first.conn.chunks == [ack1] and second.conn.chunks == []
            repl.acknowledged("b/w0", LEADER, 1)
            assert second.conn.chunks == [ack2] and second.held_acks == 0
        finally:
            await repl.close()
            await log_.aclose()

    asyncio.run(run())


class LoopLag:
    """The longest the loop went without running a 1 ms timer, while it runs (``async with``)."""

    def __init__(self) -> None:
        self.max_s = 0.0
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            self.max_s = max(self.max_s, time.perf_counter() - t - 0.001)

    async def __aenter__(self) -> LoopLag:
        self._task = asyncio.get_running_loop().create_task(self._run())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        await asyncio.sleep(0.01)  # the timer sees the last stretch too
        self._task.cancel()


async def _until(check: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


@pytest.mark.alone  # the loop's lag is measured: a broker or Spark beside it on a 2-core machine delays the loop by itself
def test_a_replica_begun_anew_is_removed_without_the_loop_waiting_for_the_disk(tmp_path):
    """A replica whose leader's log moved past it (retention: REPLICATE with high-water -2) is
    removed and begun anew. 20,000 files in it: the unlinks take a good part of a second on the
    loop (before: ``shutil.rmtree`` in the frame's handler); now the loop goes on meanwhile, and
    the new replica follows at once."""

    async def run() -> None:
        loop = asyncio.get_running_loop()
        repl, mesh = _follower(tmp_path, loop)
        try:
            peer = mesh.peers[LEADER]
            repl.replicate(peer, LEADER, 0, 9, _batch(0, 10), -1)
            old_dir = repl.replicas[LEADER].log.directory
            junk = os.path.join(old_dir, "many")
            os.mkdir(junk)
            for i in range(20_000):
                open(os.path.join(junk, str(i)), "wb").close()
            parent = os.path.dirname(old_dir)
            started = time.perf_counter()
            async with LoopLag() as lag:
                repl.replicate(peer, LEADER, 5_000, 5_009, _batch(5_000, 10), -2)
                rep = repl.replicas[LEADER]
                assert rep.log.start_offset == 5_000 and rep.log.next_offset == 5_010
                assert not os.path.exists(junk), "the old replica's files are still at its path"
                await _until(lambda: sorted(os.listdir(parent)) == [os.path.basename(old_dir)])
            removed_s = time.perf_counter() - started
            assert lag.max_s < min(0.1, removed_s / 2), \
                f"the loop waited {lag.max_s * 1000:.0f} ms of the {removed_s * 1000:.0f} ms removal"
            await _until(lambda: max(mesh.acks()) == 5_009)
        finally:
            await _close(repl)

    asyncio.run(run())


@pytest.mark.alone  # the loop's lag is measured: a broker or Spark beside it on a 2-core machine delays the loop by itself
def test_a_fetched_history_joins_its_log_without_the_loop_waiting_for_the_disk(tmp_path):
    """A follower's history fetch that a restart cut short goes on from what ``_history/`` holds,
    and the history joins the replica: a rename, an fsync and an index check per segment. With
    1,000 segments that took the loop about half a second (before: ``join_history`` on the loop);
    now the loop goes on, and the replica reads the whole partition once the history joined."""
    start, per_segment = 30_000, 4096  # about 30 records a segment

    # As a crash left them: the replica from ``start`` on, and its history below, fetched whole.
    replica = tmp_path / "b" / "_replicas" / "w0" / "a" / "w0"
    with CommitLog(replica, router_id=LEADER) as main:
        main.start_at(start)
        main.append_batch(start, msgpack.unpackb(_batch(start, 10)), None)
    with CommitLog(replica / "_history", router_id=LEADER, segment_bytes=per_segment) as hist:
        for first in range(0, start, 1000):
            hist.append_batch(first, msgpack.unpackb(_batch(first, 1000)), None)
        assert len(hist.segments()) > 900

    async def run() -> None:
        loop = asyncio.get_running_loop()
        repl, mesh = _follower(tmp_path, loop, segment_bytes=per_segment)
        try:
            rep = repl.replicas[LEADER]
            assert rep.log.start_offset == start
            async with LoopLag() as lag:
                repl.replicate(mesh.peers[LEADER], LEADER, start + 10, start + 19, _batch(start + 10, 10), start + 9)
                await _until(lambda: any(kind == "history_fetch" for _, kind, _ in mesh.sent))
                asks = [body for _, kind, body in mesh.sent if kind == "history_fetch"]
                assert asks == [[LEADER, start, start]]  # from what it holds on
                repl.history(LEADER, LEADER, -1, -1, b"")  # nothing more below
                await _until(lambda: rep.log.start_offset == 0)
            got = rep.log.read(0, max_records=start + 20, max_bytes=1 << 30)
            assert [r.offset for r in got] == list(range(start + 20))
            assert not os.path.exists(replica / "_history")
            assert lag.max_s < 0.1, f"the loop waited {lag.max_s * 1000:.0f} ms"
        finally:
            await _close(repl)

    asyncio.run(run())


def test_a_history_joins_a_log_that_is_written_to_while_it_moves_in(tmp_path):
    """``join_history_async`` on a log with no segment yet: while its thread writes the log's
    empty first segment and moves the history in, the log flushes a batch into that same
    segment. Neither undoes the other: the log reads the history and the batch, and a reopen
    goes on at the log's own end."""
    history = tmp_path / "main" / "_history"
    with CommitLog(history, router_id=LEADER, segment_bytes=4096) as hist:
        hist.append_batch(0, msgpack.unpackb(_batch(0, 300)), None)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        log_ = CommitLog(tmp_path / "main", router_id=LEADER, loop=loop)
        try:
            log_.start_at(300)
            join = loop.create_task(log_.join_history_async(str(history), 299))
            await asyncio.sleep(0)  # the join began: its thread creates the first segment
            log_.append_batch(300, msgpack.unpackb(_batch(300, 5)), None)  # a flush into it
            assert await join > 5
            log_.append_batch(305, msgpack.unpackb(_batch(305, 5)), None)
            await _until(lambda: log_.written_offset == 309)
            assert [r.offset for r in log_.read(0, 1000, 1 << 30)] == list(range(310))
        finally:
            await log_.aclose()

    asyncio.run(run())
    with CommitLog(tmp_path / "main", router_id=LEADER) as again:
        assert again.start_offset == 0 and again.next_offset == 310
        assert [r.offset for r in again.read(0, 1000, 1 << 30)] == list(range(310))
