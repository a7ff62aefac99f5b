"""Receiving: a frame read, checked, and handed to its kind's handler through one table.

``read`` turns bytes into a checked frame or a refusal (``router.mesh_format`` holds the checks);
``FRAMES`` names each kind's handler, the part of the ``Mesh`` that has it, and who may send it:
anyone (a HELLO introduces its sender), a peer met in this incarnation, or such a peer while this
router replicates (R > 1: otherwise the frame is ``ignored``; the replication's handlers are its
own, ``cluster.replication.frames``). A kind not in the table is refused as a bad frame. Handlers
take ``(peer, body, size)``, HELLO ``(sender, incarnation, body)``.

A numbered frame of another kind than PUBLISH (``mesh_format.NUMBERED``) counts as received first
(``delivery.first_receipt``: one received already is dropped); one meant for another incarnation
of this router is acted on only where its kind carries state (``SURVIVE``); and one that follows a
missed number is held until that number arrives, then acted on in order (``delivery.hold``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

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
    SURVIVE,
    SYNC_REQ,
    TAKEOVER_ANSWERS,
    TAKEOVER_ASKS,
    TAKEOVER_CHUNK,
    TAKEOVER_DONE,
    TAKEOVER_REQ,
    TAKEOVER_RESP,
    check_body,
    check_envelope,
)

from . import delivery
from .limits import RECV_BATCH, RECV_MSGS, log

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable

    from brokerd.router.router import Router

    from ..replication import Replication
    from .members import Members
    from .peer import Peer

ANYONE = "anyone"
MET = "met"
REPLICATING = "replicating"
REPLICATION = "replication.frames"  # the replication's receiving end (``cluster.replication.frames``)

# kind -> (the method that handles it, who may send it, the ``Mesh``'s part that has that method:
# "" for the ``Mesh`` itself, a dotted path for a part of a part)
FRAMES: dict[int, tuple[str, str, str]] = {
    HELLO: ("on_hello", ANYONE, "members"),
    ECHO: ("on_echo", MET, "members"),
    GOODBYE: ("on_goodbye", MET, "members"),
    PUBLISH: ("_on_publish", MET, ""),
    RETAINED: ("_on_retained", MET, ""),
    SYNC_REQ: ("_on_sync_req", MET, ""),
    CATCHUP: ("_on_catchup", MET, ""),
    INTEREST: ("on_interest", MET, "interest"),
    INTEREST_ACK: ("on_interest_ack", MET, "interest"),
    RESYNC: ("_on_resync", MET, ""),
    TAKEOVER_REQ: ("on_takeover_req", MET, "transfers"),
    TAKEOVER_RESP: ("on_takeover_resp", MET, "transfers"),
    TAKEOVER_ASKS: ("on_takeover_asks", MET, "transfers"),
    TAKEOVER_ANSWERS: ("on_takeover_answers", MET, "transfers"),
    TAKEOVER_CHUNK: ("on_takeover_chunk", MET, "transfers"),
    TAKEOVER_DONE: ("on_takeover_done", MET, "transfers"),
    SESSION_HANDON: ("on_session_handon", MET, "handons"),
    SESSION_GONE: ("_on_session_gone", MET, ""),  # (also before replication is set up at a start)
    REPLICATE: ("on_replicate", REPLICATING, REPLICATION),
    REPLICA_ACK: ("on_replica_ack", REPLICATING, REPLICATION),
    REPLICA_FETCH: ("on_replica_fetch", REPLICATING, REPLICATION),
    REPLICA_CATCHUP: ("on_replica_catchup", REPLICATING, REPLICATION),
    REPLICA_PUBLISH: ("on_replica_publish", REPLICATING, REPLICATION),
    SESSION_STATE: ("on_session_state", REPLICATING, REPLICATION),
    SESSION_CATCHUP: ("on_session_catchup", REPLICATING, REPLICATION),
    SESSION_COPIES: ("on_session_copies", REPLICATING, REPLICATION),
    SESSION_RESTORE: ("on_session_restore", REPLICATING, REPLICATION),
    SESSION_RESTORED: ("on_session_restored", REPLICATING, REPLICATION),
    HISTORY_FETCH: ("on_history_fetch", REPLICATING, REPLICATION),
    HISTORY: ("on_history", REPLICATING, REPLICATION),
}


def bind(owner: object) -> dict[int, tuple[Callable[..., None], str]]:
    """``FRAMES`` with the bound handlers of ``owner`` and its parts, for one lookup a frame. A
    part not there (the replication, on a router that replicates nothing, or a test's stand-in
    without frames) has its kinds ``ignored``; the ``Mesh`` binds again once it is set."""
    handlers: dict[int, tuple[Callable[..., None], str]] = {}
    for kind, (name, who, path) in FRAMES.items():
        part: Any = owner
        for step in path.split(".") if path else ():
            part = getattr(part, step, None)
            if part is None:
                break
        handlers[kind] = (ignored if part is None else getattr(part, name), who)
    return handlers


def ignored(peer: Peer, body: Any, size: int) -> None:
    """A replication frame reaching a router that replicates nothing (R = 1 here): no part of
    this router acts on it."""


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
        frame = msgpack.unpackb(data, raw=False, strict_map_key=False)
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


class DispatchMixin:
    """The ``Mesh``'s receiving end: frames read in turns, dispatched by kind."""

    loop: asyncio.AbstractEventLoop
    router: Router
    router_id: str
    incarnation: int
    peers: dict[str, Peer]
    replication: Replication | None
    members: Members
    _handlers: dict[int, tuple[Callable[..., None], str]]
    clock: Callable[[], float]  # the mesh's monotonic clock (``Mesh``)
    _version_warned: set[str]
    _bad_logged: set[str]

    def _on_readable(self, sock: zmq.Socket) -> None:
        """Frames waiting on ``sock``, until ``RECV_MSGS`` forwarded messages (or ``RECV_BATCH``
        frames) were handled: then the loop's other work (client reads under the turn budget,
        writes) runs before the next frames, so a backlog of frames cannot stall every client of
        this router for the time of thousands of deliveries."""
        now = self.clock()
        if now >= self.members.pause_deadline or (
                self.replication is not None and now >= self.replication.recount_at):
            self.members.check_paused()
        n = 0
        msgs = 0
        try:
            while n < RECV_BATCH and msgs < RECV_MSGS:
                try:
                    data = sock.recv(zmq.NOBLOCK)
                except zmq.Again:
                    return
                n += 1
                got = read(data)
                if got.__class__ is Refused:
                    self._refused(got)
                    continue
                # (mypy: a frame's tuple: ``__class__ is Refused`` above does not narrow ``got`` for mypy)
                kind, sender, inc, body, seq, to = got  # type: ignore[misc]
                if kind == PUBLISH:
                    msgs += len(body[1])
                try:
                    self._handle(kind, sender, inc, body, len(data), seq, to)
                except Exception as exc:  # noqa: BLE001 - a peer's frame must not stop the mesh
                    self._bad(sender, f"{KIND_NAMES[kind]} frame could not be handled: {exc!r}")
        except zmq.ZMQError:
            return
        # More may be waiting: ZeroMQ's descriptor is edge-triggered, so come back without it.
        self.loop.call_soon(self._on_readable, sock)

    def _refused(self, refused: Refused) -> None:
        sender = refused.sender
        if refused.version is None:
            self._bad(sender, refused.problem)
        elif sender not in self._version_warned:
            self._version_warned.add(str(sender))
            log.error("mesh: refusing frames from %s: mesh version %s, this node speaks %d "
                      "(run the same brokerd version on every node)", sender, refused.version, MESH_VERSION)

    def _bad(self, sender: str, problem: str) -> None:
        """Drop a bad frame: counted always, logged once per sender."""
        self.router.stats.mesh_bad_frames += 1
        if sender not in self._bad_logged:
            self._bad_logged.add(sender)
            log.error("mesh: dropped a bad frame from %s: %s (further ones from it are counted as "
                      "mesh bad_frames, not logged)", sender, problem)

    def _handle(self, kind: int, sender: str, inc: int, body: Any, size: int, seq: int = 0, to: int = 0) -> None:
        """Act on a checked frame (``seq``, ``to``: its number and the incarnation of ours it is
        for, 0 where it has none)."""
        entry = self._handlers.get(kind)
        if entry is None:
            self._bad(sender, f"unknown kind {kind}")
            return
        handler, who = entry
        if who is ANYONE:
            handler(sender, inc, body)
            known = self.peers.get(sender)
            if known is not None and known.held:  # (its HELLO may give up what they wait for)
                self._act_held(known)
            return
        peer = self.peers.get(sender)
        if peer is None or peer.incarnation != inc:
            if kind != GOODBYE:
                # A frame from an incarnation we have not met yet: wait for its hello, which the
                # other side sends first on every new link.
                log.debug("mesh: %s frame from unknown %s; ignored", KIND_NAMES.get(kind), sender)
            return
        peer.last_seen = self.clock()
        if not peer.alive and kind != GOODBYE:
            self.members.rejoin(peer, "heard again")
        if seq and not self._numbered_in(peer, kind, body, size, seq, to):
            return
        handler(peer, body, size)
        if peer.held:
            self._act_held(peer)

    def _numbered_in(self, peer: Peer, kind: int, body: Any, size: int, seq: int, to: int) -> bool:
        """A numbered frame of ``peer``: whether it is acted on now. Not one received already,
        nor one meant for another incarnation of ours whose kind names that incarnation's
        requests (its number counts all the same), nor one after a missed number (held)."""
        if not delivery.first_receipt(peer, seq, -1):
            return False  # twice, or sent again after it had come
        if to != self.incarnation and kind not in SURVIVE:
            if peer.held:
                self._act_held(peer)
            return False
        return not delivery.hold(peer, seq, (kind, body, size))

    def _act_held(self, peer: Peer, every: bool = False) -> None:
        """Act, in order, on ``peer``'s held frames no missed number comes before any more
        (``every``: all of them, its incarnation ended); one that cannot be handled is dropped as
        a bad frame, the others acted on."""
        for kind, body, size in delivery.released(peer, every):
            try:
                self._handlers[kind][0](peer, body, size)
            except Exception as exc:  # noqa: BLE001 - a peer's frame must not stop the mesh
                self._bad(peer.router_id, f"{KIND_NAMES[kind]} frame could not be handled: {exc!r}")

    # -- SESSION_GONE: also before the replication is set up at a start ------------------------

    def _on_session_gone(self, peer: Peer, body: Any, size: int) -> None:
        """These sessions of a partition were taken over from a replica: the partition's own
        router drops its stale copies (with or without replication), a follower its replicas."""
        partition, client_ids = body[0], body[1]
        wills = body[2] if len(body) == 3 else []
        if partition == self.router_id:
            self.router.drop_stale_sessions(client_ids)
            self.router.wills_published_elsewhere(wills)
        elif self.replication is not None:
            self.replication.session_gone(partition, client_ids, wills)
