"""Replication's transport (issue 19, docs/replication.md): one router's log copied to
followers on other nodes, acknowledgements held until ``--min-insync`` nodes hold a record, and
a dead router's messages and sessions served from a replica.

The rules are pure (``cluster.replication.rules``: ``LeaderState``, ``FollowerState``,
``HistoryState``; ``placement``; ``session_store``); this package moves their frames over the
mesh and their records to and from disk. Per router, on its own log (the *partition* named by
its router id) it is the leader; on other nodes' logs placed here it is a follower. Each side
has its module and its part, an object the one ``Replication`` owns (``self.lead``,
``self.follow``, ...) with its own state; a part names the others it calls on its class
(``quorum: MajorityPart``) and ``Replication`` hands it them, so what crosses between parts is
declared in one place and type-checked. The mesh, the router and the worker talk to
``Replication``, which passes each call to its part (the per-message ones bound directly):

- ``leader``: placement of the followers, batches out, acknowledgements held, ``tell_end``;
- ``follower``: the replicas here, appended to and acknowledged;
- ``history``: the records below a log's start, fetched and served;
- ``read_back``: a silent router's messages read back from a replica (failover of delivery);
- ``sessions``: session replicas, sent, held on disk, and handed over from a replica;
- ``catchup``: what a moved session may have missed, asked of the other routers' logs;
- ``wills``: the held wills of a silent router's sessions;
- ``restore``: a router back on an empty disk (its log continued, its sessions sent back);
- ``majority``: the lease and the majority rules (``in_minority``, ``gone_for_majority``);
- ``insync``: with ``--agreement``, the in-sync set committed through it (and others' sets learnt);
- ``link``: the one interface to the mesh (``MeshLink``), and ``frames``: its receiving end, the
  handlers the mesh's dispatch table names for the replication's frame kinds.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .catchup import CatchupPart
from .follower import FETCH_AGAIN_S, FollowerPart, Replica
from .frames import FramesPart
from .history import HistoryPart
from .insync import InsyncPart
from .leader import LeaderPart
from .link import MeshAdapter
from .majority import MajorityPart
from .part import Part
from .read_back import ReadBackPart
from .restore import RestorePart
from .sessions import SessionsPart
from .wills import WillsPart

if TYPE_CHECKING:
    from brokerd.router.client import Client
    from brokerd.router.router import Router
    from brokerd.router.session import Session

    from ..config import Config
    from ..mesh import Mesh, Peer

__all__ = ["Replication"]

log = logging.getLogger(__name__)

TICK_S = 0.1  # held acknowledgements' deadlines and the in-sync set are looked at this often
RETENTION_TICKS = int(60 / TICK_S)  # replicas' retention is enforced once a minute, as the log's


class Replication(Part):
    """The replication of one router: leader of its own log, follower of what is placed here.

    It owns its parts (module docstring) and is what the mesh, the router and the worker talk to:
    each call goes to the part whose it is. Its time is the mesh's (``MeshLink.clock``, ``wall``),
    handed to every part: its rules compare their times with those the mesh notes of its peers."""

    def __init__(self, config: Config, router: Router, mesh: Mesh, loop: asyncio.AbstractEventLoop) -> None:
        assert router.commit_log is not None
        self.config = config
        self.router = router
        self.net = MeshAdapter(mesh)
        self.loop = loop
        self.partition = router.router_id
        self.log = router.commit_log
        self.factor = config.replication_factor or 1
        self.min_insync = config.min_insync or 1
        self.always = config.fsync == "always"
        self._timer: asyncio.TimerHandle | None = None
        self.clock, self.wall = self.net.clock, self.net.wall  # the mesh's: one time with its ``last_seen``
        self._started = self.clock()
        self._ticks = 0
        # The parts, each with its own state; then what each calls of the others.
        self.lead = LeaderPart(self)
        self.follow = FollowerPart(self)
        self.session_part = SessionsPart(self)
        self.wills = WillsPart(self)
        self.quorum = MajorityPart(self)
        self.isr = InsyncPart(self)
        self.restorer = RestorePart(self)
        self.histories = HistoryPart(self)
        self.readback = ReadBackPart(self)
        self.catchups = CatchupPart(self)
        self.frames = FramesPart(self)  # the frames the mesh hands on (``dispatch.FRAMES``)
        parts = {"lead": self.lead, "follow": self.follow, "session_part": self.session_part, "wills": self.wills,
                 "quorum": self.quorum, "isr": self.isr, "restorer": self.restorer, "histories": self.histories,
                 "readback": self.readback, "catchups": self.catchups, "frames": self.frames}
        for part in parts.values():
            for name in _references(type(part)):
                setattr(part, name, parts[name])
        # What others call per message or per batch: the parts' own methods, with no hop.
        self.hold = self.lead.hold  # type: ignore[method-assign]  # (the method below, for the port's readers)
        self.replicate = self.follow.replicate
        self.acknowledged = self.lead.acknowledged
        if self.factor > 1:  # with R = 1 this router only follows (acknowledgements never wait)
            self.log.on_batch = self.lead.on_batch
            if self.always:
                self.log.on_durable(self.lead.leader_end)
            else:
                self.log.on_written(self.lead.leader_end)
            router.replication = self
        self.follow.open_replicas()
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
                await self.restorer.continue_log()
            if os.path.isdir(self.histories.history_dir(self.log)):  # fetched back on an earlier run, not finished
                self.histories.fetch_history(self.partition, self.log)
        finally:
            self.session_part.sessions_ready = True  # (it was already, but on an empty disk with peers)
            # The sessions this router holds now (restored from its disk, or from its followers)
            # go to its followers at once, not at their next change: until a snapshot has listed
            # them (``sessions_changed``), no full set goes out (``place``).
            if self.router.state is not None:
                self.router.state.mark(soon=True)

    def _tick(self) -> None:
        self._ticks += 1
        if self._ticks % RETENTION_TICKS == 0:
            for rep in self.follow.replicas.values():  # the same --retention-bytes/-hours as the router's own log
                deleted = rep.log.enforce_retention()
                if deleted:
                    log.info("retention deleted %d segment(s) of the replica of %s", len(deleted), rep.partition)
        released, refused = self.lead.leader.tick()
        if self.clock() >= self.quorum.recount_at:
            self.quorum.count_majority()  # a lease that ends is noticed within a tick if nothing else looked
        self.lead.release(released)
        if self.quorum.cut_off and self.quorum.in_minority:
            refused += self.quorum.cut_off.late()
        if refused:
            self.lead.refused += len(refused)
            self.router.refuse_acks([h.token for h in refused],
                                    f"not on {self.lead.leader.min_insync} node(s) within {self.config.replica_timeout:g} s")
        now = self.clock()
        for rep in self.follow.replicas.values():
            if rep.fetch_sent and now - rep.fetch_sent > FETCH_AGAIN_S:
                rep.fetch_sent = 0.0  # the next batch asks again
        if self.lead.followers:
            self.lead.tell_end()
        self.isr.check_insync()
        self._timer = self.loop.call_later(TICK_S, self._tick)

    def heartbeat(self) -> None:
        """The mesh's heartbeat: the majority counted, the followers placed on the live nodes."""
        self.quorum.count_majority()
        self.lead.place()

    def stats(self) -> dict[str, Any]:
        lead = self.lead.leader
        in_sync = set(lead.in_sync())
        # A follower's lag in bytes, estimated: its lag in records times the log's mean record
        # size on disk (headers and index included); offsets do not say bytes without a read.
        log_stats = self.log.stats()
        kept = log_stats["next_offset"] - log_stats["start_offset"]
        per_record = log_stats["bytes"] / kept if kept > 0 else 0.0
        return {
            "factor": self.factor, "min_insync": self.min_insync, "required": lead.min_insync,
            "end": lead.end, "high_water": lead.high_water,
            # With --agreement: the in-sync set committed, and this incarnation's leader epoch.
            "agreed_in_sync": None if lead.agreed is None else sorted(lead.agreed), "leader_epoch": self.isr.leader_epoch, "held": len(lead._held), "refused_total": self.lead.refused,
            "followers": {f: {"offset": lead.acked[f], "lag_records": lag,
                              "lag_bytes": round(lag * per_record),
                              "lag_seconds": round(lead.lag_s(f), 3), "in_sync": f in in_sync}
                          for f in lead.acked for lag in (max(0, lead.lag_records(f)),)},
            "replicas": {p: {"start": r.log.start_offset, "end": r.log.next_offset - 1, "acked": r.acked,
                             **self._history_stats(p)} for p, r in self.follow.replicas.items()},
            "start": self.log.start_offset, **self._history_stats(self.partition),
            "sessions": self.session_part.store.counts(),  # held for other routers
            # Of those, the offline ones with a delayed will waiting (published from here if their
            # router dies and it falls due).
            "wills": self.session_part.store.delayed_wills(),
            "majority": self.quorum.members.has_majority if self.quorum.agreed is None else self.quorum.agreed.majority,
            "members": len(self.quorum.members.nodes),
            # The lease: its epoch (one more at each end), and the member nodes backing it now.
            "lease": {"epoch": self.quorum.lease.epoch, "backing": len(self.quorum.lease.backers(self.clock()))},
            # Per router of another node: the offset of its log below which this router has what
            # it wanted (a read-back from a replica after its death starts there).
            "origin_marks": {rid: p.origin_mark for rid, p in self.net.items()
                             if p.node_id != self.config.node_id and p.origin_mark >= 0},
        }

    def _history_stats(self, partition: str) -> dict[str, Any]:
        """While the records below a log's start are fetched: from where, and below what."""
        at = self.histories.history_at.get(partition)
        return {} if at is None else {"history": {"next": at[0], "below": at[1]}}

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for key in list(self.wills.will_timers):
            self.wills.disarm_will(*key)
        if self.session_part.sessions_timer is not None:
            self.session_part.sessions_timer.cancel()
        self.session_part.write_sessions(wait=True)
        tasks = [task for _, task in self.histories.fetches.values()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)  # each closes its history log: it goes on at the next start
        for rep in self.follow.replicas.values():
            await rep.log.aclose()

    # -- what the mesh, the router and the worker read and call (the parts' own) -------------

    def hold(self, offset: int, client: Client, ack: bytes) -> bool:
        return self.lead.hold(offset, client, ack)

    @property
    def followers(self) -> list[str]:
        return self.lead.followers

    @property
    def replicas(self) -> dict[str, Replica]:
        return self.follow.replicas

    @property
    def in_minority(self) -> bool:
        return self.quorum.in_minority

    @property
    def recount_at(self) -> float:
        return self.quorum.recount_at

    @property
    def agreed(self) -> Any:
        """The router's agreed owners (``cluster.agreement.owners.SessionOwners``), with --agreement."""
        return self.quorum.agreed

    @agreed.setter
    def agreed(self, owners: Any) -> None:
        self.quorum.agreed = owners

    def hello(self) -> dict[str, int]:
        return self.follow.hello()

    def history(self, sender: str, partition: str, first: int, last: int, body: bytes) -> None:
        self.histories.history(sender, partition, first, last, body)

    def parked(self, peer: Peer) -> None:
        self.readback.parked(peer)
        self.catchups.ask_again(peer)

    def sessions_changed(self, sessions: dict[str, dict]) -> None:
        self.session_part.sessions_changed(sessions)

    def drop_users_wills(self, users: set[str]) -> list[tuple[str, str]]:
        return self.wills.drop_users_wills(users)

    def session_state(self, peer: Peer, partition: str, full: bool, updates: dict) -> None:
        self.session_part.session_state(peer, partition, full, updates)

    def release_replica(self, client_id: str, limit: int | None = -1) -> tuple[dict, Any] | None:
        return self.session_part.release_replica(client_id, limit)

    def take_replica(self, client_id: str) -> dict | None:
        return self.session_part.take_replica(client_id)

    def replica_moved(self, client_id: str, ok: bool) -> None:
        self.session_part.replica_moved(client_id, ok)

    def fence(self, client_id: str, partitions: Iterable[str]) -> None:
        self.session_part.fence(client_id, partitions)

    def session_gone(self, partition: str, client_ids: list[str], wills: Iterable[str] = ()) -> None:
        self.session_part.session_gone(partition, client_ids, wills)

    def rejoined(self, peer: Peer) -> None:
        self.session_part.rejoined(peer)
        self.catchups.ask_again(peer)
        self.catchups.returned(peer)

    def adopted(self, session: Session, state: dict) -> None:
        self.catchups.adopted(session, state)

    def read_back_handon(self, session: Session, old: str, since_ms: int, seen: dict[str, int],
                         marks: dict[str, int], only_old: bool = False) -> tuple[int, bool]:
        return self.catchups.read_back_handon(session, old, since_ms, seen, marks, only_old)

    def read_back_unheard(self, session: Session, since_ms: int, unheard: dict, marks: dict[str, int]) -> list[str]:
        return self.catchups.read_back_unheard(session, since_ms, unheard, marks)

    def moved_past_silence(self, session: Session, silent: object) -> None:
        self.catchups.moved_past_silence(session, silent)

    def moved_in_catchup(self, peer: Peer, silent_since: float) -> None:
        self.catchups.moved_in_catchup(peer, silent_since)

    def check_paused(self) -> None:
        self.quorum.check_paused()

    def recount(self) -> None:
        self.quorum.recount()

    def agreement_majority(self, majority: bool) -> None:
        self.quorum.agreement_majority(majority)

    def paused(self, gap: float) -> None:
        self.quorum.paused(gap)

    def undecided(self) -> list[str]:
        return self.quorum.undecided()

    def insync_published(self, router: str, epoch: int, followers: Any) -> None:
        self.isr.insync_published(router, epoch, followers)


def _references(cls: type) -> list[str]:
    """The parts a part's class declares it calls (annotations naming a part class)."""
    names: list[str] = []
    for klass in reversed(cls.__mro__):
        for name, kind in vars(klass).get("__annotations__", {}).items():
            if isinstance(kind, str) and kind.endswith("Part") and kind != "Part":
                names.append(name)
    return names
