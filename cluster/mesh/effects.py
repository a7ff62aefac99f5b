"""What the mesh's sans-IO cores yield that every shell acts on alike: a frame to one peer, and
a flush of what this loop iteration collected (before a frame or a state change that must follow
it). Each core's own effects live beside it (``membership``, ``announcements``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from .peer import Peer


class Frame(NamedTuple):
    """A frame to ``peer`` on its link (queued behind what waits there)."""

    peer: Peer
    kind: int
    body: Any


class Flush(NamedTuple):
    """What this loop iteration collected goes now (before what follows must)."""
