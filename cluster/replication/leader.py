"""Replication, the leader's side: this router's own log (its *partition*) copied to its followers.

The followers are the first R-1 live nodes of the rendezvous order (``follower_nodes``), on each
the router ``follower_router`` picks; the placement is recomputed on every heartbeat, so a
follower whose node falls silent is replaced by the next live node (a new follower starts at the
high-water mark + 1 and fetches what it lacks). Each log batch, as the log packs it
(``CommitLog.on_batch``: the records' msgpack body, encoded once), goes to each follower in one
REPLICATE frame ``[partition, first, last, body, high_water]``. The leader's own copy counts up
to what its log wrote into the kernel (with ``--fsync always``: what is durable), as the
followers' do (``CommitLog.on_written``, ``on_durable``). QoS 1/2 acknowledgements are held
(``Router.defer_ack``) until the high-water mark passes them, and refused at
``--replica-timeout``: the connection closes and the client sends again. With fewer live nodes
than ``--min-insync``, the live nodes are what is required (a node alone acknowledges alone):
until the cluster view is agreed, a node cannot tell a dead peer from a partition, and refusing
every publish on a peer's death is not what a user of one would expect. A gap is asked for with
REPLICA_FETCH ``[partition, offset]``, answered from the log; a leader that sends nothing new
tells a follower behind it where its log ends (``tell_end``).

The rules are ``cluster.replication.rules.LeaderState`` (held acknowledgements, the high-water mark)
and ``placement.Placement`` (who follows); this part moves their frames.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import msgpack

from brokerd.router.log.format import record_fields

from .part import Part
from .placement import PeerSeen, Placement
from .rules import Held, LeaderState, TailRepair

if TYPE_CHECKING:
    from brokerd.router.client import Client

    from ..mesh import Peer
    from .majority import MajorityPart
    from .sessions import SessionsPart

log = logging.getLogger(__package__)  # (the package's name: the log lines name it as before)

FETCH_RECORDS = 2000  # records per REPLICATE frame that answers a fetch (and per catch-up step)
FETCH_BYTES = 4 << 20
# A follower behind the leader's end that was sent nothing for this long is sent the last record
# again: it fetches what it lacks before it (a gap is otherwise seen only at the next write).
TAIL_AGAIN_S = 0.5


class LeaderPart(Part):
    """The leader of this router's log: placement, batches out, acknowledgements held."""

    # The other parts it calls (set by ``Replication``).
    session_part: SessionsPart
    quorum: MajorityPart

    def __init__(self, shared: Part) -> None:
        super().__init__(shared)
        config = self.config
        end = self.log.durable_offset if self.always else self.log.written_offset
        self.leader = LeaderState([], 1, config.replica_lag, config.replica_timeout, self.clock, end)
        self.placement = Placement(self.partition, self.config.node_id, self.factor, self.min_insync)
        self.flushed = self.log.next_offset - 1  # the last offset handed to followers in a live batch
        self.tail = TailRepair(self.flushed, TAIL_AGAIN_S)  # the gap repair (``tell_end``)
        self.refused = 0  # acknowledgements refused at --replica-timeout

    @property
    def followers(self) -> list[str]:
        """The routers that follow this router's log now (``Placement``)."""
        return self.placement.followers

    def hold(self, offset: int, client: Client, ack: bytes) -> bool:
        """Whether the acknowledgement of the record at ``offset`` must wait for the followers
        (or for the majority, on a node cut off from it)."""
        now = self.clock()
        if now >= self.net.pause_deadline() or now >= self.quorum.recount_at:
            self.net.check_paused()  # after a pause, or the lease's end, the majority is counted again first
        if self.leader.hold(offset, (client, ack)):
            return True
        if self.quorum.in_minority:
            self.quorum.cut_off.hold(offset, (client, ack))
            return True
        return False

    def on_batch(self, first: int, last: int, body: bytes) -> None:
        self.flushed = last
        if self.followers:
            frame_body = [self.partition, first, last, body, self.leader.high_water]
            for rid in self.followers:
                peer = self.net.peer(rid)
                if peer is not None and peer.alive:
                    self.net.send(peer, "replicate", frame_body)

    def leader_end(self, end: int) -> None:
        """The leader's own copy: what its log wrote into the kernel (with ``--fsync always``:
        made durable). Not at ``on_batch``: a batch is flushed there, and may wait for the writer."""
        self.release(self.leader.written(end))

    def release(self, held: list[Held]) -> None:
        if not held:
            return
        if self.quorum.in_minority:
            self.quorum.cut_off.keep(held)  # replicated, but this side of a partition may not acknowledge
            return
        self.router.release_acks([h.token for h in held])

    def acknowledged(self, sender: str, partition: str, offset: int) -> None:
        if partition == self.partition:  # never beyond what was sent: a lying follower releases nothing
            self.release(self.leader.acknowledged(sender, min(offset, self.flushed)))

    def fetch(self, peer: Peer, partition: str, offset: int) -> None:
        """A follower lacks our records from ``offset`` on: read them back from the log, up to
        the last batch that went out live (later ones are on their way)."""
        if partition != self.partition:
            return
        start = max(offset, self.log.start_offset)
        if start > self.flushed:
            return
        records = [r for r in self.log.read(start, max_records=FETCH_RECORDS, max_bytes=FETCH_BYTES)
                   if r.offset <= self.flushed]
        if not records:
            return
        body = msgpack.packb([record_fields(r) for r in records])
        # ``start`` beyond ``offset``: retention deleted what it asks for; -2 tells it to begin anew.
        hw = self.leader.high_water if start == offset else -2
        self.net.send(peer, "replicate", [self.partition, records[0].offset, records[-1].offset,
                                          body, hw])
        self.tail.told(peer.router_id, self.clock())
        if records[-1].offset < self.flushed:  # more to fetch: the follower asks at once, not at the next tick
            self._send_last(peer)

    def tell_end(self) -> None:
        """Each follower behind this log's end that was sent nothing for ``TAIL_AGAIN_S`` is sent
        the last record again, as a live batch of one: one that lacks records before it fetches
        them (``FollowerState.arrived``), one that holds it acknowledges again. Without it, a
        follower back from a cut, or whose fetch went unanswered, waits for the next write. A
        frame every follower already reads: no new kind. Nothing is sent to followers in sync."""
        now = self.clock()
        for rid in self.tail.due(self.flushed, self.leader.acked, self.followers, now):
            peer = self.net.peer(rid)
            if peer is not None and peer.alive:
                self.tail.told(rid, now)
                self._send_last(peer)

    def _send_last(self, peer: Peer) -> None:
        records = self.log.read(self.flushed, max_records=1)
        if records and records[0].offset == self.flushed:
            body = msgpack.packb([record_fields(records[0])])
            self.net.send(peer, "replicate", [self.partition, self.flushed, self.flushed, body,
                                              self.leader.high_water])

    def place(self) -> None:
        """The followers for the live nodes now (called on every heartbeat): ``Placement``'s
        decision, acted on in its order."""
        if self.factor <= 1:
            return
        seen = [PeerSeen(rid, p.node_id, p.alive, p.incarnation, self.partition in p.replicas)
                for rid, p in self.net.items()]
        starting = self.clock() - self._started < 2 * self.config.mesh_timeout + 1.0  # peers still joining
        # Cut off from the majority, it acknowledges nothing at all (said by ``count_majority``): the
        # shortfall is told once the majority is back, if it still holds.
        placed = self.placement.place(seen, starting, self.quorum.members.has_majority,
                                      self.session_part.sessions_ready and self.session_part.sessions_known)
        if placed.warn_short:
            log.warning("replication: %d live node(s), fewer than --min-insync %d: QoS 1/2 messages are "
                        "acknowledged once on %d node(s)", 1 + len(placed.followers), self.min_insync, placed.needed)
        for rid in placed.dropped:  # a follower no more: its copy of the sessions would go stale
            self.session_part.send_sessions(rid, {}, True)
        if placed.moved:
            log.info("replication: the log of %s is followed by %s", self.partition,
                     ", ".join(placed.followers) or "nobody")
        if placed.changed:
            self.release(self.leader.set_followers(placed.followers, placed.needed))
        for rid in placed.added:  # what waits for it already went out before it was chosen: send it now
            peer = self.net.peer(rid)  # (one of ``seen``: known)
            if peer is not None:
                self.fetch(peer, self.partition, self.leader.high_water + 1)
        for rid in placed.full_to:  # a new follower, or a new incarnation of one: every session
            self.session_part.send_sessions(rid, self.session_part.sessions_sent, True)
        # A router that holds a replica of this log without being its follower now (it was one
        # before this router restarted, or before a node came back): the sessions it holds of
        # this router are stale, and, taken for current after this router's death, would hand
        # a client an old state of its session. Cleared once per incarnation of each.
        for rid in placed.clear:
            self.session_part.send_sessions(rid, {}, True)
