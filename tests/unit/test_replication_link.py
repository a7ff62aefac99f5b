"""Replication's two seams: ``MeshLink`` (the one way it reaches the mesh, ``MeshAdapter`` over a
mesh's attributes) and ``ReplicationPort`` (what the router calls on it), checked against what
implements them."""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any

from brokerd.cluster.replication import Replication
from brokerd.cluster.replication.link import MeshAdapter, MeshLink
from brokerd.router.ports import ReplicationPort


class FakeMesh:
    def __init__(self) -> None:
        self.peers: dict[str, Any] = {
            "b/w0": SimpleNamespace(router_id="b/w0", node_id="b", alive=True, parked=False),
            "c/w0": SimpleNamespace(router_id="c/w0", node_id="c", alive=False, parked=True),
        }
        self.sent: list[tuple[str, str, Any]] = []
        self.pause_deadline = 12.5
        self.lease: Any = None
        self.checked = 0
        self.clock = lambda: 5.0
        self.wall = lambda: 1_700_000_000.0

    def send_replication(self, peer: Any, what: str, body: Any) -> None:
        self.sent.append((peer.router_id, what, body))

    def check_paused(self) -> None:
        self.checked += 1

    def silent_since(self, peer: Any) -> float:
        return 1000.0 if peer.parked else 2000.0


def _public(cls: type) -> dict[str, Any]:
    return {n: v for n, v in vars(cls).items() if not n.startswith("_")}


def test_the_adapter_reads_the_meshs_peers_as_they_are_now():
    mesh = FakeMesh()
    link = MeshAdapter(mesh)
    assert link.peer("b/w0") is mesh.peers["b/w0"] and link.peer("x/w0") is None
    assert link.hears("b/w0") and not link.hears("c/w0") and not link.hears("x/w0")
    mesh.peers["d/w0"] = SimpleNamespace(router_id="d/w0", node_id="d", alive=True, parked=False)
    assert list(link.ids()) == ["b/w0", "c/w0", "d/w0"]
    assert [p.router_id for p in link.peers()] == [rid for rid, _ in link.items()] == list(mesh.peers)


def test_the_adapter_sends_and_asks_through_the_mesh():
    mesh = FakeMesh()
    link = MeshAdapter(mesh)
    link.send(mesh.peers["b/w0"], "ack", ["a/w0", 7])
    assert mesh.sent == [("b/w0", "ack", ["a/w0", 7])]
    assert link.silent_since(mesh.peers["c/w0"]) == 1000.0 and link.pause_deadline() == 12.5
    link.check_paused()
    lease = object()
    link.carry_lease(lease)
    assert mesh.checked == 1 and mesh.lease is lease and link.hello_interval() > 0
    # The mesh's own clocks, the very objects: the replication reads its peers' times on them.
    assert link.clock is mesh.clock and link.wall is mesh.wall


def test_the_adapter_implements_every_method_of_the_link():
    for name, method in _public(MeshLink).items():
        impl = getattr(MeshAdapter, name)
        assert list(inspect.signature(impl).parameters) == list(inspect.signature(method).parameters), name


def test_replication_implements_the_routers_port():
    for name, member in _public(ReplicationPort).items():
        impl = getattr(Replication, name)
        if isinstance(member, property) or isinstance(impl, property):  # (compiled, the port's
            assert isinstance(impl, property), name  # properties are descriptors of another kind)
        else:
            assert list(inspect.signature(impl).parameters) == list(inspect.signature(member).parameters), name
