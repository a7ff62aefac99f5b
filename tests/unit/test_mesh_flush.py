"""The mesh's publish batch on the worker's ``EndOfTick``, with a fake loop and a fake link:
an end-only item (a quiet client's early write does not cut its frame short), small batches
waiting one more iteration (``LINGER_BELOW``), one ``call_soon`` an iteration for the mesh and
the connections together. No sockets: the mesh is made, not started."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import msgpack
import pytest

from brokerd.cluster.config import Config
from brokerd.cluster.mesh import Mesh, Peer
from brokerd.cluster.mesh.limits import LINGER_BELOW
from brokerd.connection.batching import EndOfTick
from brokerd.router.clock import FakeClock
from brokerd.router.message import Message
from brokerd.router.router import Router, RouterConfig


class _Link:
    """A peer's link that keeps what it is sent: the messages of each PUBLISH frame."""

    pending: list[bytes] = []

    def __init__(self) -> None:
        self.frames: list[int] = []  # messages per frame

    def send(self, frame: bytes, sources: Iterable[object] = ()) -> bool:
        body = msgpack.unpackb(frame, raw=False)[4]
        self.frames.append(len(body[1]))
        return True


class _Conn:
    """A connection's output on the same tick: counts its writes."""

    def __init__(self, tick: EndOfTick) -> None:
        self.tick = tick
        self.out = 0
        self.writes = 0

    def send(self) -> None:
        if not self.out:
            self.tick.mark(self)
        self.out += 1

    def flush(self) -> None:
        if self.out:
            self.writes += 1
            self.out = 0


def _mesh(clock: FakeClock, tick: EndOfTick) -> tuple[Mesh, _Link]:
    """u/w0's mesh, made and not started, with one live peer u/w1 on a fake link."""
    router = Router(RouterConfig(router_id="u/w0", node_id="u"))
    mesh = Mesh(Config(workers=2, node_id="u", listen=("127.0.0.1", 1)), 0, router, clock,  # type: ignore[arg-type]
                tick)
    peer = Peer("u/w1", "u", None, None)
    link = _Link()
    peer.alive, peer.link = True, link  # type: ignore[assignment]
    mesh.peers["u/w1"] = peer
    return mesh, link


@pytest.fixture
def setup(tmp_path, monkeypatch) -> Iterator[tuple[FakeClock, EndOfTick, Mesh, _Link]]:
    monkeypatch.setenv("BROKERD_RUN_DIR", str(tmp_path / "run"))
    clock = FakeClock()
    tick = EndOfTick(clock)
    mesh, link = _mesh(clock, tick)  # given the tick, as the worker does
    try:
        yield clock, tick, mesh, link
    finally:
        mesh.transport.close()


def _publish(mesh: Mesh, n: int) -> None:
    for i in range(n):
        mesh.forward_to(("u/w1",), Message("t", b"%d" % i, client_id="p"))


def test_a_quiet_clients_early_write_does_not_send_the_meshs_batch(setup):
    clock, tick, mesh, link = setup
    conn = _Conn(tick)
    mark = tick.pending()
    _publish(mesh, 1)  # a quiet client's publish, to a subscriber here and to one on u/w1
    conn.send()
    tick.flush_since(mark)  # what its packet caused here goes at once
    assert conn.writes == 1 and link.frames == []  # the mesh's batch keeps filling
    _publish(mesh, 3)  # the busy clients' publishes of the same iteration
    clock.run_ready()
    assert link.frames == []  # a small batch: it waits one more iteration, as without the quiet one
    _publish(mesh, 2)
    clock.run_ready()
    assert link.frames == [6]


def test_a_small_batch_waits_one_more_iteration_and_travels_with_what_came_meanwhile(setup):
    clock, tick, mesh, link = setup
    conn = _Conn(tick)
    _publish(mesh, 3)
    conn.send()
    assert clock.pending == 1  # one call_soon for the mesh and the connection
    clock.run_ready()
    assert conn.writes == 1 and link.frames == []
    _publish(mesh, 4)  # the next iteration's reads
    conn.send()
    assert clock.pending == 1
    clock.run_ready()
    assert link.frames == [7] and conn.writes == 2
    assert clock.pending == 0


def test_a_full_batch_goes_at_the_end_of_its_own_iteration(setup):
    clock, _tick, mesh, link = setup
    _publish(mesh, LINGER_BELOW)
    clock.run_ready()
    assert link.frames == [LINGER_BELOW]
    assert clock.pending == 0


def test_the_mesh_flushes_in_the_pass_of_the_tick_it_was_given(setup):
    """One pass for the connections and the mesh: the mesh schedules no call of its own."""
    clock, tick, mesh, link = setup
    assert mesh.end_of_tick is tick
    conn = _Conn(tick)
    _publish(mesh, LINGER_BELOW)
    conn.send()
    assert clock.pending == 1  # the tick's one call_soon, for both
    assert clock.run_ready() == 1
    assert link.frames == [LINGER_BELOW] and conn.writes == 1
    assert clock.pending == 0
