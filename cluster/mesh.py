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

PUBLISH frames are numbered per peer, and every HELLO says up to which number it has received
each peer's frames and its log has written the copies it made of them (durable with --fsync
always). Until then a frame stays in the sender's ring of unconfirmed frames (bounded
by ``--mesh-backlog`` bytes too): when a peer comes back as a new incarnation (a worker or node
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
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgpack
import zmq

from brokerd.router.mesh_format import (
    CATCHUP,
    ECHO,
    GOODBYE,
    HELLO,
    HISTORY,
    HISTORY_FETCH,
    INTEREST,
    INTEREST_ACK,
    KIND_NAMES,
    MESH_VERSION,
    PUBLISH,
    REPLICA_ACK,
    REPLICA_CATCHUP,
    REPLICA_FETCH,
    REPLICA_PUBLISH,
    REPLICATE,
    RESYNC,
    RETAINED,
    SESSION_CATCHUP,
    SESSION_COPIES,
    SESSION_GONE,
    SESSION_HANDON,
    SESSION_RESTORE,
    SESSION_RESTORED,
    SESSION_STATE,
    SYNC_REQ,
    TAKEOVER_CHUNK,
    TAKEOVER_DONE,
    TAKEOVER_REQ,
    TAKEOVER_RESP,
    check_body,
    check_envelope,
    handon_from_ok,
    max_frame,
    to_mesh,
    to_mesh_shared,
)
from brokerd.router.message import Message
from brokerd.router.ownership import refusal, refused_by
from brokerd.router.ports import TAKEOVER_FAILED, TAKEOVER_UNAVAILABLE
from brokerd.router.session import recency
from brokerd.router.spool import SpoolWriter, drop_named

from .config import WILDCARDS, Config
from .paths import ensure_run_dir, mesh_ipc
from .quorum import MARGIN_S

if TYPE_CHECKING:
    from brokerd.router.router import Router

log = logging.getLogger(__name__)

__all__ = ["MESH_VERSION", "PUBLISH", "Mesh"]

HELLO_INTERVAL_S = 0.5
ACK_TIMEOUT_S = 2.0
MAX_PENDING_FRAMES = 100_000  # per blocked peer, for frames with no connection to pause (wills ...)
RECV_BATCH = 512  # frames handled per readable callback at most
RECV_MSGS = 128  # forwarded messages after which the rest waits for the next loop iteration
LINGER_BELOW = 64  # publishes in a tick's frames below which they wait one more loop iteration
SYNC_WINDOW_S = 30.0  # after start, fetch the retained messages of every router that joins
MOVE_TIMEOUT_S = 60.0  # an exported session not confirmed by its new owner within this stays here
LOCAL_DOWN_WAIT_S = 5.0  # a CONNECT waits this long for a router of this node that is down
SEEN_WINDOW = 4096  # PUBLISH frame numbers remembered per peer, to drop a frame received twice
# A session taken over from a live router is confirmed (TAKEOVER_DONE) once the interest its
# subscriptions announced is acknowledged; at the latest this long after it arrived.
CONFIRM_S = 10.0  # (beyond the interest waits and a snapshot write: router.client DURABLE_WAIT_S)
HANDON_KEEP_S = 30.0  # how long the marks that filter a moved session's handed-on copies are kept
HANDON_ITEMS = 1000  # copies per SESSION_HANDON frame


def _drop_older(entries: dict, horizon: float, when: Callable[[Any], float]) -> None:
    """Drop the entries of ``entries`` (insertion-ordered, oldest first) from before ``horizon``:
    the cost is the entries dropped, not the dict's size."""
    while entries:
        first = next(iter(entries))
        if when(entries[first]) >= horizon:
            return
        del entries[first]


class _Transfer:
    """A session arriving in chunks (new owner's side); ``spool``: where its copies go
    (``router.spool``), once there are any."""

    __slots__ = ("state", "progress", "spool")

    def __init__(self, state: dict) -> None:
        self.state = state
        self.progress = time.monotonic()
        self.spool: SpoolWriter | None = None


class Link:
    """One PUSH socket to one endpoint, with the frames waiting for it to drain."""

    __slots__ = ("endpoint", "sock", "pending", "paused", "mesh")

    def __init__(self, mesh: Mesh, endpoint: str) -> None:
        self.mesh = mesh
        self.endpoint = endpoint
        self.pending: list[bytes] = []
        self.paused: set[Any] = set()  # client connections not read until this link drains
        self.sock = mesh._push(endpoint)

    def send(self, frame: bytes, sources: Any = ()) -> bool:
        """Send or keep ``frame``; False if the link is blocked (frame kept, ``sources`` paused).

        A frame with no client connection behind it (a will, a control frame) is dropped and
        counted once this many frames are waiting: nothing can be paused to bound it otherwise.
        """
        if not self.pending:
            try:
                self.sock.send(frame, zmq.NOBLOCK)
                return True
            except zmq.Again:
                self.mesh._blocked(self)
        if not sources and len(self.pending) >= MAX_PENDING_FRAMES:
            self.mesh.router.stats.drop_mesh_backpressure += 1
            return False
        self.pending.append(frame)
        for src in sources:
            if src not in self.paused:
                self.paused.add(src)
                src.pause_reading(self)
        return False

    def drain(self) -> bool:
        """Push waiting frames; True when none are left (paused connections resume)."""
        pending = self.pending
        sent = 0
        try:
            for frame in pending:
                self.sock.send(frame, zmq.NOBLOCK)
                sent += 1
        except zmq.Again:
            pass
        if sent:
            del pending[:sent]
        if pending:
            return False
        self.resume()
        return True

    def resume(self) -> None:
        for conn in self.paused:
            conn.resume_reading(self)
        self.paused.clear()

    def park(self) -> list[bytes]:
        """The peer fell silent: hand back the frames waiting here (they join its backlog) and
        let the paused connections go on; the socket and what ZeroMQ queued in it stay, for the
        peer's return."""
        pending, self.pending = self.pending, []
        self.resume()
        return pending

    def reset(self) -> None:
        """Drop queued frames (the peer is gone): a new socket with nothing queued."""
        self.pending.clear()
        self.resume()
        self.sock.close(linger=0)
        self.sock = self.mesh._push(self.endpoint)

    def close(self) -> None:
        self.resume()
        self.sock.close(linger=0)


class Peer:
    """Another router: its identity, how to reach it, and what we are about to send it."""

    __slots__ = ("router_id", "node_id", "ipc", "tcp", "incarnation", "last_seen", "alive", "link",
                 "batch", "batch_sources", "stats", "parked", "parked_at", "backlog", "backlog_bytes",
                 "backlog_msgs", "dropped", "log_mark", "replay_from", "seq_out", "seq_in", "acked",
                 "ring", "ring_bytes", "resend", "stats_tcp", "origin_mark", "replaying", "replicas",
                 "claim_floor", "interest_known", "seen_of_me", "seqs_seen", "unwritten", "left", "hears",
                 "beat_epoch", "fence", "since", "batch_packed")

    def __init__(self, router_id: str, node_id: str, ipc: str | None, tcp: str | None) -> None:
        self.router_id = router_id
        self.node_id = node_id
        self.ipc = ipc
        self.tcp = tcp
        self.incarnation: int | None = None
        self.last_seen = 0.0
        self.alive = False
        self.link: Link | None = None
        # Forwarded messages: ``to_mesh`` values, or bytes where one message went to several
        # peers and was packed once for all of them (then ``batch_packed``).
        self.batch: list[Any] = []
        self.batch_packed = False
        self.batch_sources: set[Any] = set()
        self.stats = [0, 0, 0, 0]  # msgs out, bytes out, msgs in, bytes in
        # Silent (see the module docstring): interest kept, frames kept for its return.
        self.parked = False
        self.parked_at = 0.0
        self.backlog: list[bytes] = []
        self.backlog_bytes = 0
        self.backlog_msgs = 0
        self.dropped = 0  # messages dropped for it while parked (backlog full)
        self.log_mark: int | None = None  # our log's next offset when the backlog last took a frame
        self.replay_from: int | None = None  # backlog full: our log holds the rest from here
        # Numbered PUBLISH frames: the last we sent, the last we received from it, the last it
        # confirmed, and those sent but not confirmed yet (for its next incarnation, if it crashes).
        self.seq_out = 0
        self.seq_in = 0
        # The numbers of its last PUBLISH frames received (``SEEN_WINDOW``), not only the
        # highest: frames sent again to a new incarnation of ours may come after newer ones.
        self.seqs_seen: dict[int, None] = {}
        # (frame number, the log offset its copies end at) of its frames whose copies our log
        # has not written yet (durable, with --fsync always): HELLO confirms only frames before.
        self.unwritten: deque[tuple[int, int]] = deque()
        self.acked = 0
        self.ring: deque[tuple[int, bytes]] = deque()
        self.ring_bytes = 0
        self.resend: list[bytes] = []  # the ring's unconfirmed frames, for a new incarnation
        self.stats_tcp: str | None = None  # its stats socket, when other nodes can read it
        self.replicas: dict[str, int] = {}  # the replicas it holds: {partition: last offset} (HELLO)
        # Its log offset below which we have every message of its own our interest matched (the
        # marks of its PUBLISH frames; -1: unknown). Kept across its incarnations: a new one is
        # asked (CATCHUP) for what its crashed predecessor acknowledged and never sent us.
        self.origin_mark = -1
        # Its HELLO's ``marks`` raise ``origin_mark`` too (its claim that nothing matching our
        # interest is on its way), but only once the mark has reached ``claim_floor``, its log's
        # end when this incarnation first spoke: below that, what a crashed predecessor never
        # sent is read back first (CATCHUP), and a claim must not jump over it.
        self.claim_floor = -1
        self.interest_known = False  # we have its full interest announcement (this incarnation)
        self.seen_of_me = -1  # the highest offset of our log it has seen (its HELLO's ``seen``)
        self.replaying = 0  # reads of our log back to it under way: our frames claim no mark
        self.left = False  # parked because it said GOODBYE (a graceful stop), not heard since
        # The routers it hears, by its last HELLO: whether a majority of the nodes take a router
        # that is silent here for gone (``Replication.gone_for_majority``).
        self.hears: frozenset[str] = frozenset()
        # The lease (cluster.quorum.Lease): the epoch of its last beat heard, and the fence set
        # when it was parked, (incarnation, epoch): beats of that epoch or an older one of that
        # incarnation are not echoed any more.
        self.beat_epoch = -1
        self.fence: tuple[int, int] | None = None
        self.since = 0.0  # when it was last taken in (met, heard again, a new incarnation)


class _Waiter:
    """A request answered by every live peer (interest acks, takeover answers)."""

    __slots__ = ("future", "waiting", "result", "missed", "offers", "ends")

    def __init__(self, loop: asyncio.AbstractEventLoop, peers: set[str]) -> None:
        self.future: asyncio.Future = loop.create_future()
        self.waiting = peers
        self.result: Any = None
        self.missed: set[str] = set()  # peers that fell silent or timed out instead of answering
        self.offers: list[tuple[str | None, int, dict]] = []  # takeover: (router, request, session) offered
        # Interest: each acknowledging router's log end when it took the announcement in. The
        # future of an interest waiter completes with this dict (``Router.hand_on``'s marks).
        self.ends: dict[str, int] | None = None

    def answer(self, router_id: str, result: Any = None) -> None:
        self.waiting.discard(router_id)
        if result is not None and self.result is None:
            self.result = result
        if not self.waiting:
            self.finish()

    def finish(self) -> None:
        if not self.future.done():
            self.future.set_result(self.ends if self.ends is not None else self.result)


def park_skew(config: Config) -> float:
    """How long after a router is parked here the others may still count it as alive: each
    notices a silence by its own clock, and one that got its GOODBYE (a stop, or a dying node that
    managed to say it to some) parks it a whole mesh timeout before the others. Also how long a
    router back from a death holds its overdue delayed wills (cluster.worker): the same window in
    which a replica's notice that it published them arrives."""
    return config.mesh_timeout + 1.0


class Mesh:
    """Implements ``router.ports.MeshPort`` for one router."""

    def __init__(self, config: Config, index: int, router: Router, loop: asyncio.AbstractEventLoop) -> None:
        self.config = config
        self.index = index
        self.router = router
        self.loop = loop
        self.router_id = router.router_id
        self.node_id = config.node_id
        self.incarnation = int.from_bytes(os.urandom(6), "big")
        self.ctx: zmq.Context | None = None
        self.pull: zmq.Socket | None = None
        self.ipc = mesh_ipc(config, index)
        self.tcp: str | None = None
        self.peers: dict[str, Peer] = {}
        self.links: dict[str, Link] = {}
        self.seeds: list[Link] = []
        self._dirty = False
        self._lingered = False
        self._interest_batch: list[tuple[str, bool]] = []
        self._interest_waiter: _Waiter | None = None
        self._waiters: dict[int, _Waiter] = {}
        # The other routers of this node (a CONNECT waits for them while they are down), and the
        # future that the next one to join again completes.
        self._local_ids = {f"{self.node_id}/w{j}" for j in range(config.workers)} - {self.router_id}
        self._local_joined: asyncio.Future | None = None
        self.replication: Any = None  # cluster.replication.Replication, with --replication-factor > 1
        self.lease: Any = None  # cluster.quorum.Lease, set by the replication: its beats go in each HELLO
        self._req_ids = itertools.count(1)
        self._timer: asyncio.TimerHandle | None = None
        self._drain_timer: asyncio.TimerHandle | None = None
        self._blocked_links: set[Link] = set()
        self._started = time.monotonic()
        self._version_warned: set[str] = set()
        self._auth: Any = None
        self._curve: tuple[bytes, bytes] | None = None
        self._monitors: list[tuple[zmq.Socket, str, str | None]] = []
        self._refused_logged: dict[str, float] = {}
        # Peer endpoints whose last CURVE handshake failed, and how (``brokerd stats`` names them).
        self.refused: dict[str, str] = {}
        self._bad_logged: set[str] = set()
        self._last_beat = time.monotonic()
        # A heartbeat this long after the last means a pause the others may have acted on; the
        # moment that is reached, for ``check_paused``'s callers to compare with cheaply.
        self._pause_after = config.mesh_timeout - MARGIN_S
        self.pause_deadline = self._last_beat + self._pause_after
        self.max_frame = max_frame(config.max_packet_size)
        self._tcp_pull: zmq.Socket | None = None
        self.stats_tcp: str | None = None  # this router's stats socket, if other nodes can read it
        self._incoming: dict[tuple[int, str], _Transfer] = {}  # (request, sender) → session arriving
        self._moves: dict[tuple[str, int], str] = {}  # (new owner, its request) → client id leaving
        # Moves given up unconfirmed (the new owner fell silent): key as ``_moves`` → (client id,
        # when); a confirmation that comes later settles them (``Router.moved_after_all``).
        self._in_doubt: dict[tuple[str, int], tuple[str, float]] = {}
        # Takeovers this router confirmed to a live router: its id → {request: when}. Said again
        # when that router is heard after a silence (``_confirm_again``): the first may be lost.
        self._takeovers_confirmed: dict[str, dict[int, float]] = {}
        # Sessions taken over here from a live router, not confirmed to it yet: client id →
        # (old owner, request, the timer that confirms at the latest, the header's ``handon_from``).
        self._unconfirmed_takeovers: dict[str, tuple[str | None, int, asyncio.TimerHandle, Any]] = {}
        # Copies handed on for a session whose takeover here is not settled yet (its CONNECT still
        # waits for the agreement, the session not imported): delivered once it is.
        self._early_handons: dict[str, list] = {}
        # Sessions that moved here: client id → ({router: offset of its log from which its
        # messages reach this router directly}, until when): what the old owner hands on from
        # there is here already (``_handed_on``).
        self._handon_marks: dict[str, tuple[dict[str, int], float]] = {}
        # Sessions moved here from a live router that has not ended its hand-on yet (its last
        # SESSION_HANDON): client id → [old owner, its ``handon_from``, the marks above, until
        # when, whether its own log is still to be read]. Should the old owner fall silent
        # first, what it held for the session is read back instead (``_handons_lost``).
        self._handons_due: dict[str, list] = {}
        self._peer_stats: dict[str, list[int]] = {}
        self._packer = msgpack.Packer(use_bin_type=True)
        # What every PUBLISH frame of this incarnation starts with (``_publish_frames``).
        self._publish_head = (self._packer.pack_array_header(5) + self._packer.pack(MESH_VERSION)
                              + self._packer.pack(PUBLISH) + self._packer.pack(self.router_id)
                              + self._packer.pack(self.incarnation))
        self.closed = False  # after stop(): whatever the router still says goes nowhere

    # -- sockets --------------------------------------------------------------------------------------

    def _push(self, endpoint: str) -> zmq.Socket:
        assert self.ctx is not None
        s = self.ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.SNDHWM, self.config.mesh_hwm)
        s.setsockopt(zmq.LINGER, 1000)
        s.setsockopt(zmq.RECONNECT_IVL, 50)
        s.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        if self._curve is not None and endpoint.startswith("tcp://"):
            public, secret = self._curve
            s.curve_secretkey = secret
            s.curve_publickey = public
            s.curve_serverkey = public
            self._monitor(s, f"link to {endpoint}", endpoint)
        mesh = self.config.mesh
        if endpoint.startswith("tcp://") and mesh is not None and mesh[0] not in WILDCARDS:
            # From the mesh's address: on a host with several, traffic between nodes leaves from
            # the one the operator chose for it (and firewalls see the address they expect).
            source = f"[{mesh[0]}]" if ":" in mesh[0] else mesh[0]
            s.connect(f"tcp://{source}:0;{endpoint[6:]}")
        else:
            s.connect(endpoint)
        return s

    def _monitor(self, s: zmq.Socket, what: str, peer: str | None = None) -> None:
        """Log CURVE handshake failures on both sides: the node refused says whom it cannot join
        (``peer``: the endpoint of a link), not only the node that refuses it. A link's successes
        are watched too, to tell when it joins after all."""
        events = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                  | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
        if peer is not None:
            events |= zmq.EVENT_HANDSHAKE_SUCCEEDED
        self._monitors.append((s.get_monitor_socket(events), what, peer))

    def _poll_monitors(self) -> None:
        """Read handshake events (from the heartbeat: rare events, no descriptor juggling) and
        log a failure at most every 30 s per link, since ZeroMQ retries the handshake continuously."""
        from zmq.utils.monitor import recv_monitor_message

        now = time.monotonic()
        for mon, what, peer in self._monitors:
            while True:
                try:
                    ev = recv_monitor_message(mon, zmq.NOBLOCK)
                except zmq.ZMQError:
                    break
                if ev["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    if peer is not None and self.refused.pop(peer, None) is not None:
                        log.info("mesh: the CURVE handshake with the peer at %s succeeds now", peer)
                    continue
                if peer is not None:
                    self.refused[peer] = _event_name(ev["event"])
                if now - self._refused_logged.get(what, -1e9) < 30.0:
                    continue
                self._refused_logged[what] = now
                if peer is None:
                    log.error("mesh: %s: CURVE handshake failed (%s): the other side does not hold "
                              "this cluster's --mesh-key; refused", what, _event_name(ev["event"]))
                else:
                    log.error("mesh: cannot join the peer at %s: CURVE handshake failed (%s): it and this node "
                              "hold different --mesh-key files (or it has none); this node is not in its mesh "
                              "until they match (retrying)", peer, _event_name(ev["event"]))

    def refused_links(self) -> dict[str, str]:
        """Peer endpoints this node cannot join (its CURVE handshake failed last): endpoint → why."""
        return dict(self.refused)

    async def start(self) -> None:
        self.ctx = zmq.Context()
        ensure_run_dir(self.config)
        if self.config.mesh_key:
            self._setup_curve(self.config.mesh_key)
        pull = self.ctx.socket(zmq.PULL)
        pull.setsockopt(zmq.RCVHWM, self.config.mesh_hwm)
        pull.setsockopt(zmq.LINGER, 0)
        pull.setsockopt(zmq.MAXMSGSIZE, self.max_frame)
        path = self.ipc[len("ipc://"):]
        if os.path.exists(path):
            os.unlink(path)  # left by a crashed incarnation of this router
        pull.bind(self.ipc)
        if self.config.mesh is not None:
            host, port = self.config.mesh
            tcp_pull = pull
            if self._curve is not None:
                # The ipc endpoint stays plain (same host, private directory); tcp is CURVE.
                tcp_pull = self.ctx.socket(zmq.PULL)
                tcp_pull.setsockopt(zmq.RCVHWM, self.config.mesh_hwm)
                tcp_pull.setsockopt(zmq.LINGER, 0)
                tcp_pull.setsockopt(zmq.MAXMSGSIZE, self.max_frame)
                tcp_pull.curve_server = True
                tcp_pull.curve_secretkey = self._curve[1]
                tcp_pull.curve_publickey = self._curve[0]
                self._monitor(tcp_pull, f"mesh listener {host}:{port + self.index}")
                self._tcp_pull = tcp_pull
                self.loop.add_reader(tcp_pull.FD, self._on_readable, tcp_pull)
            try:
                tcp_pull.bind(f"tcp://{host}:{port + self.index}")
            except zmq.ZMQError as exc:
                raise OSError(f"--mesh: cannot bind {host}:{port + self.index}: {exc}") from None
            if self._curve is None and self.index == 0:  # --mesh-insecure on (config refuses it otherwise)
                log.warning("mesh: %s:%d is unauthenticated and unencrypted (--mesh-insecure on): any "
                            "process that reaches it can read and inject messages", host, port)
            advertised = host if host not in WILDCARDS else socket.getfqdn()
            self.tcp = f"tcp://{advertised}:{port + self.index}"
            if self.config.mesh_advertise is not None:
                ad_host, ad_port = self.config.mesh_advertise
                self.tcp = f"tcp://{ad_host}:{ad_port + self.index}"
            if self.config.stats_port:
                # Where other nodes' `brokerd stats --cluster` reads this router (a tcp stats socket,
                # at the listener's address, or the mesh's advertised one for a wildcard listener).
                stats_host = self.config.stats_host
                if stats_host in WILDCARDS:
                    stats_host = advertised
                self.stats_tcp = f"tcp://{stats_host}:{self.config.stats_port + self.index}"
        self.pull = pull
        self.loop.add_reader(pull.FD, self._on_readable, pull)
        for j in range(self.config.workers):
            if j != self.index:
                self.seeds.append(self._link(mesh_ipc(self.config, j)))
        for host, port in self.config.peer:
            endpoint = f"tcp://{host}:{port}"
            if endpoint != self.tcp:
                self.seeds.append(self._link(endpoint))
        self._heartbeat()
        # Serve only once the routers of this node know each other (bounded): a client that
        # subscribes on one worker right after start must be reachable from every other.
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            if not self._local_down():
                break
            await asyncio.sleep(0.02)
        else:
            log.warning("mesh: not every local router answered within 10 s; serving anyway")
            return
        if self.index == 0 and self._local_ids:  # the node's own routers, in one line (each pair: DEBUG)
            log.info("mesh: the %d routers of node %s joined each other", len(self._local_ids) + 1, self.node_id)

    def _setup_curve(self, path: str) -> None:
        import zmq.auth
        from zmq.auth.asyncio import AsyncioAuthenticator

        try:
            public, secret = zmq.auth.load_certificate(path)
        except (OSError, ValueError) as exc:
            raise OSError(f"--mesh-key: cannot load {path}: {exc}") from None
        if secret is None:
            raise OSError(f"--mesh-key: {path} holds no secret key (use the .key_secret file)")
        self._curve = (public, secret)
        auth = AsyncioAuthenticator(self.ctx)
        auth.start()

        class _OnlyClusterKey:
            def callback(self, domain: str, key: bytes) -> bool:
                ok = key == public
                if not ok:
                    log.error("mesh: refused a node whose CURVE key is not this cluster's --mesh-key")
                return ok

        auth.configure_curve_callback(domain="*", credentials_provider=_OnlyClusterKey())
        self._auth = auth

    def _link(self, endpoint: str) -> Link:
        link = self.links.get(endpoint)
        if link is None:
            link = self.links[endpoint] = Link(self, endpoint)
        return link

    async def stop(self) -> None:
        self._flush()
        self.closed = True
        frame = self._frame(GOODBYE, None)
        for peer in self.peers.values():
            if peer.alive and peer.link is not None:
                try:
                    peer.link.sock.send(frame, zmq.NOBLOCK)
                except zmq.ZMQError:
                    pass
        if self._timer is not None:
            self._timer.cancel()
        if self._drain_timer is not None:
            self._drain_timer.cancel()
        for s in [self.pull, self._tcp_pull]:
            if s is not None:
                try:
                    self.loop.remove_reader(s.FD)
                except (ValueError, zmq.ZMQError):
                    pass
        for link in self.links.values():
            link.sock.close(linger=200)  # let the goodbye and the last frames out
        if self.pull is not None:
            self.pull.close(linger=0)
        if self._tcp_pull is not None:
            self._tcp_pull.close(linger=0)
        for mon, _, _ in self._monitors:
            mon.close(linger=0)
        if self._auth is not None:
            self._auth.stop()
        if self.ctx is not None:
            self.ctx.term()

    # -- frames ---------------------------------------------------------------------------------------

    def _frame(self, kind: int, body: Any) -> bytes:
        return self._packer.pack([MESH_VERSION, kind, self.router_id, self.incarnation, body])

    def _send(self, peer: Peer, kind: int, body: Any) -> None:
        if peer.link is not None:
            peer.link.send(self._frame(kind, body))

    def _replication_hook(self, hook: Any, *args: Any) -> None:
        """Call replication from the mesh's own callbacks: its failure is logged, and the mesh
        (heartbeats, parking) goes on."""
        try:
            hook(*args)
        except Exception:  # noqa: BLE001 - the heartbeat must be rescheduled whatever happens
            log.exception("replication: %s failed", getattr(hook, "__name__", hook))

    _REPLICATION_KINDS = {"replicate": REPLICATE, "ack": REPLICA_ACK, "fetch": REPLICA_FETCH,
                          "catchup": REPLICA_CATCHUP, "publish": REPLICA_PUBLISH, "sessions": SESSION_STATE,
                          "gone": SESSION_GONE, "session_catchup": SESSION_CATCHUP, "copies": SESSION_COPIES,
                          "restore": SESSION_RESTORE, "restored": SESSION_RESTORED,
                          "history_fetch": HISTORY_FETCH, "history": HISTORY}

    def send_replication(self, peer: Peer, what: str, body: Any) -> None:
        """A replication frame (``cluster.replication``) to ``peer``."""
        if self.closed:
            return
        self._send(peer, self._REPLICATION_KINDS[what], body)

    def _mark(self) -> None:
        if not self._dirty and not self.closed:
            self._dirty = True
            self.loop.call_soon(self._end_of_tick)

    def _end_of_tick(self) -> None:
        """Flush what this loop iteration collected; publishes alone and fewer than
        ``LINGER_BELOW`` wait for one more iteration first, once. Under load that iteration is
        the next turn of reads (the turn budget keeps turns short), so frames carry about twice
        as many messages and every per-frame cost (ZeroMQ's threads, wake-ups, framing) halves;
        when the loop is idle it is a poll that returns at once. Interest changes and barriers
        never wait."""
        if not self._dirty:
            return  # flushed meanwhile (a takeover or retained update flushes first)
        if not self._lingered and not self._interest_batch and self._interest_waiter is None:
            n = 0
            for peer in self.peers.values():
                n += len(peer.batch)
            if n < LINGER_BELOW:
                self._lingered = True
                self.loop.call_soon(self._end_of_tick)
                return
        self._flush()

    def _flush(self) -> None:
        """One publish frame per peer, one interest frame for all."""
        self._dirty = False
        self._lingered = False
        if self.closed:
            return
        stats = self.router.stats
        commit_log = self.router.commit_log
        # Every message of ours logged so far that a peer's interest matched is in its batch now
        # (``Router.publish`` logs, then forwards, in one call): the log's end is each frame's mark.
        mark = commit_log.next_offset if commit_log is not None else -1
        for peer in self.peers.values():
            batch = peer.batch
            if not batch:
                continue
            peer.batch = []
            packed, peer.batch_packed = peer.batch_packed, False
            sources = peer.batch_sources
            peer.batch_sources = set()
            if peer.link is None:
                continue
            for seq, frame, n in self._publish_frames(peer, batch, -1 if peer.replaying else mark, packed):
                peer.stats[0] += n
                peer.stats[1] += len(frame)
                stats.mesh_msgs_out += n
                stats.mesh_bytes_out += len(frame)
                stats.mesh_frames_out += 1
                if peer.alive:
                    self._unconfirmed(peer, seq, frame)
                    peer.link.send(frame, sources)
                else:
                    self._keep(peer, frame, n)
        if self._interest_batch or self._interest_waiter is not None:  # changes, or a barrier
            changes, self._interest_batch = self._interest_batch, []
            waiter, self._interest_waiter = self._interest_waiter, None
            seq = None
            if waiter is not None:
                seq = next(self._req_ids)
                waiter.ends = {}
                self._waiters[seq] = waiter
                self.loop.call_later(ACK_TIMEOUT_S, self._expire_waiter, seq, "interest")
            frame = self._frame(INTEREST, [seq, changes])
            for peer in self.peers.values():
                if peer.alive and peer.link is not None:
                    peer.link.send(frame)

    def _publish_frames(self, peer: Peer, batch: list, mark: int, packed: bool = False
                        ) -> list[tuple[int, bytes, int]]:
        """``batch`` as one PUBLISH frame numbered for ``peer`` (seq, frame, messages), or split
        in halves until each frame is at most half the receivers' limit (a tick's batch of large
        messages; the length check is all it costs otherwise). Only the last frame carries the
        ``mark``: the others claim nothing (-1). ``packed``: some messages are bytes packed
        already (``forward_to``); the frame is built around them, byte for byte what packing
        their values would give."""
        seq = peer.seq_out + 1
        if not packed:
            frame = self._frame(PUBLISH, [seq, batch, mark])  # one msgpack call for the whole tick
        else:
            pack = self._packer.pack
            frame = b"".join((self._publish_head, b"\x93", pack(seq), self._packer.pack_array_header(len(batch)),
                              *[m if m.__class__ is bytes else pack(m) for m in batch], pack(mark)))
        if len(frame) <= self.max_frame // 2 or len(batch) == 1:
            peer.seq_out = seq
            return [(seq, frame, len(batch))]
        half = len(batch) // 2
        return (self._publish_frames(peer, batch[:half], -1, packed)
                + self._publish_frames(peer, batch[half:], mark, packed))

    def _unconfirmed(self, peer: Peer, seq: int, frame: bytes) -> None:
        """A numbered frame handed to ``peer``'s link: kept until the peer confirms it (bounded by
        ``--mesh-backlog`` bytes, oldest first out: only a crash in that moment would miss them)."""
        ring = peer.ring
        ring.append((seq, frame))
        peer.ring_bytes += len(frame)
        cap = self.config.mesh_backlog
        while peer.ring_bytes > cap and ring:
            peer.ring_bytes -= len(ring.popleft()[1])

    def _confirmed(self, peer: Peer, acked: int) -> None:
        """``peer`` has received our frames up to ``acked``."""
        if acked <= peer.acked:
            return
        peer.acked = acked
        ring = peer.ring
        while ring and ring[0][0] <= acked:
            peer.ring_bytes -= len(ring.popleft()[1])

    def _keep(self, peer: Peer, frame: bytes, n: int) -> None:
        """A frame for a parked peer: into its backlog; once that is full, left to this router's
        log (read back when the peer returns), or without a log dropped and counted."""
        if peer.replay_from is not None:
            return
        commit_log = self.router.commit_log
        if peer.backlog_bytes + len(frame) > self.config.mesh_backlog:
            if commit_log is not None and commit_log.error is None and peer.log_mark is not None:
                # Every message of this frame was logged after the mark: it and all that follows
                # come back from the log.
                peer.replay_from = peer.log_mark
                log.warning("mesh: router %s is silent and the %d bytes kept for it (--mesh-backlog) are "
                            "used: what it would get from here on is read back from this router's log "
                            "when it returns", peer.router_id, peer.backlog_bytes)
                return
            peer.dropped += n
            self.router.stats.drop_mesh_peer_gone += n
            if peer.dropped == n:
                log.warning("mesh: router %s is silent and the %d bytes kept for it (--mesh-backlog) are "
                            "used: dropping what it would get until it returns (counted as drop "
                            "mesh_peer_gone)", peer.router_id, peer.backlog_bytes)
            return
        peer.backlog.append(frame)
        peer.backlog_bytes += len(frame)
        peer.backlog_msgs += n
        if commit_log is not None:
            peer.log_mark = commit_log.next_offset

    def _start_replay(self, peer: Peer, offset: int, why: str) -> None:
        """Read this router's log back to ``peer`` from ``offset`` to its end now (``_replay``);
        until that is done, live frames to it claim no mark."""
        commit_log = self.router.commit_log
        if commit_log is None or offset >= commit_log.next_offset:
            return
        if offset < commit_log.start_offset:
            log.warning("mesh: router %s asks for this router's log from offset %d (%s), but it starts at "
                        "%d now (retention): the %d record(s) before are gone", peer.router_id, offset, why,
                        commit_log.start_offset, commit_log.start_offset - offset)
            offset = commit_log.start_offset
        log.info("mesh: reading this router's log back to router %s from offset %d to %d (%s)",
                 peer.router_id, offset, commit_log.next_offset, why)
        peer.replaying += 1
        self._replay(peer, offset, commit_log.next_offset)

    def _replay(self, peer: Peer, offset: int, end: int, sent: int = 0) -> None:
        """Forward again, by the peer's interest, the messages published here (records whose
        origin is this router: copies from other routers are theirs to replay) in ``[offset,
        end)`` of this router's log, 256 records per loop iteration, as the link drains. Each
        frame's mark is the offset after its last record: a crash midway is resumed from there."""
        if not peer.alive or self.closed or peer.link is None:
            peer.replaying -= 1
            return
        if peer.link.pending:
            self.loop.call_later(0.005, self._replay, peer, offset, end, sent)
            return
        records = [r for r in self.router.commit_log.read(offset, max_records=256) if r.offset < end]
        if not records:
            peer.replaying -= 1
            log.info("mesh: %d message(s) read back from the log for router %s", sent, peer.router_id)
            return
        rid = peer.router_id
        me = self.router_id
        batch = []
        for rec in records:
            if (rec.origin_router and rec.origin_router != me) or not any(
                    r == rid for r, _ in self.router.interest.match(rec.topic)):
                continue
            msg = Message.from_record(rec)
            msg.origin_router, msg.origin_offset = self.router_id, rec.offset
            batch.append(to_mesh(msg))
            if rec.retain:
                self._send(peer, RETAINED, [msg.to_list()])
        for seq, frame, n in self._publish_frames(peer, batch, records[-1].offset + 1) if batch else ():
            self.router.stats.mesh_msgs_out += n
            self._unconfirmed(peer, seq, frame)
            peer.link.send(frame)
        self.loop.call_soon(self._replay, peer, records[-1].offset + 1, end, sent + len(batch))

    # -- MeshPort -------------------------------------------------------------------------------------

    def forward(self, router_id: str, msg: Message, source: Any = None, groups: list[str] | None = None,
                only: bool = False) -> None:
        if groups is None:
            self.forward_to((router_id,), msg, source)
            return
        peer = self.peers.get(router_id)
        if peer is None or self.closed or not (peer.alive or peer.parked):
            return
        peer.batch.append(to_mesh_shared(msg, groups, only))
        if source is not None:
            peer.batch_sources.add(source)
        if not self._dirty:
            self._dirty = True
            self.loop.call_soon(self._end_of_tick)

    def forward_to(self, router_ids: tuple[str, ...], msg: Message, source: Any = None) -> None:
        """Once per publish that other routers want. For one router the message's values join
        its batch, packed with the whole frame by one msgpack call; for several it is packed
        once and every one of those frames takes the same bytes (a fan-out over eight workers
        packed it seven times: 1.93 -> 0.35 us a message in-process; packing each message on
        its own for one router cost ~4 % of cross-worker p2p)."""
        if self.closed:
            return
        peers = self.peers
        item: Any = None
        for router_id in router_ids:
            peer = peers.get(router_id)
            if peer is None or not (peer.alive or peer.parked):
                continue
            if item is None:
                item = to_mesh(msg) if len(router_ids) == 1 else self._packer.pack(to_mesh(msg))
            if item.__class__ is bytes:
                peer.batch_packed = True
            peer.batch.append(item)
            if source is not None:
                peer.batch_sources.add(source)
        if item is not None and not self._dirty:
            self._dirty = True
            self.loop.call_soon(self._end_of_tick)

    def announce_interest(self, topic_filter: str, add: bool | int) -> asyncio.Future | None:
        self._interest_batch.append((topic_filter, add))
        self._mark()
        if not add:
            return None
        alive = self._alive()
        if not alive:
            return None
        if self._interest_waiter is None:
            self._interest_waiter = _Waiter(self.loop, alive)
        return self._interest_waiter.future

    def peer_stats(self) -> dict[str, list[int]]:
        return dict(self._peer_stats)

    def peer_stats_endpoints(self) -> dict[str, str]:
        return {rid: p.stats_tcp for rid, p in self.peers.items() if p.stats_tcp and (p.alive or p.parked)}

    def _alive(self) -> set[str]:
        """The ids of the peers that count as alive now."""
        return {rid for rid, p in self.peers.items() if p.alive}

    def hears(self, router_id: str) -> bool:
        peer = self.peers.get(router_id)
        return peer is not None and peer.alive

    def barrier(self) -> asyncio.Future | None:
        """An interest announcement without changes: every peer answers it after whatever it sent
        before (one PUSH socket per direction keeps a peer's frames in order), so a SUBACK that
        waits for it hands out retained messages as new as any that peer acknowledged to its
        publisher before this subscriber subscribed."""
        alive = self._alive()
        if not alive or self.closed:
            return None
        if self._interest_waiter is None:
            self._interest_waiter = _Waiter(self.loop, alive)
        self._mark()
        return self._interest_waiter.future

    def retained_update(self, msg: Message) -> None:
        if self.closed:
            return
        if self._dirty:
            self._flush()  # retained updates travel after this tick's publishes, in order
        frame = self._frame(RETAINED, [msg.to_list()])
        for peer in self.peers.values():
            if peer.alive and peer.link is not None:
                peer.link.send(frame)
            elif peer.parked:
                self._keep(peer, frame, 1)

    async def takeover(self, client_id: str, claim: list | None = None,
                       answered: set[str] | None = None) -> dict | None:
        """Ask every live peer for ``client_id``'s session, for a CONNECT making ``claim``
        (``[user name, refuse?]``, ``router.ownership``): a live router holding another
        identity's session refuses before it lets anything go, and a copy offered by a replica
        (or held here) is checked here; a refusal leaves every offer where it was. The routers of
        this node are always asked: while one is down (crashed and being restarted by the supervisor, or stopped) the
        request waits for it, bounded by ``LOCAL_DOWN_WAIT_S``, and is asked again when one fell
        silent instead of answering, since the sessions it restores from its disk would
        otherwise exist twice. Routers of other nodes that are parked are not waited for (a
        silent node may never come back; docs/guarantees.md: "Not guaranteed yet")."""
        deadline = time.monotonic() + LOCAL_DOWN_WAIT_S
        asked_again = False
        while not self.closed:
            down = self._local_down()
            if down:
                if not await self._local_back(deadline):
                    log.warning("mesh: client %r refused: router(s) %s of this node, which may hold its "
                                "session, stayed down for %g s", client_id, ", ".join(sorted(down)),
                                LOCAL_DOWN_WAIT_S)
                    return TAKEOVER_UNAVAILABLE
                continue
            waiter = self._ask_takeover(client_id, claim)
            asked = set(waiter.waiting)
            result = await waiter.future
            if answered is not None:
                answered |= asked - waiter.missed - waiter.waiting
            if result is not None:  # a transfer broke off: that router keeps the session
                self._settle(client_id, waiter.offers, failed=True)
                return result
            if waiter.offers:
                return self._settle(client_id, waiter.offers, claim=claim)
            if any(self.peers[rid].node_id == self.node_id for rid in waiter.missed):
                continue
            if self.replication is not None and not asked_again and (waiter.missed or self._just_parked()):
                # A router of another node fell silent instead of answering, or a moment ago: once
                # it counts as gone everywhere, the follower holding its sessions answers for it.
                asked_again = True
                await self._gone(waiter.missed)
                continue
            if self.replication is not None:  # the follower holding it may be this router
                return self._take_local_replica(client_id, claim)
            return result
        return None

    def _settle(self, client_id: str, offers: list[tuple[str | None, int, dict]], failed: bool = False,
                claim: list | None = None) -> dict:
        """Every router asked has answered a takeover; pick the session state this router takes.
        Normally one router offers it. More than one when replicas of silent routers hold
        copies beside the live one, or beside each other, and two live routers for a moment
        after a partition healed (before the fence reached the side that was cut off): a copy a
        live router offers is the session, the most recent of them (``recency``: the highest
        ownership epoch) where there are two; among replicas' copies, the most recent. Every
        router that offered one drops its copy (TAKEOVER_DONE true: the one taken and the older
        ones alike); the silent routers whose copies were passed over are fenced
        (``Replication.fence``), the one taken by ``Replication.adopted``. ``failed``: a transfer
        broke off, nothing is taken and every offer stays where it is; so does a ``claim`` the
        chosen copy's owner refuses (``ownership.refused_by``)."""
        if failed:
            for rid, req, state in offers:
                self._done(rid, req, False)
                if rid is None:  # this router's own replica: it stays held here
                    self.replication.replica_moved(client_id, False)
                drop_named(state)
            return TAKEOVER_FAILED
        live = [o for o in offers if not o[2].get("replica")]
        if not live and self.replication is not None:
            local = self.replication.take_replica(client_id)  # this router may hold a newer copy
            if local is TAKEOVER_FAILED:  # (its copies could not be spooled: it stays held here)
                return self._settle(client_id, offers, failed=True)
            if local is not None:
                offers.append((None, 0, local))
        best = max(live or offers, key=lambda o: recency(o[2]))
        chosen = best[2]
        refused = refused_by(claim, chosen, best[0] or chosen.get("replica"))
        if refused is not None:
            self._settle(client_id, offers, failed=True)
            return refused
        if len(live) > 1:
            log.warning("mesh: session %s was offered by %d live routers (%s): the most recent copy is taken, "
                        "the others dropped", client_id, len(live), ", ".join(sorted(str(o[0]) for o in live)))
        stale: list[str] = []
        for rid, req, state in offers:
            if state.get("replica"):
                stale += state.get("stale_replicas", ())
                if state is not chosen:
                    stale.append(state["replica"])
            if rid is None:  # this router's own replica: its copy is kept until confirmed
                if state is chosen:
                    self._await_confirm(client_id, None, 0)
                else:
                    self.replication.replica_moved(client_id, True)  # an older copy: dropped
                continue
            if state is chosen:
                state["offered_by"] = rid  # (the agreement's claim checks it against the record)
                # Confirmed once its interest is known everywhere and it is in this router's
                # snapshot (``confirm_takeover``): a live router then hands on all that still
                # reaches it; a replica's holder drops its copy only when this one is durable.
                self._await_confirm(client_id, rid, req, state.get("handon_from"))
                continue
            self._done(rid, req, True)
            drop_named(state)
        if stale and self.replication is not None:
            log.warning("mesh: session %s: copies of it held for silent router(s) %s are older than the one "
                        "taken; passed over", client_id, ", ".join(sorted(set(stale))))
            self.replication.fence(client_id, stale)
        return chosen

    def _await_confirm(self, client_id: str, rid: str | None, req: int, handon_from: Any = None) -> None:
        """The session taken from router ``rid`` (None: this router's replica) is confirmed by
        ``confirm_takeover``, at the latest ``CONFIRM_S`` from now. ``handon_from``: where the
        old owner's logs stood when it exported the session (``_release``)."""
        self.confirm_takeover(client_id)  # a confirmation still due for an earlier one
        timer = self.loop.call_later(CONFIRM_S, self.confirm_takeover, client_id)
        self._unconfirmed_takeovers[client_id] = (rid, req, timer, handon_from)

    def _take_local_replica(self, client_id: str, claim: list | None = None) -> dict | object | None:
        """The session from the replica this router holds (nobody else offered one)."""
        state = self.replication.take_replica(client_id)
        if state is not None and state is not TAKEOVER_FAILED:
            refused = refused_by(claim, state, state.get("replica"))  # type: ignore[arg-type]
            if refused is not None:
                self.replication.replica_moved(client_id, False)  # it stays held here
                drop_named(state)
                return refused
            self._await_confirm(client_id, None, 0)
        return state

    def abort_takeover(self, client_id: str) -> None:
        """See ``MeshPort.abort_takeover``: the router that offered the session keeps it (told
        TAKEOVER_DONE false), or this router's replica keeps holding it."""
        pending = self._unconfirmed_takeovers.pop(client_id, None)
        early = self._early_handons.pop(client_id, None)
        if early:
            log.warning("mesh: %d message(s) handed on for session %s, whose move here was not agreed, dropped "
                        "(the old owner keeps the session)", len(early), client_id)
        if pending is None:
            return
        rid, req, timer, _ = pending
        timer.cancel()
        if rid is None:
            self.replication.replica_moved(client_id, False)
        else:
            self._done(rid, req, False)

    def confirm_takeover(self, client_id: str, acked: list | None = None) -> None:
        """A session taken over (``_settle``) is here, in this router's snapshot, and the interest
        its subscriptions announced has been acknowledged (``acked``: the results of those waits,
        each {router: its log end when it took the announcement in}; None: nothing waited):
        tell its old owner, TAKEOVER_DONE (a live router then hands on what still reaches it for
        the session, ``Router.hand_on``; a replica's holder, this router's included, drops its
        copy). And remember from which offset of each router's log its
        messages come here directly, so that the copies handed on are not delivered twice: that
        end for a router that acknowledged every announcement, how far this router has seen its
        log where nothing was announced (the session's filters were this router's already), this
        router's own log end; none (every copy counts) for a router that did not acknowledge."""
        pending = self._unconfirmed_takeovers.pop(client_id, None)
        early = self._early_handons.pop(client_id, None)
        if early:
            self.router.take_copies(client_id, early)
        if pending is None:
            return
        rid, req, timer, handon_from = pending
        timer.cancel()
        marks: dict[str, int] = {}
        ends = [a for a in acked or () if a.__class__ is dict]
        if not acked or len(ends) == len(acked):
            for prid, peer in self.peers.items():
                mark = peer.origin_mark
                if acked:
                    if any(prid not in e for e in ends):
                        continue
                    mark = max(mark, *(e[prid] for e in ends))
                if mark >= 0:
                    marks[prid] = mark
        commit_log = self.router.commit_log
        if commit_log is not None:
            marks[self.router_id] = commit_log.next_offset
        now = time.monotonic()
        kept = self._handon_marks
        for cid in [c for c, (_, until) in kept.items() if until < now]:
            del kept[cid]
        kept[client_id] = (marks, now + HANDON_KEEP_S)
        session = self.router.sessions.get(client_id)
        if (rid is not None and handon_from_ok(handon_from) and session is not None and session.persistent
                and session.subscriptions):
            # Until the old owner's last SESSION_HANDON, what reached it for the session is there
            # only; should it fall silent first, that is read back (``_handons_lost``).
            due = self._handons_due
            for cid in [c for c, entry in due.items() if entry[3] < now]:
                del due[cid]
            due[client_id] = [rid, handon_from, marks, now + self.config.mesh_forget, False]
            old = self.peers.get(rid)
            if old is not None and not old.alive:
                self._handons_lost(rid)
        if rid is None:
            self.replication.replica_moved(client_id, True)
        else:
            self._done(rid, req, True)

    def hand_on(self, router_id: str, client_id: str, items: list, answered: dict | None = None,
                stale: bool = False) -> None:
        """Copies for ``client_id``, which moved to ``router_id``, that reached this router
        after it was handed over (``Router.hand_on``); the last frame says so, even with none
        (the new owner stops waiting for them: ``_handons_lost``). The last frame also names the
        routers that did not answer the barrier before it (``answered``: those that did), with
        how far this router had seen their logs: what they sent here before they knew of the
        move may still be on its way (a link cut between them and this router alone), and
        arrive after the session left; the new owner asks them for it (``_handed_on``).
        ``stale``: from a copy the agreement fenced (``Router.fence_stale``): the new owner takes
        every copy, since this router's messages did not go to it directly meanwhile."""
        peer = self.peers.get(router_id)
        parked = peer is not None and not peer.alive and peer.parked and not self.closed
        if peer is None or not (peer.alive or parked) or self.closed:
            if items:
                log.warning("mesh: %d message(s) for session %s not handed on: its new router %s is gone",
                            len(items), client_id, router_id)
            return
        unheard = None
        if answered is not None:
            unheard = {rid: p.origin_mark for rid, p in self.peers.items()
                       if rid not in answered and rid != router_id and p.origin_mark >= 0}
        for i in range(0, max(len(items), 1), HANDON_ITEMS):
            last = i + HANDON_ITEMS >= len(items)
            body = [client_id, items[i:i + HANDON_ITEMS], last]
            if stale:
                body = [*body, unheard if last else None, True]
            elif last and unheard:
                body = [*body, unheard]
            if not parked:
                self._send(peer, SESSION_HANDON, body)
                continue
            # Silent here (a fenced copy hands on as the partition heals, before the mesh hears
            # the new owner again): kept for it, with the publishes it is owed, in order.
            self._keep(peer, self._frame(SESSION_HANDON, body), len(body[1]))
            if peer.replay_from is not None and body[1]:
                log.warning("mesh: %d message(s) for session %s not handed on: the backlog kept for its new "
                            "router %s is full", len(body[1]), client_id, router_id)

    def _handons_lost(self, router_id: str) -> None:
        """Router ``router_id`` fell silent (or restarted) before it had handed on all that
        reached it for sessions that moved here from it: those copies are in logs, its own
        (read from its replica, or from it once back) from where it stood at the export, and
        each origin's from where the old owner had seen it to where its messages came here
        directly (``Replication.read_back_handon``). At least once."""
        self._read_handons(router_id, False)

    def _read_handons(self, router_id: str, back: bool) -> None:
        """``_handons_lost`` (``back`` False), or ``router_id`` heard again (``back``): its own
        log's part, which neither it nor a replica could be asked for while it was silent (a
        router of this node, whose log has no replica elsewhere, restarted), now from it."""
        due = self._handons_due
        now = time.monotonic()
        for cid in [c for c, entry in due.items() if entry[0] == router_id and entry[4] == back]:
            entry = due.pop(cid)
            _, (since_ms, seen), marks, until, _ = entry
            session = self.router.sessions.get(cid)
            if until < now or session is None or self.replication is None:
                continue
            asked, own = self.replication.read_back_handon(session, router_id, since_ms, seen,
                                                           {} if back else marks, only_old=back)
            if not own and not back:
                entry[4] = True
                due[cid] = entry
            log.warning("mesh: router %s %s before it had handed on what reached it for session %s after it moved "
                        "here: %d router(s) asked to read it back", router_id, "came back" if back else "fell silent",
                        cid, asked)

    def _handed_on(self, client_id: str, items: list, last: bool, unheard: Any = None, stale: Any = False) -> None:
        """Copies handed on by a session's old router: those that also came here directly (at
        or beyond the marks of ``confirm_takeover``) are dropped, the rest delivered. With the
        last: ``unheard``, the routers that had not answered the old router's barrier, {router:
        how far it had seen that router's log}: their copies between there and where they send
        here directly (the marks) are read back from their logs (SESSION_CATCHUP). At least once.
        ``stale``: from a copy the agreement fenced: all are delivered (no marks apply)."""
        if last:
            entry = self._handons_due.pop(client_id, None)
            if unheard.__class__ is dict and unheard and entry is not None:
                self._ask_unheard(client_id, entry, unheard)
        marks = self._handon_marks.get(client_id, ({}, 0.0))[0]
        if marks and stale is not True:
            kept = []
            for item in items:
                values = item[2]
                mark = marks.get(values[5])
                if mark is None or values[6] is None or values[6] < mark:
                    kept.append(item)
            items = kept
        if not items:
            return
        if client_id not in self.router.sessions and client_id in self._unconfirmed_takeovers:
            # Its old copy was fenced (its node learnt of the agreed move) before this router
            # imported the session: held until it has (``confirm_takeover``).
            self._early_handons.setdefault(client_id, []).extend(items)
            return
        self.router.take_copies(client_id, items)

    def _ask_unheard(self, client_id: str, entry: list, unheard: dict) -> None:
        _, (since_ms, _seen), marks, _, _ = entry
        session = self.router.sessions.get(client_id)
        if session is None or self.replication is None or not session.subscriptions:
            return
        asked = self.replication.read_back_unheard(session, since_ms, unheard, marks)
        if asked:
            log.info("mesh: session %s: router(s) %s had not answered its old router when it handed on: asked "
                     "for what they sent there before they knew of the move", client_id, ", ".join(asked))

    def _done(self, rid: str | None, req: int, ok: bool) -> None:
        """Tell router ``rid`` (None: this one, nothing to tell) whether the session it offered
        for takeover ``req`` was taken. A confirmation is remembered, to be said again if that
        router turns out to have taken this one for silent meanwhile (``_confirm_again``)."""
        peer = self.peers.get(rid) if rid is not None else None
        if peer is None:
            return
        if ok:
            now = time.monotonic()
            sent = self._takeovers_confirmed.setdefault(peer.router_id, {})
            _drop_older(sent, now - self.config.mesh_forget, lambda when: when)
            sent[req] = now
        if peer.alive:
            self._send(peer, TAKEOVER_DONE, [req, ok])

    def _confirm_again(self, peer: Peer) -> None:
        """``peer`` is heard again after a silence (on either side): the takeovers confirmed to
        it lately are confirmed again. One it missed, or never got because it was silent here,
        left it keeping the session it gave, in doubt (``_move_expired``); one it had already is
        ignored there."""
        sent = self._takeovers_confirmed.get(peer.router_id)
        if not sent:
            return
        _drop_older(sent, time.monotonic() - self.config.mesh_forget, lambda when: when)
        for req in sent:
            self._send(peer, TAKEOVER_DONE, [req, True])

    def silent_since(self, peer: Peer) -> float:
        """When ``peer`` fell silent, as a Unix time: a mesh timeout before it was parked here
        (now, if it is not parked)."""
        now = time.time()
        if not peer.parked:
            return now
        return now - (time.monotonic() - peer.parked_at) - self.config.mesh_timeout

    def _just_parked(self) -> list[Peer]:
        """Routers of other nodes parked so recently that the other routers may not count them
        as gone yet."""
        now = time.monotonic()
        skew = park_skew(self.config)
        return [p for p in self.peers.values()
                if p.parked and p.node_id != self.node_id and now - p.parked_at < skew]

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

    def _ask_takeover(self, client_id: str, claim: list | None = None) -> _Waiter:
        alive = self._alive()
        waiter = _Waiter(self.loop, alive)
        if not alive:
            waiter.future.set_result(None)
            return waiter
        req = next(self._req_ids)
        self._waiters[req] = waiter
        self._flush()
        # Whether this router spools the copies of a backlog moved to it (``router.spool``: it
        # has a log): then the old router sends all of it, else at most max_queued.
        body = [req, client_id, self.router.commit_log is not None]
        frame = self._frame(TAKEOVER_REQ, body if claim is None else [*body, claim])
        for rid in alive:
            link = self.peers[rid].link
            if link is not None:
                link.send(frame)
        self.loop.call_later(ACK_TIMEOUT_S + 1.0, self._expire_waiter, req, "takeover")
        return waiter

    def _expire_waiter(self, req: int, what: str) -> None:
        transfers = [k for k in self._incoming if k[0] == req]
        if transfers:
            now = time.monotonic()
            if any(now - self._incoming[k].progress < ACK_TIMEOUT_S for k in transfers):
                self.loop.call_later(ACK_TIMEOUT_S, self._expire_waiter, req, what)
                return  # a session is still arriving, chunk by chunk
            for key in transfers:
                self._transfer_failed(key, "no progress")
        waiter = self._waiters.pop(req, None)
        if waiter is not None and not waiter.future.done():
            log.warning("mesh: %s request %d unanswered by %s; continuing", what, req,
                        ", ".join(sorted(waiter.waiting)))
            waiter.missed |= waiter.waiting
            waiter.finish()

    # -- receiving ------------------------------------------------------------------------------------

    def _on_readable(self, sock: zmq.Socket) -> None:
        """Frames waiting on ``sock``, until ``RECV_MSGS`` forwarded messages (or ``RECV_BATCH``
        frames) were handled: then the loop's other work (client reads under the turn budget,
        writes) runs before the next frames, so a backlog of frames cannot stall every client of
        this router for the time of thousands of deliveries."""
        now = time.monotonic()
        if now >= self.pause_deadline or (self.replication is not None and now >= self.replication.recount_at):
            self.check_paused()
        n = 0
        msgs = 0
        unpackb = msgpack.unpackb
        try:
            while n < RECV_BATCH and msgs < RECV_MSGS:
                try:
                    data = sock.recv(zmq.NOBLOCK)
                except zmq.Again:
                    return
                n += 1
                try:
                    frame = unpackb(data, raw=False, strict_map_key=False)
                except (ValueError, TypeError, msgpack.UnpackException):
                    self._bad("?", f"undecodable frame of {len(data)} bytes")
                    continue
                problem = check_envelope(frame)
                if problem is not None:
                    self._bad("?", problem)
                    continue
                version, kind, sender, inc, body = frame
                if version != MESH_VERSION:
                    if sender not in self._version_warned:
                        self._version_warned.add(str(sender))
                        log.error("mesh: refusing frames from %s: mesh version %s, this node speaks %d "
                                  "(run the same brokerd version on every node)", sender, version,
                                  MESH_VERSION)
                    continue
                problem = check_body(kind, body)
                if problem is not None:
                    self._bad(sender, problem)
                    continue
                if kind == PUBLISH:
                    msgs += len(body[1])
                try:
                    self._handle(kind, sender, inc, body, len(data))
                except Exception as exc:  # noqa: BLE001 - a peer's frame must not stop the mesh
                    self._bad(sender, f"{KIND_NAMES[kind]} frame could not be handled: {exc!r}")
        except zmq.ZMQError:
            return
        # More may be waiting: ZeroMQ's descriptor is edge-triggered, so come back without it.
        self.loop.call_soon(self._on_readable, sock)

    def _bad(self, sender: str, problem: str) -> None:
        """Drop a bad frame: counted always, logged once per sender."""
        self.router.stats.mesh_bad_frames += 1
        if sender not in self._bad_logged:
            self._bad_logged.add(sender)
            log.error("mesh: dropped a bad frame from %s: %s (further ones from it are counted as "
                      "mesh bad_frames, not logged)", sender, problem)

    def _handle(self, kind: int, sender: str, inc: int, body: Any, size: int) -> None:
        peer = self.peers.get(sender)
        if kind == HELLO:
            self._on_hello(sender, inc, body)
            return
        if peer is None or peer.incarnation != inc:
            if kind != GOODBYE:
                # A frame from an incarnation we have not met yet: wait for its hello, which the
                # other side sends first on every new link.
                log.debug("mesh: %s frame from unknown %s; ignored", KIND_NAMES.get(kind), sender)
            return
        peer.last_seen = time.monotonic()
        if not peer.alive and kind != GOODBYE:
            self._rejoin(peer, "heard again")
        if kind == ECHO:
            if body[0] == self.incarnation and self.lease is not None:
                self.lease.echoed(peer.node_id, body[1], body[2], peer.last_seen)
            return
        router = self.router
        if kind == PUBLISH:
            seq, batch, mark = body
            seen = peer.seqs_seen
            if seq <= peer.seq_in and (seq in seen or seq <= peer.seq_in - SEEN_WINDOW):
                return  # sent again to a new incarnation of ours, or twice: we have it
            # A number below the highest that is not among those seen: a frame our previous
            # incarnation never read, sent again after newer ones reached us (the sender's link
            # reconnected to us before it knew we had restarted).
            seen[seq] = None
            if len(seen) > SEEN_WINDOW:
                del seen[next(iter(seen))]
            if seq > peer.seq_in:
                peer.seq_in = seq
            if mark > peer.origin_mark:
                peer.origin_mark = mark
            stats = router.stats
            stats.mesh_frames_in += 1
            stats.mesh_msgs_in += len(batch)
            stats.mesh_bytes_in += size
            peer.stats[2] += len(batch)
            peer.stats[3] += size
            bad = router.deliver_forwarded(batch, sender)
            if bad:
                log.error("mesh: dropped %d malformed message(s) from %s", bad, sender)
            if router.commit_log is not None:
                peer.unwritten.append((seq, router.commit_log.next_offset - 1))
                if len(peer.unwritten) > SEEN_WINDOW:  # the log stalls (a failing disk): as before,
                    peer.unwritten.popleft()  # confirmed on receipt
        elif kind == INTEREST:
            seq, changes = body[0], body[1]
            if len(body) == 3 and body[2]:
                router.peer_left(sender)  # a full announcement replaces everything it said before
                peer.interest_known = True
            for topic_filter, add in changes:
                router.peer_interest(sender, topic_filter, add)
            if seq is not None:
                if self._dirty:  # what was collected before it goes first: the answer follows it
                    self._flush()
                # With where this router's log is now: its own messages from there on that the
                # filters match go to the announcer (a session moved there counts on it).
                commit_log = router.commit_log
                self._send(peer, INTEREST_ACK, [seq, commit_log.next_offset if commit_log is not None else -1])
        elif kind == INTEREST_ACK:
            seq, end = body
            waiter = self._waiters.get(seq)
            if waiter is not None and waiter.ends is not None:
                waiter.ends[sender] = end
            self._answer(seq, sender)
        elif kind == RETAINED:
            for t in body:
                router.peer_retained(Message.from_list(t))
        elif kind == TAKEOVER_REQ:
            self._release(peer, *body)
        elif kind == TAKEOVER_RESP:
            req, state, more = body[:3]
            if state is None:  # none there, or (a fourth value, [owner]) another identity's
                self._answer(req, sender, refusal(body[3][0], sender) if len(body) > 3 else None)
                return
            state.pop("spool", None)  # (this router's to name, never a peer's)
            state.pop("spool_marks", None)
            waiter = self._waiters.get(req)
            if waiter is None or waiter.future.done():
                self._send(peer, TAKEOVER_DONE, [req, False])  # nobody here takes it: it stays there
                return
            items, state["queue"] = state["queue"], []
            transfer = _Transfer(state)
            self._incoming[(req, sender)] = transfer
            self._arrived(peer, req, transfer, items, not more)
        elif kind == TAKEOVER_CHUNK:
            req, items, last = body
            transfer = self._incoming.get((req, sender))
            if transfer is None:
                if last:
                    self._send(peer, TAKEOVER_DONE, [req, False])
                return
            transfer.progress = time.monotonic()
            self._arrived(peer, req, transfer, items, last)
        elif kind == SESSION_HANDON:
            self._handed_on(*body[:5])
        elif kind == TAKEOVER_DONE:
            req, ok = body
            client_id = self._moves.pop((sender, req), None)
            if client_id is not None:
                self._moved(client_id, ok, sender)
                return
            doubt = self._in_doubt.pop((sender, req), None)
            if doubt is not None and ok:
                router.moved_after_all(doubt[0], sender)
        elif kind == SYNC_REQ:
            snapshot = router.retained_snapshot()
            for i in range(0, len(snapshot), 1000):
                self._send(peer, RETAINED, [m.to_list() for m in snapshot[i:i + 1000]])
        elif kind == RESYNC:
            self._announce_all(peer)
            self._confirm_again(peer)  # it had taken us for silent: our confirmations may be lost
        elif kind == CATCHUP:
            self._start_replay(peer, body, "it restarted and asks for what it may have missed")
        elif kind == GOODBYE:
            self._park(peer, "said goodbye")
            peer.left = True
        elif kind == SESSION_GONE:
            partition, client_ids = body[0], body[1]
            wills = body[2] if len(body) == 3 else []
            if partition == self.router_id:  # (also before replication is set up at a start)
                router.drop_stale_sessions(client_ids)
                router.wills_published_elsewhere(wills)
            elif self.replication is not None:
                self.replication.session_gone(partition, client_ids, wills)
        elif self.replication is None:
            return  # replication frames for a router that replicates nothing (R = 1 here)
        elif kind == REPLICATE:
            self.replication.replicate(peer, *body)
        elif kind == REPLICA_ACK:
            self.replication.acknowledged(sender, *body)
        elif kind == REPLICA_FETCH:
            self.replication.fetch(peer, *body)
        elif kind == REPLICA_CATCHUP:
            self.replication.catchup(peer, *body)
        elif kind == REPLICA_PUBLISH:
            self.replication.replayed(*body)
        elif kind == SESSION_STATE:
            self.replication.session_state(peer, *body)
        elif kind == SESSION_CATCHUP:
            self.replication.session_catchup(peer, *body)
        elif kind == SESSION_COPIES:
            router.take_copies(body[0], body[1], read_back=True)
        elif kind == SESSION_RESTORE:
            self.replication.restore_sessions(peer, body)
        elif kind == SESSION_RESTORED:
            self.replication.restored(sender, *body)
        elif kind == HISTORY_FETCH:
            self.replication.history_fetch(peer, *body)
        elif kind == HISTORY:
            self.replication.history(sender, *body)

    # -- session transfers ----------------------------------------------------------------------------

    def _release(self, peer: Peer, req: int, client_id: str, spools: bool = False, claim: list | None = None,
                 until: float | None = None) -> None:
        """``peer`` takes ``client_id`` over: answer with the session's header and its first
        chunk of copies, then stream the rest, one chunk per loop iteration. All of them where
        ``peer`` spools them (``router.spool``); else at most max_queued.

        A session being moved already (an earlier request, which its router may have given up
        while this one was stopped or silent) is answered once that move settles, bounded by
        ``ACK_TIMEOUT_S``: answered at once, "no session" would have the asker make a new,
        empty one while the session stays here (chaos seed 1745875908)."""
        if client_id in self.router.moving and peer.alive and not self.closed:
            now = time.monotonic()
            until = now + ACK_TIMEOUT_S if until is None else until
            if now < until:
                self.loop.call_later(0.01, self._release, peer, req, client_id, spools, claim, until)
                return
        if claim is not None:  # the asker's CONNECT is another identity's: nothing is let go
            owner = self.router.claim_refused(client_id, claim[0], claim[1])
            if owner is not None:
                self._send(peer, TAKEOVER_RESP, [req, None, False, owner])
                return
        limit = None if spools else -1
        released = self.router.release_session(client_id, peer.node_id == self.node_id, limit)
        if released is None and self.replication is not None:
            released = self.replication.release_replica(client_id, limit)  # its router is silent
        self._flush()
        if released is None:
            self._send(peer, TAKEOVER_RESP, [req, None, False])
            return
        header, chunks = released
        if not header.get("replica"):
            # Routers silent here may hold, for this router, messages they routed to the session
            # here; they arrive after it left when they are heard again (a partition that cut
            # only this link: the new owner may hear them all along). It asks them for what they
            # published since (``Replication.moved_past_silence``).
            silent = {rid: int(self.silent_since(p) * 1000) for rid, p in self.peers.items() if p.parked}
            if silent:
                header["silent"] = silent
            # Where this router stood in each log when the session left: what reaches it for the
            # session from there on is handed on, or, should this router die first, read back
            # (``_handons_lost``): [now (Unix ms), {router: its log's offset as seen here}].
            seen = {rid: p.origin_mark for rid, p in self.peers.items() if p.origin_mark >= 0}
            commit_log = self.router.commit_log
            if commit_log is not None:
                seen[self.router_id] = commit_log.next_offset
            header["handon_from"] = [int(time.time() * 1000), seen]
        header["queue"] = next(chunks, [])
        following = next(chunks, None)
        key = (peer.router_id, req)
        self._moves[key] = client_id
        self.loop.call_later(MOVE_TIMEOUT_S, self._move_expired, key)
        self._send(peer, TAKEOVER_RESP, [req, header, following is not None])
        if following is not None:
            self._stream(peer, key, chunks, following)

    def _stream(self, peer: Peer, key: tuple[str, int], chunks: Any, chunk: list) -> None:
        if key not in self._moves or not peer.alive or peer.link is None or self.closed:
            return  # the transfer failed meanwhile (the session stayed here)
        if peer.link.pending:  # wait for the link to drain: chunks are never dropped
            self.loop.call_later(0.005, self._stream, peer, key, chunks, chunk)
            return
        following = next(chunks, None)
        self._send(peer, TAKEOVER_CHUNK, [key[1], chunk, following is None])
        if following is not None:
            self.loop.call_soon(self._stream, peer, key, chunks, following)

    def _move_expired(self, key: tuple[str, int]) -> None:
        """The new owner of an exported session fell silent, or never confirmed: it stays here,
        in doubt until that router, heard again, confirms (or a client resumes it here)."""
        client_id = self._moves.pop(key, None)
        if client_id is None:
            return
        now = time.monotonic()
        _drop_older(self._in_doubt, now - self.config.mesh_forget, lambda entry: entry[1])
        self._in_doubt[key] = (client_id, now)
        self._moved(client_id, False, key[0], doubt=True)

    def _moved(self, client_id: str, ok: bool, to: str | None = None, doubt: bool = False) -> None:
        """A session exported to another router (by this router, or from a replica held here)
        is with its new owner ``to`` (``ok``), or stays here (``doubt``: for now)."""
        self.router.moved(client_id, ok, to, doubt)
        if self.replication is not None:
            self.replication.replica_moved(client_id, ok)

    def _arrived(self, peer: Peer, req: int, transfer: _Transfer, items: list, last: bool) -> None:
        """Copies of a session arriving. Where this router has a log, all go to a spool file
        (``router.spool``: synced before the session is taken, so before its old router lets it
        go; read back as the session drains, kept across a restart, any number in bounded
        memory); a spool that cannot be written (a full disk) fails the transfer, and the
        session stays where it was. Without a log: up to max_queued into its queue, the rest
        dropped and counted (as a session without a log keeps no more)."""
        key = (req, peer.router_id)
        commit_log = self.router.commit_log
        if commit_log is None:
            queue = transfer.state["queue"]
            room = max(self.config.max_queued - len(queue), 0)
            if len(items) > room:
                self.router.stats.drop_queue_full += len(items) - room
                items = items[:room]
            queue += items
        elif items:
            try:
                if transfer.spool is None:
                    transfer.spool = SpoolWriter(commit_log.directory)
                transfer.spool.add(items)
            except OSError as exc:
                self._transfer_failed(key, f"its queued copies could not be spooled: {exc}")
                return
        if not last:
            return
        spool = transfer.spool
        if spool is not None:
            try:
                spool.finish_into(transfer.state)
            except OSError as exc:
                self._transfer_failed(key, f"its spooled copies could not be synced: {exc}")
                return
            transfer.spool = None
            if spool.count > self.config.max_queued:
                log.info("mesh: session %s from %s: %d queued copies (more than --max-queued %d) spooled to disk",
                         transfer.state.get("client_id"), peer.router_id, spool.count, self.config.max_queued)
        del self._incoming[key]
        self._take(peer, req, transfer.state)

    def _take(self, peer: Peer, req: int, state: dict) -> None:
        """A whole session arrived: an offer, settled (TAKEOVER_DONE) once every router asked
        has answered (``_settle``); if the request is over, it stays where it was."""
        waiter = self._waiters.get(req)
        if waiter is None or waiter.future.done():
            self._send(peer, TAKEOVER_DONE, [req, False])
            drop_named(state)
            return
        waiter.offers.append((peer.router_id, req, state))
        self._answer(req, peer.router_id)

    def _transfer_failed(self, key: tuple[int, str], why: str) -> None:
        """A session stopped arriving: its old owner keeps it, and the CONNECT waiting for it is
        refused rather than given an empty session."""
        transfer = self._incoming.pop(key, None)
        if transfer is not None and transfer.spool is not None:
            transfer.spool.discard()
        req, sender = key
        log.warning("mesh: session transfer %d from %s failed (%s); it stays there", req, sender, why)
        peer = self.peers.get(sender)
        if peer is not None and peer.alive:
            self._send(peer, TAKEOVER_DONE, [req, False])
        waiter = self._waiters.get(req)
        if waiter is not None and waiter.result is None:
            waiter.result = TAKEOVER_FAILED

    def _answer(self, req: int, router_id: str, result: Any = None) -> None:
        """``router_id`` answered request ``req`` (or left: counts as an empty answer)."""
        waiter = self._waiters.get(req)
        if waiter is not None:
            waiter.answer(router_id, result)
            if waiter.future.done():
                del self._waiters[req]

    # -- membership -----------------------------------------------------------------------------------

    def _hello_body(self) -> dict:
        known = [[p.router_id, p.node_id, p.ipc, p.tcp] for p in self.peers.values() if p.alive]
        # Each confirmation names the incarnation whose frames it counts: a HELLO queued for a
        # peer that restarted meanwhile must not confirm its new incarnation's frames.
        acks = {p.router_id: [p.incarnation, self._confirmable(p)] for p in self.peers.values() if p.seq_in}
        commit_log = self.router.commit_log
        body = {"node": self.node_id, "ipc": self.ipc, "tcp": self.tcp, "peers": known, "acks": acks,
                "stats": self.stats_tcp, "log": commit_log.next_offset if commit_log is not None else -1}
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
        """The number up to which ``peer``'s PUBLISH frames can be confirmed: received, and the
        copies our log made of them written (durable with --fsync always). A crash loses what is
        not confirmed from the sender's ring, which sends it to our next incarnation; confirmed
        on receipt alone, a copy still in memory would be lost with the crash."""
        pending = peer.unwritten
        if pending:
            commit_log = self.router.commit_log
            done = commit_log.durable_offset if self.config.fsync == "always" else commit_log.written_offset
            while pending and pending[0][1] <= done:
                pending.popleft()
            if pending:
                return min(peer.seq_in, pending[0][0] - 1)
        return peer.seq_in

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
            peer.link = self._link(endpoint)
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
                log_now = body.get("log", -1)
                catchup = peer.origin_mark if log_now < 0 else min(peer.origin_mark, log_now)
                # What its old incarnation had not read is lost with it; what was kept for it
                # while it was silent goes to the new one, whose restored sessions want it.
                self._park(peer, "restarted")
                peer.link.reset()
                # Its request numbers start again: what was in doubt with the old one, and what
                # we confirmed to it, cannot be told from the new one's.
                for key in [k for k in self._in_doubt if k[0] == sender]:
                    del self._in_doubt[key]
                self._takeovers_confirmed.pop(sender, None)
                peer.seq_in = 0  # its frames are numbered anew
                peer.seqs_seen.clear()
                peer.unwritten.clear()
                # What its old incarnation never confirmed goes to the new one first.
                peer.resend = [frame for seq, frame in peer.ring if seq > peer.acked]
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
            self._confirmed(peer, acked[1])
        peer.seen_of_me = body.get("seen", {}).get(self.router_id, -1)
        peer.hears = frozenset(p[0] for p in body.get("peers", ()))
        beat = body.get("beat")
        if beat is not None:
            self._echo(peer, inc, beat)
        claim = body.get("marks", {}).get(self.router_id)
        if claim is not None and peer.origin_mark >= peer.claim_floor and claim > peer.origin_mark:
            peer.origin_mark = claim
        for rid, node, ipc, tcp in body.get("peers", ()):
            if rid != self.router_id and rid not in self.peers:
                endpoint = ipc if node == self.node_id else tcp
                if endpoint:
                    self._send_hello(self._link(endpoint))

    def _echo(self, peer: Peer, inc: int, beat: list[int]) -> None:
        """Answer a peer's beat at once (its lease, ``cluster.quorum.Lease``), unless it is
        fenced: this router parked that incarnation at that epoch or a later one, and so voted it
        gone. Nor in the first mesh timeout after this router started or took the peer in (met
        it, heard it again, a new incarnation of it): until then another router may still count
        our last HELLO without it as a vote that it is gone (our previous incarnation's vote, whose
        fence went with it, or our own before we heard it again); by the end of that time it has
        our HELLOs saying we hear it."""
        peer.beat_epoch = beat[0]
        fence = peer.fence
        if fence is not None and fence[0] == inc and beat[0] <= fence[1]:
            return
        if time.monotonic() - max(self._started, peer.since) < self.config.mesh_timeout or peer.link is None:
            return
        try:
            peer.link.sock.send(self._frame(ECHO, [inc, beat[0], beat[1]]), zmq.NOBLOCK)
        except zmq.Again:
            pass  # a blocked link: the next beat is echoed instead

    def _announce_all(self, peer: Peer) -> None:
        """Everything this router announces, as one full announcement (it replaces the last)."""
        changes = self.router.interest_announcements()
        for i in range(0, max(len(changes), 1), 5000):
            self._send(peer, INTEREST, [None, changes[i:i + 5000], i == 0])

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
        self._announce_all(peer)
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
        peer.dropped = 0
        peer.replay_from = None
        peer.log_mark = self.router.commit_log.next_offset if self.router.commit_log is not None else None
        log.warning("mesh: router %s %s; keeping its interest and up to %d bytes of frames for it for "
                    "%g s", peer.router_id, why, self.config.mesh_backlog, self.config.mesh_forget)
        self.router.peer_silent(peer.router_id)
        if peer.link is not None:
            for frame in peer.link.park():
                self._keep(peer, frame, 0)
            self._blocked_links.discard(peer.link)
        for key in [k for k in self._incoming if k[1] == peer.router_id]:
            self._transfer_failed(key, why)
        for key in [k for k in self._moves if k[0] == peer.router_id]:
            self._move_expired(key)  # it may never confirm: the session stays here
        if self._handons_due:
            self._handons_lost(peer.router_id)
        for req, waiter in list(self._waiters.items()):
            if peer.router_id in waiter.waiting:
                waiter.missed.add(peer.router_id)
            self._answer(req, peer.router_id)
        if self._interest_waiter is not None:
            self._interest_waiter.answer(peer.router_id)
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
        backlog, kept, msgs, dropped = peer.backlog, peer.backlog_bytes, peer.backlog_msgs, peer.dropped
        peer.parked = False
        peer.backlog, peer.backlog_bytes, peer.backlog_msgs, peer.dropped = [], 0, 0, 0
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
            peer.link.pending.extend(backlog)
            self._blocked(peer.link)
        replay_from, peer.replay_from = peer.replay_from, None
        self._joined(peer, quiet=was_parked)
        if self._handons_due:
            self._read_handons(peer.router_id, True)
        if why != "restarted":
            self._confirm_again(peer)
        if was_parked and why != "restarted" and self.replication is not None:
            # (A restarted router's own catch-up reads its log back by our interest as it is now.)
            self._replication_hook(self.replication.moved_in_catchup, peer, silent_since)
        self._send(peer, RESYNC, None)
        if replay_from is not None:
            self._start_replay(peer, replay_from, "its backlog here was full")

    def _forget(self, peer: Peer) -> None:
        """Parked for ``--mesh-forget`` seconds: drop its interest and what was kept for it."""
        peer.parked = False
        lost = peer.backlog_msgs
        self.router.stats.drop_mesh_peer_gone += lost
        log.warning("mesh: router %s silent for %g s: forgotten, %d kept message(s) dropped", peer.router_id,
                    self.config.mesh_forget, lost + peer.dropped)
        peer.backlog, peer.backlog_bytes, peer.backlog_msgs, peer.dropped = [], 0, 0, 0
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
        late = gap - HELLO_INTERVAL_S
        self._last_beat = now
        self.pause_deadline = now + self._pause_after
        if gap >= self._pause_after and self.replication is not None:
            # The others may have taken this router for gone meanwhile (and its sessions over):
            # it counts no node as heard until one speaks again (``Replication.paused``).
            self._replication_hook(self.replication.paused, gap)
        if late > timeout / 2:
            # This process was not running (SIGSTOP, swapped out, a VM paused): the silence was
            # ours. Give every peer a fresh timeout to be heard instead of parking them all.
            log.warning("mesh: this router's loop was paused for %.1f s; giving peers %g s to be heard",
                        late, timeout)
            for peer in self.peers.values():
                peer.last_seen = max(peer.last_seen, now)
        for peer in list(self.peers.values()):
            if peer.alive and now - peer.last_seen > timeout:
                self._park(peer, f"silent for {timeout:g} s")
            elif peer.parked and now - peer.parked_at > self.config.mesh_forget:
                self._forget(peer)
        if self.replication is not None:
            self._replication_hook(self.replication.heartbeat)  # followers placed on the live nodes
        for link in self.links.values():
            self._send_hello(link)
        if self._monitors:
            self._poll_monitors()
        self._timer = self.loop.call_later(HELLO_INTERVAL_S, self._heartbeat)

    # -- backpressure ---------------------------------------------------------------------------------

    def _blocked(self, link: Link) -> None:
        self._blocked_links.add(link)
        if self._drain_timer is None:
            self._drain_timer = self.loop.call_later(0.005, self._drain)

    def _drain(self) -> None:
        self._drain_timer = None
        for link in list(self._blocked_links):
            if link.drain():
                self._blocked_links.discard(link)
        if self._blocked_links:
            self._drain_timer = self.loop.call_later(0.005, self._drain)


def _event_name(event: int) -> str:
    for name in ("EVENT_HANDSHAKE_FAILED_AUTH", "EVENT_HANDSHAKE_FAILED_PROTOCOL",
                 "EVENT_HANDSHAKE_FAILED_NO_DETAIL"):
        if getattr(zmq, name, None) == event:
            return name[len("EVENT_"):].lower()
    return str(event)

