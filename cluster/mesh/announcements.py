"""Interest announcements without sockets, a loop or a clock: the core of ``interest``.

``InterestCore`` keeps this loop iteration's changes (``batch``) and turns frames into what to
do: an INTEREST received becomes the changes the router applies (a full one first replaces
everything its sender said before) and, when numbered, an acknowledgement sent after what this
iteration collected; an INTEREST_ACK becomes an answer to a numbered request; the changes
collected become one INTEREST frame for every live peer, and a full announcement its frames.
The shell (``interest.Interest``) owns the requests' futures and their timeouts, packs and sends,
and applies each effect through one table.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from brokerd.router.mesh_format import INTEREST

from .effects import Flush, Frame
from .peer import Peer

FULL_CHUNK = 5000  # filters per frame of a full announcement
NEVER = float("inf")  # a request number no acknowledgement reaches: a full announcement is due first


class Replaced(NamedTuple):
    """A full announcement from ``router_id``: everything it announced before goes."""

    router_id: str


class Changed(NamedTuple):
    """``router_id`` announces ``topic_filter`` (``add``: true, a count of shared groups, or
    false for a filter it no longer wants)."""

    router_id: str
    topic_filter: str
    add: bool | int


class Acknowledge(NamedTuple):
    """``peer``'s numbered announcement ``seq`` is answered (INTEREST_ACK, with where this
    router's log is then: its own messages from there that the filters match go to ``peer``)."""

    peer: Peer
    seq: int


class Answered(NamedTuple):
    """``router_id`` acknowledged this router's request ``seq``, its log then at ``end``."""

    seq: int
    router_id: str
    end: int


class Broadcast(NamedTuple):
    """One frame, packed once, for every live peer with a link."""

    kind: int
    body: Any


class InterestCore:
    """This router's interest announcements, as values: the changes of this loop iteration."""

    __slots__ = ("batch",)

    def __init__(self) -> None:
        self.batch: list[tuple[str, bool | int]] = []  # this tick's changes

    def collect(self, topic_filter: str, add: bool | int) -> None:
        """A change to announce with this iteration's others."""
        self.batch.append((topic_filter, add))

    def out(self, seq: int | None) -> Broadcast:
        """This iteration's changes as one INTEREST frame for every live peer; ``seq`` numbers it
        when a request waits for the acknowledgements (an added filter, a barrier)."""
        changes, self.batch = self.batch, []
        return Broadcast(INTEREST, [seq, changes])

    @staticmethod
    def full(peer: Peer, changes: list, seq: int | None = None) -> list[Frame]:
        """Everything this router announces (``changes``) as frames to ``peer``, the first of
        which replaces what it was told before; one even with nothing to announce. ``seq``
        numbers the last: ``peer`` acknowledges it once it has taken everything in."""
        starts = range(0, max(len(changes), 1), FULL_CHUNK)
        return [Frame(peer, INTEREST, [seq if i == starts[-1] else None, changes[i:i + FULL_CHUNK], i == 0])
                for i in starts]

    @staticmethod
    def received(peer: Peer, body: list) -> list[Any]:
        """An INTEREST from ``peer``: its changes, after a ``Replaced`` where it is a full one
        (from then on its interest is known here); then, for a numbered one, what this router
        collected goes first and the acknowledgement follows it."""
        effects: list[Any] = []
        sender = peer.router_id
        seq, changes = body[0], body[1]
        if len(body) == 3 and body[2]:
            effects.append(Replaced(sender))
            peer.interest_known = True
        effects += [Changed(sender, topic_filter, add) for topic_filter, add in changes]
        if seq is not None:
            effects += (Flush(), Acknowledge(peer, seq))
        return effects

    @staticmethod
    def acknowledged(peer: Peer, body: list) -> Answered:
        """An INTEREST_ACK from ``peer``."""
        return Answered(body[0], peer.router_id, body[1])


class Floors:
    """Where each peer router took this router's filters in (``floors``, {router: its log end
    then}): from there on, its messages that any filter here matches come here directly, so a
    session moved here has marks no lower (``Connecting._import_announced``; partition seed 363:
    how far a peer's log is seen here may lie before where it took in a filter another session
    announced just before). A peer reads this router's announcements in order (one socket per
    direction), so its acknowledgement of a request says it had taken in, by that end, whatever
    was sent it before. A floor is kept only from an acknowledgement of a request no older than
    the last one that added a filter, or than its last full announcement; a peer not sent an
    added filter (silent) has none until its next full announcement is acknowledged. Values in,
    the dict changed in place: one entry per peer router, none per filter."""

    __slots__ = ("floors", "_due")

    def __init__(self, floors: dict[str, int]) -> None:
        self.floors = floors
        self._due: dict[str, float] = {}  # router -> the request its acknowledgement must reach

    def added(self, seq: int | None, sent: Iterable[str], others: Iterable[str]) -> None:
        """An announcement that adds a filter (numbered ``seq``), sent to ``sent`` and not to
        ``others``, which take it in from their next full announcement."""
        for rid, due in [*((rid, NEVER if seq is None else seq) for rid in sent), *((rid, NEVER) for rid in others)]:
            self._due[rid] = due
            self.floors.pop(rid, None)

    def full(self, rid: str, seq: int) -> None:
        """A full announcement, its last frame numbered ``seq``, sent to ``rid``."""
        self._due[rid] = seq
        self.floors.pop(rid, None)

    def acknowledged(self, rid: str, seq: int, end: int) -> None:
        """``rid`` acknowledged request ``seq``, its log then at ``end``."""
        if seq >= self._due.get(rid, 0) and end >= self.floors.get(rid, -1):
            self.floors[rid] = end
