"""Replication's receiving end: each replication frame the mesh reads, handed to its part.

The mesh's one dispatch table (``cluster.mesh.dispatch.FRAMES``) names these handlers with the
part "replication": the mesh checks a frame and its sender, and the replication decides what the
frame means here. Each handler takes ``(peer, body, size)``, as every mesh handler does, and
unpacks the body (its shape is checked by ``router.mesh_format``) for the part whose frame it is.
A router that replicates nothing (R = 1 on every node) has no ``Replication``: the mesh ignores
these frames there. SESSION_GONE is not here: it also reaches a router before its replication
is set up (its stale copies are dropped by the router itself), so the mesh keeps its handler.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .part import Part

if TYPE_CHECKING:
    from ..mesh import Peer
    from .catchup import CatchupPart
    from .follower import FollowerPart
    from .history import HistoryPart
    from .leader import LeaderPart
    from .read_back import ReadBackPart
    from .restore import RestorePart
    from .sessions import SessionsPart


class FramesPart(Part):
    """The handlers of the frames only a replicating router acts on, one a kind."""

    lead: LeaderPart
    follow: FollowerPart
    histories: HistoryPart
    readback: ReadBackPart
    session_part: SessionsPart
    catchups: CatchupPart
    restorer: RestorePart

    def on_replicate(self, peer: Peer, body: Any, size: int) -> None:
        """REPLICATE: a batch of ``peer``'s log for the replica here (the follower's)."""
        self.follow.replicate(peer, *body)

    def on_replica_ack(self, peer: Peer, body: Any, size: int) -> None:
        """REPLICA_ACK: a follower holds this router's log up to an offset (the leader's)."""
        self.lead.acknowledged(peer.router_id, *body)

    def on_replica_fetch(self, peer: Peer, body: Any, size: int) -> None:
        """REPLICA_FETCH: a follower lacks records from an offset (the leader reads them back)."""
        self.lead.fetch(peer, *body)

    def on_replica_catchup(self, peer: Peer, body: Any, size: int) -> None:
        """REPLICA_CATCHUP: read a silent router's messages back from its replica here."""
        self.readback.catchup(peer, *body)

    def on_replica_publish(self, peer: Peer, body: Any, size: int) -> None:
        """REPLICA_PUBLISH: the answer, messages of a silent router read back from a replica."""
        self.readback.replayed(*body)

    def on_session_state(self, peer: Peer, body: Any, size: int) -> None:
        """SESSION_STATE: a leader's persistent sessions, held here as replicas."""
        self.session_part.session_state(peer, *body)

    def on_session_catchup(self, peer: Peer, body: Any, size: int) -> None:
        """SESSION_CATCHUP: read this router's log (or a replica) back for one moved session."""
        self.catchups.session_catchup(peer, *body)

    def on_session_copies(self, peer: Peer, body: Any, size: int) -> None:
        """SESSION_COPIES: the answer, copies for a session of this router's; the last of an
        answer names the partition asked for (mesh version 20), and the ask is done."""
        self.router.take_copies(body[0], body[1], read_back=True)
        if body[2] and len(body) > 3:
            self.catchups.answered(body[0], body[3])

    def on_session_restore(self, peer: Peer, body: Any, size: int) -> None:
        """SESSION_RESTORE: a router back on an empty disk asks for its sessions held here."""
        self.restorer.restore_sessions(peer, body)

    def on_session_restored(self, peer: Peer, body: Any, size: int) -> None:
        """SESSION_RESTORED: one of this router's sessions, sent back by a follower."""
        self.restorer.restored(peer.router_id, *body)

    def on_history_fetch(self, peer: Peer, body: Any, size: int) -> None:
        """HISTORY_FETCH: a log that starts too high asks for the records below its start."""
        self.histories.history_fetch(peer, *body)

    def on_history(self, peer: Peer, body: Any, size: int) -> None:
        """HISTORY: the answer, contiguous records below a log's start."""
        self.histories.history(peer.router_id, *body)
