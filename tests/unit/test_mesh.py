"""The mesh with two routers in one event loop: real ZeroMQ sockets (ipc in a temporary run
directory), real routers, fake connections. Faster and more precise than a broker process for
the mesh's own rules: interest announcements, forwarding once per router, takeover."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import msgpack
import pytest

from brokerd.cluster.config import Config
from brokerd.cluster.mesh import Mesh, Peer
from brokerd.connection.batching import EndOfTick
from brokerd.connection.packets import Publish, Subscription
from brokerd.router.mesh_format import ECHO, PUBLISH, TAKEOVER_RESP, to_mesh
from brokerd.router.message import Message
from brokerd.router.router import Router, RouterConfig
from tests.unit.conftest import FakeConn, online


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("BROKERD_RUN_DIR", str(tmp_path / "run"))
    return tmp_path / "run"


async def _pair() -> tuple[list[Router], list[Mesh]]:
    config = Config(workers=2, node_id="u", listen=("127.0.0.1", 1), mesh_timeout=1.0)
    loop = asyncio.get_running_loop()
    routers = [Router(RouterConfig(router_id=f"u/w{i}", node_id="u")) for i in range(2)]
    meshes = [Mesh(config, i, r, loop, EndOfTick(loop)) for i, r in enumerate(routers)]
    for r, m in zip(routers, meshes, strict=True):
        r.attach_mesh(m)
    await asyncio.wait_for(asyncio.gather(*(m.start() for m in meshes)), 10)
    return routers, meshes


async def _until(predicate, what: str, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


def _payloads(conn: FakeConn) -> list[bytes]:
    return [p.payload for p in conn.packets() if isinstance(p, Publish)]


def test_two_routers_forward_by_interest_once_per_router(run_dir):
    async def main() -> None:
        (a, b), meshes = await _pair()
        try:
            subs = [online(b, f"s{i}", ("m/#", 1)) for i in range(3)]
            await asyncio.wait_for(asyncio.gather(*b.interest_pending.values()), 5)
            assert "m/#" in {f for f, _rid, _ in a.interest.items()}
            for i in range(10):
                a.publish(Message("m/x", b"%d" % i, qos=1, client_id="p"))
            a.publish(Message("other/x", b"nobody", qos=1, client_id="p"))
            await _until(lambda: all(len(_payloads(c)) == 10 for _, c in subs), "10 messages each")
            assert all(_payloads(c) == [b"%d" % i for i in range(10)] for _, c in subs)
            # One copy per router, however many subscribers it has; none for a topic it does not want.
            assert meshes[0].peer_stats()["u/w1"][0] == 10
        finally:
            await asyncio.gather(*(m.stop() for m in meshes))

    asyncio.run(main())


def test_a_message_for_several_routers_is_packed_once_and_framed_as_msgpack_would(run_dir):
    """``forward_to`` packs a message for several routers once and each such peer's batch holds
    those bytes (one router's batch keeps the values, packed with the frame); a PUBLISH frame
    built around packed messages, alone or mixed with values, is what packing all the values
    gives, byte for byte (so the receiving side reads it as before), whole or split in halves."""

    async def main() -> None:
        _routers, meshes = await _pair()
        m = meshes[0]
        try:
            live, parked, gone = (Peer(f"{n}/w0", n, None, None) for n in "xyz")
            live.alive, parked.parked = True, True
            for p in (live, parked, gone):
                m.peers[p.router_id] = p
            msg = Message.published("f/1", b"payload", 0, False, "p", "u/w0", None,
                                    b"\x30\x0c\x00\x03f/1payload", 4)
            m.forward_to(("x/w0", "y/w0", "z/w0", "nobody"), msg)
            assert live.batch == [m._packer.pack(to_mesh(msg))] and parked.batch[0] is live.batch[0]
            assert live.batch_packed and parked.batch_packed and gone.batch == []
            m.forward_to(("x/w0",), msg)  # one router: the values, packed with the frame
            assert live.batch[1] == to_mesh(msg)
            live.batch, parked.batch = [], []
            msgs = [Message(f"t/{i:02d}", b"%02d" % i * 20, qos=i % 2, client_id="c") for i in range(50)]
            values = [to_mesh(x) for x in msgs]
            mixed = [m._packer.pack(v) if i % 3 else v for i, v in enumerate(values)]
            [(seq, frame, n)] = m._publish_frames(live, mixed, 42, True)
            assert (seq, n) == (1, 50) and frame == m._frame(PUBLISH, [1, values, 42])
            m.max_frame = len(frame) + 100  # a frame over half the limit is split in halves
            frames = m._publish_frames(live, mixed, 43, True)
            assert [(s, n) for s, _, n in frames] == [(2, 25), (3, 25)]
            assert frames[0][1] == m._frame(PUBLISH, [2, values[:25], -1])
            assert frames[1][1] == m._frame(PUBLISH, [3, values[25:], 43])
        finally:
            await asyncio.gather(*(x.stop() for x in meshes))

    asyncio.run(main())


def test_takeover_moves_a_session_between_two_routers(run_dir):
    async def main() -> None:
        (a, b), meshes = await _pair()
        try:
            s = b.new_session("mover", True)
            b.subscribe(s, Subscription("t/#", 1))
            for i in range(5):
                b.publish(Message("t/x", b"%d" % i, qos=1, client_id="p"))  # queued: offline
            state = await asyncio.wait_for(meshes[0].takeover("mover"), 5)
            assert state is not None and [q[2][1] for q in state["queue"]] == [b"%d" % i for i in range(5)]
            moved = a.import_session("mover", state)
            conn = FakeConn()
            moved.attach(conn)  # type: ignore[arg-type]
            assert _payloads(conn) == [b"%d" % i for i in range(5)]
            # The old router keeps it until the new one confirms (the caller does, once the
            # session's interest is acknowledged and it is in the new router's snapshot).
            await asyncio.sleep(0.2)
            assert "mover" in b.sessions and b.stats.takeovers == 0
            meshes[0].confirm_takeover("mover")
            await _until(lambda: "mover" not in b.sessions, "the old router letting the session go")
            assert b.stats.takeovers == 1
        finally:
            await asyncio.gather(*(m.stop() for m in meshes))

    asyncio.run(main())


def test_a_session_asked_for_while_it_is_being_moved_is_answered_once_the_move_settles(run_dir):
    """A router asked again for a session it is exporting for an earlier request (which the
    asker may have given up while this router was stopped) answers once that move settles, not
    "no session" at once: the asker would make a new, empty session while this one stays here
    (chaos seed 1745875908)."""

    async def main() -> None:
        (a, _b), meshes = await _pair()
        m = meshes[0]
        try:
            s = a.new_session("mover", True)
            a.subscribe(s, Subscription("t/#", 1))
            assert a.release_session("mover", True) is not None and "mover" in a.moving  # the first request
            answers: list = []
            transfers = m.transfers  # the part that answers takeover requests
            send = transfers._send
            transfers._send = lambda peer, kind, body: (answers.append(body) if kind == TAKEOVER_RESP
                                                        else send(peer, kind, body))
            transfers.release(m.peers["u/w1"], 7, "mover")
            await asyncio.sleep(0.1)
            assert answers == [], "answered while the session was being moved"
            a.moved("mover", False)  # the first transfer failed: the session stays here
            await _until(lambda: answers, "the deferred answer")
            [(req, header, _more)] = answers
            assert req == 7 and header is not None and "mover" in a.moving  # offered now, for this request
        finally:
            await asyncio.gather(*(x.stop() for x in meshes))

    asyncio.run(main())


def test_a_router_echoes_a_beat_unless_it_fenced_that_epoch_or_heard_the_peer_for_less_than_a_mesh_timeout(run_dir):
    """The lease's two rules on the echoing side (cluster.quorum.Lease): parking a peer fences
    its incarnation and epoch; a peer taken in (or this router started) less than a mesh timeout
    ago gets no echo."""

    async def main() -> None:
        _routers, meshes = await _pair()
        m = meshes[0].members  # the part that echoes beats
        try:
            real = m.peers["u/w1"]
            real.beat_epoch = 3
            m.park(real, "stopped for the test")
            assert real.fence == (real.incarnation, 3)  # parked: that epoch is fenced
            sent: list = []
            peer = Peer("x/w0", "x", None, None)
            peer.link = SimpleNamespace(sock=SimpleNamespace(send=lambda data, flags=0: sent.append(msgpack.unpackb(data))))
            peer.since = time.monotonic()
            m.core.started -= 10.0
            m._act(m.core.answer_beat(peer, 7, [0, 1], time.monotonic()))
            assert sent == [], "echoed a peer taken in less than a mesh timeout ago"
            peer.since -= 1.5  # heard for longer than the mesh timeout (1 s)
            m._act(m.core.answer_beat(peer, 7, [0, 2], time.monotonic()))
            assert [f[1] for f in sent] == [ECHO] and sent[0][4] == [7, 0, 2]
            peer.fence = (7, 0)  # parked at epoch 0
            m._act(m.core.answer_beat(peer, 7, [0, 3], time.monotonic()))
            assert len(sent) == 1, "echoed a fenced epoch"
            m._act(m.core.answer_beat(peer, 7, [1, 4], time.monotonic()))  # its next epoch
            m._act(m.core.answer_beat(peer, 8, [0, 1], time.monotonic()))  # a new incarnation
            assert [f[4] for f in sent[1:]] == [[7, 1, 4], [8, 0, 1]]
            m.core.started = time.monotonic()
            m._act(m.core.answer_beat(peer, 8, [0, 2], time.monotonic()))
            assert len(sent) == 3, "echoed in this router's own first mesh timeout"
        finally:
            await asyncio.gather(*(x.stop() for x in meshes))

    asyncio.run(main())


def test_frames_kept_for_a_silent_peer_stay_unconfirmed_once_sent_until_it_confirms_them(run_dir):
    """What a router kept for a silent peer goes to it when it is heard again, and into the ring
    of unconfirmed frames like any frame sent: should the peer crash before its log wrote their
    copies, its next incarnation gets them again (the ring is what a restart sends again).
    Sent straight to the link, they were lost with a node SIGKILLed the moment its silence ended
    (partition seed 3: 22 acknowledged messages of a persistent session)."""

    async def main() -> None:
        (a, b), meshes = await _pair()
        m = meshes[0]
        try:
            _, conn = online(b, "s", ("m/#", 1))
            await asyncio.wait_for(asyncio.gather(*b.interest_pending.values()), 5)
            peer = m.peers["u/w1"]
            await _until(lambda: not peer.ring, "the ring empty")
            m.members.park(peer, "silent for the test")
            first = peer.seq_out + 1
            for i in range(3):
                a.publish(Message("m/x", b"%d" % i, qos=1, client_id="p"))
            m._flush()
            kept = list(range(first, peer.seq_out + 1))
            assert kept and peer.backlog and not peer.ring
            m.members.rejoin(peer, "heard again")  # (no await since the park: nothing else rejoined it)
            # (then the numbered frames the rejoin sends: RESYNC, our interest)
            assert [seq for seq, _ in peer.ring if seq > peer.acked][:len(kept)] == kept, \
                "frames kept for a silent peer were sent without entering the ring: a crash now loses them"
            await _until(lambda: _payloads(conn) == [b"0", b"1", b"2"], "the kept messages delivered")
            await _until(lambda: not peer.ring, "the peer confirming them")
        finally:
            await asyncio.gather(*(x.stop() for x in meshes))

    asyncio.run(main())
