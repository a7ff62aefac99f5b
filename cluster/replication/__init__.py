"""Replication's transport (issue 19, docs/replication.md): one router's log copied to
followers on other nodes, acknowledgements held until ``--min-insync`` nodes hold a record, and
a dead router's messages and sessions served from a replica.

The rules are pure (``router.replication``: ``LeaderState``, ``FollowerState``,
``HistoryState``; ``placement``; ``session_store``); this package moves their frames over the
mesh and their records to and from disk. Per router, on its own log (the *partition* named by
its router id) it is the leader; on other nodes' logs placed here it is a follower. Each side
has its module, each a part of the one ``Replication`` the mesh and the router talk to:

- ``leader``: placement of the followers, batches out, acknowledgements held, ``_tell_end``;
- ``follower``: the replicas here, appended to and acknowledged;
- ``history``: the records below a log's start, fetched and served;
- ``read_back``: a silent router's messages read back from a replica (failover of delivery);
- ``sessions``: session replicas, sent, held on disk, and handed over from a replica;
- ``catchup``: what a moved session may have missed, asked of the other routers' logs;
- ``wills``: the held wills of a silent router's sessions;
- ``restore``: a router back on an empty disk (its log continued, its sessions sent back);
- ``majority``: the lease and the majority rules (``in_minority``, ``gone_for_majority``);
- ``insync``: with ``--agreement``, the in-sync set committed through it (and others' sets learnt);
- ``link``: the one interface to the mesh (``MeshLink``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from .catchup import CatchupPart
from .follower import FETCH_AGAIN_S, FollowerPart
from .history import HistoryPart
from .insync import InsyncPart
from .leader import LeaderPart
from .link import MeshAdapter
from .majority import MajorityPart
from .read_back import ReadBackPart
from .restore import RestorePart
from .sessions import SessionsPart
from .wills import WillsPart

if TYPE_CHECKING:
    from brokerd.router.router import Router

    from ..config import Config
    from ..mesh import Mesh

__all__ = ["Replication"]

log = logging.getLogger(__name__)

TICK_S = 0.1  # held acknowledgements' deadlines and the in-sync set are looked at this often
RETENTION_TICKS = int(60 / TICK_S)  # replicas' retention is enforced once a minute, as the log's


class Replication(LeaderPart, FollowerPart, HistoryPart, ReadBackPart, SessionsPart, CatchupPart, WillsPart,
                  RestorePart, MajorityPart, InsyncPart):
    """The replication of one router: leader of its own log, follower of what is placed here."""

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
        self._started = time.monotonic()
        self._ticks = 0
        self._init_leader()
        self._init_follower()
        self._init_sessions()
        self._init_wills()
        self._init_majority()
        self._init_insync()
        self._init_restore()
        self._init_history()
        self._init_read_back()
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
        if self.cut_off and self.in_minority:
            refused += self.cut_off.late()
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
        self._check_insync()
        self._timer = self.loop.call_later(TICK_S, self._tick)

    def heartbeat(self) -> None:
        """The mesh's heartbeat: the majority counted, the followers placed on the live nodes."""
        self._majority()
        self._place()

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
            "end": lead.end, "high_water": lead.high_water,
            # With --agreement: the in-sync set committed, and this incarnation's leader epoch.
            "agreed_in_sync": None if lead.agreed is None else sorted(lead.agreed), "leader_epoch": self.leader_epoch, "held": len(lead._held), "refused_total": self.refused,
            "followers": {f: {"offset": lead.acked[f], "lag_records": lag,
                              "lag_bytes": round(lag * per_record),
                              "lag_seconds": round(lead.lag_s(f), 3), "in_sync": f in in_sync}
                          for f in lead.acked for lag in (max(0, lead.lag_records(f)),)},
            "replicas": {p: {"start": r.log.start_offset, "end": r.log.next_offset - 1, "acked": r.acked,
                             **self._history_stats(p)} for p, r in self.replicas.items()},
            "start": self.log.start_offset, **self._history_stats(self.partition),
            "sessions": self.store.counts(),  # held for other routers
            # Of those, the offline ones with a delayed will waiting (published from here if their
            # router dies and it falls due).
            "wills": self.store.delayed_wills(),
            "majority": self.members.has_majority if self.agreed is None else self.agreed.majority,
            "members": len(self.members.nodes),
            # The lease: its epoch (one more at each end), and the member nodes backing it now.
            "lease": {"epoch": self.lease.epoch, "backing": len(self.lease.backers(time.monotonic()))},
            # Per router of another node: the offset of its log below which this router has what
            # it wanted (a read-back from a replica after its death starts there).
            "origin_marks": {rid: p.origin_mark for rid, p in self.net.items()
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
