"""Replication against a real commit log: what a follower's acknowledgement means, and when a
replicated batch leaves.

The mesh is a recording fake (these tests are about the log and the event loop, not the
transport); the logs are real ``CommitLog`` directories under ``tmp_path``."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import msgpack

from brokerd.cluster.config import Config
from brokerd.cluster.replication import Replication
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

            def publish(packet_id: int) -> tuple[SimpleNamespace, bytes]:
                client = SimpleNamespace(conn=FakeConn(), held_acks=0)
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
