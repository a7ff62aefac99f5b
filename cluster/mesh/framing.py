"""Framing: a frame is ``[MESH_VERSION, kind, sender, incarnation, body]`` packed by msgpack.

The formats themselves, the kinds and the one history of mesh versions live in
``router.mesh_format``; this part packs this router's frames: any kind (``_frame``), a frame of a
``NUMBERED`` kind for one peer (``_numbered``: ``[..., body, seq, to]``, in the series of its
PUBLISH frames, kept in its ring like them until confirmed), a peer's PUBLISH batch as numbered
frames split to fit the receivers' limit (``_publish_frames``), and the replication's frames by
name (``send_replication``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgpack

from brokerd.router.mesh_format import (
    HISTORY,
    HISTORY_FETCH,
    MESH_VERSION,
    NUMBERED,
    PUBLISH,
    REPLICA_ACK,
    REPLICA_CATCHUP,
    REPLICA_FETCH,
    REPLICA_PUBLISH,
    REPLICATE,
    SESSION_CATCHUP,
    SESSION_COPIES,
    SESSION_GONE,
    SESSION_RESTORE,
    SESSION_RESTORED,
    SESSION_STATE,
)

from . import delivery

if TYPE_CHECKING:
    from ..config import Config
    from .peer import Peer


def one_or_batch(one: int, batch: int, bodies: list) -> tuple[int, Any]:
    """A loop turn's bodies of one kind to one peer, as one frame: alone as kind ``one`` (the
    same bytes as before batching), several as ``batch`` with the list (TAKEOVER_REQ or
    TAKEOVER_ASKS, TAKEOVER_RESP or TAKEOVER_ANSWERS)."""
    return (one, bodies[0]) if len(bodies) == 1 else (batch, list(bodies))


class FramingMixin:
    """The ``Mesh``'s frames: packed once, sent on a peer's link."""

    config: Config
    router_id: str
    incarnation: int
    max_frame: int
    closed: bool
    _packer: msgpack.Packer
    _publish_head: bytes

    def _frame(self, kind: int, body: Any) -> bytes:
        frame: bytes = self._packer.pack([MESH_VERSION, kind, self.router_id, self.incarnation, body])
        return frame

    def _numbered(self, peer: Peer, kind: int, body: Any) -> tuple[int, bytes]:
        """A frame of ``kind`` for ``peer`` alone, with the next number of its series (and the
        incarnation of ``peer`` it is for); the caller sends it, or keeps it for a silent peer."""
        seq = peer.seq_out = peer.seq_out + 1
        frame: bytes = self._packer.pack([MESH_VERSION, kind, self.router_id, self.incarnation, body, seq,
                                          peer.incarnation or 0])
        return seq, frame

    def _send(self, peer: Peer, kind: int, body: Any) -> None:
        """A frame to ``peer``'s link; one of a ``NUMBERED`` kind stays in its ring until the
        peer confirms it, so that it is sent again if the peer names it missed: ZeroMQ drops
        what a broken connection held (``delivery``)."""
        if peer.link is None:
            return
        if kind not in NUMBERED:
            peer.link.send(self._frame(kind, body))
            return
        seq, frame = self._numbered(peer, kind, body)
        delivery.unconfirmed(peer, seq, frame, self.config.mesh_backlog)
        peer.link.send(frame)

    _REPLICATION_KINDS = {"replicate": REPLICATE, "ack": REPLICA_ACK, "fetch": REPLICA_FETCH,
                          "catchup": REPLICA_CATCHUP, "publish": REPLICA_PUBLISH, "sessions": SESSION_STATE,
                          "gone": SESSION_GONE, "session_catchup": SESSION_CATCHUP, "copies": SESSION_COPIES,
                          "restore": SESSION_RESTORE, "restored": SESSION_RESTORED,
                          "history_fetch": HISTORY_FETCH, "history": HISTORY}

    def send_replication(self, peer: Peer, what: str, body: Any) -> None:
        """A replication frame (``cluster.replication``) to ``peer``."""
        if self.closed:
            return
        self._send(peer, self._REPLICATION_KINDS[what], body)

    def _publish_frames(self, peer: Peer, batch: list, mark: int, packed: bool = False
                        ) -> list[tuple[int, bytes, int]]:
        """``batch`` as one PUBLISH frame numbered for ``peer`` (seq, frame, messages), or split
        in halves until each frame is at most half the receivers' limit (a tick's batch of large
        messages; the length check is all it costs otherwise). Only the last frame carries the
        ``mark``: the others claim nothing (-1). ``packed``: some messages are bytes packed
        already (``forward_to``); the frame is built around them, byte for byte what packing
        their values would give."""
        seq = peer.seq_out + 1
        if not packed:
            frame = self._frame(PUBLISH, [seq, batch, mark])  # one msgpack call for the whole tick
        else:
            pack = self._packer.pack
            frame = b"".join((self._publish_head, b"\x93", pack(seq), self._packer.pack_array_header(len(batch)),
                              *[m if m.__class__ is bytes else pack(m) for m in batch], pack(mark)))
        if len(frame) <= self.max_frame // 2 or len(batch) == 1:
            peer.seq_out = seq
            return [(seq, frame, len(batch))]
        half = len(batch) // 2
        return (self._publish_frames(peer, batch[:half], -1, packed)
                + self._publish_frames(peer, batch[half:], mark, packed))
