"""The mesh between routers: ZeroMQ PUSH/PULL, msgpack frames, batched per loop iteration.

Every router binds one PULL socket: ipc:// in the node's run directory for the routers of the same
node, and also tcp://HOST:PORT+i when the node has ``--mesh HOST:PORT``. It holds one PUSH socket
per peer router. Everything a router says to a peer travels on that one PUSH socket, so frames
between two routers arrive in the order they were sent.

Frames are msgpack lists ``[MESH_VERSION, kind, sender_router_id, sender_incarnation, body]``; a
frame of another version is refused with a log line naming the sender. Publishes for one peer
collected during one loop iteration travel as one frame (fewer than ``LINGER_BELOW`` in all wait
one more iteration, once, to fill the frame). A message in it is ``mesh_format.to_mesh(msg)`` (5 values
for a plain QoS 0 message, or a plain QoS 1/2 one with its MQTT 3.1.1 head; 9 otherwise), or that
plus a last element naming the shared subscriptions the receiver was chosen for (6 or 10 values):
a list, or ``{"only": list}`` for a message handed on from a member whose session ended, which is
for those groups alone.

Membership is gossip: every router says HELLO to every link twice a second with the routers it
knows; a HELLO with an unknown router makes us link to it, so one live ``--peer`` is enough to join.

A router silent for ``--mesh-timeout`` seconds (stopped, paused by a slow disk or a VM migration,
partitioned, crashed), that said GOODBYE, or that came back with a new incarnation, is *parked*:
requests stop waiting for it and its shared-group presence goes (groups' messages go to members
that can take them), but its filter interest stays, and the frames it would have been sent are
kept, up to ``--mesh-backlog`` bytes. Beyond that, with the commit log on, nothing more is kept:
the offset from which this router's own log holds the rest is noted, and when the peer returns
those records are read back and forwarded again by its interest (the log is the backlog's
overflow). With the log off, what is beyond is dropped, counted as ``mesh_peer_gone`` and logged.
The moment it is heard again (any frame of the same incarnation, or a HELLO of a new one) it is
taken back: the kept frames go first, then both sides send all their interest again, each a full
announcement that replaces the last (``reset``), asked for with RESYNC. A router parked for
``--mesh-forget`` seconds is forgotten, its backlog dropped and counted. A router whose own loop
was paused does not blame its peers for the silence it did not hear: it gives them a fresh
timeout.

PUBLISH frames are numbered per peer (and, in the same series, every frame of the other kinds
whose loss nothing else repairs: ``mesh_format.NUMBERED``), and every HELLO says up to which number it has received
each peer's frames and its log has written the copies it made of them (durable with --fsync
always). Until then a frame stays in the sender's ring of unconfirmed frames (bounded
by ``--mesh-backlog`` bytes too; a frame kept for a silent peer enters it when it is sent at
last): when a peer comes back as a new incarnation (a worker or node
that crashed and restarted), what its old incarnation never confirmed is sent again, before what
was kept while it was silent, so the sessions it restored from its disk get what other routers
acknowledged to their publishers in the moment before the crash was noticed. A receiver drops a
frame whose number it has already seen.

Every frame is checked (``router.mesh_format``) before it is acted on; a bad one is dropped,
counted (``mesh_bad_frames``) and logged once per sender. The PULL sockets refuse frames larger
than ``mesh_format.max_frame``; publish batches are split well below it.

Consistency points:
- SUBACK waits (bounded) until every live peer has acknowledged a new interest, so a publish on any
  router after the SUBACK reaches the new subscriber.
- A CONNECT waits (bounded) until every live peer has answered a takeover request, so an existing
  session anywhere in the cluster is moved, not duplicated. The old owner answers with the
  session's header (on the same node its offline backlog as positions in the logs) and streams its
  queued copies in chunks, one per loop iteration (heartbeats flow meanwhile); it keeps the
  session until the new owner says TAKEOVER_DONE, and keeps it for good if the transfer fails
  (the new owner gave up after ``ACK_TIMEOUT_S`` without progress, or either side fell silent):
  the CONNECT is then refused (server unavailable) and the session stays in one place.
- Backpressure: a peer whose PUSH socket is at its high-water mark gets no more frames; the frames
  wait in a list and the client connections whose publishes are waiting stop being read until the
  peer drains. Local delivery and other peers carry on.

The package, one part a module. The ``Mesh`` holds the transport and the parts, each of which
owns its state and reaches the others only through what the ``Mesh`` hands it (a reference to a
part, a callback); the pure rules take values and time in and are tested without sockets:
- ``transport`` (the one part that owns sockets: CURVE, monitors, backpressure);
- the publish path, still the ``Mesh``'s own methods so that a message costs no hop more:
  ``framing`` (packing frames; the formats are ``router.mesh_format``), ``dispatch`` (reading and
  checking a frame, the one table of handlers by kind and the part that has each), ``forwarding``
  (publishes out and in, replay from the log) and ``delivery`` (rules: numbering, the ring, the
  backlog);
- ``members`` (``Members``: the peers, HELLO, heartbeat, park, rejoin, forget; what the others do
  as a peer comes and goes is its ``Hooks``), the shell of ``membership`` (the rules: parking,
  forgetting, echoing, pauses; and ``MembersCore``, the sans-IO core: time and frames in, frames
  and effects out);
- ``waiter`` (``Requests``: the numbered requests every live peer answers), ``interest``
  (``Interest``: announcements and barriers), the shell of ``announcements`` (``InterestCore``,
  the sans-IO core: frames in, frames and effects out); ``effects`` holds what every core
  yields alike (a frame to a peer, a flush);
- sessions moving: ``takeover`` (``Takeovers``: asking, settling, confirming) and ``offer``
  (rules: which copy is taken), ``transfer`` (``Transfers``: a session leaving and arriving),
  ``handon`` (``Handons``: what reaches the old owner after the move) and ``marks`` (rules: which
  handed-on copies came directly);
- ``peer`` (the one record of a peer every part reads), ``limits``.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import TYPE_CHECKING, Any

import msgpack
import zmq

from brokerd.router.mesh_format import GOODBYE, MESH_VERSION, PUBLISH, max_frame

from . import dispatch
from .dispatch import DispatchMixin
from .forwarding import ForwardingMixin
from .framing import FramingMixin
from .handon import Handons
from .interest import Interest
from .limits import HELLO_INTERVAL_S, LOCAL_DOWN_WAIT_S, park_skew
from .members import Hooks, Members
from .peer import Peer
from .takeover import Roster, Takeovers
from .transfer import Transfers
from .transport import Transport
from .waiter import Requests

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from brokerd.connection.batching import EndOfTick
    from brokerd.router.router import Router

    from ..config import Config
    from ..quorum import Lease
    from ..replication import Replication

__all__ = ["HELLO_INTERVAL_S", "LOCAL_DOWN_WAIT_S", "MESH_VERSION", "PUBLISH", "Mesh", "Peer", "park_skew"]


class Mesh(FramingMixin, DispatchMixin, ForwardingMixin):
    """Implements ``router.ports.MeshPort`` for one router: it holds the ``Transport`` (its
    sockets) and the parts that own their state (``members``, ``requests``, ``interest``,
    ``takeovers``, ``transfers``, ``handons``), wired here to each other by narrow references
    and callbacks. Framing, dispatch and forwarding, the publish path, stay its own: one
    object's attributes, no hop more per message."""

    def __init__(self, config: Config, index: int, router: Router, loop: asyncio.AbstractEventLoop,
                 end_of_tick: EndOfTick, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        """``end_of_tick``: the worker's end-of-iteration pass, shared with its connections and its
        log; the mesh's frames are an end-only item of it (``ForwardingMixin.flush``).

        ``clock`` (monotonic seconds) and ``wall`` (Unix seconds): the one time of the mesh and
        of every part of it, read by each rule with a time in it (a peer's silence, a takeover's
        wait, the hand-on's young window, what is forgotten), so a test drives them with a
        ``FakeClock``'s ``now`` and ``unix``. The replication reads these two as well (``MeshAdapter``):
        it compares its times with those the mesh notes (``Peer.last_seen``, ``pause_deadline``). The
        host's clocks, not the loop's: uvloop's ``time()`` is cached for a turn, in milliseconds."""
        self.config = config
        self.clock = clock  # (read by dispatch per frame, and by the replication: ``MeshAdapter``)
        self.wall = wall
        self.router = router
        self.loop = loop
        self.end_of_tick = end_of_tick
        self.router_id = router.router_id
        self.incarnation = int.from_bytes(os.urandom(6), "big")
        self.transport = Transport(config, index, loop, router, self._on_readable, clock)  # the sockets
        self.peers: dict[str, Peer] = {}  # every part's record of each peer (``peer``)
        self._dirty = False
        self._lingered = False
        self._replication: Replication | None = None  # with --replication-factor > 1
        self._version_warned: set[str] = set()
        self._bad_logged: set[str] = set()
        self.max_frame = max_frame(config.max_packet_size)
        self._packer = msgpack.Packer(use_bin_type=True)
        # What every PUBLISH frame of this incarnation starts with (``_publish_frames``).
        self._publish_head = (self._packer.pack_array_header(5) + self._packer.pack(MESH_VERSION)
                              + self._packer.pack(PUBLISH) + self._packer.pack(self.router_id)
                              + self._packer.pack(self.incarnation))
        self.closed = False  # after stop(): whatever the router still says goes nowhere
        peers, frame, send, flush = self.peers, self._frame, self._send, self._flush
        self.requests = Requests()  # numbered requests every live peer answers
        self.interest = Interest(loop, router, peers, self.requests, send, self._mark, self._flush_collected)
        hooks = Hooks(self.interest.announce_all, self._peer_gone, self._peer_restarted, self._peer_back)
        self.members = Members(config, index, loop, router, self.incarnation, peers, self.transport, hooks, frame,
                               send, flush, self._keep, self._unconfirmed, self._start_replay, clock, wall)
        members = self.members
        self.transfers = Transfers(config, loop, router, peers, self.requests, send, flush, members.silent_since,
                                   end_of_tick, clock, wall)
        self.handons = Handons(config, router, peers, send, self._keep_frame, clock)
        roster = Roster(members.local_down, members.local_back, members.just_parked, members.gone)
        self.takeovers = Takeovers(config, loop, router, peers, self.requests, roster, self.transfers, self.handons,
                                   send, flush, end_of_tick, clock)
        self.handons.hold_early = self.takeovers.hold_early
        self.transfers.heard_answers = self.takeovers.heard_answers
        self._parts = (self.members, self.interest, self.transfers, self.handons, self.takeovers)
        self._handlers = dispatch.bind(self)  # kind -> (handler, who may send it)

    # The transport's, as others read them: where this router listens, its links, its refusals.
    ipc = property(lambda self: self.transport.ipc)
    tcp = property(lambda self: self.transport.tcp)
    stats_tcp = property(lambda self: self.transport.stats_tcp)
    links = property(lambda self: self.transport.links)
    refused = property(lambda self: self.transport.refused)

    def refused_links(self) -> dict[str, str]:
        """Peer endpoints this node cannot join (its CURVE handshake failed last): endpoint → why."""
        return self.transport.refused_links()

    def announce_interest(self, topic_filter: str, add: bool | int) -> asyncio.Future | None:
        """See ``MeshPort.announce_interest`` (the ``interest`` part's)."""
        return self.interest.announce(topic_filter, add)

    def barrier(self) -> asyncio.Future | None:
        """See ``Interest.barrier``."""
        return self.interest.barrier()

    def takeover(self, client_id: str, claim: list | None = None,
                 answered: set[str] | None = None) -> Awaitable[dict | None]:
        """See ``Takeovers.takeover``."""
        return self.takeovers.takeover(client_id, claim, answered)

    def takeover_then(self, client_id: str, claim: list | None, answered: set[str] | None,
                      then: Callable[[dict | None], None]) -> None:
        """See ``Takeovers.takeover_then``."""
        self.takeovers.takeover_then(client_id, claim, answered, then)

    def abort_takeover(self, client_id: str) -> None:
        """See ``Takeovers.abort``."""
        self.takeovers.abort(client_id)

    def confirm_takeover(self, client_id: str, acked: list | None = None) -> None:
        """See ``Takeovers.confirm``."""
        self.takeovers.confirm(client_id, acked)

    def hand_on(self, router_id: str, client_id: str, items: list, answered: dict | None = None,
                stale: bool = False) -> None:
        """See ``Handons.hand_on``."""
        self.handons.hand_on(router_id, client_id, items, answered, stale)

    @property
    def replication(self) -> Replication | None:
        """The replication (``cluster.replication``), with --replication-factor > 1; set by the
        worker once this mesh is made, and handed to the parts that use it."""
        return self._replication

    @replication.setter
    def replication(self, replication: Replication | None) -> None:
        self._replication = replication
        for part in (self.members, self.transfers, self.handons, self.takeovers):
            part.replication = replication
        self._handlers = dispatch.bind(self)  # its frames now reach its handlers

    # The members', as the router and the replication read them (``MeshPort``, ``MeshAdapter``).
    def hears(self, router_id: str) -> bool:
        """See ``MeshPort.hears``."""
        return self.members.hears(router_id)

    def interest_known(self, router_id: str) -> bool:
        """See ``MeshPort.interest_known``."""
        peer = self.peers.get(router_id)
        return peer is None or peer.interest_known

    def silent_since(self, peer: Peer) -> float:
        """See ``Members.silent_since``."""
        return self.members.silent_since(peer)

    def check_paused(self) -> None:
        """See ``Members.check_paused``."""
        self.members.check_paused()

    def peer_stats(self) -> dict[str, list[int]]:
        """See ``MeshPort.peer_stats``."""
        return self.members.peer_stats()

    def peer_stats_endpoints(self) -> dict[str, str]:
        """See ``MeshPort.peer_stats_endpoints``."""
        return self.members.peer_stats_endpoints()

    @property
    def lease(self) -> Lease | None:
        """The lease whose beats each HELLO carries (``cluster.quorum.Lease``), set by the
        replication."""
        return self.members.lease

    @lease.setter
    def lease(self, lease: Lease | None) -> None:
        self.members.lease = lease

    @property
    def pause_deadline(self) -> float:
        """When, on the monotonic clock, a heartbeat not run yet means this process was paused."""
        return self.members.pause_deadline

    @pause_deadline.setter
    def pause_deadline(self, deadline: float) -> None:
        self.members.pause_deadline = deadline

    # What the other parts do as membership changes (``members.Hooks``).
    def _peer_gone(self, router_id: str, why: str) -> None:
        """``router_id`` fell silent, left or restarted: what it was sending stops arriving, the
        sessions it was taking stay here, the hand-ons it owed are read back, and no request
        waits for it."""
        self.transfers.peer_gone(router_id, why)
        self.handons.peer_gone(router_id)
        self.requests.peer_gone(router_id)
        self.interest.peer_gone(router_id)

    def _peer_restarted(self, router_id: str) -> None:
        """``router_id`` is a new incarnation: the frames of the old one held behind a missed
        number are acted on now (that number died with it); its request numbers start again, so
        what was in doubt with the old one, and what we confirmed to it, cannot be told from the
        new one's."""
        peer = self.peers.get(router_id)
        if peer is not None and peer.held:
            self._act_held(peer, every=True)
        self.transfers.peer_restarted(router_id)
        self.takeovers.forget_confirmed(router_id)

    def _peer_back(self, peer: Peer, restarted: bool) -> None:
        """``peer`` is taken back after a silence: its own log's part of the hand-ons read back
        meanwhile, and, unless it restarted, our takeover confirmations again."""
        self.handons.peer_back(peer.router_id)
        if not restarted:
            self.takeovers.confirm_again(peer)

    def _on_resync(self, peer: Peer, body: Any, size: int) -> None:
        """``peer`` had taken this router for silent: it gets our interest again, and our
        takeover confirmations, which may have been lost."""
        self.interest.announce_all(peer)
        self.takeovers.confirm_again(peer)

    async def start(self) -> None:
        self.transport.bind()
        await self.members.start()

    async def stop(self) -> None:
        self._flush()
        self.closed = True
        for part in self._parts:
            part.closed = True
        frame = self._frame(GOODBYE, None)
        for peer in self.peers.values():
            if peer.alive and peer.link is not None:
                try:
                    peer.link.sock.send(frame, zmq.NOBLOCK)
                except zmq.ZMQError:
                    pass
        self.members.stop()
        self.transport.close()
