"""Where a leader's log is followed: the placement rule, pure (no mesh, no clock).

On every heartbeat the leader hands ``Placement.place`` what it sees of its peer routers and
gets back its followers and what to do about the change: which followers are new (sent what
waits for them), which are followers no more (told to drop this router's sessions: their copy
would go stale), which get every session (a new follower, or a new incarnation of one), and
which hold a stale replica without being followers (cleared once per incarnation). The rule:
the first R-1 live nodes of the rendezvous order (``cluster.replication.rules.follower_nodes``), on
each the router ``follower_router`` picks; a record must be on ``min(--min-insync, 1 +
followers)`` nodes (a node alone acknowledges alone).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from .rules import follower_nodes, follower_router


class PeerSeen(NamedTuple):
    """A peer router as the leader sees it at a heartbeat."""

    router_id: str
    node_id: str
    alive: bool
    incarnation: int | None
    holds_replica: bool  # its HELLO lists a replica of this leader's log


@dataclass
class Placed:
    """What one ``Placement.place`` decided, in the order the leader acts on it."""

    followers: list[str]
    needed: int  # the nodes a record must be on now
    warn_short: bool = False  # say (once) that fewer nodes than --min-insync are live
    dropped: list[str] = field(default_factory=list)  # followers no more: clear their sessions
    changed: bool = False  # followers or ``needed`` changed: the leader's state is told
    moved: bool = False  # the followers changed (logged)
    added: list[str] = field(default_factory=list)  # new followers: send them what waits
    full_to: list[str] = field(default_factory=list)  # send every session (new follower or incarnation)
    clear: list[str] = field(default_factory=list)  # hold a stale replica: clear their sessions


class Placement:
    """The followers of one leader's log, and whom its sessions went to."""

    def __init__(self, partition: str, own_node: str, factor: int, min_insync: int) -> None:
        self.partition = partition
        self.own_node = own_node
        self.factor = factor
        self.min_insync = min_insync
        self.followers: list[str] = []
        self.required = 1  # as ``LeaderState`` starts
        self.warned_short = False
        self.follower_incs: dict[str, int | None] = {}  # followers sent every session: their incarnation
        self.cleared: dict[str, int | None] = {}  # routers told to drop our sessions: their incarnation

    def place(self, peers: Iterable[PeerSeen], starting: bool, has_majority: bool, sessions_on: bool) -> Placed:
        """The followers for the live peers now. ``starting``: peers may still be joining (no
        shortfall is said); ``has_majority``: cut off from the majority nothing is acknowledged
        anyway (the shortfall is said once it is back); ``sessions_on``: this router's sessions
        are known and may go out in full."""
        seen = list(peers)
        incarnations = {p.router_id: p.incarnation for p in seen}
        routers_by_node: dict[str, list[str]] = {}
        for p in seen:
            if p.alive and p.node_id != self.own_node:
                routers_by_node.setdefault(p.node_id, []).append(p.router_id)
        nodes = follower_nodes(self.partition, self.own_node, routers_by_node, self.factor - 1)
        followers = [follower_router(self.partition, routers_by_node[n]) for n in nodes]
        needed = min(self.min_insync, 1 + len(followers))
        out = Placed(followers, needed)
        if needed < self.min_insync and not self.warned_short and not starting and has_majority:
            self.warned_short = out.warn_short = True
        elif needed == self.min_insync:
            self.warned_short = False
        if followers != self.followers or needed != self.required:
            out.changed = True
            out.moved = followers != self.followers
            out.added = [f for f in followers if f not in self.followers]
            for rid in self.followers:
                if rid not in followers:
                    out.dropped.append(rid)
                    self.follower_incs.pop(rid, None)
                    self.cleared[rid] = incarnations[rid]
            self.followers = followers
            self.required = needed
        if not sessions_on:
            return out
        for rid in followers:
            inc = incarnations[rid]
            if self.follower_incs.get(rid, -1) != inc:
                self.follower_incs[rid] = inc
                out.full_to.append(rid)
        for p in seen:
            if (p.alive and p.holds_replica and p.router_id not in followers and p.node_id != self.own_node
                    and self.cleared.get(p.router_id, -1) != p.incarnation):
                self.cleared[p.router_id] = p.incarnation
                out.clear.append(p.router_id)
        return out
