"""Failover of delivery: a silent router's messages read back from a replica.

HELLO says which replicas a router holds (``replicas``: {partition: end}). When a router of
another node falls silent, each router asks the holder of its replica with the highest end
(REPLICA_CATCHUP ``[partition, offset]``, from the offset below which it has every message of
that router's own: the mark of mesh version 8) to read the replica back by its interest; the
holder answers with REPLICA_PUBLISH ``[partition, messages, mark]`` frames. A router that holds
the replica itself reads it back to its own subscribers. Every message the dead router
acknowledged is in the replicas of ``--min-insync`` nodes, so its subscribers on the surviving
nodes get it (at least once: what they had is delivered again only if it lies after the mark).
Shared groups are served by the holder that answers the catch-ups: it reads the dead router's
QoS 1/2 messages back to the groups from the lowest mark asked for (``_groups_back``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from brokerd.router.message import Message

from .leader import FETCH_RECORDS
from .link import HERE
from .part import Part

if TYPE_CHECKING:
    from ..mesh import Peer
    from .follower import FollowerPart
    from .insync import InsyncPart
    from .wills import WillsPart

log = logging.getLogger(__package__)  # (the package's name: the log lines name it as before)


def highest_holder(partition: str, peers: Iterable[Any], best: Any = None,
                   best_end: int = -1) -> tuple[Any, int]:
    """The live peer whose replica of ``partition`` (its HELLO's ``replicas``) ends highest, and
    that end, if above ``best_end``; else ``best`` and ``best_end`` (a first one wins a tie)."""
    for other in peers:
        end = other.replicas.get(partition, -1) if other.alive else -1
        if end > best_end:
            best, best_end = other, end
    return best, best_end

class ReadBackPart(Part):
    """Reading a silent router's replica back to subscribers and shared groups."""

    # The other parts it calls (set by ``Replication``).
    follow: FollowerPart
    wills: WillsPart
    isr: InsyncPart

    def __init__(self, shared: Part) -> None:
        super().__init__(shared)
        # Per silent router whose replica is read back here: the lowest offset from which its
        # QoS 1/2 messages went to the shared groups, and how far up they went (``_groups_back``).
        self.groups_low: dict[str, int] = {}
        self.groups_high: dict[str, int] = {}
        self._groups_rising: set[str] = set()  # those whose upward read is still going

    def forget_groups(self, partition: str) -> None:
        """``partition``'s router is heard again: a later silence reads back afresh."""
        self.groups_low.pop(partition, None)
        self.groups_high.pop(partition, None)

    def parked(self, peer: Peer) -> None:
        """A router fell silent: if it is of another node, have its replica read back what it
        acknowledged and this router's subscribers may not have had; arm its sessions' delayed
        wills held here."""
        if peer.node_id == self.config.node_id:
            return
        self.wills.arm_wills(peer.router_id)
        if peer.origin_mark < 0:
            return
        partition = peer.router_id
        best, best_end = self.holder(partition)
        if best is None:
            return
        where = "this router" if best is HERE else best.router_id
        in_sync = self.isr.in_sync_holders(partition)
        if in_sync and (self.partition if best is HERE else best.router_id) not in in_sync:
            log.warning("replication: router %s is silent and no follower the agreement names in sync with its "
                        "log (%s) is heard: its replica on %s may lack what it acknowledged last", partition,
                        ", ".join(sorted(in_sync)), where)
        if best_end < peer.origin_mark:
            log.info("replication: router %s is silent; this router has what it wanted of its messages up to "
                     "offset %d, as far as its replica on %s goes: nothing to read back", partition,
                     peer.origin_mark, where)
            return
        log.info("replication: router %s is silent; reading its replica on %s back from offset %d",
                 partition, where, peer.origin_mark)
        if best is HERE:
            # The mark read once: the read-back's first step runs now and raises it (``replayed``),
            # and the groups' read from the raised mark skipped what they were owed (seed 713).
            mark = peer.origin_mark
            self._read_back(partition, mark, None)
            self._groups_back(partition, mark)
        else:
            self.net.send(best, "catchup", [partition, peer.origin_mark])

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
        what reached it between the marks). The records the replica got after the first read
        reached its end go too, at the next ask: a router cut off from the dead one only in part
        goes on replicating to here a while (partition seed 445: a second ask from above the
        first mark returned at once, and the 64 messages the replica had got since reached no
        group)."""
        low = self.groups_low.get(partition)
        if low is None or offset < low:
            self.groups_low[partition] = offset
            if low is None:
                self.groups_high[partition] = offset
                self._groups_rising.add(partition)
                self._groups_step(partition, offset, None, 0)
                return
            self._groups_step(partition, offset, low, 0)
        if partition not in self._groups_rising:
            self._groups_rising.add(partition)
            self._groups_step(partition, self.groups_high.get(partition, offset), None, 0)

    def _groups_step(self, partition: str, offset: int, end: int | None, sent: int) -> None:
        """One step of ``_groups_back`` (per loop iteration): records from ``offset`` up to
        ``end`` (None: the replica's end, and how far that went is kept in ``groups_high``)."""
        rep = self.follow.replicas.get(partition)
        records = []
        if rep is not None and self.router.has_shared:
            records = rep.log.read(max(offset, rep.log.start_offset), max_records=FETCH_RECORDS // 4)
        if end is not None:
            records = [r for r in records if r.offset < end]
        if not records:
            if end is None:
                self._groups_rising.discard(partition)
            if sent:
                log.info("replication: %d message(s) of %s read back from its replica for the shared groups",
                         sent, partition)
            return
        for rec in records:
            if rec.origin_router == partition and rec.qos > 0 and self.router.to_groups(Message.from_record(rec)):
                sent += 1
        if end is None and partition in self.groups_high:
            self.groups_high[partition] = records[-1].offset + 1
        self.loop.call_soon(self._groups_step, partition, records[-1].offset + 1, end, sent)

    def _read_back(self, partition: str, offset: int, peer: Peer | None, sent: int = 0) -> None:
        """Read the replica of ``partition`` back from ``offset``, by ``peer``'s interest (or to
        this router's own subscribers), one step per loop iteration."""
        rep = self.follow.replicas.get(partition)
        if rep is None or (peer is not None and not peer.alive):
            return
        records = rep.log.read(max(offset, rep.log.start_offset), max_records=FETCH_RECORDS // 4)
        if not records:
            if sent:
                log.info("replication: %d message(s) of %s read back from its replica for %s", sent, partition,
                         "this router" if peer is None else peer.router_id)
            return
        batch = []
        wanted: Callable[[str], bool]
        if peer is None:  # to this router's own subscribers
            def subscribed(topic: str, subs: Any = self.router.subs.match) -> bool:
                return bool(subs(topic))
            wanted = subscribed
        else:
            def interested(topic: str, interest: Any = self.router.interest.match, rid: str = peer.router_id) -> bool:
                return any(r == rid for r, _ in interest(topic))
            wanted = interested
        for rec in records:
            if rec.origin_router != partition or not wanted(rec.topic):
                continue  # a copy from a third router (that one replays its own), or not wanted
            batch.append(Message.from_record(rec).to_list())
        mark = records[-1].offset + 1
        if peer is None:
            self.replayed(partition, batch, mark)  # as if a holder elsewhere had sent it
        else:
            self.net.send(peer, "publish", [partition, batch, mark])
        self.loop.call_soon(self._read_back, partition, mark, peer, sent + len(batch))

    def replayed(self, partition: str, batch: list, mark: int) -> None:
        """Messages of ``partition`` read back from a replica elsewhere."""
        if batch:
            bad = self.router.deliver_forwarded(batch, partition)
            if bad:
                log.error("replication: dropped %d malformed message(s) of %s", bad, partition)
        origin = self.net.peer(partition)
        if origin is not None and mark > origin.origin_mark:
            origin.origin_mark = mark

    def holder(self, partition: str) -> tuple[Any, int]:
        """Who holds the replica of ``partition`` with the highest end (``HERE``: this router; a
        live peer; None: nobody), and that end."""
        own = self.follow.replicas.get(partition)
        if own is not None:
            return highest_holder(partition, self.net.peers(), HERE, own.log.next_offset - 1)
        return highest_holder(partition, self.net.peers())
