"""The one way replication reaches the mesh: the few things it asks of it, declared.

Replication reads who is alive, what each peer router holds and says (``Peer``'s fields:
``alive``, ``node_id``, ``incarnation``, ``replicas``, ``hears``, ...), and sends its frames.
``MeshLink`` names those needs; ``MeshAdapter`` is the only code that touches ``cluster.mesh.Mesh``'s
attributes, so that a change of the mesh's insides changes one class here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..mesh import Peer

# Where a replica's holder is this router itself (``ReadBackPart.holder``), not a peer.
HERE: Any = object()


class MeshLink(Protocol):
    """What replication needs from the mesh: peers by router id or node, frames out, and the
    mesh's clock of silence and pauses."""

    clock: Callable[[], float]
    """The mesh's monotonic clock: the one its ``Peer.last_seen``, ``parked_at`` and
    ``pause_deadline`` are read on, so the replication's rules read it too."""

    wall: Callable[[], float]
    """The mesh's Unix clock (``silent_since``'s)."""

    def peer(self, router_id: str) -> Peer | None:
        """The peer router ``router_id``, heard or silent; None if unknown."""

    def peers(self) -> Iterable[Peer]:
        """Every peer router known (alive, parked or gone quiet)."""

    def items(self) -> Iterable[tuple[str, Peer]]:
        """``peers`` with their router ids."""

    def ids(self) -> Iterable[str]:
        """The ids of every peer router known."""

    def hears(self, router_id: str) -> bool:
        """Whether peer router ``router_id`` counts as alive here now."""

    def send(self, peer: Peer, what: str, body: Any) -> None:
        """A replication frame (``what``: its name in ``Mesh.send_replication``) to ``peer``."""

    def silent_since(self, peer: Peer) -> float:
        """When ``peer`` fell silent (Unix time; now if it is not parked)."""

    def pause_deadline(self) -> float:
        """When, on the monotonic clock, the mesh takes its own heartbeat for late (a pause)."""

    def check_paused(self) -> None:
        """Run a late heartbeat now (``Mesh.check_paused``)."""

    def carry_lease(self, lease: Any) -> None:
        """Have the mesh's HELLOs carry this router's lease beats (``cluster.quorum.Lease``)."""

    def hello_interval(self) -> float:
        """Seconds between the mesh's HELLOs."""


class MeshAttributes(Protocol):
    """What ``MeshAdapter`` reads of ``cluster.mesh.Mesh`` (a test's stand-in has the same)."""

    peers: dict[str, Peer]
    pause_deadline: float
    lease: Any
    clock: Callable[[], float]
    wall: Callable[[], float]

    def send_replication(self, peer: Peer, what: str, body: Any) -> None: ...

    def silent_since(self, peer: Peer) -> float: ...

    def check_paused(self) -> None: ...


class MeshAdapter:
    """``MeshLink`` over ``cluster.mesh.Mesh``: the only code that reads the mesh's attributes."""

    __slots__ = ("_mesh", "clock", "wall")

    def __init__(self, mesh: MeshAttributes) -> None:
        self._mesh = mesh
        self.clock = mesh.clock  # (read once: a per-message rule calls it with no hop)
        self.wall = mesh.wall

    def peer(self, router_id: str) -> Peer | None:
        return self._mesh.peers.get(router_id)

    def peers(self) -> Iterable[Peer]:
        return self._mesh.peers.values()

    def items(self) -> Iterable[tuple[str, Peer]]:
        return self._mesh.peers.items()

    def ids(self) -> Iterator[str]:
        return iter(self._mesh.peers)

    def hears(self, router_id: str) -> bool:
        peer = self._mesh.peers.get(router_id)
        return peer is not None and peer.alive

    def send(self, peer: Peer, what: str, body: Any) -> None:
        self._mesh.send_replication(peer, what, body)

    def silent_since(self, peer: Peer) -> float:
        return self._mesh.silent_since(peer)

    def pause_deadline(self) -> float:
        return self._mesh.pause_deadline

    def check_paused(self) -> None:
        self._mesh.check_paused()

    def carry_lease(self, lease: Any) -> None:
        self._mesh.lease = lease

    def hello_interval(self) -> float:
        from ..mesh import HELLO_INTERVAL_S  # (late, as it always was)

        return HELLO_INTERVAL_S
