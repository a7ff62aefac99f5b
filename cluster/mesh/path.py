"""The mesh's per-message path, compiled with the router's (setup.py ``ROUTER_PATH_ROOTS``).

Two small classes the ``Mesh`` holds and calls, sans-IO but for the sockets it hands them:
``Outbound`` puts a publish in each wanting peer's batch and makes the batches numbered PUBLISH
frames at the end of the loop iteration; ``Inbound`` reads the frames waiting on the PULL
socket, acts on a PUBLISH frame itself (numbering, counters, the router's delivery) and hands
every other kind, and any frame whose peer is not plainly live, to the ``Mesh``'s dispatch.

Why apart from the ``Mesh``: it is a Python class made of mixins, which mypyc cannot compile
(several bases), nor can a Python class inherit compiled ones. Here the router calls
``Outbound.forward_to`` and the receiving end calls ``Router.deliver_forwarded`` natively, in
the same compiled group; ``Peer`` and the links stay Python (every part reads them).

Compiled, every annotation is checked at run time: a frame's values come from other processes,
so what is read from one is checked (``router.mesh_format``) or held as ``Any``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import msgpack
import zmq

from brokerd.router.mesh_format import (
    KIND_NAMES,
    MESH_VERSION,
    PUBLISH,
    check_body,
    check_envelope,
    to_mesh,
)

from . import delivery
from .limits import LINGER_BELOW, RECV_BATCH, RECV_MSGS, log

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable

    from brokerd.connection.batching import EndOfTick, Flushable
    from brokerd.router.message import Message
    from brokerd.router.ports import Source
    from brokerd.router.router import Router
    from brokerd.router.stats import RouterStats

    from .peer import Peer


class Refused(NamedTuple):
    """A frame not acted on: from ``sender`` ("?" where the envelope is unreadable), with what
    is wrong; ``version`` where it is of another mesh version (logged once, not counted)."""

    sender: str
    problem: str
    version: Any = None


def read(data: bytes) -> tuple[int, str, int, Any, int, int] | Refused:
    """``data`` as a checked frame, (kind, sender, incarnation, body, number, the incarnation
    it is for; both 0 where it has no number), or why it is refused."""
    try:
        frame: Any = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException):
        return Refused("?", f"undecodable frame of {len(data)} bytes")
    problem = check_envelope(frame)
    if problem is not None:
        return Refused("?", problem)
    if len(frame) == 5:
        version, kind, sender, inc, body = frame
        seq = to = 0
    else:
        version, kind, sender, inc, body, seq, to = frame
    if version != MESH_VERSION:
        return Refused(sender, f"mesh version {version}", version)
    problem = check_body(kind, body)
    if problem is not None:
        return Refused(sender, problem)
    return kind, sender, inc, body, seq, to


class Outbound:
    """Publishes out: each wanting peer's batch, and at the end of the loop iteration one
    numbered PUBLISH frame per peer (split when it would pass half the receivers' limit)."""

    def __init__(self, peers: dict[str, Peer], packer: msgpack.Packer, head: bytes, max_frame: int,
                 backlog: int, end_of_tick: EndOfTick, item: Flushable) -> None:
        """``head``: what every PUBLISH frame of this incarnation starts with; ``backlog``: the
        bytes a peer's ring of unconfirmed frames holds (``--mesh-backlog``); ``item``: what
        ``end_of_tick`` flushes (the ``Mesh``, whose ``flush`` may wait a turn to fill)."""
        self.peers = peers
        self.packer = packer
        self.head = head
        self.max_frame = max_frame
        self.backlog = backlog
        self.end_of_tick = end_of_tick
        self.item = item
        self.dirty = False  # something collected waits for the iteration's end
        self.lingered = False  # it waited one iteration already
        self.closed = False

    def forward_to(self, router_ids: tuple[str, ...], msg: Message, source: Source | None = None) -> None:
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
                item = to_mesh(msg) if len(router_ids) == 1 else self.packer.pack(to_mesh(msg))
            if item.__class__ is bytes:
                peer.batch_packed = True
            peer.batch.append(item)
            if source is not None:
                peer.batch_sources.add(source)
        if item is not None and not self.dirty:
            self.mark()

    def mark(self) -> None:
        """Something to send at the end of this loop iteration (the ``Mesh``'s ``flush``)."""
        if not self.dirty and not self.closed:
            self.dirty = True
            self.end_of_tick.mark_end(self.item)

    def waiting(self) -> int:
        """The publishes in every peer's batch."""
        n = 0
        for peer in self.peers.values():
            n += len(peer.batch)
        return n

    def linger(self) -> bool:
        """Whether this iteration's publishes, fewer than ``LINGER_BELOW``, wait one more
        iteration (once) to fill their frames."""
        if self.lingered or self.waiting() >= LINGER_BELOW:
            return False
        self.lingered = True
        self.end_of_tick.mark_next(self.item)
        return True

    def flush(self, stats: RouterStats, mark: int, keep: Callable[[Peer, bytes, int, int], None]) -> None:
        """One publish frame per peer with a batch: into its ring and onto its link, or, for a
        parked peer, to ``keep`` (the ``Mesh``'s backlog and its log lines). ``mark``: the log's
        end, claimed by each frame (none while the log is read back to that peer)."""
        self.dirty = False
        self.lingered = False
        if self.closed:
            return
        for peer in self.peers.values():
            batch = peer.batch
            if not batch:
                continue
            peer.batch = []
            packed = peer.batch_packed
            peer.batch_packed = False
            sources = peer.batch_sources
            peer.batch_sources = set()
            link = peer.link
            if link is None:
                continue
            counts: list[int] = peer.stats
            for seq, frame, n in self.publish_frames(peer, batch, -1 if peer.replaying else mark, packed):
                size = len(frame)
                counts[0] += n
                counts[1] += size
                stats.mesh_msgs_out += n
                stats.mesh_bytes_out += size
                stats.mesh_frames_out += 1
                if peer.alive:
                    delivery.unconfirmed(peer, seq, frame, self.backlog)
                    link.send(frame, sources)
                else:
                    keep(peer, frame, n, seq)

    def publish_frames(self, peer: Peer, batch: list, mark: int, packed: bool = False
                       ) -> list[tuple[int, bytes, int]]:
        """``batch`` as one PUBLISH frame numbered for ``peer`` (seq, frame, messages), or split
        in halves until each frame is at most half the receivers' limit (a tick's batch of large
        messages; the length check is all it costs otherwise). Only the last frame carries the
        ``mark``: the others claim nothing (-1). ``packed``: some messages are bytes packed
        already (``forward_to``); the frame is built around them, byte for byte what packing
        their values would give."""
        seq: int = peer.seq_out + 1
        pack = self.packer.pack
        if not packed:
            frame: bytes = self.head + pack([seq, batch, mark])  # one msgpack call for the whole tick
        else:
            frame = b"".join([self.head, b"\x93", pack(seq), self.packer.pack_array_header(len(batch)),
                              *[m if m.__class__ is bytes else pack(m) for m in batch], pack(mark)])
        if len(frame) <= self.max_frame // 2 or len(batch) == 1:
            peer.seq_out = seq
            return [(seq, frame, len(batch))]
        half = len(batch) // 2
        return (self.publish_frames(peer, batch[:half], -1, packed)
                + self.publish_frames(peer, batch[half:], mark, packed))


class Inbound:
    """Frames in: read in turns from the PULL socket; a PUBLISH frame of a live peer acted on
    here, every other frame handed to the ``Mesh``'s dispatch (``handle``)."""

    def __init__(self, router: Router, peers: dict[str, Peer], loop: asyncio.AbstractEventLoop,
                 clock: Callable[[], float], handle: Callable[..., None], refused: Callable[[Refused], None],
                 bad: Callable[[str, str], None], paused: Callable[[float], None]) -> None:
        """``handle(kind, sender, incarnation, body, size, seq, to)``: the dispatch of any frame
        (``DispatchMixin._handle``); ``refused``, ``bad``: a refused frame, one whose handler
        failed; ``paused(now)``: the check, once per turn, that this process was not paused."""
        self.router = router
        self.peers = peers
        self.loop = loop
        self.clock = clock
        self.handle = handle
        self.refused = refused
        self.bad = bad
        self.paused = paused

    def on_readable(self, sock: Any) -> None:
        """Frames waiting on ``sock``, until ``RECV_MSGS`` forwarded messages (or ``RECV_BATCH``
        frames) were handled: then the loop's other work (client reads under the turn budget,
        writes) runs before the next frames, so a backlog of frames cannot stall every client of
        this router for the time of thousands of deliveries."""
        self.paused(self.clock())
        n = 0
        msgs = 0
        peers = self.peers
        try:
            while n < RECV_BATCH and msgs < RECV_MSGS:
                try:
                    data: bytes = sock.recv(zmq.NOBLOCK)
                except zmq.Again:
                    return
                n += 1
                got = read(data)
                if isinstance(got, Refused):
                    self.refused(got)
                    continue
                kind, sender, inc, body, seq, to = got
                try:
                    if kind == PUBLISH:
                        msgs += len(body[1])
                        peer = peers.get(sender)
                        # A live peer of this incarnation with nothing held back, the frame's
                        # number in its body (no sender numbers its envelope): here; the rest
                        # (parked, unknown, held frames) as the dispatch does it.
                        if (peer is not None and peer.incarnation == inc and peer.alive and not peer.held
                                and not seq):
                            peer.last_seen = self.clock()
                            self.on_publish(peer, body, len(data))
                            continue
                    self.handle(kind, sender, inc, body, len(data), seq, to)
                except Exception as exc:  # noqa: BLE001 - a peer's frame must not stop the mesh
                    self.bad(sender, f"{KIND_NAMES[kind]} frame could not be handled: {exc!r}")
        except zmq.ZMQError:
            return
        # More may be waiting: ZeroMQ's descriptor is edge-triggered, so come back without it.
        self.loop.call_soon(self.on_readable, sock)

    def on_publish(self, peer: Peer, body: Any, size: int) -> None:
        """A PUBLISH frame of ``peer`` (``[seq, batch, mark]``, checked by ``mesh_format``):
        counted once, its messages to the router, its number noted for confirmation once the
        log has written the copies made of it."""
        seq: int = body[0]
        batch: list = body[1]
        if not delivery.first_receipt(peer, seq, body[2]):
            return  # sent again to a new incarnation of ours, or twice: we have it
        router = self.router
        stats = router.stats
        stats.mesh_frames_in += 1
        stats.mesh_msgs_in += len(batch)
        stats.mesh_bytes_in += size
        counts: list[int] = peer.stats
        counts[2] += len(batch)
        counts[3] += size
        bad = router.deliver_forwarded(batch, peer.router_id)
        if bad:
            log.error("mesh: dropped %d malformed message(s) from %s", bad, peer.router_id)
        commit_log = router.commit_log
        if commit_log is not None:
            delivery.logged(peer, seq, commit_log.next_offset - 1)
