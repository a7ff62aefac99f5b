"""Replication of one router's log: the state machines of its leader and of a follower (issue 19).

No I/O here (docs/replication.md, "The replication protocol"): the router tells these classes
what happened (its log wrote a batch, a follower acknowledged an offset, a batch arrived, time
passed) and does what they return (release or refuse held acknowledgements, append, acknowledge,
fetch). The mesh carries the frames; tests drive these classes with no mesh at all.

Why these rules (Kafka's, where brokerd has no reason to differ):

* The **high-water mark** is the highest offset held by ``min_insync`` nodes, counting the leader:
  a QoS 1/2 acknowledgement for a record at or below it is safe to send, because that many nodes
  would have to lose their disks for it to be lost.
* A follower is **in sync** while the oldest batch it has not acknowledged is younger than
  ``max_lag_s`` (Kafka's ``replica.lag.time.max.ms``): a follower that is merely busy stays in,
  one that stopped falls out, and the leader stops waiting for it. Only in-sync followers count
  towards the high-water mark, so a dead follower cannot hold it back for longer than that.
* With fewer than ``min_insync`` nodes in sync nothing new is acknowledged: acknowledgements are
  held until enough followers are back, or refused at their deadline (never sent unreplicated).
* With ``--agreement``, the in-sync set is **agreed** (Kafka's ISR kept by its controller): only
  the followers the agreement names count, and the high-water mark never passes what one of them
  lacks, so that every follower the agreed state names holds every acknowledged record, whatever
  a failover later reads back. A follower joins the set once it holds the high-water mark and
  leaves it once it lags; either change counts only once committed (``agree``): until a lagging
  member is agreed out, acknowledgements wait for it.
"""

from __future__ import annotations

import hashlib
import zlib
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


def follower_nodes(partition: str, own_node: str, nodes: Iterable[str], count: int) -> list[str]:
    """The ``count`` nodes (other than the partition's own) that follow ``partition``: the first in
    rendezvous (highest random weight) order of ``hash(partition, node)``. Every router that
    knows the same nodes computes the same answer, and a node that leaves moves only the
    partitions it followed."""
    def weight(node: str) -> bytes:
        return hashlib.blake2b(f"{partition}\0{node}".encode(), digest_size=8).digest()

    return sorted({n for n in nodes if n != own_node}, key=weight, reverse=True)[:max(count, 0)]


def follower_router(partition: str, routers: Iterable[str]) -> str:
    """Which of a follower node's routers holds the replica of ``partition``: the work of
    following spreads over the node's workers."""
    ordered = sorted(routers)
    return ordered[zlib.crc32(partition.encode()) % len(ordered)]


@dataclass(slots=True)
class Held:
    """An acknowledgement (``token``: what the router sends when released) waiting for ``offset``."""

    offset: int
    token: Any
    deadline: float


class LeaderState:
    """The leader side of one partition: who holds what, and which acknowledgements may go.

    ``end`` is the last offset the leader's own log holds (written; with ``--fsync always``,
    durable): the leader counts as one of the ``min_insync`` nodes only up to it."""

    def __init__(self, followers: Iterable[str], min_insync: int, max_lag_s: float, hold_timeout_s: float,
                 clock: Callable[[], float], end: int = -1) -> None:
        if min_insync < 1:
            raise ValueError("min_insync must be at least 1")
        self.min_insync = min_insync
        self.max_lag_s = max_lag_s
        self.hold_timeout_s = hold_timeout_s
        self.clock = clock
        self.end = end
        self.high_water = end if min_insync == 1 else -1
        self.acked: dict[str, int] = dict.fromkeys(followers, -1)  # follower -> last offset it holds
        self._batches: deque[tuple[int, float]] = deque()  # (last offset, when written), unacked by someone
        self._held: deque[Held] = deque()  # in offset order (appends only grow)
        # The in-sync followers the agreement committed (``agree``); None: none is agreed (no
        # ``--agreement``, or none committed yet), and the followers in sync by their lag count.
        self.agreed: frozenset[str] | None = None
        # A set proposed and not committed yet: counted with the agreed one meanwhile (Kafka's
        # "maximal ISR"), so that whichever the agreement ends with, each member holds every
        # record below the high-water mark.
        self.pending: frozenset[str] = frozenset()

    # -- what happened ----------------------------------------------------------------------------

    def written(self, last_offset: int) -> list[Held]:
        """The leader's log holds everything up to ``last_offset``; returns what that releases."""
        if last_offset <= self.end:
            return []
        self.end = last_offset
        self._batches.append((last_offset, self.clock()))
        return self._advance()

    def acknowledged(self, follower: str, offset: int) -> list[Held]:
        """``follower`` holds everything up to ``offset`` (an older, repeated ack changes nothing).
        It may be ahead of ``end``: a follower can write a batch before the leader's own write
        is done (the transport caps it at what was sent)."""
        if follower not in self.acked or offset <= self.acked[follower]:
            return []
        self.acked[follower] = offset
        self._prune()
        return self._advance()

    def set_followers(self, followers: Iterable[str], min_insync: int) -> list[Held]:
        """The placement changed: these are the followers now (a new one holds nothing yet), and
        ``min_insync`` the nodes a record must be on (capped by the transport at the nodes there
        are); returns what that releases."""
        wanted = list(followers)
        for f in [f for f in self.acked if f not in wanted]:
            del self.acked[f]
        for f in wanted:
            self.acked.setdefault(f, -1)
        self.min_insync = max(1, min_insync)
        self._prune()
        return self._advance()

    def hold(self, offset: int, token: Any) -> bool:
        """Whether the acknowledgement of the record at ``offset`` must wait (then it is held and
        comes back from ``written``/``acknowledged``/``tick``); False: send it now."""
        if offset <= self.high_water:
            return False
        self._held.append(Held(offset, token, self.clock() + self.hold_timeout_s))
        return True

    def propose(self, followers: frozenset[str]) -> None:
        """``followers`` are proposed as the in-sync set: until a later proposal commits they count
        too (one whose outcome is unknown may still commit)."""
        self.pending = self.pending | followers

    def agree(self, followers: Iterable[str]) -> list[Held]:
        """The agreement committed ``followers`` as this log's in-sync set (the last proposed): from
        now on only they count, each one for every record; returns what that releases."""
        self.agreed = frozenset(followers)
        self.pending = frozenset()
        return self._advance()

    def wanted(self) -> frozenset[str]:
        """The in-sync set to propose: the followers in sync by their lag that hold the high-water
        mark (a follower outside it that joins must hold every acknowledged record)."""
        hw = self.high_water
        return frozenset(f for f in self.acked if self.acked[f] >= hw and self.lag_s(f) <= self.max_lag_s)

    def tick(self) -> tuple[list[Held], list[Held]]:
        """Time passed: (released, refused). Followers that fell out of sync stop holding the
        high-water mark back; acknowledgements past their deadline are refused (the client is
        told, or its connection closed: never acknowledged unreplicated)."""
        released = self._advance()
        refused: list[Held] = []
        now = self.clock()
        held = self._held
        while held and held[0].deadline <= now:
            refused.append(held.popleft())
        return released, refused

    # -- what follows from it ---------------------------------------------------------------------

    def lag_s(self, follower: str) -> float:
        """How long the oldest batch ``follower`` does not hold has been written (0: none)."""
        ack = self.acked[follower]
        for last, t in self._batches:
            if last > ack:
                return max(0.0, self.clock() - t)
        return 0.0

    def in_sync(self) -> list[str]:
        return [f for f in self.acked if self.lag_s(f) <= self.max_lag_s]

    def lag_records(self, follower: str) -> int:
        return self.end - self.acked[follower]

    def _advance(self) -> list[Held]:
        agreed = self.agreed
        if agreed is None:
            holders = sorted([self.end, *(self.acked[f] for f in self.in_sync())], reverse=True)
            if len(holders) >= self.min_insync:
                mark = holders[self.min_insync - 1]
                if mark > self.high_water:
                    self.high_water = mark
        elif 1 + len(agreed) >= self.min_insync:
            # Every agreed (or proposed) member holds it (one placed elsewhere since holds nothing here).
            mark = min([self.end, *(self.acked.get(f, -1) for f in agreed | self.pending)])
            if mark > self.high_water:
                self.high_water = mark
        released: list[Held] = []
        held = self._held
        while held and held[0].offset <= self.high_water:
            released.append(held.popleft())
        return released

    def _prune(self) -> None:
        """Forget the batches every follower holds (the lag is measured from the oldest missing)."""
        low = min(self.acked.values(), default=self.end)
        batches = self._batches
        while batches and batches[0][0] <= low:
            batches.popleft()


class CutOffHolds:
    """Acknowledgements held while this node sees no majority of the cluster: replicated or not,
    this side of a partition may not acknowledge. All go at once when the majority is back
    (``release``); each is refused at its deadline while it is not (``late``)."""

    def __init__(self, hold_timeout_s: float, clock: Callable[[], float]) -> None:
        self.hold_timeout_s = hold_timeout_s
        self.clock = clock
        self.held: list[Held] = []

    def __len__(self) -> int:
        return len(self.held)

    def hold(self, offset: int, token: Any) -> None:
        """A new acknowledgement, held from now for ``hold_timeout_s``."""
        self.held.append(Held(offset, token, self.clock() + self.hold_timeout_s))

    def keep(self, held: Iterable[Held]) -> None:
        """Acknowledgements the followers released, kept with their deadlines."""
        self.held.extend(held)

    def release(self) -> list[Held]:
        """The majority is back: every one held goes."""
        held, self.held = self.held, []
        return held

    def late(self) -> list[Held]:
        """Those past their deadline (no longer held): refused."""
        now = self.clock()
        late = [h for h in self.held if h.deadline <= now]
        if late:
            self.held = [h for h in self.held if h.deadline > now]
        return late


class TailRepair:
    """When a follower behind the leader's end is sent the leader's last record again: one that
    lacks records before it then fetches them (``FollowerState.arrived``), one that holds it
    acknowledges again. Without it, a follower back from a cut, or whose fetch went unanswered,
    waits for the next write. Only once nothing new went out for ``again_s`` (a live batch
    reaches every follower: no cost there), and then once per ``again_s`` per follower, counting
    what the leader sent it otherwise (``told``: a fetch answered)."""

    def __init__(self, end: int, again_s: float) -> None:
        self.again_s = again_s
        self.end_seen = (end, 0.0)  # the leader's last offset sent live, and when ``due`` first saw it
        self.told_at: dict[str, float] = {}  # follower -> when it was last sent a read-back or the last record

    def told(self, follower: str, now: float) -> None:
        """``follower`` was sent records (the last one, or a fetch's answer) at ``now``."""
        self.told_at[follower] = now

    def due(self, end: int, acked: dict[str, int], followers: Iterable[str], now: float) -> list[str]:
        """The followers to send the record at ``end`` again now (call ``told`` for each one
        sent). ``acked``: what each follower holds."""
        if end != self.end_seen[0]:
            self.end_seen = (end, now)  # a live batch went to every follower
            return []
        return [f for f in followers if acked.get(f, end) < end
                and now - max(self.end_seen[1], self.told_at.get(f, 0.0)) >= self.again_s]


@dataclass
class FollowerState:
    """A follower's side of one partition: where its replica log ends, and what to do with a batch
    that arrives (append it, acknowledge a repeat, or fetch the gap before it).

    ``next_offset`` is None for a replica that holds nothing yet: it starts at the leader's
    high-water mark + 1 (what is at or below it was on enough nodes before this one was chosen),
    or at the batch if that starts lower."""

    next_offset: int | None = None

    APPEND = "append"
    REPEAT = "repeat"
    FETCH = "fetch"

    def arrived(self, first: int, last: int, high_water: int = -1) -> str:
        """A batch of records ``first..last``: APPEND it from ``next_offset`` on (then call
        ``appended``; a batch that starts before it, a fetched range read back beside a live
        batch, is appended from there), REPEAT the current acknowledgement (it holds them
        already), or FETCH from ``next_offset`` (records before ``first`` are missing: a frame
        was lost, or this replica is new)."""
        if last < first:
            raise ValueError("an empty batch")
        if self.next_offset is None:
            self.next_offset = max(0, min(first, high_water + 1))
        if last < self.next_offset:
            return self.REPEAT
        if first > self.next_offset:
            return self.FETCH
        return self.APPEND

    def appended(self, last: int) -> int:
        """The replica log holds everything up to ``last``: the offset to acknowledge."""
        if self.next_offset is None or last >= self.next_offset:
            self.next_offset = last + 1
        return self.next_offset - 1


@dataclass
class HistoryState:
    """Fetching the records of a log below where it starts, from a node that holds them: a
    follower placed at its leader's high-water mark (what lies below was on enough nodes when it
    was placed, but one of them is gone), or a router back on an empty disk (its old records are
    on its followers). The history is fetched forwards, one request at a time, into a log of its
    own, which joins the main log once it reaches it (``CommitLog.join_history``).

    ``before`` is the main log's first offset (the history ends below it); ``next_offset`` where
    the history goes on (None: it holds nothing yet)."""

    before: int
    next_offset: int | None = None

    APPEND = "append"
    BEGIN = "begin"
    REPEAT = "repeat"
    DONE = "done"

    def ask(self) -> int:
        """The offset to fetch from."""
        return 0 if self.next_offset is None else self.next_offset

    def arrived(self, first: int, last: int) -> str:
        """An answer: records ``first..last``, or ``first`` -1: the source holds no more below
        ``before``. DONE; APPEND them from ``next_offset`` on (then call ``appended``); BEGIN the
        history anew at ``first`` (the first answer, or the source no longer holds what lies
        between: retention deleted it), then append; or REPEAT the request (they are held
        already)."""
        if first < 0:
            return self.DONE
        if last < first or last >= self.before:
            raise ValueError(f"history: records {first}..{last} for a history below {self.before}")
        if self.next_offset is None or first > self.next_offset:
            self.next_offset = first
            return self.BEGIN
        if last < self.next_offset:
            return self.REPEAT
        return self.APPEND

    def appended(self, last: int) -> bool:
        """The history holds everything up to ``last``: whether it reached the main log."""
        self.next_offset = last + 1
        return self.next_offset >= self.before
