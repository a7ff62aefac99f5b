"""Replication's transport (issue 19, docs/replication.md step 1): one router's log copied to
followers on other nodes, acknowledgements held until ``--min-insync`` nodes hold a record, and
a dead router's messages delivered from a replica.

The rules are ``router.replication`` (no I/O); this module moves their frames over the mesh and
their records to and from disk. Per router, on its own log (the *partition* named by its router
id) it is the leader; on other nodes' logs placed here it is a follower.

Leader. The followers are the first R-1 live nodes of the rendezvous order
(``follower_nodes``), on each the router ``follower_router`` picks; the placement is recomputed
on every heartbeat, so a follower whose node falls silent is replaced by the next live node (a
new follower starts at the high-water mark + 1 and fetches what it lacks). Each log batch, as
the log packs it (``CommitLog.on_batch``: the records' msgpack body, encoded once), goes to each
follower in one REPLICATE frame ``[partition, first, last, body, high_water]``. The leader's own
copy counts up to what its log wrote into the kernel (with ``--fsync always``: what is durable),
as the followers' do (``CommitLog.on_written``, ``on_durable``). QoS 1/2 acknowledgements are
held (``Router.defer_ack``) until the high-water mark passes them, and refused at
``--replica-timeout``: the connection closes and the client sends again. With fewer live nodes
than ``--min-insync``, the live nodes are what is required (a node alone acknowledges alone):
until the cluster view is agreed (step 2), a node cannot tell a dead peer from a partition, and
refusing every publish on a peer's death is not what a user of one would expect.

Follower. A replica is a commit log of the same format under
``DATA/<node>/_replicas/<router>/<partition>``
(names that start with ``_`` are not router logs to the tools that list them); it keeps the
leader's offsets. A batch is appended and acknowledged with REPLICA_ACK ``[partition, offset]``
once its log wrote it into the kernel (with ``--fsync always``: once durable); a gap is asked
for with REPLICA_FETCH ``[partition, offset]``, answered from the leader's log. A leader that
sends nothing new tells a follower behind it where its log ends (``_tell_end``).

Failover of delivery. HELLO says which replicas a router holds (``replicas``: {partition: end}).
When a router of another node falls silent, each router asks the holder of its replica with the
highest end (REPLICA_CATCHUP ``[partition, offset]``, from the offset below which it has every
message of that router's own: the mark of mesh version 8) to read the replica back by its
interest; the holder answers with REPLICA_PUBLISH ``[partition, messages, mark]`` frames. A router
that holds the replica itself reads it back to its own subscribers. Every message the dead router
acknowledged is in the replicas of ``--min-insync`` nodes, so its subscribers on the surviving
nodes get it (at least once: what they had is delivered again only if it lies after the mark).
Shared groups are served by the holder that answers the catch-ups: it reads the dead router's QoS
1/2 messages back to the groups from the lowest mark asked for (``_groups_back``).

Sessions (step 3 without the agreement of step 2; docs/replication.md, "Sessions"). A leader's
persistent sessions, as its snapshot holds them (subscriptions, position in its log, QoS 2 state,
will, expiry), go to the same followers as its log: what changed since the last snapshot, in
SESSION_STATE frames, and all of them to a new follower (or a follower's new incarnation). When a
client reconnects elsewhere while its session's router is silent, the follower holding that
session answers the takeover in the router's place: the session's header, and as copies what it
subscribed to in the replica from its position on. The new owner then (a) tells every router the
session is gone from that partition (SESSION_GONE: the other replicas forget it, and the old
router, when it returns, drops its stale copy), and (b) asks every other router for what it
published that the session may not have had (SESSION_CATCHUP): what was forwarded to the dead
router and not yet in its replica when it died. Each answers from its log (or, for a dead router,
its replica), from the offset after the last of its messages among the copies, or from shortly
before the session's position in time where none was; at least once, as every catch-up.

The wills of a silent router's sessions go out from a holder of its sessions when they fall due
(the holders stagger by ``WILL_STAGGER_S`` in router-id order; the first tells the others and,
when it returns, the router: SESSION_GONE's third list), unless the session is taken over first
or the router is heard again: the delayed will of an offline session at its time, and the will
of a session whose client was connected (the snapshot's ``live_will``) its Will Delay Interval
after the silence began, once a majority takes the router for gone.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import shutil
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import msgpack

from brokerd.cluster.quorum import MARGIN_S, MEMBERS_FILE, MIN_MEMBERS, Lease, Members
from brokerd.connection.packets import Subscription
from brokerd.router.log import CommitLog, LogReader
from brokerd.router.log.format import record_fields
from brokerd.router.message import Message
from brokerd.router.persistence import SnapshotFile, restore_state
from brokerd.router.ports import TAKEOVER_FAILED
from brokerd.router.replication import (
    FollowerState,
    Held,
    HistoryState,
    LeaderState,
    follower_nodes,
    follower_router,
)
from brokerd.router.session import LogRange, Session, recency, router_log_dir
from brokerd.router.spool import note_span, spool_into, valid_spans

if TYPE_CHECKING:
    from brokerd.router.router import Router

    from .config import Config
    from .mesh import Mesh, Peer

log = logging.getLogger(__name__)

FETCH_RECORDS = 2000  # records per REPLICATE frame that answers a fetch (and per catch-up step)
FETCH_BYTES = 4 << 20
FETCH_AGAIN_S = 1.0  # a fetch not answered within this is asked again
# A follower behind the leader's end that was sent nothing for this long is sent the last record
# again: it fetches what it lacks before it (a gap is otherwise seen only at the next write).
TAIL_AGAIN_S = 0.5
TICK_S = 0.1  # held acknowledgements' deadlines and the in-sync set are looked at this often
REPLICAS_DIR = "_replicas"
SESSIONS_FILE = "sessions.msgpack"  # beside a replica: the sessions of its router held here
SESSIONS_WRITE_S = 1.0  # held sessions are written at most this often (a write per dirty partition)
READY_WAIT_S = 2.0  # an empty log waits at most this long for other nodes to say where it continues
RESTORE_WAIT_S = 10.0  # ... and at most this long for its followers to send its sessions back
RETENTION_TICKS = int(60 / TICK_S)  # replicas' retention is enforced once a minute, as the log's
SESSION_CHUNK = 2000  # sessions per SESSION_STATE frame
# A session taken over from a replica asks the other routers for their messages from this long
# before its position's time, where the copies it got name none of theirs: what was on its way
# to the dead router when it died (a mesh frame's transit, a backlog kept for a paused peer).
CATCHUP_MARGIN_MS = 10_000
# SESSION_CATCHUP's ``end`` for "to the log's end, the records of every origin" (-1 reads to the
# end, the log's own records only).
LOG_END = 1 << 62
WILL_STAGGER_S = 0.5  # between the holders of a silent router's sessions publishing its delayed wills
HISTORY_DIR = "_history"  # inside a log's directory: its records below its start, being fetched
HISTORY_WAIT_S = 5.0  # a history request not answered within this is asked again (of the source then)
# A history answer is read and packed on the source's loop (under 1 ms for 500 records of 1 KiB, 5.6 ms for 2,000):
# small answers, and a pause of HISTORY_PACE times the round trip between them, keep a fetch of
# a large log from taking more than about a quarter of the source's loop.
HISTORY_RECORDS = 500
HISTORY_BYTES = 1 << 20
HISTORY_PACE = 3.0
# A directory being removed is first renamed to its name plus this and a number: the rename frees
# its path at once, in order, and the files go in a thread (``Replication._remove_tree``); one
# left behind by a crash is removed at the next start.
ASIDE = ".removing-"


def _remove_aside(directory: str) -> None:
    """Remove what ``_remove_tree`` renamed aside in ``directory`` and a crash left there (any thread)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if ASIDE in name:
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


class Replica:
    """A follower's copy of one partition."""

    __slots__ = ("partition", "log", "state", "fetch_sent", "acked", "leader_inc", "history_asked")

    def __init__(self, partition: str, log_: CommitLog) -> None:
        self.partition = partition
        self.log = log_
        self.leader_inc: int | None = None  # the leader's incarnation whose batches came last
        self.state = FollowerState(None if log_.next_offset == log_.start_offset == 0 else log_.next_offset)
        self.fetch_sent = 0.0
        self.acked = -1  # the last offset acknowledged to the leader
        self.history_asked = False  # whether what lies below its start was looked for (``_fetch_history``)


class Replication:
    """The replication of one router: leader of its own log, follower of what is placed here."""

    def __init__(self, config: Config, router: Router, mesh: Mesh, loop: asyncio.AbstractEventLoop) -> None:
        assert router.commit_log is not None
        self.config = config
        self.router = router
        self.mesh = mesh
        self.loop = loop
        self.partition = router.router_id
        self.log = router.commit_log
        self.factor = config.replication_factor or 1
        self.min_insync = config.min_insync or 1
        self.always = config.fsync == "always"
        end = self.log.durable_offset if self.always else self.log.written_offset
        self.leader = LeaderState([], 1, config.replica_lag, config.replica_timeout, time.monotonic, end)
        self.followers: list[str] = []
        self.flushed = self.log.next_offset - 1  # the last offset handed to followers in a live batch
        # The gap repair (``_tell_end``): when ``flushed`` last moved, as the tick saw it, and when
        # each follower was last sent a read-back or the last record (not each live batch: no cost there).
        self._end_seen = (self.flushed, 0.0)
        self._told_at: dict[str, float] = {}
        self.replicas: dict[str, Replica] = {}
        # Each router's replicas in a directory of its own: two workers of a node may follow the
        # same partition one after the other (its leader picks among the live ones).
        self.root = os.path.join(config.data_dir, config.node_id, REPLICAS_DIR, router.router_id.rsplit("/", 1)[1])
        self.refused = 0  # acknowledgements refused at --replica-timeout
        self._timer: asyncio.TimerHandle | None = None
        self._warned_short = False
        self._started = time.monotonic()
        # When this router's loop last came back from a pause long enough for the others to take
        # it for gone (``paused``): only a node heard since counts towards the majority.
        self._resumed_at = 0.0
        self._ticks = 0
        self._acks_due: set[str] = set()  # replicas whose acknowledgement goes at the end of this iteration
        # Sessions: as last sent to the followers (leader), held for other partitions (follower),
        # being handed over from a replica, and taken from a replica here (the old router drops
        # its copy when it returns).
        self._sessions_sent: dict[str, dict] = {}
        self._follower_incs: dict[str, int | None] = {}
        self._cleared: dict[str, int | None] = {}  # former followers told to drop our sessions: their incarnation
        self.sessions: dict[str, dict[str, dict]] = {}
        self._handing: dict[str, tuple[str, dict]] = {}
        self._will_timers: dict[tuple[str, str], asyncio.TimerHandle] = {}  # (partition, client id)
        # Held sessions are kept on disk beside their replica, so that a follower restarted while
        # their router is dead still has them (two failures in a row).
        self._sessions_dirty: set[str] = set()
        self._session_files: dict[str, SnapshotFile] = {}
        self._sessions_timer: asyncio.TimerHandle | None = None
        self.members = Members(os.path.join(self.log.directory, MEMBERS_FILE), config.node_id)
        # This router's lease from a majority of the nodes (docs/replication.md, "The lease"): it
        # ends a margin before the others may take this router for gone.
        self.lease = Lease(self.members, config.mesh_timeout - MARGIN_S)
        self.recount_at = float("inf")  # the lease's end as last counted: the majority is counted again then
        self._rule_since: float | None = self._started  # since when the majority rule (three members) is on
        if self.factor > 1:
            mesh.lease = self.lease
        self._cut_off: list[Held] = []  # acknowledgements held while this node sees no majority
        self.agreed: Any = None  # cluster.agreement.owners.SessionOwners, with --agreement
        self._agreed_once = False  # its member has had a majority since the start
        # Back on an empty disk: the followers asked for this router's sessions (``_restore``).
        self._restoring: set[str] = set()
        self._restored_from: dict[str, tuple[int, int]] = {}  # client id → recency of the copy restored
        self._restore_done: asyncio.Future | None = None
        self._restored = 0
        # No full set of sessions goes to the followers before ``ready``: on an empty disk it
        # would replace the sessions this router is about to ask them for.
        self._sessions_ready = self.log.next_offset != 0 or not config.peer
        # Whether ``_sessions_sent`` lists this router's sessions: a snapshot was taken since it
        # started (``sessions_changed``). A full set sent before that is empty and would wipe what
        # the followers hold: the sessions of a restarted router (the chaos suite, seed 697068541).
        self._sessions_known = False
        # Logs whose records below their start are being fetched (``_fetch_history``): the task,
        # the request waiting for its answer, and how far it is (next offset, the log's start).
        self._histories: dict[str, tuple[CommitLog, asyncio.Task]] = {}
        self._history_waits: dict[str, tuple[str, asyncio.Future]] = {}
        # Per silent router whose replica is read back here: the lowest offset from which its
        # QoS 1/2 messages went to the shared groups (``_groups_back``).
        self._groups_low: dict[str, int] = {}
        self.history_at: dict[str, tuple[int, int]] = {}
        if self.factor > 1:  # with R = 1 this router only follows (acknowledgements never wait)
            self.log.on_batch = self._on_batch
            if self.always:
                self.log.on_durable(self._leader_end)
            else:
                self.log.on_written(self._leader_end)
            router.replication = self
        self._open_replicas()
        self._timer = loop.call_later(TICK_S, self._tick)

    async def ready(self) -> None:
        """Before serving: a router whose log is empty (a first start, or a disk that was lost)
        and that has peers to ask learns how far the other nodes have its log (their replicas'
        ends, and the offsets they have seen: HELLO's ``replicas`` and ``seen``) and continues
        beyond, so that no offset ever names two messages and its replicas stay valid (what
        they hold before that stays readable there), then gets its persistent sessions back
        from its followers (``_restore``). Bounded by ``READY_WAIT_S``, live peers answer within a
        HELLO interval, and ``RESTORE_WAIT_S``."""
        try:
            if self.log.next_offset == 0 and self.config.peer:
                await self._continue_log()
            if os.path.isdir(self._history_dir(self.log)):  # fetched back on an earlier run, not finished
                self._fetch_history(self.partition, self.log)
        finally:
            self._sessions_ready = True  # (it was already, but on an empty disk with peers)
            # The sessions this router holds now (restored from its disk, or from its followers)
            # go to its followers at once, not at their next change: until a snapshot has listed
            # them (``sessions_changed``), no full set goes out (``_place``).
            if self.router.state is not None:
                self.router.state.mark(soon=True)

    async def _continue_log(self) -> None:
        loop = self.loop
        deadline = loop.time() + READY_WAIT_S
        heard = None
        own = self.config.node_id
        while loop.time() < deadline:
            if heard is None and any(p.alive and p.node_id != own for p in self.mesh.peers.values()):
                heard = loop.time()  # a node answered: one more HELLO round meets the routers it knows
            if heard is not None and loop.time() - heard > 0.6:
                break
            await asyncio.sleep(0.05)
        start = 0
        for peer in self.mesh.peers.values():
            if peer.node_id != own:
                start = max(start, peer.seen_of_me, peer.replicas.get(self.partition, -1) + 1)
        if start > 0:
            log.warning("replication: this router's log is empty, but other nodes have it up to offset %d "
                        "(a lost or replaced disk?): it continues at %d; what came before stays on its "
                        "replicas", start - 1, start)
            self.log.start_at(start)
            self.flushed = start - 1
            self.leader = LeaderState(self.followers, self.leader.min_insync, self.config.replica_lag,
                                      self.config.replica_timeout, time.monotonic, start - 1)
        holders = [p for p in self.mesh.peers.values()
                   if p.alive and p.node_id != own and self.partition in p.replicas]
        if start > 0 and holders:  # its records below ``start`` are fetched back from them (``ready``)
            os.makedirs(self._history_dir(self.log), mode=0o700, exist_ok=True)
        if holders:
            await self._restore(holders)

    async def _restore(self, holders: list[Peer]) -> None:
        """The persistent sessions of this router that its followers hold, with what each is
        owed from their replicas, come back before it serves (a lost disk loses no session that
        was not taken over elsewhere meanwhile). Bounded by ``RESTORE_WAIT_S``."""
        self._restoring = {p.router_id for p in holders}
        done = self._restore_done = self.loop.create_future()
        for peer in holders:
            self.mesh.send_replication(peer, "restore", self.partition)
        try:
            await asyncio.wait_for(done, RESTORE_WAIT_S)
        except TimeoutError:
            log.warning("replication: %s did not send this router's sessions back within %g s: serving with "
                        "the %d restored so far", ", ".join(sorted(self._restoring)), RESTORE_WAIT_S,
                        self._restored)
        else:
            log.warning("replication: %d persistent session(s) of this router restored from its followers",
                        self._restored)
        self._restoring = set()
        self._restored_from = {}

    def restore_sessions(self, peer: Peer, partition: str) -> None:
        """``peer`` came back on an empty disk and asks for its sessions held here: one
        SESSION_RESTORED frame per session (its header and copies from the replica), one
        session per loop iteration, then a last, empty one."""
        if partition != peer.router_id:
            raise ValueError(f"session-restore: {peer.router_id} asked for the sessions of {partition}")
        self._restore_step(peer, partition, list(self.sessions.get(partition, {})), 0, 0)

    def _restore_step(self, peer: Peer, partition: str, client_ids: list[str], i: int, sent: int) -> None:
        if not peer.alive:
            return
        while i < len(client_ids):
            cid = client_ids[i]
            i += 1
            st = self.sessions.get(partition, {}).get(cid)
            if st is None or partition not in self.replicas:
                continue
            header = self._restore_header(cid, partition, st)
            if header is None:
                continue
            self.mesh.send_replication(peer, "restored", [partition, header, False])
            self.loop.call_soon(self._restore_step, peer, partition, client_ids, i, sent + 1)
            return
        self.mesh.send_replication(peer, "restored", [partition, None, True])
        log.info("replication: %d session(s) of %s sent back to it from the replica here", sent, partition)

    def _restore_header(self, client_id: str, partition: str, st: dict) -> dict | None:
        """A session of ``partition`` held here, for its router back on an empty disk: its
        header, without copies; ``copies`` names what it is to read back instead (``restored``):
        the replica from the session's position, and what its router held for it outside its
        log (``Session.copy_spans``). Before, the copies came in the header, at most
        ``--max-queued`` of them. None (logged) when its held state cannot be read back."""
        rebuilt = self._replica_header(client_id, partition, st)
        if rebuilt is None:
            return None
        session, header, _ = rebuilt
        spans = valid_spans(st.get("copies"))
        for rng in session.ranges:  # the replica, from the session's position
            if rng.start < rng.end:
                note_span(spans, partition, rng.start)
                note_span(spans, partition, rng.end - 1)
        header["copies"] = {origin: span[:2] for origin, span in spans.items()}
        return header

    def restored(self, sender: str, partition: str, header: dict | None, last: bool) -> None:
        """A session of this router sent back by a follower (``_restore``)."""
        if partition != self.partition or sender not in self._restoring:
            return
        router = self.router
        if header is not None:
            cid = header["client_id"]
            had = router.sessions.get(cid)
            earlier = self._restored_from.get(cid)
            # Two holders may answer: a former follower's copy can be older than the current
            # follower's (this router clears it only once it serves: ``_place``). The newer counts.
            if had is None or (earlier is not None and earlier < recency(header)):
                if had is not None:
                    router.drop_session(had)
                else:
                    self._restored += 1
                session = router.import_session(cid, header)
                # Back with its own router, as the holder had it: not a move.
                session.epoch = header.get("epoch", 0)
                session.arrived_ms = header.get("arrived") or session.arrived_ms
                self._restored_from[cid] = recency(header)
                router.schedule_expiry(session)
                router.rearm_will(session)
                # What waited for it in this router's lost log, read back from the sender's
                # replica, all of it (spooled here); then what it held outside the log.
                copies = valid_spans(header.get("copies"))
                own = copies.pop(self.partition, None)
                peer = self.mesh.peers.get(sender)
                if own is not None and peer is not None:
                    body = self._catchup_body(session, self.partition, own[0], 0, own[1] + 1)
                    self.mesh.send_replication(peer, "session_catchup", body)
                self.read_back_copies(session, copies)
        if last:
            self._restoring.discard(sender)
            if not self._restoring and not self._restore_done.done():
                self._restore_done.set_result(None)

    # -- leader ------------------------------------------------------------------------------------

    def hold(self, offset: int, client: Any, ack: bytes) -> bool:
        """Whether the acknowledgement of the record at ``offset`` must wait for the followers
        (or for the majority, on a node cut off from it)."""
        now = time.monotonic()
        if now >= self.mesh.pause_deadline or now >= self.recount_at:
            self.mesh.check_paused()  # after a pause, or the lease's end, the majority is counted again first
        if self.leader.hold(offset, (client, ack)):
            return True
        if self.in_minority:
            self._cut_off.append(Held(offset, (client, ack), time.monotonic() + self.config.replica_timeout))
            return True
        return False

    def _on_batch(self, first: int, last: int, body: bytes) -> None:
        self.flushed = last
        if self.followers:
            frame_body = [self.partition, first, last, body, self.leader.high_water]
            for rid in self.followers:
                peer = self.mesh.peers.get(rid)
                if peer is not None and peer.alive:
                    self.mesh.send_replication(peer, "replicate", frame_body)

    def _leader_end(self, end: int) -> None:
        """The leader's own copy: what its log wrote into the kernel (with ``--fsync always``:
        made durable). Not at ``_on_batch``: a batch is flushed there, and may wait for the writer."""
        self._release(self.leader.written(end))

    def _release(self, held: list[Held]) -> None:
        if not held:
            return
        if self.in_minority:
            self._cut_off.extend(held)  # replicated, but this side of a partition may not acknowledge
            return
        self.router.release_acks([h.token for h in held])

    def acknowledged(self, sender: str, partition: str, offset: int) -> None:
        if partition == self.partition:  # never beyond what was sent: a lying follower releases nothing
            self._release(self.leader.acknowledged(sender, min(offset, self.flushed)))

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
        self.mesh.send_replication(peer, "replicate", [self.partition, records[0].offset, records[-1].offset,
                                                       body, hw])
        self._told_at[peer.router_id] = time.monotonic()
        if records[-1].offset < self.flushed:  # more to fetch: the follower asks at once, not at the next tick
            self._send_last(peer)

    def _tell_end(self) -> None:
        """Each follower behind this log's end that was sent nothing for ``TAIL_AGAIN_S`` is sent
        the last record again, as a live batch of one: one that lacks records before it fetches
        them (``FollowerState.arrived``), one that holds it acknowledges again. Without it, a
        follower back from a cut, or whose fetch went unanswered, waits for the next write. A
        frame every follower already reads: no new kind. Nothing is sent to followers in sync."""
        if self.flushed != self._end_seen[0]:
            self._end_seen = (self.flushed, time.monotonic())  # a live batch went to every follower
            return
        acked = self.leader.acked
        now = time.monotonic()
        for rid in self.followers:
            if acked.get(rid, self.flushed) >= self.flushed:
                continue
            if now - max(self._end_seen[1], self._told_at.get(rid, 0.0)) < TAIL_AGAIN_S:
                continue
            peer = self.mesh.peers.get(rid)
            if peer is not None and peer.alive:
                self._told_at[rid] = now
                self._send_last(peer)

    def _send_last(self, peer: Peer) -> None:
        records = self.log.read(self.flushed, max_records=1)
        if records and records[0].offset == self.flushed:
            body = msgpack.packb([record_fields(records[0])])
            self.mesh.send_replication(peer, "replicate", [self.partition, self.flushed, self.flushed, body,
                                                           self.leader.high_water])

    def _place(self) -> None:
        """The followers for the live nodes now (called on every heartbeat)."""
        if self.factor <= 1:
            return
        routers_by_node: dict[str, list[str]] = {}
        for rid, peer in self.mesh.peers.items():
            if peer.alive and peer.node_id != self.config.node_id:
                routers_by_node.setdefault(peer.node_id, []).append(rid)
        nodes = follower_nodes(self.partition, self.config.node_id, routers_by_node, self.factor - 1)
        followers = [follower_router(self.partition, routers_by_node[n]) for n in nodes]
        needed = min(self.min_insync, 1 + len(followers))
        starting = time.monotonic() - self._started < 2 * self.config.mesh_timeout + 1.0  # peers still joining
        # Cut off from the majority, it acknowledges nothing at all (said by ``_majority``): the
        # shortfall is told once the majority is back, if it still holds.
        if needed < self.min_insync and not self._warned_short and not starting and self.members.has_majority:
            self._warned_short = True
            log.warning("replication: %d live node(s), fewer than --min-insync %d: QoS 1/2 messages are "
                        "acknowledged once on %d node(s)", 1 + len(followers), self.min_insync, needed)
        elif needed == self.min_insync:
            self._warned_short = False
        if followers != self.followers or needed != self.leader.min_insync:
            added = [f for f in followers if f not in self.followers]
            for rid in self.followers:
                if rid not in followers:  # a follower no more: its copy of the sessions would go stale
                    self._send_sessions(rid, {}, True)
                    self._follower_incs.pop(rid, None)
                    self._cleared[rid] = self.mesh.peers[rid].incarnation
            if followers != self.followers:
                log.info("replication: the log of %s is followed by %s", self.partition,
                         ", ".join(followers) or "nobody")
            self.followers = followers
            self._release(self.leader.set_followers(followers, needed))
            for rid in added:  # what waits for it already went out before it was chosen: send it now
                self.fetch(self.mesh.peers[rid], self.partition, self.leader.high_water + 1)
        if not self._sessions_ready or not self._sessions_known:
            return
        for rid in followers:  # a new follower, or a new incarnation of one: every session
            inc = self.mesh.peers[rid].incarnation
            if self._follower_incs.get(rid, -1) != inc:
                self._follower_incs[rid] = inc
                self._send_sessions(rid, self._sessions_sent, True)
        # A router that holds a replica of this log without being its follower now (it was one
        # before this router restarted, or before a node came back): the sessions it holds of
        # this router are stale, and, taken for current after this router's death, would hand
        # a client an old state of its session. Cleared once per incarnation of each.
        for rid, peer in self.mesh.peers.items():
            if (peer.alive and self.partition in peer.replicas and rid not in followers
                    and peer.node_id != self.config.node_id and self._cleared.get(rid, -1) != peer.incarnation):
                self._cleared[rid] = peer.incarnation
                self._send_sessions(rid, {}, True)

    def _tick(self) -> None:
        self._ticks += 1
        if self._ticks % RETENTION_TICKS == 0:
            for rep in self.replicas.values():  # the same --retention-bytes/-hours as the router's own log
                deleted = rep.log.enforce_retention()
                if deleted:
                    log.info("retention deleted %d segment(s) of the replica of %s", len(deleted), rep.partition)
        released, refused = self.leader.tick()
        if time.monotonic() >= self.recount_at:
            self._majority()  # a lease that ends is noticed within a tick if nothing else looked
        self._release(released)
        if self._cut_off and self.in_minority:
            now = time.monotonic()
            late = [h for h in self._cut_off if h.deadline <= now]
            if late:
                self._cut_off = [h for h in self._cut_off if h.deadline > now]
                refused += late
        if refused:
            self.refused += len(refused)
            self.router.refuse_acks([h.token for h in refused],
                                    f"not on {self.leader.min_insync} node(s) within {self.config.replica_timeout:g} s")
        now = time.monotonic()
        for rep in self.replicas.values():
            if rep.fetch_sent and now - rep.fetch_sent > FETCH_AGAIN_S:
                rep.fetch_sent = 0.0  # the next batch asks again
        if self.followers:
            self._tell_end()
        self._timer = self.loop.call_later(TICK_S, self._tick)

    def heartbeat(self) -> None:
        self._majority()
        self._place()

    def check_paused(self) -> None:
        """See ``Mesh.check_paused``: for a persistent CONNECT, before ``in_minority``."""
        self.mesh.check_paused()

    def recount(self) -> None:
        """The lease ended, or was renewed, since the majority was counted (``recount_at``)."""
        self._majority()

    @property
    def in_minority(self) -> bool:
        """Whether the majority rule holds this router back now: no majority of the member nodes
        backs its lease, and replication is on (with R = 1 the rule is off). With agreement on
        (``agreed``), the majority is the agreement's: this node's member can commit."""
        if self.agreed is not None:
            return self.factor > 1 and not self.agreed.majority
        return self.factor > 1 and not self.members.has_majority

    def agreement_majority(self, majority: bool) -> None:
        """This node's agreement member gained or lost the majority (``AgreementClient``): the
        acknowledgements held meanwhile go out on regaining it; on losing it for longer than a
        mesh timeout (not a leader election's moment) while its mesh, too, hears no majority of
        the nodes (cut off, not just from the agreement's leader), the clients of persistent
        sessions here are asked to connect elsewhere, where the majority may serve their sessions."""
        if self.factor <= 1:
            return
        if majority:
            held, self._cut_off = self._cut_off, []
            if self._agreed_once:  # (the first majority after the start is no news)
                log.warning("cluster: this node's agreement member can commit again: QoS 1/2 acknowledgements go "
                            "on (%d held ones sent)", len(held))
            self._agreed_once = True
            self._release(held)
            return
        log.error("cluster: this node's agreement member cannot commit (no majority of the cluster reachable): "
                  "QoS 1/2 publishes are not acknowledged and no session is taken in until it can")

        def still_cut_off() -> None:
            if not self.in_minority:
                return
            members = len(self.config.agreement_peer) + 1
            heard = {p.node_id for p in self.mesh.peers.values() if p.alive} | {self.config.node_id}
            if 2 * len(heard) > members:
                # Its mesh hears a majority: only the way to the agreement's leader is cut (a one-way
                # or pair cut). Its clients are served here as they are; the majority side cannot
                # take their sessions without their asking it, and nothing it holds is lost.
                log.warning("cluster: this node's mesh hears %d of %d nodes: its clients stay", len(heard), members)
                return
            router = self.router
            moved = [c for cid, c in router.clients.items()
                     if (s := router.sessions.get(cid)) is not None and s.persistent and s.conn is c.conn]
            if moved:
                log.warning("cluster: %d client(s) of persistent sessions asked to connect elsewhere", len(moved))
            for client in moved:
                client.move_away()

        self.loop.call_later(self.config.mesh_timeout, still_cut_off)

    def paused(self, gap: float) -> None:
        """The mesh's heartbeat came ``gap`` seconds after the last, about a mesh timeout or
        more: this router's loop was stopped (SIGSTOP, swapped out, a paused VM) for long enough
        that the other nodes may have taken it for gone and served its sessions from their
        replicas. Until a majority of the nodes is heard again, it acts as a node cut off from
        the majority (no QoS 1/2 acknowledgement, its persistent sessions' clients sent
        elsewhere), at once rather than a mesh timeout later."""
        if time.monotonic() - self._started < self.config.mesh_timeout + 1.0:
            return  # starting (its restore took the loop): the majority is not counted yet anyway
        self._resumed_at = time.monotonic()  # (the mesh then stamps every peer heard "now": not counted)
        if self.members.has_majority and self.factor > 1 and len(self.members.nodes) >= MIN_MEMBERS:
            log.warning("replication: this router's loop was paused for %.1f s, beyond what the other nodes "
                        "wait before taking it for gone; nothing more is acknowledged until they are heard "
                        "again", gap)
        self._majority()

    def gone_for_majority(self, router_id: str) -> bool:
        """Whether a majority of the member nodes take ``router_id`` for gone: each node of
        which every router heard here (this one included) says so, this one because it does not
        hear it, the others by their last HELLO, which lists the routers they hear; the router's
        own node does not vote (its lease counts that node as backing it, whatever its other
        routers say). A node that still hears it says it is alive, whatever this one sees: under
        a partition that cuts only some links (a and c cannot reach each other, b reaches both),
        a and c each see a majority, and c must not serve the sessions of a while a does. Each
        router that says it is gone parked it, and so echoes its lease no more (the fence,
        ``cluster.quorum.Lease``): by the time such a majority says so, its lease has ended.
        With fewer than three members the rule is off."""
        peer = self.mesh.peers.get(router_id)
        if peer is not None and peer.alive:
            return False
        members = self.members.nodes
        if len(members) < MIN_MEMBERS:
            return True
        own = self.config.node_id
        reports: dict[str, bool] = {own: True}  # node: every router of it heard here says it is gone
        for p in self.mesh.peers.values():
            if p.alive and p.node_id in members:
                reports[p.node_id] = reports.get(p.node_id, True) and router_id not in p.hears
        reports.pop(peer.node_id if peer is not None else router_id.rsplit("/", 1)[0], None)
        return 2 * sum(reports.values()) > len(members)

    def undecided(self) -> list[str]:
        """Routers of other nodes that are silent here but not gone for a majority (another node
        still hears them): one of them may be serving a session that nobody here was offered."""
        own = self.config.node_id
        return sorted(rid for rid, p in self.mesh.peers.items()
                      if p.parked and p.node_id != own and not self.gone_for_majority(rid))

    # -- a node cut off from the majority (cluster.quorum) ----------------------------------------

    def _majority(self) -> None:
        if self.agreed is not None:
            return  # the agreement's member says whether this node has the majority
        self._lease_majority()

    def _lease_majority(self) -> None:
        """Count the member nodes that back this router's lease (they hear it and answer its
        heartbeats, ``cluster.quorum.Lease``; with R = 1, those it hears); on losing the majority,
        stop acknowledging QoS 1/2 (held, then refused at --replica-timeout) and taking sessions
        in; on regaining it, send what was held. The members are the nodes heard (after a pause
        of this router's loop, ``paused``, only those heard since)."""
        known: dict[str, bool] = {}
        live = set()
        resumed = self._resumed_at
        for peer in self.mesh.peers.values():
            known[peer.node_id] = known.get(peer.node_id, False) or peer.alive or peer.parked
            if peer.alive and peer.last_seen > resumed:
                live.add(peer.node_id)
        now = time.monotonic()
        if now - self._started < self.config.mesh_timeout + 1.0:
            self.members.met(live)  # starting: the other nodes' HELLOs are still on their way
            return
        backing: set[str] | None = None  # with R = 1 no lease is asked for: the nodes heard count
        lease = self.lease
        if len(self.members.nodes | live) < MIN_MEMBERS:
            self._rule_since = None  # the majority rule is off: so is the lease
        elif self._rule_since is None:
            # A third member came (the rule comes on): its first lease is awaited as at a start
            # (one node of two may be dead, the newcomer echoes only after a mesh timeout).
            self._rule_since = now
            lease.began = False
        # Until its first lease (the others echo nothing in their own first mesh timeout, and
        # nodes start a moment apart), for at most 2 x mesh timeout + 1 s after the start or the
        # rule coming on, the nodes heard count.
        self.recount_at = float("inf")
        if self.factor > 1 and self._rule_since is not None and (
                lease.began or now - self._rule_since >= 2 * self.config.mesh_timeout + 1.0):
            valid = lease.valid(now)
            backing = lease.backers(now) if valid else set()
            if valid and lease.until > now:
                self.recount_at = lease.until
        changed = self.members.update(live, {n for n, k in known.items() if not k}, backing)
        if changed is None or self.factor <= 1:
            return
        heard = len(live | {self.config.node_id})
        backed = heard if backing is None else len(backing | {self.config.node_id})
        if changed:
            held, self._cut_off = self._cut_off, []
            log.warning("cluster: this node sees a majority of the cluster again (%d of %d nodes): QoS 1/2 "
                        "acknowledgements go on (%d held ones sent)", backed, len(self.members.nodes),
                        len(held))
            self._release(held)
        else:
            router = self.router
            moved = [c for cid, c in router.clients.items()
                     if (s := router.sessions.get(cid)) is not None and s.persistent and s.conn is c.conn]
            # The others stopped gracefully (each said GOODBYE): a cluster being shut down or
            # upgraded, not a fault; said as a warning, the rule is the same.
            stopped = {p.node_id for p in self.mesh.peers.values() if p.left}
            missing = self.members.nodes - live - {self.config.node_id}
            graceful = bool(missing) and missing <= stopped
            # Heard *now*: a peer that died is still "live" until its mesh timeout, which comes after
            # the lease's end; what tells it from a one-way cut is that its HELLOs stopped.
            from .mesh import HELLO_INTERVAL_S

            recent = max(2 * HELLO_INTERVAL_S, self.lease.period / 2)
            hearing = {p.node_id for p in self.mesh.peers.values()
                       if p.alive and now - p.last_seen < recent} | {self.config.node_id}
            silent = sorted(self.members.nodes - hearing)
            if graceful:
                why = "the others stopped"
            elif backed < len(hearing):
                # It hears them, they do not answer its beats: its frames do not reach them.
                why = f"it hears {len(hearing)}, but only {backed} answer its heartbeats: its lease ended"
            else:
                why = (f"{', '.join(silent)} silent: down, or cut off by a partition" if silent
                       else "cut off by a partition, or the others are down")
            log.log(logging.WARNING if graceful else logging.ERROR,
                    "cluster: this node sees %d of %d member nodes, not a majority (%s): QoS 1/2 publishes "
                    "are not acknowledged and no session is taken in until it sees a majority again; %d "
                    "client(s) of persistent sessions asked to connect elsewhere", backed, len(self.members.nodes),
                    why, len(moved))
            for client in moved:  # the majority side serves their sessions from the replicas
                client.move_away()

    # -- follower ----------------------------------------------------------------------------------

    def _replica_dir(self, partition: str) -> str:
        return router_log_dir(self.root, partition)

    def _open_replicas(self) -> None:
        """The replicas this router held before a restart: kept, and followed again if placed here."""
        if not os.path.isdir(self.root):
            return
        for node in sorted(os.listdir(self.root)):
            node_dir = os.path.join(self.root, node)
            names = sorted(os.listdir(node_dir)) if os.path.isdir(node_dir) else []
            if any(ASIDE in name for name in names):  # a removal a crash cut short
                self.loop.run_in_executor(None, _remove_aside, node_dir)
            for name in names:
                if ".lost-" not in name and ASIDE not in name:  # (.lost-: set aside when its leader lost its disk)
                    self._open(f"{node}/{name}")

    def _remove_tree(self, path: str) -> None:
        """Remove a directory tree without the loop waiting for the disk: renamed aside at once (one
        metadata call: the path is free for what comes next, in order), its files removed in a
        thread of the loop's executor (a replica of gigabytes is thousands of unlinks: seconds)."""
        aside = f"{path}{ASIDE}{time.time_ns()}"
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return
        self.loop.run_in_executor(None, functools.partial(shutil.rmtree, aside, ignore_errors=True))

    def _open(self, partition: str, fresh: bool = False) -> Replica:
        directory = self._replica_dir(partition)
        if fresh:
            self._stop_history(partition)  # its history names the records of what is replaced
            self._remove_tree(directory)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        c = self.config
        log_ = CommitLog(directory, router_id=partition, loop=self.loop, fsync=c.fsync,
                         fsync_interval_ms=c.fsync_interval_ms, segment_bytes=c.segment_bytes,
                         retention_bytes=c.retention_bytes or None, retention_hours=c.retention_hours or None)
        rep = self.replicas[partition] = Replica(partition, log_)
        if not fresh:
            self._load_sessions(partition)
        elif self.sessions.get(partition):  # they came before its first batch: keep them now
            self._sessions_changed(partition)
        # Acknowledged as the leader counts its own copy: once written into the kernel (with
        # ``--fsync always``: durable), never while a batch waits in memory for the writer.
        if self.always:
            log_.on_durable(lambda durable, rep=rep: self._ack(rep, durable))
        else:
            log_.on_written(lambda written, rep=rep: self._ack(rep, written))
        return rep

    def replicate(self, peer: Peer, partition: str, first: int, last: int, body: bytes, hw: int) -> None:
        """A batch of ``partition`` from its leader."""
        if partition != peer.router_id or peer.node_id == self.config.node_id:
            raise ValueError(f"replicate: {peer.router_id} sent records of {partition}")
        rep = self.replicas.get(partition)
        if rep is None:
            rep = self._open(partition, fresh=True)
            log.info("replication: following %s from offset %d", partition, max(0, min(first, hw + 1)))
        if rep.leader_inc != peer.incarnation:
            held = rep.state.next_offset
            if (rep.leader_inc is not None and held is not None and first < held
                    and 0 <= peer.claim_floor < held):
                # Its new incarnation started with less than this replica holds: its disk was lost
                # (and it could not learn where to continue). Keep what is here, aside, and follow
                # its new log from scratch: offsets below ``held`` now name other messages.
                aside = f"{self._replica_dir(partition)}.lost-{int(time.time())}"
                rep.log.close()
                os.rename(self._replica_dir(partition), aside)
                log.error("replication: %s came back with its log at offset %d, below this replica's %d: "
                          "its disk was lost; the replica is kept in %s, and followed anew", partition,
                          peer.claim_floor, held, aside)
                rep = self._open(partition, fresh=True)
            rep.leader_inc = peer.incarnation
        if hw == -2:  # the leader's log no longer has what we asked for: begin anew at what it has
            if first > (rep.state.next_offset or 0):
                rep.log.close()
                rep = self._open(partition, fresh=True)
                log.warning("replication: %s's log starts at %d now (retention): its replica here "
                            "begins again there", partition, first)
            hw = first - 1
        empty = rep.state.next_offset is None
        action = rep.state.arrived(first, last, hw)
        if empty:
            rep.log.start_at(rep.state.next_offset)  # type: ignore[arg-type]
        if not rep.history_asked:
            # A new replica placed at the high-water mark, or one whose history a restart
            # interrupted: what lies below it is fetched too (once per replica opened).
            rep.history_asked = True
            if rep.log.start_offset > 0 and (empty or os.path.isdir(self._history_dir(rep.log))):
                self._fetch_history(partition, rep.log)
        if action == FollowerState.FETCH:
            if not rep.fetch_sent:
                rep.fetch_sent = time.monotonic()
                self.mesh.send_replication(peer, "fetch", [partition, rep.state.next_offset])
            return
        if action == FollowerState.APPEND:
            skip = rep.state.next_offset - first  # type: ignore[operator]
            records = msgpack.unpackb(body, raw=False)
            if len(records) != last - first + 1:
                raise ValueError(f"replicate: {len(records)} records for offsets {first}..{last}")
            # The leader's bytes as they came (no per-record call), unless part of it is here already.
            rep.log.append_batch(rep.state.next_offset, records[skip:], body if not skip else None)
            rep.fetch_sent = 0.0
            rep.state.appended(last)
            return  # acknowledged once written, or durable (``_ack`` from the log)
        # A repeat: acknowledged again, up to what the log holds (a batch before it may still wait).
        held = rep.log.durable_offset if self.always else rep.log.written_offset
        self._ack(rep, min(rep.state.next_offset - 1, held), again=True)  # type: ignore[operator]

    def _ack(self, rep: Replica, offset: int, again: bool = False) -> None:
        """Acknowledge up to ``offset``: one REPLICA_ACK per replica per loop iteration, however
        many batches arrived in it (the mesh reads up to hundreds of frames per callback, and a
        frame sent costs a ZeroMQ send)."""
        if offset <= rep.acked and not again:
            return
        rep.acked = max(rep.acked, offset)
        if not self._acks_due:
            self.loop.call_soon(self._send_acks)
        self._acks_due.add(rep.partition)

    def _send_acks(self) -> None:
        due, self._acks_due = self._acks_due, set()
        for partition in due:
            rep = self.replicas.get(partition)
            peer = self.mesh.peers.get(partition)
            if rep is not None and peer is not None and peer.alive:
                self.mesh.send_replication(peer, "ack", [partition, rep.acked])

    def hello(self) -> dict[str, int]:
        """The replicas held here and their ends, for HELLO."""
        return {p: r.log.next_offset - 1 for p, r in self.replicas.items()}

    # -- history: the records below where a log starts -----------------------------------------

    @staticmethod
    def _history_dir(log_: CommitLog) -> str:
        return os.path.join(log_.directory, HISTORY_DIR)

    def _fetch_history(self, partition: str, log_: CommitLog) -> None:
        """Fetch the records of ``partition`` below where ``log_`` starts, from a node that
        holds them, and join them to it (docs/replication.md, "History"): a follower placed at the
        high-water mark holds what lies below only once this is done; a router back on an empty
        disk gets its old records back. One task per log, one request at a time."""
        running = self._histories.get(partition)
        if running is not None and running[0] is log_ and not running[1].done():
            return
        previous = running[1] if running is not None else None
        # At once, not when the task opens it: a restart finds it and goes on (``replicate``).
        os.makedirs(self._history_dir(log_), mode=0o700, exist_ok=True)
        task = self.loop.create_task(self._history(partition, log_, previous))
        self._histories[partition] = (log_, task)

    def _stop_history(self, partition: str) -> None:
        running = self._histories.get(partition)
        if running is not None:
            running[1].cancel()

    def _history_source(self, partition: str) -> Any:
        """Whom to fetch ``partition``'s history from: its router while it is alive, else the
        live holder of the replica with the highest end (this router's own log: a follower)."""
        peer = self.mesh.peers.get(partition)
        if peer is not None and peer.alive:
            return peer
        best, best_end = None, -1
        for other in self.mesh.peers.values():
            end = other.replicas.get(partition, -1) if other.alive else -1
            if end > best_end:
                best, best_end = other, end
        return best

    async def _history(self, partition: str, target: CommitLog, previous: asyncio.Task | None) -> None:
        if previous is not None:  # the history of a log this one replaced: wait until it let go
            previous.cancel()
            await asyncio.wait([previous])
        directory = self._history_dir(target)
        self.loop.run_in_executor(None, _remove_aside, target.directory)  # what a crash left
        if previous is not None:
            self._remove_tree(directory)
        c = self.config
        # No fsync per batch (nothing waits on it): the close makes the history durable before it joins.
        hist = await CommitLog.open_async(directory, router_id=partition, fsync="interval",
                                          segment_bytes=c.segment_bytes)
        try:
            await self._fetch_into(partition, target, hist, directory)
        except Exception:  # noqa: BLE001 - a peer that lies, a disk that fails: said, and tried at the next start
            log.exception("replication: fetching the records of %s below offset %d failed", partition,
                          target.start_offset)

    async def _fetch_into(self, partition: str, target: CommitLog, hist: CommitLog, directory: str) -> None:
        c = self.config
        try:
            before = target.start_offset
            held = hist.next_offset > hist.start_offset
            if hist.next_offset > before:  # (a log that began again lower: not this one's history)
                await hist.aclose()
                self._remove_tree(directory)
                hist = await CommitLog.open_async(directory, router_id=partition, fsync="interval",
                                                  segment_bytes=c.segment_bytes)
                held = False
            state = HistoryState(before, hist.next_offset if held else None)
            log.info("replication: fetching the records of %s below offset %d%s", partition, before,
                     f" (from {hist.start_offset}..{hist.next_offset - 1} held)" if held else "")
            while not target.closed:
                self.history_at[partition] = (state.ask(), before)
                source = self._history_source(partition)
                if source is None:
                    await asyncio.sleep(FETCH_AGAIN_S)
                    continue
                answer = self.loop.create_future()
                self._history_waits[partition] = (source.router_id, answer)
                asked = self.loop.time()
                self.mesh.send_replication(source, "history_fetch", [partition, state.ask(), before])
                try:
                    first, last, body = await asyncio.wait_for(answer, HISTORY_WAIT_S)
                except TimeoutError:
                    continue
                finally:
                    if self._history_waits.get(partition, (None, None))[1] is answer:
                        del self._history_waits[partition]
                pause = HISTORY_PACE * (self.loop.time() - asked)
                action = state.arrived(first, last)
                if action == HistoryState.DONE:
                    break
                if action == HistoryState.REPEAT:
                    continue
                records = msgpack.unpackb(body, raw=False)
                if len(records) != last - first + 1:
                    raise ValueError(f"history: {len(records)} records for offsets {first}..{last}")
                if action == HistoryState.BEGIN:
                    if hist.next_offset > hist.start_offset:  # the source no longer has what lies between
                        await hist.aclose()
                        self._remove_tree(directory)
                        hist = await CommitLog.open_async(directory, router_id=partition, fsync="interval",
                                                          segment_bytes=c.segment_bytes)
                    hist.start_at(first)
                skip = state.ask() - first
                hist.append_batch(state.ask(), records[skip:], body if not skip else None)
                if state.appended(last):
                    break
                await asyncio.sleep(pause)
            held_to = hist.next_offset - 1
            fetched = hist.next_offset - hist.start_offset
            await hist.aclose()
            if target.closed:
                return
            joined = await self._join(target, directory, held_to) if fetched > 0 else 0
            self._remove_tree(directory)
            log.info("replication: %s: %d record(s) below offset %d fetched%s", partition, max(fetched, 0),
                     before, f" and joined to the log ({joined} segment(s))" if joined else
                     "; nobody holds any (none, or retention deleted them)")
        finally:
            self.history_at.pop(partition, None)
            if not hist.closed:
                await hist.aclose()

    async def _join(self, target: CommitLog, directory: str, last: int) -> int:
        """``target.join_history_async``, which a cancel (its replica begun anew) does not cut
        short: the task that follows waits for this one, and must not meet files half moved."""
        join = self.loop.create_task(target.join_history_async(directory, last))
        try:
            return await asyncio.shield(join)
        except asyncio.CancelledError:
            await asyncio.wait([join])
            if not join.cancelled() and join.exception() is not None:  # retrieved: the cancel says why we stop
                log.debug("replication: a join cut short by a cancel failed: %s", join.exception())
            raise

    def history_fetch(self, peer: Peer, partition: str, offset: int, before: int) -> None:
        """``peer`` fetches the records of ``partition`` below ``before`` from ``offset`` on
        (``_history``): from this router's log, or its replica of it; contiguous records up to
        ``HISTORY_RECORDS``/``HISTORY_BYTES``, or an empty answer: no more."""
        rep = self.replicas.get(partition)
        log_ = self.log if partition == self.partition else rep.log if rep is not None else None
        records = []
        if log_ is not None:
            for r in log_.read(offset, max_records=HISTORY_RECORDS, max_bytes=HISTORY_BYTES):
                if r.offset >= before or (records and r.offset != records[-1].offset + 1):
                    break  # (a log continued after a lost disk has a gap: the asker begins again after it)
                records.append(r)
        if not records:
            self.mesh.send_replication(peer, "history", [partition, -1, -1, b""])
            return
        body = msgpack.packb([record_fields(r) for r in records])
        self.mesh.send_replication(peer, "history", [partition, records[0].offset, records[-1].offset, body])

    def history(self, sender: str, partition: str, first: int, last: int, body: bytes) -> None:
        """The answer to a history request: to the task that asked, if it asked ``sender``."""
        waiting = self._history_waits.get(partition)
        if waiting is not None and waiting[0] == sender and not waiting[1].done():
            waiting[1].set_result((first, last, body))

    # -- failover of delivery ---------------------------------------------------------------------

    def parked(self, peer: Peer) -> None:
        """A router fell silent: if it is of another node, have its replica read back what it
        acknowledged and this router's subscribers may not have had; arm its sessions' delayed
        wills held here."""
        if peer.node_id == self.config.node_id:
            return
        self._arm_wills(peer.router_id)
        if peer.origin_mark < 0:
            return
        partition = peer.router_id
        best, best_end = self._holder(partition)
        if best is None:
            return
        where = "this router" if best is self.mesh else best.router_id
        if best_end < peer.origin_mark:
            log.info("replication: router %s is silent; this router has what it wanted of its messages up to "
                     "offset %d, as far as its replica on %s goes: nothing to read back", partition,
                     peer.origin_mark, where)
            return
        log.info("replication: router %s is silent; reading its replica on %s back from offset %d",
                 partition, where, peer.origin_mark)
        if best is self.mesh:
            self._read_back(partition, peer.origin_mark, None)
            self._groups_back(partition, peer.origin_mark)
        else:
            self.mesh.send_replication(best, "catchup", [partition, peer.origin_mark])

    def catchup(self, peer: Peer | None, partition: str, offset: int) -> None:
        """``peer`` (None: this router) asks for what ``partition`` published from ``offset`` on."""
        self._read_back(partition, offset, peer)
        self._groups_back(partition, offset)

    def _groups_back(self, partition: str, offset: int) -> None:
        """The shared groups' part of a read-back. A group's message went to one router, chosen
        by the dead router, and the catch-up each router asks for is by its plain interest: the
        messages the dead router acknowledged but had not yet sent to a group's router are sent
        to the groups from here instead (``Router.to_groups``), from the lowest offset any router
        asked from (its mark: below it, that router had every message of the dead one). Each
        asker's lower mark extends the range downwards; at least once (a group may get again
        what reached it between the marks)."""
        low = self._groups_low.get(partition)
        if low is not None and offset >= low:
            return
        self._groups_low[partition] = offset
        self._groups_step(partition, offset, low, 0)

    def _groups_step(self, partition: str, offset: int, end: int | None, sent: int) -> None:
        """One step of ``_groups_back`` (per loop iteration): records from ``offset`` up to
        ``end`` (None: the replica's end)."""
        rep = self.replicas.get(partition)
        if rep is None or not self.router.has_shared:
            return
        records = rep.log.read(max(offset, rep.log.start_offset), max_records=FETCH_RECORDS // 4)
        if end is not None:
            records = [r for r in records if r.offset < end]
        if not records:
            if sent:
                log.info("replication: %d message(s) of %s read back from its replica for the shared groups",
                         sent, partition)
            return
        for rec in records:
            if rec.origin_router == partition and rec.qos > 0 and self.router.to_groups(Message.from_record(rec)):
                sent += 1
        self.loop.call_soon(self._groups_step, partition, records[-1].offset + 1, end, sent)

    def _read_back(self, partition: str, offset: int, peer: Peer | None, sent: int = 0) -> None:
        """Read the replica of ``partition`` back from ``offset``, by ``peer``'s interest (or to
        this router's own subscribers), one step per loop iteration."""
        rep = self.replicas.get(partition)
        if rep is None or (peer is not None and not peer.alive):
            return
        records = rep.log.read(max(offset, rep.log.start_offset), max_records=FETCH_RECORDS // 4)
        if not records:
            if sent:
                log.info("replication: %d message(s) of %s read back from its replica for %s", sent, partition,
                         "this router" if peer is None else peer.router_id)
            return
        batch = []
        if peer is None:  # to this router's own subscribers
            def wanted(topic: str, subs: Any = self.router.subs.match) -> bool:
                return bool(subs(topic))
        else:
            def wanted(topic: str, interest: Any = self.router.interest.match, rid: str = peer.router_id) -> bool:
                return any(r == rid for r, _ in interest(topic))
        for rec in records:
            if rec.origin_router != partition or not wanted(rec.topic):
                continue  # a copy from a third router (that one replays its own), or not wanted
            batch.append(Message.from_record(rec).to_list())
        mark = records[-1].offset + 1
        if peer is None:
            self.replayed(partition, batch, mark)  # as if a holder elsewhere had sent it
        else:
            self.mesh.send_replication(peer, "publish", [partition, batch, mark])
        self.loop.call_soon(self._read_back, partition, mark, peer, sent + len(batch))

    def replayed(self, partition: str, batch: list, mark: int) -> None:
        """Messages of ``partition`` read back from a replica elsewhere."""
        if batch:
            bad = self.router.deliver_forwarded(batch, partition)
            if bad:
                log.error("replication: dropped %d malformed message(s) of %s", bad, partition)
        origin = self.mesh.peers.get(partition)
        if origin is not None and mark > origin.origin_mark:
            origin.origin_mark = mark

    # -- sessions ----------------------------------------------------------------------------------

    def sessions_changed(self, sessions: dict[str, dict]) -> None:
        """The router's persistent sessions as its snapshot holds them (``StateStore``, at every
        write: within a second of a change, at once after a subscription change): those that
        changed since the last go to the followers."""
        if self.factor <= 1:
            return
        self._sessions_known = True
        sent = self._sessions_sent
        updates: dict[str, dict | None] = {cid: st for cid, st in sessions.items() if sent.get(cid) != st}
        updates.update((cid, None) for cid in sent if cid not in sessions)
        self._sessions_sent = sessions
        if updates:
            for rid in self.followers:
                self._send_sessions(rid, updates, False)

    def _send_sessions(self, rid: str, sessions: dict, full: bool) -> None:
        peer = self.mesh.peers.get(rid)
        if peer is None or not peer.alive:
            return
        items = list(sessions.items())
        for i in range(0, max(len(items), 1), SESSION_CHUNK):
            self.mesh.send_replication(peer, "sessions", [self.partition, full and i == 0,
                                                          dict(items[i:i + SESSION_CHUNK])])

    def session_state(self, peer: Peer, partition: str, full: bool, updates: dict) -> None:
        """Sessions of ``partition`` from its leader."""
        if partition != peer.router_id or peer.node_id == self.config.node_id:
            raise ValueError(f"session-state: {peer.router_id} sent sessions of {partition}")
        held = self.sessions.setdefault(partition, {})
        if full:
            held.clear()
        for cid, st in updates.items():
            if st is None:
                held.pop(cid, None)
            else:
                held[cid] = st
        self._sessions_changed(partition)

    def _sessions_changed(self, partition: str) -> None:
        self._sessions_dirty.add(partition)
        if self._sessions_timer is None:
            self._sessions_timer = self.loop.call_later(SESSIONS_WRITE_S, self._write_sessions)

    def _write_sessions(self, wait: bool = False) -> None:
        """Write the held sessions of the partitions changed since the last write (in a thread;
        ``wait``: here, at a stop)."""
        self._sessions_timer = None
        dirty, self._sessions_dirty = self._sessions_dirty, set()
        for partition in dirty:
            directory = self._replica_dir(partition)
            if not os.path.isdir(directory):
                continue  # not following it (any more): nothing to keep
            path = os.path.join(directory, SESSIONS_FILE)
            data = msgpack.packb(self.sessions.get(partition, {}), use_bin_type=True)
            file = self._session_files.get(path)
            if file is None:
                file = self._session_files[path] = SnapshotFile(path)
            if wait:
                self._write_file(file, data, file.ticket())
            else:
                self.loop.run_in_executor(None, self._write_file, file, data, file.ticket())

    @staticmethod
    def _write_file(file: SnapshotFile, data: bytes, ticket: int) -> None:
        path = file.path
        try:
            file.write(data, ticket)
        except OSError as exc:
            log.error("replication: cannot write %s: %s (a restart of this router before its leader "
                      "returns would not have those sessions)", path, exc.strerror)

    def _load_sessions(self, partition: str) -> None:
        path = os.path.join(self._replica_dir(partition), SESSIONS_FILE)
        try:
            with open(path, "rb") as f:
                held = msgpack.unpackb(f.read(), raw=False, strict_map_key=False)
        except FileNotFoundError:
            return
        except (OSError, ValueError, msgpack.UnpackException) as exc:
            log.error("replication: %s unreadable (%s): the sessions of %s held here are not restored",
                      path, exc, partition)
            return
        if isinstance(held, dict) and held:
            self.sessions[partition] = held

    def release_replica(self, client_id: str, limit: int | None = -1) -> tuple[dict, Any] | None:
        """A takeover of ``client_id`` whose router is silent, answered from the replica here:
        the session's header and its copies from its position on (``Session.export_copies``),
        or None when no silent router's session of that id is held here. The copy stays held
        until the new owner has it in its snapshot (``replica_moved``)."""
        if client_id in self._handing:
            return None  # being handed over already (to another connection of that id)
        if self.in_minority:
            if any(client_id in held for held in self.sessions.values()):
                log.warning("replication: session %s not handed over from its replica: this node sees no "
                            "majority of the cluster", client_id)
            return None
        found = []  # (partition, state) of every silent router whose sessions held here name it
        for partition, held in self.sessions.items():
            st = held.get(client_id)
            leader = self.mesh.peers.get(partition)
            if st is not None and (leader is None or not leader.alive):
                found.append((partition, st))  # (no replica yet: its router logged nothing)
        if found and not all(self.gone_for_majority(p) for p, _ in found):
            # Silent here, but another node still hears its router: that router may be serving
            # it (a partition that cut only some links). The client is refused, not given a
            # second copy (``undecided``).
            log.warning("replication: session %s not handed over from its replica: router(s) %s are silent "
                        "here but heard by other nodes", client_id,
                        ", ".join(p for p, _ in found if not self.gone_for_majority(p)))
            return None
        if not found:
            return None
        # Two silent routers of one node may both have had it (it moved between them shortly
        # before the node died, before the first said it was gone): the most recent counts.
        partition, st = max(found, key=lambda f: recency(f[1]))
        due = self._held_will_due(partition, st)
        if due is not None and time.time() >= due:
            # Its will fell due before this connection came (the will of a connection its
            # router's loss closed, with a Will Delay Interval of 0, at once): it goes out before
            # the session moves, wherever the holders' timers were (they look once a second
            # for the majority's vote).
            self._publish_held_will(partition, client_id, st)
        exported = self._export_replica(client_id, partition, st, limit)
        if exported is None:
            return None
        header, copies, since_ms = exported
        header["replica"] = partition
        header["since_ms"] = since_ms
        header["stale_replicas"] = [p for p, _ in found if p != partition]
        if st.get("copies"):  # copies its router held outside its log: read back (``adopted``)
            header["copies"] = st["copies"]
        for p, _ in found:
            if p != partition:  # stale: dropped now
                del self.sessions[p][client_id]
                self._sessions_changed(p)
        self._handing[client_id] = (partition, st)
        log.warning("replication: session %s of silent router %s handed over from its replica here",
                    client_id, partition)
        return header, copies

    def take_replica(self, client_id: str) -> dict | object | None:
        """``release_replica`` for a takeover asked on this router: the whole state at once. The
        copy stays held until the caller says it is taken (``replica_moved``: the mesh does, once
        the session is in this router's snapshot). With a log here its copies are spooled, all
        of them (``router.spool``), as a takeover from another node spools them; before, this
        one took at most ``max_queued``, and the read-back that follows (from after the last of
        them, at most ``max_queued`` per router too) left the rest out. A spool that cannot be
        written leaves the copy held here: TAKEOVER_FAILED (the client may retry)."""
        log_ = self.router.commit_log
        released = self.release_replica(client_id, None if log_ is not None else -1)
        if released is None:
            return None
        header, chunks = released
        if log_ is None:
            header["queue"] = [item for chunk in chunks for item in chunk]
            return header
        try:
            spool_into(header, log_.directory, chunks)
        except OSError as exc:
            self.replica_moved(client_id, False)
            log.error("replication: session %s not taken from the replica here: its copies could not be "
                      "spooled (%s); it stays held", client_id, exc)
            return TAKEOVER_FAILED
        return header

    def _export_replica(self, client_id: str, partition: str, st: dict,
                        limit: int | None = -1) -> tuple[dict, Any, int] | None:
        """A session of ``partition`` held here, exported from its replica: its takeover header,
        its copies (``Session.export_copies``, read as they are taken), and the time of its
        position; None (logged) when its held state cannot be read back."""
        rebuilt = self._replica_header(client_id, partition, st)
        if rebuilt is None:
            return None
        session, header, since_ms = rebuilt
        return header, session.export_copies(False, limit=limit), since_ms

    def _replica_header(self, client_id: str, partition: str, st: dict) -> tuple[Session, dict, int] | None:
        """A session of ``partition`` rebuilt from its replica (``_replica_session``), its
        takeover header and the time of its position; None (logged) when its held state cannot
        be read back."""
        try:
            session, since_ms = self._replica_session(client_id, partition, st)
            return session, session.export_header(False), since_ms
        except (KeyError, TypeError, ValueError, OSError) as exc:
            log.error("replication: session %s of %s cannot be served from its replica: %s", client_id,
                      partition, exc)
            return None

    def _replica_session(self, client_id: str, partition: str, st: dict) -> tuple[Session, int]:
        """A session of ``partition`` rebuilt from its replicated state (not indexed by this
        router), reading the replica from its position; with the time of that position."""
        session = self._detached(client_id, st["subs"])
        restore_state(session, st)
        for values in st.get("shared", ()):
            sub = Subscription.from_values(values)
            session.shared[sub.topic_filter] = sub
        rep = self.replicas.get(partition)
        if rep is None:  # its router had logged nothing when it fell silent: nothing to read
            return session, self._silent_since_ms(partition)
        rep.log.flush()  # the range is read from the disk
        start = max(st.get("position") or 0, rep.log.start_offset)
        end = rep.log.next_offset
        first = rep.log.read(start, max_records=1) if start < end else []
        since_ms = first[0].timestamp_ms if first else self._silent_since_ms(partition)
        session.ranges = [LogRange(rep.log.directory, start, end)]
        return session, since_ms

    def _silent_since_ms(self, partition: str) -> int:
        """When the router of ``partition`` fell silent (Unix ms; now if it is not parked here):
        a session served from its replica with nothing logged after its position asks the others
        (``adopted``) for what was published since then."""
        peer = self.mesh.peers.get(partition)
        return int((self.mesh.silent_since(peer) if peer is not None else time.time()) * 1000)

    def _detached(self, client_id: str, subs: list) -> Session:
        """A session that no router indexes, to read logs with (its subscriptions' QoS, No
        Local, identifiers and the ACLs, as a catch-up reads them)."""
        session = Session(client_id, True, self.router.config.session, self.router.stats)
        session.acl = self.router.acl
        for values in subs:
            sub = Subscription.from_values(values)
            session.subscriptions[sub.topic_filter] = sub
        return session

    def replica_moved(self, client_id: str, ok: bool) -> None:
        """The new owner has the session handed from a replica, in its snapshot (``ok``): the
        copy here is dropped; or the transfer failed: it stays held here."""
        handing = self._handing.pop(client_id, None)
        if handing is not None and ok:
            partition, st = handing
            held = self.sessions.get(partition, {})
            if held.get(client_id) is st:
                del held[client_id]
                self._sessions_changed(partition)

    def adopted(self, session: Session, state: dict) -> None:
        """A session came here from the replica of a silent router: make it the only one, and ask
        every other router for what it may have missed (module docstring)."""
        partition = state["replica"]
        cid = session.client_id
        self.fence(cid, [partition])
        # The copies from the replica (not live ones since): in the queue, or, where they were
        # spooled (``router.spool``), their marks taken as they were written.
        marks: dict[str, int] = dict(state.get("spool_marks") or {})
        for _, _, values in state["queue"]:
            msg = Message.from_list(values)
            if msg.origin_offset >= marks.get(msg.origin_router, -1):
                marks[msg.origin_router] = msg.origin_offset
        since = state.get("since_ms", 0) - CATCHUP_MARGIN_MS
        asked = 0
        for rid in [self.partition, *self.mesh.peers]:
            if rid == partition:
                continue  # its messages came from its replica
            start = marks[rid] + 1 if rid in marks else -1
            asked += self._ask_catchup(rid, self._catchup_body(session, rid, start, since))
        spans = self.read_back_copies(session, state.get("copies"))
        log.info("replication: session %s taken over from the replica of %s; asked %d router(s) for what "
                 "was on its way there%s", cid, partition, asked + 1,
                 f", and {spans} for the copies it held" if spans else "")

    def read_back_copies(self, session: Session, copies: Any) -> int:
        """The copies a lost router held for ``session`` outside its log (a spool not read yet,
        copies in memory: ``Session.copy_spans``, named by its replicated state as ``copies``)
        were on that node only: ask each origin router (or, silent, the holder of its replica)
        for its span of them, to the span's end. Returns how many routers were asked."""
        asked = 0
        for rid, (lo, hi, _) in valid_spans(copies).items():
            asked += self._ask_catchup(rid, self._catchup_body(session, rid, lo, 0, hi + 1))
        return asked

    def read_back_handon(self, session: Session, old: str, since_ms: int, seen: dict[str, int],
                         marks: dict[str, int], only_old: bool = False) -> tuple[int, bool]:
        """``session`` moved here from router ``old``, which fell silent before it had handed on
        what reached it for the session after it left (``Mesh._handons_lost``). Those copies
        are in logs: ``old``'s own, from where it stood when the session left (``seen``, its
        ``handon_from``) to its end, whatever their origin (it logged the copies other routers
        sent it), read from its replica; and each other router's, from where ``old`` had seen
        it (or ``since_ms``, less a margin, where it had seen nothing) to where its messages
        came here directly (``marks``, as ``Mesh.confirm_takeover`` noted them; its end where
        none), for the copies ``old`` logged and had not replicated. At least once.
        ``only_old``: ``old``'s own log alone. Returns how many routers were asked, and whether
        ``old``'s log was (False: neither it nor a replica of it could be asked now)."""
        asked, old_asked = 0, False
        origins = {old} if only_old else {old, self.partition, *seen, *marks, *self.mesh.peers}
        for rid in sorted(origins):
            start = seen.get(rid, -1)
            end = LOG_END if rid == old else marks.get(rid, LOG_END)
            if rid == old and start < 0 or 0 <= end <= start:
                continue  # (old had no log: what it held was in memory, and in the others' logs)
            ok = self._ask_catchup(rid, self._catchup_body(session, rid, start, since_ms - CATCHUP_MARGIN_MS, end))
            asked += ok
            old_asked = old_asked or (ok and rid == old)
        return asked, old_asked

    def read_back_unheard(self, session: Session, since_ms: int, unheard: dict, marks: dict[str, int]) -> list[str]:
        """``session`` moved here from a router that handed on what reached it, but some routers
        had not answered its barrier (``unheard``: {router: how far the old router had seen its
        log}): what they sent the old router before they knew of the move may reach it after the
        session left. Ask each for its copies from there to where it sends here directly
        (``marks``; its log's end where none). Returns the routers asked."""
        asked = []
        for rid, seen in sorted(unheard.items()):
            if rid.__class__ is not str or seen.__class__ is not int:
                continue
            end = marks.get(rid, LOG_END)
            if 0 <= end <= seen:
                continue  # it sends here directly from where the old router had seen it
            if self._ask_catchup(rid, self._catchup_body(session, rid, seen, since_ms - CATCHUP_MARGIN_MS, end)):
                asked.append(rid)
        return asked

    def _catchup_body(self, session: Session, rid: str, start: int, since_ms: int, end: int = -1) -> list:
        """SESSION_CATCHUP's body asking router ``rid`` for ``session``'s messages (from
        ``start``, or -1: from ``since_ms``; to ``end``, -1: the log's end), and whether this
        router spools the answers: with a log it does (``Router.take_copies``), and is sent all
        of them; without one, at most ``--max-queued`` (they wait in memory)."""
        return [session.client_id, rid, start, since_ms, [s.to_values() for s in session.subscriptions.values()],
                session.username, end, self.router.commit_log is not None]

    def _ask_catchup(self, rid: str, body: list) -> bool:
        """Send SESSION_CATCHUP ``body`` to router ``rid``, to this router itself, or (``rid``
        silent) to the holder of its replica with the highest end; False when none can answer."""
        if rid == self.partition:
            self.session_catchup(None, *body)
            return True
        peer = self.mesh.peers.get(rid)
        if peer is None:
            holder = self._holder(rid)[0] if rid in self.replicas else None
        else:
            holder = peer if peer.alive else self._holder(rid)[0]
        if holder is self.mesh:
            self.session_catchup(None, *body)
        elif holder is not None:
            self.mesh.send_replication(holder, "session_catchup", body)
        else:
            return False
        return True

    def fence(self, client_id: str, partitions: Iterable[str]) -> None:
        """``client_id``'s session is here now, not with the silent routers ``partitions`` (its
        replicas there were handed over, or stale): their other replicas forget it (SESSION_GONE)
        and each router drops its copy when it is heard again (``rejoined``)."""
        fenced = self.router.fenced
        for partition in partitions:
            fenced.setdefault(partition, set()).add(client_id)
            gone = [partition, [client_id]]
            for peer in self.mesh.peers.values():
                if peer.alive:
                    self.mesh.send_replication(peer, "gone", gone)
        if self.router.state is not None:
            self.router.state.mark(soon=True)

    def _holder(self, partition: str) -> tuple[Any, int]:
        """Who holds the replica of ``partition`` with the highest end (the mesh: this router; a
        live peer; None: nobody), and that end."""
        best, best_end = None, -1
        own = self.replicas.get(partition)
        if own is not None:
            best, best_end = self.mesh, own.log.next_offset - 1
        for other in self.mesh.peers.values():
            end = other.replicas.get(partition, -1) if other.alive else -1
            if end > best_end:
                best, best_end = other, end
        return best, best_end

    def session_gone(self, partition: str, client_ids: list[str], wills: Iterable[str] = ()) -> None:
        """Sessions of ``partition`` were taken over from a replica: forget them; and the delayed
        wills of ``wills`` were published from one: not again from here. (To ``partition``
        itself: ``Router.drop_stale_sessions`` and ``Router.wills_published_elsewhere``.)"""
        held = self.sessions.get(partition, {})
        changed = False
        for cid in client_ids:
            changed = held.pop(cid, None) is not None or changed
        for cid in wills:
            st = held.get(cid)
            if st is not None:
                st["will"] = st["live_will"] = None
                changed = True
            self._disarm_will(partition, cid)
        if changed:
            self._sessions_changed(partition)

    def rejoined(self, peer: Peer) -> None:
        """A router is heard again: the sessions taken from its replica while it was silent
        are not its any more, and the delayed wills published from here not its to publish; its
        other wills are its own again."""
        for key in [k for k in self._will_timers if k[0] == peer.router_id]:
            self._disarm_will(*key)
        self._groups_low.pop(peer.router_id, None)  # a later silence reads back afresh
        fenced = self.router.fenced.pop(peer.router_id, None)
        wills = self.router.fenced_wills.pop(peer.router_id, None)
        if fenced or wills:
            body: list = [peer.router_id, sorted(fenced or ())]
            if wills:
                body.append(sorted(wills))
            self.mesh.send_replication(peer, "gone", body)
            if self.router.state is not None:
                self.router.state.mark(soon=True)

    # -- the delayed wills of a silent router's sessions ---------------------------------------------

    def _arm_wills(self, partition: str) -> None:
        """``partition``'s router fell silent: each will of its sessions held here goes out when
        due (``_will_due``), this router's turn among the live holders of its replica later by
        ``WILL_STAGGER_S`` each: a delayed will of an offline session at its time, the will of a
        session whose client was connected (``live_will``) its Will Delay Interval after the
        silence began (that connection is lost with its node, or sent away from a minority)."""
        held = self.sessions.get(partition)
        if not held:
            return
        holders = sorted({self.partition, *(p.router_id for p in self.mesh.peers.values()
                                            if p.alive and partition in p.replicas)})
        stagger = holders.index(self.partition) * WILL_STAGGER_S
        now = time.time()
        for cid, st in held.items():
            due = self._held_will_due(partition, st)
            if due is not None and (partition, cid) not in self._will_timers:
                delay = max(0.0, due - now) + stagger
                self._will_timers[(partition, cid)] = self.loop.call_later(delay, self._will_due, partition, cid)

    def _held_will_due(self, partition: str, st: dict) -> float | None:
        """When the will held with session state ``st`` of silent ``partition`` falls due (Unix
        time; None: it has none): a delayed will at its time, a connected client's will its
        delay after the silence began."""
        if st.get("will"):
            return st["will"][1] / 1000
        live = st.get("live_will")
        return self._silent_since_ms(partition) / 1000 + live[1] if live else None

    def _disarm_will(self, partition: str, cid: str) -> None:
        timer = self._will_timers.pop((partition, cid), None)
        if timer is not None:
            timer.cancel()

    def _will_due(self, partition: str, cid: str) -> None:
        """Publish the will of ``cid`` (of silent ``partition``) unless its router is back or
        the session was taken over; without a majority (the router may be alive on the other
        side of a partition), look again in a second."""
        self._will_timers.pop((partition, cid), None)
        leader = self.mesh.peers.get(partition)
        st = self.sessions.get(partition, {}).get(cid)
        if st is None or not (st.get("will") or st.get("live_will")) or (leader is not None and leader.alive):
            return
        if self.in_minority or cid in self._handing or not self.gone_for_majority(partition):
            # (a takeover may resume it; another node may still hear its router)
            self._will_timers[(partition, cid)] = self.loop.call_later(1.0, self._will_due, partition, cid)
            return
        self._publish_held_will(partition, cid, st)

    def _publish_held_will(self, partition: str, cid: str, st: dict) -> None:
        """Publish the will held in ``st`` (session ``cid`` of silent ``partition``) from this
        router, once: the other holders and, when it returns, the router are told."""
        self._disarm_will(partition, cid)
        delayed = bool(st.get("will"))
        will = st.get("will") or st["live_will"]
        st["will"] = st["live_will"] = None
        self._sessions_changed(partition)
        kind = "delayed will" if delayed else "will"
        try:
            msg = Message.from_list(will[0])
        except (TypeError, ValueError, IndexError) as exc:
            log.error("replication: the %s of session %s of %s cannot be read: %s", kind, cid, partition, exc)
            return
        self.router.publish_will(msg, st.get("username"))  # as its owner: a revoked grant stops it
        self.router.fenced_wills.setdefault(partition, set()).add(cid)
        if self.router.state is not None:
            self.router.state.mark(soon=True)
        notice = [partition, [], [cid]]
        for peer in self.mesh.peers.values():
            if peer.alive:
                self.mesh.send_replication(peer, "gone", notice)
        log.info("replication: the %s of session %s of silent router %s published here%s", kind, cid, partition,
                 "" if delayed else " (its client was connected to it)")

    def moved_past_silence(self, session: Session, silent: Any) -> None:
        """A session moved here from a live router to which other routers were silent
        (``silent``: {router: when its silence began, Unix ms}, as the old router saw it). What
        they published for the session meanwhile they kept for the old router, which gets it
        after the session left, when they are heard there again: under a partition that cut
        only that link, long after this router (which may hear them all along) took the session.
        Ask each that is alive here for its own messages since (SESSION_CATCHUP, from
        ``CATCHUP_MARGIN_MS`` before the silence): at least once. One silent here too is asked
        when it is heard again (``moved_in_catchup``)."""
        if silent.__class__ is not dict:
            return
        cid = session.client_id
        asked = []
        for rid, since_ms in silent.items():
            if rid.__class__ is not str or since_ms.__class__ is not int or not session.subscriptions:
                continue
            body = self._catchup_body(session, rid, -1, since_ms - CATCHUP_MARGIN_MS)
            peer = self.mesh.peers.get(rid)
            if rid == self.partition:
                self.session_catchup(None, *body)
            elif peer is not None and peer.alive:
                self.mesh.send_replication(peer, "session_catchup", body)
            else:
                continue
            asked.append(rid)
        if asked:
            log.info("replication: session %s moved here from a router to which %s were silent: asked them "
                     "for what they published since", cid, ", ".join(sorted(asked)))

    def moved_in_catchup(self, peer: Peer, silent_since: float) -> None:
        """``peer`` is heard again after a silence that began at ``silent_since`` (Unix time).
        Sessions that moved to this router from another one meanwhile may have missed what it
        published for them: it sent that to their old router, by the interest it knew, and a
        partition can deliver it there after they left. Ask it for those messages
        (SESSION_CATCHUP, from ``CATCHUP_MARGIN_MS`` before the silence): at least once."""
        moved = self.router.moved_in
        horizon = time.time() - self.config.mesh_forget  # a peer silent longer is forgotten
        for cid in [c for c, t in moved.items() if t < horizon]:
            del moved[cid]
        since_ms = int(silent_since * 1000) - CATCHUP_MARGIN_MS
        asked = 0
        for cid, t in moved.items():
            session = self.router.sessions.get(cid)
            if t < silent_since - self.config.mesh_timeout or session is None or not session.subscriptions:
                continue
            self.mesh.send_replication(peer, "session_catchup",
                                       self._catchup_body(session, peer.router_id, -1, since_ms))
            asked += 1
        if asked:
            log.info("replication: %d session(s) that moved to this router while %s was silent ask it for what "
                     "it published meanwhile", asked, peer.router_id)

    def session_catchup(self, peer: Peer | None, client_id: str, partition: str, start: int, since_ms: int,
                        subs: list, username: str | None, end: int = -1, spools: bool = False) -> None:
        """Read this router's log (or the replica of ``partition``) back for one session taken
        over elsewhere: the QoS 1/2 messages of ``partition`` its subscriptions match, from
        ``start`` (-1: from ``since_ms``), as SESSION_COPIES to ``peer`` (None: this router).
        With an ``end``, the records of ``[start, end)`` whatever their origin: copies a lost
        router held for the session (``read_back_copies``), among them a range of this log it
        had still to read. All of them where the asker ``spools`` the answers; else at most
        ``--max-queued`` (whole steps of ``FETCH_RECORDS // 4`` records)."""
        if partition == self.partition:
            log_ = self.log
        else:
            rep = self.replicas.get(partition)
            log_ = rep.log if rep is not None else None
        if log_ is None:
            return
        if start < 0:
            with LogReader(log_.directory) as reader:
                found = reader.offset_for_time(since_ms)
            start = found if found is not None else log_.next_offset
        session = self._detached(client_id, subs)
        session.username = username
        stop = log_.next_offset if end < 0 else min(end, log_.next_offset)
        cap = None if spools else self.config.max_queued
        self._catchup_step(peer, session, partition, end >= 0, cap, log_, max(start, log_.start_offset), stop, 0)

    def _catchup_step(self, peer: Peer | None, session: Session, partition: str, whole: bool, cap: int | None,
                      log_: Any, offset: int, end: int, sent: int) -> None:
        if peer is not None and not peer.alive:
            return
        records = [r for r in log_.read(offset, max_records=FETCH_RECORDS // 4) if r.offset < end] \
            if offset < end else []
        items = []
        for rec in records:
            if rec.qos and (whole or rec.origin_router in ("", partition)):
                best, ids = session._best_qos(rec)
                if best > 0:
                    msg = Message.from_record(rec)
                    items.append([min(best, rec.qos), False, (msg.with_ids(ids) if ids else msg).to_list()])
        last = not records or (cap is not None and sent + len(items) >= cap)
        if peer is None:
            self.router.take_copies(session.client_id, items, read_back=True)
        else:
            self.mesh.send_replication(peer, "copies", [session.client_id, items, last])
        if not last:
            self.loop.call_soon(self._catchup_step, peer, session, partition, whole, cap, log_,
                                records[-1].offset + 1, end, sent + len(items))
        elif sent + len(items):
            log.info("replication: %d message(s) of %s read back for session %s", sent + len(items), partition,
                     session.client_id)

    # -- stats and life ----------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        lead = self.leader
        in_sync = set(lead.in_sync())
        # A follower's lag in bytes, estimated: its lag in records times the log's mean record
        # size on disk (headers and index included); offsets do not say bytes without a read.
        log_stats = self.log.stats()
        kept = log_stats["next_offset"] - log_stats["start_offset"]
        per_record = log_stats["bytes"] / kept if kept > 0 else 0.0
        return {
            "factor": self.factor, "min_insync": self.min_insync, "required": lead.min_insync,
            "end": lead.end, "high_water": lead.high_water, "held": len(lead._held), "refused_total": self.refused,
            "followers": {f: {"offset": lead.acked[f], "lag_records": lag,
                              "lag_bytes": round(lag * per_record),
                              "lag_seconds": round(lead.lag_s(f), 3), "in_sync": f in in_sync}
                          for f in lead.acked for lag in (max(0, lead.lag_records(f)),)},
            "replicas": {p: {"start": r.log.start_offset, "end": r.log.next_offset - 1, "acked": r.acked,
                             **self._history_stats(p)} for p, r in self.replicas.items()},
            "start": self.log.start_offset, **self._history_stats(self.partition),
            "sessions": {p: len(held) for p, held in self.sessions.items() if held},  # held for other routers
            # Of those, the offline ones with a delayed will waiting (published from here if their
            # router dies and it falls due).
            "wills": {p: n for p, held in self.sessions.items() if (n := sum(1 for st in held.values() if st.get("will")))},
            "majority": self.members.has_majority if self.agreed is None else self.agreed.majority,
            "members": len(self.members.nodes),
            # The lease: its epoch (one more at each end), and the member nodes backing it now.
            "lease": {"epoch": self.lease.epoch, "backing": len(self.lease.backers(time.monotonic()))},
            # Per router of another node: the offset of its log below which this router has what
            # it wanted (a read-back from a replica after its death starts there).
            "origin_marks": {rid: p.origin_mark for rid, p in self.mesh.peers.items()
                             if p.node_id != self.config.node_id and p.origin_mark >= 0},
        }

    def _history_stats(self, partition: str) -> dict[str, Any]:
        """While the records below a log's start are fetched: from where, and below what."""
        at = self.history_at.get(partition)
        return {} if at is None else {"history": {"next": at[0], "below": at[1]}}

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for key in list(self._will_timers):
            self._disarm_will(*key)
        if self._sessions_timer is not None:
            self._sessions_timer.cancel()
        self._write_sessions(wait=True)
        tasks = [task for _, task in self._histories.values()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)  # each closes its history log: it goes on at the next start
        for rep in self.replicas.values():
            await rep.log.aclose()
