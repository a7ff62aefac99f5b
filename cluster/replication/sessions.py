"""Session replicas (docs/replication.md, "Sessions"): a leader's persistent sessions held by its
followers, and handed over from there when their router is silent.

A leader's persistent sessions, as its snapshot holds them (subscriptions, position in its log,
QoS 2 state, will, expiry), go to the same followers as its log: what changed since the last
snapshot, in SESSION_STATE frames, and all of them to a new follower (or a follower's new
incarnation). A follower keeps them on disk beside the replica (``SESSIONS_FILE``). When a
client reconnects elsewhere while its session's router is silent, the follower holding that
session answers the takeover in the router's place (``release_replica``): the session's header,
and as copies what it subscribed to in the replica from its position on. The new owner then
tells every router the session is gone from that partition (SESSION_GONE, ``fence``: the other
replicas forget it, and the old router, when it returns, drops its stale copy) and asks the
others for what it may have missed (``catchup.CatchupPart.adopted``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import msgpack

from brokerd.connection.packets import Subscription
from brokerd.router.persistence import SnapshotFile, restore_state
from brokerd.router.ports import TAKEOVER_FAILED
from brokerd.router.session import LogRange, Session
from brokerd.router.spool import spool_into

from .part import Part
from .session_store import SessionStore, changes

if TYPE_CHECKING:
    from ..mesh import Peer
    from .follower import FollowerPart
    from .insync import InsyncPart
    from .leader import LeaderPart
    from .majority import MajorityPart
    from .read_back import ReadBackPart
    from .wills import WillsPart

log = logging.getLogger(__package__)  # (the package's name: the log lines name it as before)

SESSIONS_FILE = "sessions.msgpack"  # beside a replica: the sessions of its router held here
SESSIONS_WRITE_S = 1.0  # held sessions are written at most this often (a write per dirty partition)
SESSION_CHUNK = 2000  # sessions per SESSION_STATE frame


class SessionsPart(Part):
    """Sessions sent to the followers, held for other routers, and handed over from a replica."""

    # The other parts it calls (set by ``Replication``).
    lead: LeaderPart
    follow: FollowerPart
    readback: ReadBackPart
    wills: WillsPart
    quorum: MajorityPart
    isr: InsyncPart

    def __init__(self, shared: Part) -> None:
        super().__init__(shared)
        # Sessions: as last sent to the followers (leader), held for other partitions (follower),
        # and being handed over from a replica.
        self.sessions_sent: dict[str, dict] = {}
        self.store = SessionStore()
        # Held sessions are kept on disk beside their replica, so that a follower restarted while
        # their router is dead still has them (two failures in a row).
        self._session_files: dict[str, SnapshotFile] = {}
        self.sessions_timer: asyncio.TimerHandle | None = None
        # No full set of sessions goes to the followers before ``ready``: on an empty disk it
        # would replace the sessions this router is about to ask them for.
        self.sessions_ready = self.log.next_offset != 0 or not self.config.peer
        # Whether ``sessions_sent`` lists this router's sessions: a snapshot was taken since it
        # started (``sessions_changed``). A full set sent before that is empty and would wipe what
        # the followers hold: the sessions of a restarted router (the chaos suite, seed 697068541).
        self.sessions_known = False

    @property
    def sessions(self) -> dict[str, dict[str, dict]]:
        """The sessions held here for other routers: {partition: {client id: state}} (``store``)."""
        return self.store.held

    def sessions_changed(self, sessions: dict[str, dict]) -> None:
        """The router's persistent sessions as its snapshot holds them (``StateStore``, at every
        write: within a second of a change, at once after a subscription change): those that
        changed since the last go to the followers."""
        if self.factor <= 1:
            return
        self.sessions_known = True
        updates = changes(self.sessions_sent, sessions)
        self.sessions_sent = sessions
        if updates:
            for rid in self.lead.followers:
                self.send_sessions(rid, updates, False)

    def send_sessions(self, rid: str, sessions: dict, full: bool) -> None:
        peer = self.net.peer(rid)
        if peer is None or not peer.alive:
            return
        items = list(sessions.items())
        for i in range(0, max(len(items), 1), SESSION_CHUNK):
            self.net.send(peer, "sessions", [self.partition, full and i == 0,
                                             dict(items[i:i + SESSION_CHUNK])])

    def session_state(self, peer: Peer, partition: str, full: bool, updates: dict) -> None:
        """Sessions of ``partition`` from its leader."""
        if partition != peer.router_id or peer.node_id == self.config.node_id:
            raise ValueError(f"session-state: {peer.router_id} sent sessions of {partition}")
        self.store.apply(partition, full, updates)
        self._arm_write()

    def replica_changed(self, partition: str) -> None:
        self.store.mark(partition)
        self._arm_write()

    def _arm_write(self) -> None:
        if self.sessions_timer is None:
            self.sessions_timer = self.loop.call_later(SESSIONS_WRITE_S, self.write_sessions)

    def write_sessions(self, wait: bool = False) -> None:
        """Write the held sessions of the partitions changed since the last write (in a thread;
        ``wait``: here, at a stop)."""
        self.sessions_timer = None
        for partition in self.store.take_dirty():
            directory = self.follow.replica_dir(partition)
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

    def load_sessions(self, partition: str) -> None:
        path = os.path.join(self.follow.replica_dir(partition), SESSIONS_FILE)
        try:
            with open(path, "rb") as f:
                held = msgpack.unpackb(f.read(), raw=False, strict_map_key=False)
        except FileNotFoundError:
            return
        except (OSError, ValueError, msgpack.UnpackException) as exc:
            log.error("replication: %s unreadable (%s): the sessions of %s held here are not restored",
                      path, exc, partition)
            return
        self.store.load(partition, held)

    def release_replica(self, client_id: str, limit: int | None = -1) -> tuple[dict, Any] | None:
        """A takeover of ``client_id`` whose router is silent, answered from the replica here:
        the session's header and its copies from its position on (``Session.export_copies``),
        or None when no silent router's session of that id is held here. The copy stays held
        until the new owner has it in its snapshot (``replica_moved``)."""
        if client_id in self.store.handing:
            return None  # being handed over already (to another connection of that id)
        if self.quorum.in_minority:
            if self.store.holds(client_id):
                log.warning("replication: session %s not handed over from its replica: this node sees no "
                            "majority of the cluster", client_id)
            return None
        # (partition, state) of every silent router whose sessions held here name it (with no
        # replica yet where its router logged nothing)
        found = self.store.found(client_id, self.net.hears)
        if found and not all(self.quorum.gone_for_majority(p) for p, _ in found):
            # Silent here, but another node still hears its router: that router may be serving
            # it (a partition that cut only some links). The client is refused, not given a
            # second copy (``undecided``).
            log.warning("replication: session %s not handed over from its replica: router(s) %s are silent "
                        "here but heard by other nodes", client_id,
                        ", ".join(p for p, _ in found if not self.quorum.gone_for_majority(p)))
            return None
        if not found:
            return None
        # Two silent routers of one node may both have had it (it moved between them shortly
        # before the node died, before the first said it was gone): the most recent counts.
        partition, st = self.store.newest(found)
        in_sync = self.isr.in_sync_holders(partition)
        if in_sync and self.partition not in in_sync:
            # The agreement names other followers in sync with that router's log: this replica may
            # lack what it acknowledged last. The client is refused until one of them serves it.
            log.warning("replication: session %s not handed over from its replica here: the log of %s is in "
                        "sync on %s, not on this router", client_id, partition, ", ".join(sorted(in_sync)))
            return None
        due = self.wills.held_will_due(partition, st)
        if due is not None and self.wall() >= due:
            # Its will fell due before this connection came (the will of a connection its
            # router's loss closed, with a Will Delay Interval of 0, at once): it goes out before
            # the session moves, wherever the holders' timers were (they look once a second
            # for the majority's vote).
            self.wills.publish_held_will(partition, client_id, st)
        exported = self._export_replica(client_id, partition, st, limit)
        if exported is None:
            return None
        header, copies, since_ms = exported
        header["replica"] = partition
        header["since_ms"] = since_ms
        header["stale_replicas"] = [p for p, _ in found if p != partition]
        if st.get("copies"):  # copies its router held outside its log: read back (``adopted``)
            header["copies"] = st["copies"]
        self.store.hand(client_id, partition, st, header["stale_replicas"])  # the stale copies: dropped now
        self._arm_write()
        log.warning("replication: session %s of silent router %s handed over from its replica here",
                    client_id, partition)
        return header, copies

    def take_replica(self, client_id: str) -> dict | None:
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
        rebuilt = self.replica_header(client_id, partition, st)
        if rebuilt is None:
            return None
        session, header, since_ms = rebuilt
        rep = self.follow.replicas.get(partition)
        if rep is not None:
            # Where its replica ends: what the silent router logs beyond it, its stale copy hands on
            # when it is back, or, should it fall silent again first, the new owner reads back
            # (``Mesh.confirm_takeover``, as for a live old owner's ``handon_from``).
            header["handon_from"] = [int(self.wall() * 1000), {partition: rep.log.next_offset}]
        return header, session.export_copies(False, limit=limit), since_ms

    def replica_header(self, client_id: str, partition: str, st: dict) -> tuple[Session, dict, int] | None:
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
        session = self.detached(client_id, st["subs"])
        restore_state(session, st)
        for values in st.get("shared", ()):
            sub = Subscription.from_values(values)
            session.own_shared()[sub.topic_filter] = sub
        rep = self.follow.replicas.get(partition)
        if rep is None:  # its router had logged nothing when it fell silent: nothing to read
            return session, self.silent_since_ms(partition)
        rep.log.flush()  # the range is read from the disk
        start = max(st.get("position") or 0, rep.log.start_offset)
        end = rep.log.next_offset
        first = rep.log.read(start, max_records=1) if start < end else []
        since_ms = first[0].timestamp_ms if first else self.silent_since_ms(partition)
        session.ranges = [LogRange(rep.log.directory, start, end)]
        return session, since_ms

    def silent_since_ms(self, partition: str) -> int:
        """When the router of ``partition`` fell silent (Unix ms; now if it is not parked here):
        a session served from its replica with nothing logged after its position asks the others
        (``adopted``) for what was published since then."""
        peer = self.net.peer(partition)
        return int((self.net.silent_since(peer) if peer is not None else self.wall()) * 1000)

    def detached(self, client_id: str, subs: list) -> Session:
        """A session that no router indexes, to read logs with (its subscriptions' QoS, No
        Local, identifiers and the ACLs, as a catch-up reads them)."""
        session = Session(client_id, True, self.router.config.session, self.router.stats)
        session.acl = self.router.acl
        for values in subs:
            sub = Subscription.from_values(values)
            session.own_subscriptions()[sub.topic_filter] = sub
        return session

    def replica_moved(self, client_id: str, ok: bool) -> None:
        """The new owner has the session handed from a replica, in its snapshot (``ok``): the
        copy here is dropped; or the transfer failed: it stays held here."""
        if self.store.moved(client_id, ok):
            self._arm_write()

    def fence(self, client_id: str, partitions: Iterable[str]) -> None:
        """``client_id``'s session is here now, not with the silent routers ``partitions`` (its
        replicas there were handed over, or stale): their other replicas forget it (SESSION_GONE)
        and each router drops its copy when it is heard again (``rejoined``)."""
        fenced = self.router.fenced
        for partition in partitions:
            fenced.setdefault(partition, set()).add(client_id)
            gone = [partition, [client_id]]
            for peer in self.net.peers():
                if peer.alive:
                    self.net.send(peer, "gone", gone)
        if self.router.state is not None:
            self.router.state.mark(soon=True)

    def session_gone(self, partition: str, client_ids: list[str], wills: Iterable[str] = ()) -> None:
        """Sessions of ``partition`` were taken over from a replica: forget them; and the delayed
        wills of ``wills`` were published from one: not again from here. (To ``partition``
        itself: ``Router.drop_stale_sessions`` and ``Router.wills_published_elsewhere``.)"""
        wills = list(wills)
        changed = self.store.forget(partition, client_ids, wills)
        for cid in wills:
            self.wills.disarm_will(partition, cid)
        if changed:
            self._arm_write()

    def rejoined(self, peer: Peer) -> None:
        """A router is heard again: the sessions taken from its replica while it was silent
        are not its any more, and the delayed wills published from here not its to publish; its
        other wills are its own again."""
        for key in [k for k in self.wills.will_timers if k[0] == peer.router_id]:
            self.wills.disarm_will(*key)
        self.readback.forget_groups(peer.router_id)  # a later silence reads back afresh
        fenced = self.router.fenced.pop(peer.router_id, None)
        wills = self.router.fenced_wills.pop(peer.router_id, None)
        if fenced or wills:
            body: list = [peer.router_id, sorted(fenced or ())]
            if wills:
                body.append(sorted(wills))
            self.net.send(peer, "gone", body)
            if self.router.state is not None:
                self.router.state.mark(soon=True)
