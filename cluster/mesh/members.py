"""Membership: HELLO and heartbeats, parking a silent peer, taking it back, forgetting it.

Every ``HELLO_INTERVAL_S`` this router says HELLO on every link, with the routers it knows (one
live ``--peer`` is enough to join), its confirmations of each peer's frames, its log's end and
marks, and its lease's beat. A peer silent for ``--mesh-timeout``, that said GOODBYE, or back as
a new incarnation is parked; heard again, it is taken back (``rejoin``); parked for
``--mesh-forget``, forgotten.

The decisions and the peers' membership state are the sans-IO core, ``membership.MembersCore``:
it takes the time and a frame's values and yields frames and effects. ``Members`` is its shell
(as uvicorn's ``h11_impl`` is h11's): it owns the clock, the heartbeat timer and the links, and
acts on each effect through one table (``_actions``): sending, logging, moving kept frames to a
link, telling the other parts (``Hooks``) and the replication.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, NamedTuple

import zmq

from brokerd.router.mesh_format import ECHO, HELLO

from . import delivery, effects, membership
from .forwarding import to_other_members
from .limits import HELLO_INTERVAL_S, log, park_skew
from .peer import Peer

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from brokerd.router.router import Router

    from ..config import Config
    from ..quorum import Lease
    from ..replication import Replication
    from .transport import Link, Transport


# An idle link (its HELLO the same as the last one sent there: no new frames, confirmations,
# log end, membership or lease beat) hears a HELLO this often instead of every ``HELLO_INTERVAL_S``:
# the routers of one node HELLO each other all to all, and on an idle node those HELLOs were most
# of its CPU (docs/benchmarks.md, "An idle node's CPU by its workers"). A silent peer is parked as
# soon as before (each router still checks every beat); a live one is heard at least every
# second, a third of the default --mesh-timeout.
_QUIET_HELLO_S = 1.0
# The core's effects that leave membership as it was: the others reset ``Members._said``.
_QUIET_KEEPS = frozenset({membership.Beat, membership.Echo, membership.Echoed})


class Hooks(NamedTuple):
    """What the other parts do when membership changes (the ``Mesh`` wires them): a peer
    ``joined`` (it gets our interest), is ``gone`` (silent, left or restarted: nothing waits for
    it, ``why``), ``restarted`` (its request numbers start again), or is ``back`` after a
    silence (``restarted``: as a new incarnation)."""

    joined: Callable[[Peer], None]
    gone: Callable[[str, str], None]
    restarted: Callable[[str], None]
    back: Callable[[Peer, bool], None]


class Members:
    """The ``Mesh``'s peers, owned: who is alive, parked or gone (``peers``, the one record of
    each that every part reads), the heartbeat and its clock of pauses, and the routers of this
    node a CONNECT waits for."""

    def __init__(self, config: Config, index: int, loop: asyncio.AbstractEventLoop, router: Router,
                 incarnation: int, peers: dict[str, Peer], transport: Transport, hooks: Hooks,
                 frame: Callable[[int, Any], bytes], send: Callable[[Peer, int, Any], None],
                 flush: Callable[[], None], keep: Callable[[Peer, bytes, int], None],
                 unconfirmed: Callable[[Peer, int, bytes], None],
                 start_replay: Callable[[Peer, int, str], None],
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self.config = config
        self._clock = clock  # the mesh's monotonic clock: a test's own moves the heartbeat's time
        self._wall = wall  # the mesh's Unix clock: when a peer fell silent, as the others are told
        self.index = index
        self.loop = loop
        self.router = router
        self.router_id = router.router_id
        self.node_id = config.node_id
        self.peers = peers
        self.transport = transport
        self.hooks = hooks
        self._frame = frame  # (framing) a frame of ours, packed
        self._send = send  # (framing) a frame to one peer
        self._flush = flush  # (forwarding) what this tick collected goes first
        self._keep = keep  # (forwarding) a frame kept for a parked peer
        self._unconfirmed = unconfirmed  # (forwarding) a numbered frame into a peer's ring
        self._start_replay = start_replay  # (forwarding) this router's log read back to a peer
        self.replication: Replication | None = None  # set with the ``Mesh``'s
        self.lease: Lease | None = None  # set by the replication: its beats go in each HELLO
        self.closed = False
        self._peer_stats: dict[str, list[int]] = {}
        # The other routers of this node (a CONNECT waits for them while they are down), and the
        # future that the next one to join again completes.
        self._local_ids = {f"{self.node_id}/w{j}" for j in range(config.workers)} - {self.router_id}
        self._local_joined: asyncio.Future | None = None
        self._timer: asyncio.TimerHandle | None = None
        # Per link endpoint: the last HELLO a beat sent there, and when (``_beat``). A link whose
        # HELLO would say the same again hears it every ``_quiet_gap`` instead of every beat; a
        # mesh timeout under 3 s keeps every beat (the gap is under two intervals).
        self._said: dict[str, tuple[bytes, float]] = {}
        self._quiet_gap = min(_QUIET_HELLO_S, config.mesh_timeout / 3)
        # The membership itself (who is alive, parked, forgotten; the heartbeat's clock): the
        # core decides, with the time given; this shell acts (``_actions``).
        self.core = membership.MembersCore(self.router_id, self.node_id, incarnation, peers, config.mesh_timeout,
                                           config.mesh_forget, self._clock())

    async def start(self) -> None:
        """Start the heartbeat, and serve only once the routers of this node know each other
        (bounded): a client that subscribes on one worker right after start must be reachable
        from every other."""
        self.heartbeat()
        deadline = self._clock() + 10.0
        while self._clock() < deadline:
            if not self.local_down():
                break
            await asyncio.sleep(0.02)
        else:
            log.warning("mesh: not every local router answered within 10 s; serving anyway")
            return
        if self.index == 0 and self._local_ids:  # the node's own routers, in one line (each pair: DEBUG)
            log.info("mesh: the %d routers of node %s joined each other", len(self._local_ids) + 1, self.node_id)

    def stop(self) -> None:
        """No more heartbeats."""
        if self._timer is not None:
            self._timer.cancel()

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

    def hears(self, router_id: str) -> bool:
        peer = self.peers.get(router_id)
        return peer is not None and peer.alive

    def silent_since(self, peer: Peer) -> float:
        """When ``peer`` fell silent, as a Unix time: a mesh timeout before it was parked here
        (now, if it is not parked)."""
        return membership.silent_since(peer, self._clock(), self._wall(), self.config.mesh_timeout)

    def just_parked(self) -> list[Peer]:
        """Routers of other nodes parked so recently that the other routers may not count them
        as gone yet."""
        return membership.just_parked(self.peers.values(), self.node_id, self._clock(), park_skew(self.config))

    async def gone(self, routers: set[str]) -> None:
        """Wait until ``routers`` count as gone (parked) here, at most one mesh timeout and a
        second, and until every router parked here counts as gone elsewhere too (``park_skew``)."""
        end = self._clock() + self.config.mesh_timeout + 1.0
        while self._clock() < end and not self.closed and any(
                self.peers[rid].alive for rid in routers if rid in self.peers):
            await asyncio.sleep(0.1)
        recent = self.just_parked()
        if recent:
            await asyncio.sleep(park_skew(self.config) - (self._clock() - min(p.parked_at for p in recent)))

    def local_down(self) -> set[str]:
        """The routers of this node that are not alive now."""
        return {rid for rid in self._local_ids if not (rid in self.peers and self.peers[rid].alive)}

    async def local_back(self, deadline: float) -> bool:
        """Wait until a router of this node joins again (True), or the deadline (False)."""
        left = deadline - self._clock()
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
        # Frames lost on the way (``delivery``): the numbers we sent each peer (from what it may
        # still get; up to the last, where all went out before this HELLO on its socket), and
        # those of its frames we miss, named with the incarnation that numbered them.
        sent = {p.router_id: [delivery.base(p), p.seq_out if p.alive and p.link is not None and not p.link.pending
                              and not p.backlog else -1] for p in self.peers.values() if p.seq_out}
        if sent:
            body["sent"] = sent
        missing = {p.router_id: [p.incarnation, delivery.missed(p)] for p in self.peers.values() if p.missing}
        if missing:
            body["missing"] = missing
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
            body["beat"] = self.lease.beat(self._clock())
        return body

    def _confirmable(self, peer: Peer) -> int:
        """The number up to which ``peer``'s PUBLISH frames can be confirmed (``delivery``): our
        log written up to its durable offset with --fsync always, else its written one."""
        if not peer.unwritten:
            return delivery.contiguous(peer)
        commit_log = self.router.commit_log
        assert commit_log is not None  # frames are unwritten only where the log is on (``_on_publish``)
        done = commit_log.durable_offset if self.config.fsync == "always" else commit_log.written_offset
        return delivery.confirmable(peer, done)

    def _send_hello(self, link: Link, frame: bytes | None = None) -> bool:
        try:
            link.sock.send(frame if frame is not None else self._frame(HELLO, self._hello_body()), zmq.NOBLOCK)
        except zmq.Again:
            return False  # a blocked or absent peer: the next heartbeat tries again
        return True

    # -- the core's transitions, and the shell's actions on its effects --------------------------

    def _act(self, yielded: Iterable[Any]) -> None:
        """Act on each effect the core yields, before it goes on (``membership.MembersCore``)."""
        actions = self._actions
        for effect in yielded:
            cls = effect.__class__
            if cls not in _QUIET_KEEPS:
                self._said.clear()  # membership moved: every link hears the next beat's HELLO
            actions[cls](self, effect)

    def on_hello(self, sender: str, inc: int, body: dict) -> None:
        self._act(self.core.hello(sender, inc, body, self._clock()))

    def on_echo(self, peer: Peer, body: Any, size: int) -> None:
        self._act(self.core.echo(peer, body))

    def on_goodbye(self, peer: Peer, body: Any, size: int) -> None:
        self._act(self.core.goodbye(peer, self._clock()))

    def park(self, peer: Peer, why: str) -> None:
        """``peer`` fell silent, left or restarted: nothing waits for it any more, its shared-group
        presence goes, and what it would be sent is kept (bounded) until it is heard again."""
        self._act(self.core.park(peer, why, self._clock()))

    def rejoin(self, peer: Peer, why: str) -> None:
        """A parked (or forgotten) peer is heard again: the frames kept for it first, then
        interest both ways, each side's a full announcement."""
        self._act(self.core.rejoin(peer, why, self._clock()))

    def heartbeat(self) -> None:
        self._act(self.core.heartbeat(self._clock()))

    def check_paused(self) -> None:
        """If the heartbeat is a mesh timeout late (this process was paused), run it now, and
        count the majority again if this router's lease ended since it was counted, before what
        waited is acted on (frames read, acknowledgements, a persistent CONNECT), which the
        event loop may otherwise run first."""
        if self.core.late(self._clock()) and self._timer is not None and not self.closed:
            self._timer.cancel()
            self.heartbeat()
        if self.replication is not None and self._clock() >= self.replication.recount_at:
            self._replication_hook(self.replication.recount)  # its lease ended (or was renewed)

    @property
    def pause_deadline(self) -> float:
        """When, on the monotonic clock, a heartbeat not run yet means this process was paused."""
        return self.core.pause_deadline

    @pause_deadline.setter
    def pause_deadline(self, deadline: float) -> None:
        self.core.pause_deadline = deadline

    def _frame_out(self, effect: effects.Frame) -> None:
        self._send(effect.peer, effect.kind, effect.body)

    def _echo(self, effect: membership.Echo) -> None:
        assert effect.peer.link is not None  # (the core echoes only on a link)
        try:
            effect.peer.link.sock.send(self._frame(ECHO, effect.body), zmq.NOBLOCK)
        except zmq.Again:
            pass  # a blocked link: the next beat is echoed instead

    def _send_again(self, effect: membership.SendAgain) -> None:
        peer = effect.peer
        if peer.link is None:
            return
        log.info("mesh: %d frame(s) router %s missed (lost on the way) are sent again", len(effect.frames),
                 peer.router_id)
        for frame in effect.frames:
            peer.link.send(frame)

    def _greet(self, effect: membership.Greet) -> None:
        self._send_hello(self.transport.link(effect.endpoint))

    def _met(self, effect: membership.Met) -> None:
        self._peer_stats[effect.peer.router_id] = effect.peer.stats

    def _reach(self, effect: membership.Reach) -> None:
        effect.peer.link = self.transport.link(effect.endpoint)

    def _unreachable(self, effect: membership.Unreachable) -> None:
        log.warning("mesh: router %s of node %s has no --mesh address; cannot reach it", effect.peer.router_id,
                    effect.peer.node_id)

    def _flush_now(self, effect: effects.Flush) -> None:
        self._flush()

    def _parked(self, effect: membership.Parked) -> None:
        """What the rest of the router does as ``peer`` is parked: its backlog starts, the
        router drops its shared-group presence, what its link held is kept, nothing waits for it."""
        peer, why = effect
        delivery.parked(peer, self.router.commit_log.next_offset if self.router.commit_log is not None else None)
        log.warning("mesh: router %s %s; keeping its interest and up to %d bytes of frames for it for "
                    "%g s", peer.router_id, why, self.config.mesh_backlog, self.config.mesh_forget)
        self.router.peer_silent(peer.router_id)
        if peer.link is not None:
            for frame in peer.link.park():
                self._keep(peer, frame, 0)
            self.transport.unblock(peer.link)
        self.hooks.gone(peer.router_id, why)
        if self.replication is not None and why.startswith("silent"):
            # Fell silent (it may be dead): its replica has what it acknowledged. One that said
            # goodbye sent everything first; one that restarted reads its own log back (CATCHUP).
            self._replication_hook(self.replication.parked, peer)

    def _restarted(self, effect: membership.Restarted) -> None:
        peer = effect.peer
        assert peer.link is not None  # (reached before its incarnation is compared)
        peer.link.reset()
        # Its request numbers start again: what was in doubt with the old one, and what we
        # confirmed to it, cannot be told from the new one's.
        self.hooks.restarted(peer.router_id)
        # Its frames are numbered anew; what its old incarnation never confirmed goes to the new
        # one first.
        delivery.new_incarnation(peer)

    def _returning(self, effect: membership.Returning) -> None:
        """The frames kept for a peer taken back go to its link: unconfirmed frames of a crashed
        incarnation first, then what was kept meanwhile."""
        peer, why, was_parked = effect
        backlog, kept, msgs, dropped = delivery.take_backlog(peer)
        if was_parked:
            log.info("mesh: router %s is back (%s) after %.1f s: %d kept frame(s) of %d bytes (%d "
                     "message(s)) go to it%s", peer.router_id, why, self._clock() - peer.parked_at,
                     len(backlog), kept, msgs, f"; {dropped} were dropped (backlog full)" if dropped else "")
        resend, peer.resend = peer.resend, []
        if peer.link is None or not (resend or backlog):
            return
        # Straight into the link's queue (not ``send``: nothing is dropped for its length).
        if resend:
            log.info("mesh: %d frame(s) router %s had not confirmed before it restarted are sent "
                     "again", len(resend), peer.router_id)
        peer.link.pending.extend(resend)
        for seq, frame in backlog:
            if seq:
                # Unconfirmed until the peer's HELLO says its log wrote their copies, like any
                # frame sent: should it crash first, its next incarnation gets them again. (Sent
                # without, a node killed just after its silence ended lost what was kept for it
                # meanwhile: partition seed 3.)
                self._unconfirmed(peer, seq, frame)
            peer.link.pending.append(frame)
        self.transport.blocked(peer.link)

    def _joined(self, effect: membership.Joined) -> None:
        """A router (re)appeared: greet it, tell it our interest (``Hooks.joined``)."""
        peer, first, quiet = effect
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
        self.hooks.joined(peer)
        if self.replication is not None:
            self.replication.rejoined(peer)

    def _back(self, effect: membership.Back) -> None:
        peer, restarted, was_parked, silent_for = effect
        self.hooks.back(peer, restarted)
        if was_parked and not restarted and self.replication is not None:
            # (A restarted router's own catch-up reads its log back by our interest as it is now.)
            self._replication_hook(self.replication.moved_in_catchup, peer, self._wall() - silent_for)

    def _replay(self, effect: membership.Replay) -> None:
        self._start_replay(effect.peer, effect.offset, "its backlog here was full")

    def _forgotten(self, effect: membership.Forgotten) -> None:
        """Parked for ``--mesh-forget`` seconds: drop its interest and what was kept for it; the
        shared groups' copies it never confirmed go to other members (``delivery.group_copies``)."""
        peer = effect.peer
        kept, _, lost, dropped = delivery.take_backlog(peer)
        copies = delivery.group_copies(peer, kept, self.router_id, self._frame)
        self.router.stats.drop_mesh_peer_gone += lost
        log.warning("mesh: router %s silent for %g s: forgotten, %d kept message(s) dropped", peer.router_id,
                    self.config.mesh_forget, lost + dropped)
        if peer.replay_from is not None:
            log.warning("mesh: router %s forgotten: the messages for it in this router's log from offset "
                        "%d on are not sent", peer.router_id, peer.replay_from)
            peer.replay_from = None
        self.router.peer_left(peer.router_id)
        # The shared groups' copies chosen for it that it never confirmed: to another member each.
        to_other_members(self.router, copies, peer.router_id)
        if peer.link is not None:
            peer.link.reset()

    def _our_pause(self, effect: membership.OurPause) -> None:
        gap, late = effect
        if gap >= self.core.pause_after and self.replication is not None:
            # The others may have taken this router for gone meanwhile (and its sessions over):
            # it counts no node as heard until one speaks again (``Replication.paused``).
            self._replication_hook(self.replication.paused, gap)
        if late is not None:
            # The silence was ours (``membership.paused_ours``): every peer gets a fresh timeout
            # to be heard instead of being parked.
            log.warning("mesh: this router's loop was paused for %.1f s; giving peers %g s to be heard",
                        late, self.config.mesh_timeout)

    def _echoed(self, effect: membership.Echoed) -> None:
        if self.lease is not None:
            self.lease.echoed(effect.peer.node_id, effect.epoch, effect.n, effect.peer.last_seen)

    def _beat(self, effect: membership.Beat) -> None:
        """The heartbeat's own work: followers placed on the live nodes, HELLO on every link."""
        if self.replication is not None:
            self._replication_hook(self.replication.heartbeat)
        transport = self.transport
        if transport.links:
            # One HELLO for every link (it names no link), and none on a link whose last one said
            # the same less than ``_quiet_gap`` ago (``_QUIET_HELLO_S``).
            frame = self._frame(HELLO, self._hello_body())
            now = self._clock()
            said = self._said
            skip_below = self._quiet_gap - HELLO_INTERVAL_S / 2
            for endpoint, link in transport.links.items():
                last = said.get(endpoint)
                if last is not None and last[0] == frame and now - last[1] < skip_below:
                    continue
                if self._send_hello(link, frame):
                    said[endpoint] = (frame, now)
        if transport.monitors:
            transport.poll_monitors()
        self._timer = self.loop.call_later(HELLO_INTERVAL_S, self.heartbeat)

    # effect -> its action (the core's effects, ``membership``)
    _actions: dict[type, Callable[[Members, Any], None]] = {
        effects.Frame: _frame_out, membership.Echo: _echo, membership.Greet: _greet, membership.Met: _met,
        membership.Reach: _reach, membership.Unreachable: _unreachable, effects.Flush: _flush_now,
        membership.Parked: _parked, membership.Restarted: _restarted, membership.Returning: _returning,
        membership.Joined: _joined, membership.Back: _back, membership.Replay: _replay,
        membership.Forgotten: _forgotten, membership.OurPause: _our_pause, membership.Echoed: _echoed,
        membership.Beat: _beat, membership.SendAgain: _send_again,
    }
