"""Replication, the follower's side: the replicas of other nodes' logs placed here.

A replica is a commit log of the same format under ``DATA/<node>/_replicas/<router>/<partition>``
(names that start with ``_`` are not router logs to the tools that list them); it keeps the
leader's offsets. A batch is appended and acknowledged with REPLICA_ACK ``[partition, offset]``
once its log wrote it into the kernel (with ``--fsync always``: once durable); a gap is asked
for with REPLICA_FETCH ``[partition, offset]``. The rule for each batch is
``cluster.replication.rules.FollowerState``.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import time
from typing import TYPE_CHECKING

import msgpack

from brokerd.router.log import CommitLog
from brokerd.router.session import router_log_dir

from .part import Part
from .rules import FollowerState

if TYPE_CHECKING:
    from ..mesh import Peer
    from .history import HistoryPart
    from .sessions import SessionsPart

log = logging.getLogger(__package__)  # (the package's name: the log lines name it as before)

FETCH_AGAIN_S = 1.0  # a fetch not answered within this is asked again
REPLICAS_DIR = "_replicas"
# A directory being removed is first renamed to its name plus this and a number: the rename frees
# its path at once, in order, and the files go in a thread (``FollowerPart.remove_tree``); one
# left behind by a crash is removed at the next start.
ASIDE = ".removing-"


def _remove_aside(directory: str) -> None:
    """Remove what ``remove_tree`` renamed aside in ``directory`` and a crash left there (any thread)."""
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
        self.history_asked = False  # whether what lies below its start was looked for (``fetch_history``)


class FollowerPart(Part):
    """The replicas held here: opened, appended to, acknowledged."""

    # The other parts it calls (set by ``Replication``).
    histories: HistoryPart
    session_part: SessionsPart

    def __init__(self, shared: Part) -> None:
        super().__init__(shared)
        self.replicas: dict[str, Replica] = {}
        # Each router's replicas in a directory of its own: two workers of a node may follow the
        # same partition one after the other (its leader picks among the live ones).
        config = self.config
        self.root = os.path.join(config.data_dir, config.node_id, REPLICAS_DIR, self.partition.rsplit("/", 1)[1])
        self._acks_due: set[str] = set()  # replicas whose acknowledgement goes at the end of this iteration

    def replica_dir(self, partition: str) -> str:
        return router_log_dir(self.root, partition)

    def open_replicas(self) -> None:
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

    def remove_tree(self, path: str) -> None:
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
        directory = self.replica_dir(partition)
        if fresh:
            self.histories.stop_history(partition)  # its history names the records of what is replaced
            self.remove_tree(directory)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        c = self.config
        log_ = CommitLog(directory, router_id=partition, loop=self.loop, fsync=c.fsync,
                         fsync_interval_ms=c.fsync_interval_ms, segment_bytes=c.segment_bytes,
                         retention_bytes=c.retention_bytes or None, retention_hours=c.retention_hours or None)
        rep = self.replicas[partition] = Replica(partition, log_)
        if not fresh:
            self.session_part.load_sessions(partition)
        elif self.session_part.sessions.get(partition):  # they came before its first batch: keep them now
            self.session_part.replica_changed(partition)
        # Acknowledged as the leader counts its own copy: once written into the kernel (with
        # ``--fsync always``: durable), never while a batch waits in memory for the writer.
        if self.always:
            log_.on_durable(functools.partial(self._ack, rep))
        else:
            log_.on_written(functools.partial(self._ack, rep))
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
                aside = f"{self.replica_dir(partition)}.lost-{int(time.time())}"
                rep.log.close()
                os.rename(self.replica_dir(partition), aside)
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
            rep.log.start_at(rep.state.next_offset)  # type: ignore[arg-type]  # arrived() set it
        if not rep.history_asked:
            # A new replica placed at the high-water mark, or one whose history a restart
            # interrupted: what lies below it is fetched too (once per replica opened).
            rep.history_asked = True
            if rep.log.start_offset > 0 and (empty or os.path.isdir(self.histories.history_dir(rep.log))):
                self.histories.fetch_history(partition, rep.log)
        if action == FollowerState.FETCH:
            if not rep.fetch_sent:
                rep.fetch_sent = self.clock()
                self.net.send(peer, "fetch", [partition, rep.state.next_offset])
            return
        if action == FollowerState.APPEND:
            at = rep.state.next_offset
            assert at is not None  # (``arrived`` set it)
            skip = at - first
            records = msgpack.unpackb(body, raw=False)
            if len(records) != last - first + 1:
                raise ValueError(f"replicate: {len(records)} records for offsets {first}..{last}")
            # The leader's bytes as they came (no per-record call), unless part of it is here already.
            rep.log.append_batch(at, records[skip:], body if not skip else None)
            rep.fetch_sent = 0.0
            rep.state.appended(last)
            return  # acknowledged once written, or durable (``_ack`` from the log)
        # A repeat: acknowledged again, up to what the log holds (a batch before it may still wait).
        held = rep.log.durable_offset if self.always else rep.log.written_offset
        # (a repeat: ``next_offset`` is set, as for every batch that arrived)
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
            peer = self.net.peer(partition)
            if rep is not None and peer is not None and peer.alive:
                self.net.send(peer, "ack", [partition, rep.acked])

    def hello(self) -> dict[str, int]:
        """The replicas held here and their ends, for HELLO."""
        return {p: r.log.next_offset - 1 for p, r in self.replicas.items()}
