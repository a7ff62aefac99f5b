"""A peer router as the mesh sees it: one record of everything the parts keep per peer.

The parts (``delivery``, ``membership``, ``forwarding`` ...) each own some of its fields, named
beside them; they live on one object because every frame a peer sends touches several of them,
and because the replication reads a few (``alive``, ``node_id``, ``origin_mark`` ...).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from brokerd.router.ports import Source

    from .transport import Link


class Peer:
    """Another router: its identity, how to reach it, and what we are about to send it."""

    __slots__ = ("router_id", "node_id", "ipc", "tcp", "incarnation", "last_seen", "alive", "link",
                 "batch", "batch_sources", "stats", "parked", "parked_at", "backlog", "backlog_bytes",
                 "backlog_msgs", "dropped", "log_mark", "replay_from", "seq_out", "seq_in", "acked",
                 "ring", "ring_bytes", "resend", "stats_tcp", "origin_mark", "replaying", "replicas",
                 "claim_floor", "interest_known", "seen_of_me", "missing", "unsure", "held_mark", "held", "resent", "unwritten", "left", "hears",
                 "beat_epoch", "fence", "since", "batch_packed")

    def __init__(self, router_id: str, node_id: str, ipc: str | None, tcp: str | None) -> None:
        self.router_id = router_id
        self.node_id = node_id
        self.ipc = ipc
        self.tcp = tcp
        self.incarnation: int | None = None
        self.last_seen = 0.0
        self.alive = False
        self.link: Link | None = None
        # Forwarded messages: ``to_mesh`` values, or bytes where one message went to several
        # peers and was packed once for all of them (then ``batch_packed``).
        self.batch: list[Any] = []
        self.batch_packed = False
        self.batch_sources: set[Source] = set()
        self.stats = [0, 0, 0, 0]  # msgs out, bytes out, msgs in, bytes in
        # Silent (see the module docstring): interest kept, frames kept for its return.
        self.parked = False
        self.parked_at = 0.0
        # (frame number, frame): a PUBLISH frame's number, 0 for a frame that has none or is in
        # the ring already (one the link still held when it was parked).
        self.backlog: list[tuple[int, bytes]] = []
        self.backlog_bytes = 0
        self.backlog_msgs = 0
        self.dropped = 0  # messages dropped for it while parked (backlog full)
        self.log_mark: int | None = None  # our log's next offset when the backlog last took a frame
        self.replay_from: int | None = None  # backlog full: our log holds the rest from here
        # Numbered PUBLISH frames: the last we sent, the last we received from it, the last it
        # confirmed, and those sent but not confirmed yet (for its next incarnation, if it crashes).
        self.seq_out = 0
        self.seq_in = 0
        # The numbers below ``seq_in`` of its PUBLISH frames that did not come (lost on the way,
        # or sent again later to a new incarnation of ours), oldest first; and the highest mark
        # held back meanwhile (``delivery.first_receipt``).
        self.missing: dict[int, None] = {}
        self.held_mark = -1
        # Its numbered frames of kinds other than PUBLISH received after a missed number, waiting
        # to be acted on in order: (number, (kind, body, size)) (``delivery.hold``).
        self.held: list[tuple[int, Any]] = []
        # Frames of it may have been lost on the way without our knowing yet: since it was parked
        # here (its connection may have dropped what it held), until a frame numbered beyond them
        # or its HELLO's last number tells which (``delivery``).
        self.unsure = False
        # Our frames it named as missed and we sent again: number → when (``to_send_again``).
        self.resent: dict[int, float] = {}
        # (frame number, the log offset its copies end at) of its frames whose copies our log
        # has not written yet (durable, with --fsync always): HELLO confirms only frames before.
        self.unwritten: deque[tuple[int, int]] = deque()
        self.acked = 0
        self.ring: deque[tuple[int, bytes]] = deque()
        self.ring_bytes = 0
        self.resend: list[bytes] = []  # the ring's unconfirmed frames, for a new incarnation
        self.stats_tcp: str | None = None  # its stats socket, when other nodes can read it
        self.replicas: dict[str, int] = {}  # the replicas it holds: {partition: last offset} (HELLO)
        # Its log offset below which we have every message of its own our interest matched (the
        # marks of its PUBLISH frames; -1: unknown). Kept across its incarnations: a new one is
        # asked (CATCHUP) for what its crashed predecessor acknowledged and never sent us.
        self.origin_mark = -1
        # Its HELLO's ``marks`` raise ``origin_mark`` too (its claim that nothing matching our
        # interest is on its way), but only once the mark has reached ``claim_floor``, its log's
        # end when this incarnation first spoke: below that, what a crashed predecessor never
        # sent is read back first (CATCHUP), and a claim must not jump over it.
        self.claim_floor = -1
        self.interest_known = False  # we have its full interest announcement (this incarnation)
        self.seen_of_me = -1  # the highest offset of our log it has seen (its HELLO's ``seen``)
        self.replaying = 0  # reads of our log back to it under way: our frames claim no mark
        self.left = False  # parked because it said GOODBYE (a graceful stop), not heard since
        # The routers it hears, by its last HELLO: whether a majority of the nodes take a router
        # that is silent here for gone (``Replication.gone_for_majority``).
        self.hears: frozenset[str] = frozenset()
        # The lease (cluster.quorum.Lease): the epoch of its last beat heard, and the fence set
        # when it was parked, (incarnation, epoch): beats of that epoch or an older one of that
        # incarnation are not echoed any more.
        self.beat_epoch = -1
        self.fence: tuple[int, int] | None = None
        self.since = 0.0  # when it was last taken in (met, heard again, a new incarnation)
