"""Membership: HELLO and heartbeats, parking a silent peer, taking it back, forgetting it.

Every ``HELLO_INTERVAL_S`` this router says HELLO on every link, with the routers it knows (one
live ``--peer`` is enough to join), its confirmations of each peer's frames, its log's end and
marks, and its lease's beat. A peer silent for ``--mesh-timeout``, that said GOODBYE, or back as
a new incarnation is parked; heard again, it is taken back (``_rejoin``); parked for
``--mesh-forget``, forgotten. The timing rules are ``membership``; this part acts on them.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import zmq

from brokerd.router.mesh_format import CATCHUP, ECHO, HELLO, RESYNC, SYNC_REQ

from . import delivery, membership
from .limits import HELLO_INTERVAL_S, SYNC_WINDOW_S, log, park_skew
from .peer import Peer

if TYPE_CHECKING:
    from brokerd.router.router import Router

    from ..config import Config
    from ..quorum import Lease
    from ..replication import Replication
    from .handon import Handons
    from .interest import Interest
    from .takeover import Takeovers
    from .transfer import Transfers
    from .transport import Link, Transport
    from .waiter import Requests


class MembersMixin:
    """The ``Mesh``'s peers: who is alive, parked or gone."""

    config: Config
    index: int
    loop: asyncio.AbstractEventLoop
    router: Router
    router_id: str
    node_id: str
    incarnation: int
    peers: dict[str, Peer]
    transport: Transport
    closed: bool
    replication: Replication | None
    lease: Lease | None
    pause_deadline: float
    requests: Requests
    interest: Interest
    _peer_stats: dict[str, list[int]]
    _local_ids: set[str]
    _local_joined: asyncio.Future | None
    _started: float
    _last_beat: float
    _pause_after: float
    _timer: asyncio.TimerHandle | None
    takeovers: Takeovers
    transfers: Transfers
    handons: Handons

    if TYPE_CHECKING:  # the other parts' methods this one calls (the ``Mesh`` is their union)
        def _frame(self, kind: int, body: Any) -> bytes: ...
        def _send(self, peer: Peer, kind: int, body: Any) -> None: ...
        def _flush(self) -> None: ...
        def _keep(self, peer: Peer, frame: bytes, n: int, seq: int = 0) -> None: ...
        def _unconfirmed(self, peer: Peer, seq: int, frame: bytes) -> None: ...
        def _start_replay(self, peer: Peer, offset: int, why: str) -> None: ...

    def _replication_hook(self, hook: Any, *args: Any) -> None:
        """Call replication from the mesh's own callbacks: its failure is logged, and the mesh
        (heartbeats, parking) goes on."""
        try:
            hook(*args)
        except Exception:  # noqa: BLE001 - the heartbeat must be rescheduled whatever happens
            log.exception("replication: %s failed", getattr(hook, "__name__", hook))

    def peer_stats(self) -> dict[str, list[int]]:
        return dict(self._peer_stats)

    def peer_stats_endpoints(self) -> dict[str, str]:
        return {rid: p.stats_tcp for rid, p in self.peers.items() if p.stats_tcp and (p.alive or p.parked)}

    def _alive(self) -> set[str]:
        """The ids of the peers that count as alive now."""
        return membership.alive(self.peers)

    def hears(self, router_id: str) -> bool:
        peer = self.peers.get(router_id)
        return peer is not None and peer.alive

    def silent_since(self, peer: Peer) -> float:
        """When ``peer`` fell silent, as a Unix time: a mesh timeout before it was parked here
        (now, if it is not parked)."""
        return membership.silent_since(peer, time.monotonic(), time.time(), self.config.mesh_timeout)

    def _just_parked(self) -> list[Peer]:
        """Routers of other nodes parked so recently that the other routers may not count them
        as gone yet."""
        return membership.just_parked(self.peers.values(), self.node_id, time.monotonic(), park_skew(self.config))

    async def _gone(self, routers: set[str]) -> None:
        """Wait until ``routers`` count as gone (parked) here, at most one mesh timeout and a
        second, and until every router parked here counts as gone elsewhere too (``park_skew``)."""
        end = time.monotonic() + self.config.mesh_timeout + 1.0
        while time.monotonic() < end and not self.closed and any(
                self.peers[rid].alive for rid in routers if rid in self.peers):
            await asyncio.sleep(0.1)
        recent = self._just_parked()
        if recent:
            await asyncio.sleep(park_skew(self.config) - (time.monotonic() - min(p.parked_at for p in recent)))

    def _local_down(self) -> set[str]:
        """The routers of this node that are not alive now."""
        return {rid for rid in self._local_ids if not (rid in self.peers and self.peers[rid].alive)}

    async def _local_back(self, deadline: float) -> bool:
        """Wait until a router of this node joins again (True), or the deadline (False)."""
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if self._local_joined is None or self._local_joined.done():
            self._local_joined = self.loop.create_future()
        try:
            await asyncio.wait_for(asyncio.shield(self._local_joined), left)
        except TimeoutError:
            return False
        return True

    def _hello_body(self) -> dict:
        known = [[p.router_id, p.node_id, p.ipc, p.tcp] for p in self.peers.values() if p.alive]
        # Each confirmation names the incarnation whose frames it counts: a HELLO queued for a
        # peer that restarted meanwhile must not confirm its new incarnation's frames.
        acks = {p.router_id: [p.incarnation, self._confirmable(p)] for p in self.peers.values() if p.seq_in}
        commit_log = self.router.commit_log
        transport = self.transport
        body: dict[str, Any] = {
            "node": self.node_id, "ipc": transport.ipc, "tcp": transport.tcp, "peers": known, "acks": acks,
            "stats": transport.stats_tcp, "log": commit_log.next_offset if commit_log is not None else -1}
        if commit_log is not None:
            # To each peer with nothing of ours on its way (nothing collected, waiting in the link,
            # kept, or being read back), and whose interest we know: every message of this log so
            # far that its interest matched has been sent, before this HELLO on the same socket.
            end = commit_log.next_offset
            marks = {p.router_id: end for p in self.peers.values()
                     if p.alive and p.interest_known and not p.batch and not p.backlog and not p.replaying
                     and p.link is not None and not p.link.pending}
            if marks:
                body["marks"] = marks
        # How far we have seen each peer's log: a peer that comes back with an empty disk
        # continues its offsets beyond, so no offset ever names two messages.
        seen = {p.router_id: p.origin_mark for p in self.peers.values() if p.origin_mark >= 0}
        if seen:
            body["seen"] = seen
        if self.replication is not None and self.replication.replicas:
            body["replicas"] = self.replication.hello()
        if self.lease is not None:
            body["beat"] = self.lease.beat(time.monotonic())
        return body

    def _confirmable(self, peer: Peer) -> int:
        """The number up to which ``peer``'s PUBLISH frames can be confirmed (``delivery``): our
        log written up to its durable offset with --fsync always, else its written one."""
        if not peer.unwritten:
            return peer.seq_in
        commit_log = self.router.commit_log
        assert commit_log is not None  # frames are unwritten only where the log is on (``_on_publish``)
        done = commit_log.durable_offset if self.config.fsync == "always" else commit_log.written_offset
        return delivery.confirmable(peer, done)

    def _on_hello(self, sender: str, inc: int, body: dict) -> None:
        if sender == self.router_id:
            return
        peer = self.peers.get(sender)
        if peer is None:
            peer = Peer(sender, body["node"], body.get("ipc"), body.get("tcp"))
            self.peers[sender] = peer
            self._peer_stats[sender] = peer.stats
        peer.ipc, peer.tcp = body.get("ipc"), body.get("tcp")
        peer.stats_tcp = body.get("stats")
        peer.replicas = body.get("replicas", {})
        if peer.link is None:
            endpoint = peer.ipc if peer.node_id == self.node_id else peer.tcp
            if endpoint is None:
                log.warning("mesh: router %s of node %s has no --mesh address; cannot reach it", sender,
                            peer.node_id)
                return
            peer.link = self.transport.link(endpoint)
        peer.last_seen = time.monotonic()
        catchup = -1
        if peer.incarnation != inc:
            peer.claim_floor = body.get("log", -1)
            peer.interest_known = False
            if peer.incarnation is None:
                if peer.origin_mark < 0:  # first met: what it logged before is not ours to ask
                    peer.origin_mark = body.get("log", -1)
            else:
                # It crashed and came back: ask it (after our interest, below) for what it
                # acknowledged since our mark and never sent, or from where its log is now if it
                # came back with less (a lost disk).
                catchup = membership.catchup_from(peer.origin_mark, body.get("log", -1))
                # What its old incarnation had not read is lost with it; what was kept for it
                # while it was silent goes to the new one, whose restored sessions want it.
                self._park(peer, "restarted")
                peer.link.reset()
                # Its request numbers start again: what was in doubt with the old one, and what
                # we confirmed to it, cannot be told from the new one's.
                self.transfers.peer_restarted(sender)
                self.takeovers.forget_confirmed(sender)
                # Its frames are numbered anew; what its old incarnation never confirmed goes to
                # the new one first.
                delivery.new_incarnation(peer)
            peer.incarnation = inc
            if peer.parked:
                self._rejoin(peer, "restarted")
            else:
                self._joined(peer)
            if catchup >= 0:
                peer.origin_mark = catchup  # raised again by its frames as it reads back
                self._send(peer, CATCHUP, catchup)
        elif not peer.alive:
            self._rejoin(peer, "heard again")
        acked = body.get("acks", {}).get(self.router_id)
        if acked is not None and acked[0] == self.incarnation:
            delivery.confirmed(peer, acked[1])
        peer.seen_of_me = body.get("seen", {}).get(self.router_id, -1)
        peer.hears = frozenset(p[0] for p in body.get("peers", ()))
        beat = body.get("beat")
        if beat is not None:
            self._echo(peer, inc, beat)
        peer.origin_mark = membership.claimed_mark(peer, body.get("marks", {}).get(self.router_id))
        for rid, node, ipc, tcp in body.get("peers", ()):
            if rid != self.router_id and rid not in self.peers:
                endpoint = ipc if node == self.node_id else tcp
                if endpoint:
                    self._send_hello(self.transport.link(endpoint))

    def _echo(self, peer: Peer, inc: int, beat: list[int]) -> None:
        """Answer a peer's beat at once (its lease, ``cluster.quorum.Lease``), where
        ``membership.echo_allowed`` allows it."""
        peer.beat_epoch = beat[0]
        if peer.link is None or not membership.echo_allowed(peer, inc, beat[0], time.monotonic(), self._started,
                                                            self.config.mesh_timeout):
            return
        try:
            peer.link.sock.send(self._frame(ECHO, [inc, beat[0], beat[1]]), zmq.NOBLOCK)
        except zmq.Again:
            pass  # a blocked link: the next beat is echoed instead

    def _joined(self, peer: Peer, quiet: bool = False) -> None:
        """A router (re)appeared: greet it, tell it our interest, fetch retained messages once."""
        first = not any(p.alive for p in self.peers.values() if p.node_id == peer.node_id)
        if not peer.alive:
            peer.since = time.monotonic()
        peer.alive = True
        peer.left = False
        if peer.node_id == self.node_id and self._local_joined is not None and not self._local_joined.done():
            self._local_joined.set_result(None)  # CONNECTs waiting for a router of this node go on
        if not quiet:
            # One INFO line per node that joins, from router 0 of this node; each router pair: DEBUG.
            where = peer.link.endpoint if peer.link else "?"
            log.debug("mesh: router %s joined (%s)", peer.router_id, where)
            if first and self.index == 0 and peer.node_id != self.node_id:
                log.info("mesh: node %s joined (first router %s at %s)", peer.node_id, peer.router_id, where)
        assert peer.link is not None
        self._send_hello(peer.link)
        self.interest.announce_all(peer)
        if self.replication is not None:
            self.replication.rejoined(peer)
        if time.monotonic() - self._started < SYNC_WINDOW_S:
            # Starting up: merge the retained set of every router we meet (newest version of a
            # topic wins), so a retained update that only reached some routers before a crash of
            # the whole node comes back from any one of them.
            self._send(peer, SYNC_REQ, None)

    def _park(self, peer: Peer, why: str) -> None:
        """``peer`` fell silent, left or restarted: nothing waits for it any more, its shared-group
        presence goes, and what it would be sent is kept (bounded) until it is heard again."""
        if not peer.alive:
            return
        self._flush()  # what this tick collected for it goes first, into its backlog
        peer.alive = False
        peer.parked = True
        peer.parked_at = time.monotonic()
        if peer.incarnation is not None:
            peer.fence = (peer.incarnation, peer.beat_epoch)  # its lease gets no echo of ours now
        delivery.parked(peer, self.router.commit_log.next_offset if self.router.commit_log is not None else None)
        log.warning("mesh: router %s %s; keeping its interest and up to %d bytes of frames for it for "
                    "%g s", peer.router_id, why, self.config.mesh_backlog, self.config.mesh_forget)
        self.router.peer_silent(peer.router_id)
        if peer.link is not None:
            for frame in peer.link.park():
                self._keep(peer, frame, 0)
            self.transport.unblock(peer.link)
        self.transfers.peer_gone(peer.router_id, why)  # a session it takes stays here
        self.handons.peer_gone(peer.router_id)
        self.requests.peer_gone(peer.router_id)
        self.interest.peer_gone(peer.router_id)
        if self.replication is not None and why.startswith("silent"):
            # Fell silent (it may be dead): its replica has what it acknowledged. One that said
            # goodbye sent everything first; one that restarted reads its own log back (CATCHUP).
            self._replication_hook(self.replication.parked, peer)

    def _rejoin(self, peer: Peer, why: str) -> None:
        """A parked (or forgotten) peer is heard again: the frames kept for it first, then
        interest both ways, each side's a full announcement."""
        was_parked = peer.parked
        # When its silence began: taken while it still counts as parked (after, it reads as now).
        silent_since = self.silent_since(peer)
        peer.parked = False
        backlog, kept, msgs, dropped = delivery.take_backlog(peer)
        if was_parked:
            log.info("mesh: router %s is back (%s) after %.1f s: %d kept frame(s) of %d bytes (%d "
                     "message(s)) go to it%s", peer.router_id, why, time.monotonic() - peer.parked_at,
                     len(backlog), kept, msgs, f"; {dropped} were dropped (backlog full)" if dropped else "")
        resend, peer.resend = peer.resend, []
        if peer.link is None:
            return
        if resend or backlog:
            # Straight into the link's queue (not ``send``: nothing is dropped for its length):
            # unconfirmed frames of a crashed incarnation first, then what was kept meanwhile.
            if resend:
                log.info("mesh: %d frame(s) router %s had not confirmed before it restarted are sent "
                         "again", len(resend), peer.router_id)
            peer.link.pending.extend(resend)
            for seq, frame in backlog:
                if seq:
                    # Unconfirmed until the peer's HELLO says its log wrote their copies, like
                    # any frame sent: should it crash first, its next incarnation gets them again.
                    # (Sent without, a node killed just after its silence ended lost what was
                    # kept for it meanwhile: partition seed 3.)
                    self._unconfirmed(peer, seq, frame)
                peer.link.pending.append(frame)
            self.transport.blocked(peer.link)
        replay_from, peer.replay_from = peer.replay_from, None
        self._joined(peer, quiet=was_parked)
        self.handons.peer_back(peer.router_id)
        if why != "restarted":
            self.takeovers.confirm_again(peer)
        if was_parked and why != "restarted" and self.replication is not None:
            # (A restarted router's own catch-up reads its log back by our interest as it is now.)
            self._replication_hook(self.replication.moved_in_catchup, peer, silent_since)
        self._send(peer, RESYNC, None)
        if replay_from is not None:
            self._start_replay(peer, replay_from, "its backlog here was full")

    def _forget(self, peer: Peer) -> None:
        """Parked for ``--mesh-forget`` seconds: drop its interest and what was kept for it."""
        peer.parked = False
        _, _, lost, dropped = delivery.take_backlog(peer)
        self.router.stats.drop_mesh_peer_gone += lost
        log.warning("mesh: router %s silent for %g s: forgotten, %d kept message(s) dropped", peer.router_id,
                    self.config.mesh_forget, lost + dropped)
        if peer.replay_from is not None:
            log.warning("mesh: router %s forgotten: the messages for it in this router's log from offset "
                        "%d on are not sent", peer.router_id, peer.replay_from)
            peer.replay_from = None
        self.router.peer_left(peer.router_id)
        if peer.link is not None:
            peer.link.reset()

    def _send_hello(self, link: Link) -> None:
        try:
            link.sock.send(self._frame(HELLO, self._hello_body()), zmq.NOBLOCK)
        except zmq.Again:
            pass  # a blocked or absent peer: the next heartbeat tries again

    def check_paused(self) -> None:
        """If the heartbeat is a mesh timeout late (this process was paused), run it now, and
        count the majority again if this router's lease ended since it was counted, before what
        waited is acted on (frames read, acknowledgements, a persistent CONNECT), which the
        event loop may otherwise run first."""
        if time.monotonic() >= self.pause_deadline and self._timer is not None and not self.closed:
            self._timer.cancel()
            self._heartbeat()
        if self.replication is not None and time.monotonic() >= self.replication.recount_at:
            self._replication_hook(self.replication.recount)  # its lease ended (or was renewed)

    def _heartbeat(self) -> None:
        now = time.monotonic()
        timeout = self.config.mesh_timeout
        gap = now - self._last_beat  # since our last HELLO went out
        self._last_beat = now
        self.pause_deadline = now + self._pause_after
        if gap >= self._pause_after and self.replication is not None:
            # The others may have taken this router for gone meanwhile (and its sessions over):
            # it counts no node as heard until one speaks again (``Replication.paused``).
            self._replication_hook(self.replication.paused, gap)
        late = membership.paused_ours(gap, HELLO_INTERVAL_S, timeout)
        if late is not None:
            # The silence was ours (``membership.paused_ours``): give every peer a fresh timeout to
            # be heard instead of parking them all.
            log.warning("mesh: this router's loop was paused for %.1f s; giving peers %g s to be heard",
                        late, timeout)
            for peer in self.peers.values():
                peer.last_seen = max(peer.last_seen, now)
        for peer in list(self.peers.values()):
            step = membership.due(peer, now, timeout, self.config.mesh_forget)
            if step is membership.PARK:
                self._park(peer, f"silent for {timeout:g} s")
            elif step is membership.FORGET:
                self._forget(peer)
        if self.replication is not None:
            self._replication_hook(self.replication.heartbeat)  # followers placed on the live nodes
        transport = self.transport
        for link in transport.links.values():
            self._send_hello(link)
        if transport.monitors:
            transport.poll_monitors()
        self._timer = self.loop.call_later(HELLO_INTERVAL_S, self._heartbeat)

    # -- frames received ------------------------------------------------------------------------

    def _on_echo(self, peer: Peer, body: Any, size: int) -> None:
        if body[0] == self.incarnation and self.lease is not None:
            self.lease.echoed(peer.node_id, body[1], body[2], peer.last_seen)

    def _on_goodbye(self, peer: Peer, body: Any, size: int) -> None:
        self._park(peer, "said goodbye")
        peer.left = True
