"""The cluster's members as one node knows them, and whether it sees a majority of them
(issue 19, step 2 without Raft; docs/replication.md, "A node cut off from the majority").

Why a majority: a node cannot tell a dead peer from one it cannot reach. If both sides of a
partition went on acknowledging and serving sessions, each would take the other's sessions for
dead and serve them too. A side that sees more than half of the members is the only one that
can; a node that sees half or fewer stops acknowledging QoS 1/2 and takes no session in.

Members are the nodes this node has heard, kept on disk (``members``, beside its log) so that a
node restarted inside a minority still knows it is one. A member silent long enough for the mesh
to forget it (``--mesh-forget``) leaves the set, but only while this node sees a majority: a
minority never shrinks the set until it looks like a majority. With fewer than three members
there is no majority to lose without losing the cluster (two nodes cannot tell a death from a
partition): the rule then does not apply, and a node alone goes on, as before.
"""

from __future__ import annotations

import json
import logging
import os

log = logging.getLogger(__name__)

MEMBERS_FILE = "members"
MIN_MEMBERS = 3  # below this, a node alone cannot be told from a partition: the rule is off
# A router's lease ends, and a heartbeat this late counts as a pause, this much short of a mesh
# timeout after the moment that counts: the others may take the router for gone from then on
# (their silence timer started when they heard it last, later than it spoke; the margin is for
# the rates of their clocks).
MARGIN_S = 0.1
BEAT_REUSE_S = 0.05  # HELLOs sent within this of a beat's first carry the same beat


class Members:
    """The member nodes (persisted) and the majority rule over them. No sockets: the caller
    says which nodes it hears (``heard``) and which the mesh forgot (``forgotten``)."""

    def __init__(self, path: str, own: str) -> None:
        self.path = path
        self.own = own
        self.nodes: set[str] = {own}
        try:
            with open(path, encoding="utf-8") as f:
                self.nodes.update(n for n in json.load(f) if isinstance(n, str))
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            log.error("cluster members file %s unreadable (%s): starting from the nodes heard", path, exc)
        self.has_majority = True

    def met(self, live: set[str]) -> None:
        """Nodes heard while this one is starting, before the majority is judged (their HELLOs
        may still be on the way): they become members at once. Counted only from the end of
        the start, they would be missing from the set of a node whose peers all went away
        within its first seconds: it would then see itself as the whole cluster."""
        if live - self.nodes:
            self.nodes |= live
            self._save()

    def update(self, live: set[str], forgotten: set[str], backing: set[str] | None = None) -> bool | None:
        """The nodes heard now (``live``), those the mesh forgot, and those that back this
        router's lease now (``backing``; by default those heard): returns the new majority
        state when it changed (True: regained, False: lost), else None."""
        live = live | {self.own}
        changed = bool(live - self.nodes)
        self.nodes |= live
        majority = self._majority(live if backing is None else backing | {self.own})
        gone = (forgotten & self.nodes) - live
        if majority and gone:
            self.nodes -= gone
            changed = True
            log.warning("cluster: node(s) %s silent beyond --mesh-forget: no longer counted as members (%d "
                        "left)", ", ".join(sorted(gone)), len(self.nodes))
        if changed:
            self._save()
        if majority == self.has_majority:
            return None
        self.has_majority = majority
        return majority

    def _majority(self, live: set[str]) -> bool:
        if len(self.nodes) < MIN_MEMBERS:
            return True
        return 2 * len(live & self.nodes) > len(self.nodes)

    def _save(self) -> None:
        tmp = self.path + ".tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(sorted(self.nodes), f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            log.error("cannot write the cluster members file %s: %s", self.path, exc)


class Lease:
    """How long a majority of the member nodes lets this router serve: its lease (issue 19's
    "majority-quorum lease protocol", docs/replication.md "The lease").

    Why: a node that *hears* a majority is not one the majority *hears*. Cut one way (its frames
    dropped, the others' reaching it), a router went on serving its persistent sessions while the
    others took it for gone and served them from its replicas. The lease asks the other side:
    every HELLO carries a beat ``[epoch, n]``, each router that hears it answers at once with an
    ECHO of it, and a node backs this router until ``period`` after the beat it echoed last was
    *sent* (by this router's own clock: no clock is compared across nodes). The lease holds while
    this node and enough others to make a majority of the members back it.

    Safety rests on the rules the echoing side keeps (``Mesh._echo``, its rule in
    ``cluster/mesh/membership.echo_allowed``): a router that parks a
    silent peer (``--mesh-timeout`` of silence, its vote that the peer is gone) never echoes that
    incarnation's epoch again (the fence), and echoes a peer only once it has heard it, and has
    itself run, for a mesh timeout (by then its HELLOs say it hears the peer); and on
    ``period`` being shorter than the mesh timeout. So a node's backing ends before it votes,
    and a majority that votes a router gone shares a node with any majority that could back it:
    the lease has ended before any vote is complete (docs/replication.md argues it in full).

    A lease that ended is never revived: the next beats carry the next epoch, which the fences
    of the old one do not stop, so a router that was only slow gets a new lease one round trip
    later (a mesh timeout after the others hear it again, if they had parked it). No sockets and
    no clock of its own: the caller passes ``now``."""

    __slots__ = ("members", "period", "epoch", "_n", "_sent", "_backing", "held", "until", "began", "_last")

    def __init__(self, members: Members, period: float) -> None:
        self.members = members
        self.period = period
        self.epoch = 0
        self._n = 0
        self._sent: dict[int, float] = {}  # beat number: when it was first sent (in that order)
        self._last = -1.0  # when the last beat number was made
        self._backing: dict[str, float] = {}  # node: until when it backs this router
        self.held = False  # a majority backed this epoch at some moment
        self.until = 0.0  # when the lease ends, as last computed (0: not held)
        self.began = False  # held once, in any epoch (the others echo only after their own start)

    def beat(self, now: float) -> list[int]:
        """The beat for the HELLO about to go out: one number for the HELLOs of one heartbeat
        (to every link), timed from the first of them, which backs the least."""
        if now - self._last >= BEAT_REUSE_S or self._n not in self._sent:
            self._n += 1
            self._sent[self._n] = self._last = now
            old = now - self.period
            sent = self._sent
            while (first := next(iter(sent))) != self._n and sent[first] < old:
                del sent[first]  # older than a period: backs nothing any more
        return [self.epoch, self._n]

    def echoed(self, node: str, epoch: int, n: int, now: float) -> None:
        """A router of ``node`` echoed beat ``n`` of ``epoch``."""
        self._end_if_over(now)  # ended before this echo came: it is not revived
        sent = self._sent.get(n)
        if epoch != self.epoch or sent is None or node == self.members.own:
            return
        if sent + self.period > self._backing.get(node, 0.0):
            self._backing[node] = sent + self.period
            self._compute(now)

    def valid(self, now: float) -> bool:
        """Whether this router holds its lease now (always, with fewer than MIN_MEMBERS members)."""
        if len(self.members.nodes) < MIN_MEMBERS:
            return True
        self._end_if_over(now)
        return now < self.until

    def backers(self, now: float) -> set[str]:
        """The nodes backing this router now, its own counted."""
        return {self.members.own} | {n for n, t in self._backing.items() if t > now}

    def _end_if_over(self, now: float) -> None:
        """A lease held in this epoch whose end has come lapses, whoever notices it first."""
        if self.held and now >= self.until:
            self.lapse()

    def lapse(self) -> None:
        """The lease ended (or a pause may have let it end): the next beats start a new epoch."""
        self.epoch += 1
        self._sent.clear()
        self._last = -1.0
        self._backing.clear()
        self.held = False
        self.until = 0.0

    def _compute(self, now: float) -> None:
        nodes, own = self.members.nodes, self.members.own
        others = sorted((t for n, t in self._backing.items() if n in nodes and n != own), reverse=True)
        need = len(nodes) // 2  # nodes needed besides this one for a majority
        if len(others) >= need:
            until = others[need - 1] if need else float("inf")
            if until > now:  # (echoes too late to back anything now start nothing)
                self.until = until
                self.held = self.began = True
