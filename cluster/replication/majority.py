"""The majority rules: whether this router may acknowledge and take sessions in (docs/replication.md,
"The lease", and ``cluster.quorum``).

A router that no majority of the member nodes backs (its lease, ``cluster.quorum.Lease``; with
agreement, its node's member cannot commit) holds its QoS 1/2 acknowledgements (refused at
``--replica-timeout``), takes no session in, and sends its persistent sessions' clients
elsewhere. A silent router's sessions and wills are served from replicas only once a majority
of the nodes takes it for gone (``gone_for_majority``). A loop paused for about a mesh timeout
(``paused``) counts as cut off until the others are heard again.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Any

from brokerd.cluster.quorum import MARGIN_S, MEMBERS_FILE, MIN_MEMBERS, Lease, Members

from .part import Part
from .rules import CutOffHolds

if TYPE_CHECKING:
    from .leader import LeaderPart

log = logging.getLogger(__package__)  # (the package's name: the log lines name it as before)



def majority_says_gone(node: str, members: Collection[str], own_node: str,
                       heard: Iterable[tuple[str, bool]]) -> bool:
    """Whether a majority of ``members`` takes a silent router of ``node`` for gone
    (``MajorityPart.gone_for_majority``). ``heard``: per live peer router here, its node and
    whether its last HELLO says it hears that router. A node votes "gone" when every router of it
    heard here says so; this node does (it does not hear it); ``node`` itself does not vote.
    With fewer than ``MIN_MEMBERS`` members the rule is off: gone."""
    if len(members) < MIN_MEMBERS:
        return True
    reports: dict[str, bool] = {own_node: True}  # node: every router of it heard here says it is gone
    for peer_node, hears in heard:
        if peer_node in members:
            reports[peer_node] = reports.get(peer_node, True) and not hears
    reports.pop(node, None)
    return 2 * sum(reports.values()) > len(members)

class MajorityPart(Part):
    """The lease, the majority, and the acknowledgements held while cut off from it."""

    # The other parts it calls (set by ``Replication``).
    lead: LeaderPart

    def __init__(self, shared: Part) -> None:
        super().__init__(shared)
        config = self.config
        # When this router's loop last came back from a pause long enough for the others to take
        # it for gone (``paused``): only a node heard since counts towards the majority.
        self._resumed_at = 0.0
        self.members = Members(os.path.join(self.log.directory, MEMBERS_FILE), config.node_id)
        # This router's lease from a majority of the nodes (docs/replication.md, "The lease"): it
        # ends a margin before the others may take this router for gone.
        self.lease = Lease(self.members, config.mesh_timeout - MARGIN_S)
        self.recount_at = float("inf")  # the lease's end as last counted: the majority is counted again then
        self._rule_since: float | None = self._started  # since when the majority rule (three members) is on
        if self.factor > 1:
            self.net.carry_lease(self.lease)
        self.cut_off = CutOffHolds(config.replica_timeout, self.clock)  # held while no majority is seen
        self.agreed: Any = None  # cluster.agreement.owners.SessionOwners, with --agreement
        self._agreed_once = False  # its member has had a majority since the start

    def check_paused(self) -> None:
        """See ``Mesh.check_paused``: for a persistent CONNECT, before ``in_minority``."""
        self.net.check_paused()

    def recount(self) -> None:
        """The lease ended, or was renewed, since the majority was counted (``recount_at``)."""
        self.count_majority()

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
            held = self.cut_off.release()
            if self._agreed_once:  # (the first majority after the start is no news)
                log.warning("cluster: this node's agreement member can commit again: QoS 1/2 acknowledgements go "
                            "on (%d held ones sent)", len(held))
            self._agreed_once = True
            self.lead.release(held)
            return
        log.error("cluster: this node's agreement member cannot commit (no majority of the cluster reachable): "
                  "QoS 1/2 publishes are not acknowledged and no session is taken in until it can")

        def still_cut_off() -> None:
            if not self.in_minority:
                return
            members = len(self.config.agreement_peer) + 1
            heard = {p.node_id for p in self.net.peers() if p.alive} | {self.config.node_id}
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
        if self.clock() - self._started < self.config.mesh_timeout + 1.0:
            return  # starting (its restore took the loop): the majority is not counted yet anyway
        self._resumed_at = self.clock()  # (the mesh then stamps every peer heard "now": not counted)
        if self.members.has_majority and self.factor > 1 and len(self.members.nodes) >= MIN_MEMBERS:
            log.warning("replication: this router's loop was paused for %.1f s, beyond what the other nodes "
                        "wait before taking it for gone; nothing more is acknowledged until they are heard "
                        "again", gap)
        self.count_majority()

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
        peer = self.net.peer(router_id)
        if peer is not None and peer.alive:
            return False
        return majority_says_gone(peer.node_id if peer is not None else router_id.rsplit("/", 1)[0],
                                  self.members.nodes, self.config.node_id,
                                  ((p.node_id, router_id in p.hears) for p in self.net.peers() if p.alive))

    def undecided(self) -> list[str]:
        """Routers of other nodes that are silent here but not gone for a majority (another node
        still hears them): one of them may be serving a session that nobody here was offered."""
        own = self.config.node_id
        return sorted(rid for rid, p in self.net.items()
                      if p.parked and p.node_id != own and not self.gone_for_majority(rid))

    def count_majority(self) -> None:
        if self.agreed is not None:
            # The agreement's member says whether this node has the majority. The members are
            # still the nodes met, for the rule on silent routers (``gone_for_majority``: a will
            # of a replica, a session served from one); met only while starting, a router whose
            # peers were heard a moment late kept one or two members for good, the rule off, and
            # took every silent router for gone, one that only its own node could not hear too.
            self.members.met({p.node_id for p in self.net.peers() if p.alive})
            return
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
        for peer in self.net.peers():
            known[peer.node_id] = known.get(peer.node_id, False) or peer.alive or peer.parked
            if peer.alive and peer.last_seen > resumed:
                live.add(peer.node_id)
        now = self.clock()
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
            held = self.cut_off.release()
            log.warning("cluster: this node sees a majority of the cluster again (%d of %d nodes): QoS 1/2 "
                        "acknowledgements go on (%d held ones sent)", backed, len(self.members.nodes),
                        len(held))
            self.lead.release(held)
        else:
            router = self.router
            moved = [c for cid, c in router.clients.items()
                     if (s := router.sessions.get(cid)) is not None and s.persistent and s.conn is c.conn]
            # The others stopped gracefully (each said GOODBYE): a cluster being shut down or
            # upgraded, not a fault; said as a warning, the rule is the same.
            stopped = {p.node_id for p in self.net.peers() if p.left}
            missing = self.members.nodes - live - {self.config.node_id}
            graceful = bool(missing) and missing <= stopped
            # Heard *now*: a peer that died is still "live" until its mesh timeout, which comes after
            # the lease's end; what tells it from a one-way cut is that its HELLOs stopped.
            recent = max(2 * self.net.hello_interval(), self.lease.period / 2)
            hearing = {p.node_id for p in self.net.peers()
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
