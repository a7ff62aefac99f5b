"""What must survive a restart besides the log itself: persistent sessions and retained messages.

The commit log holds every message; this module keeps the small state around it, Kafka style: a
snapshot file per router (``state.msgpack``, written atomically: temporary file, fsync, rename)
with the persistent sessions (subscriptions, log position, QoS 2 packet ids) and the retained
messages, plus the log offset the snapshot is consistent with. On start, the snapshot is loaded and
the log records after that offset are replayed for retained messages, so a crash loses nothing the
log kept. Sessions come back offline, with a position in the log: a client that reconnects catches
up from there (at least once: a message it received after the last snapshot may come again).

Snapshots are written on a timer when something changed, after every subscription change of a
persistent session (soon, not per packet), and at a graceful stop. A write encodes again only the
sessions that changed since the last (``StateStore.snapshot``); the file is the same msgpack map
either way. The router is read through one view (``StateView``); a session's snapshot form is
``router.session_state``'s.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

import msgpack

from .log import LogReader
from .message import Message
from .retained import SYS_PREFIX
from .session import Session
from .session_state import restore_state, snapshot_key, snapshot_state
from .topics import filter_matches

if TYPE_CHECKING:
    from .clock import Clock, Timer
    from .limits import Qos2Sweeper
    from .log import CommitLog
    from .ports import ClientHandle, ReplicationPort
    from .retained import RetainedStore
    from .router import Router
    from .session_life import SessionLife
    from .stats import RouterStats

__all__ = ["SNAPSHOT", "SnapshotFile", "StateStore", "StateView", "restore_missing_copies", "restore_state"]

log = logging.getLogger(__name__)

SNAPSHOT = "state.msgpack"
SNAPSHOT_VERSION = 2  # 2: retained messages stored as Message.to_list()


class StateView(Protocol):
    """The router as its snapshot store sees it, and all it reads: what a snapshot holds
    (persistent sessions and the wills of their connections, retained messages, fences, the
    log's written end), where the sessions' state also goes (``replication``), what tells it
    that sessions moved (``session_moves``), where a restored session goes (``life``; its QoS 2
    ids awaiting PUBREL are timed from its restore: ``qos2_sweeper``), and whose time the writes
    are timed by (``clock``)."""

    router_id: str
    commit_log: CommitLog | None
    sessions: dict[str, Session]
    clients: dict[str, ClientHandle]
    retained: RetainedStore
    fenced: dict[str, set[str]]
    fenced_wills: dict[str, set[str]]
    replication: ReplicationPort | None
    stats: RouterStats
    life: SessionLife
    qos2_sweeper: Qos2Sweeper
    clock: Clock

    def session_moves(self) -> tuple[int, ...]: ...


class StateStore:
    def __init__(self, router: StateView, directory: str, interval_s: float = 1.0) -> None:
        self.router = router
        self.path = os.path.join(directory, SNAPSHOT)
        self.file = SnapshotFile(self.path)
        self.interval_s = interval_s
        self._timer: Timer | None = None
        self._writing = False
        self.dirty = False
        self._soon = False  # a write was asked for soon while one was under way
        self._waiters: list[asyncio.Future] = []  # ``durable``: for the next write to start
        self._writing_for: list[asyncio.Future] = []  # ... and for the one under way
        self._built: tuple[int, ...] = ()  # ``_moves`` when the last snapshot was built
        self._none_persistent: tuple[int, ...] = ()  # ``_moves`` when ``periodic`` found no persistent session
        self._entries: dict[str, _Entry] = {}  # each persistent session's encoding at the last snapshot

    # -- writing --------------------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """The state as it is now, encoded. Incremental: each session's encoding is kept
        (``_Entry``) and made again only when something it holds changed (``snapshot_key``); a session
        with messages in flight, queued or in ranges, or QoS 2 ids, is encoded every time. Its
        position, which moves with the log, is encoded apart, last in its map. At 100,000
        sessions a write that re-encoded all of them held the loop 1.4-2 s: each takeover
        (which waits for one) cost as much as every session held."""
        router = self.router
        self._built = self._moves()
        log_ = router.commit_log
        # Positions name at most the log's written end: records assigned offsets but still with
        # the writer thread are gone after a crash, and the log goes on from the written end, so
        # a position beyond it would skip what is written there after the restart.
        end = log_.written_offset + 1 if log_ is not None else 0
        clients = router.clients
        cached = self._entries
        entries: dict[str, _Entry] = {}
        parts: list[bytes] = []
        pack = msgpack.Packer().pack  # one packer for the write (packb makes one per call)
        for cid, s in router.sessions.items():
            if not s.persistent:
                continue
            client = clients.get(cid) if s.conn is not None else None
            live = client.will if client is not None and client.session is s else None
            key = snapshot_key(s, live)
            e = cached.get(cid)
            if e is None or key is None or e.session is not s or e.key != key:
                e = _Entry(cid, s, key, snapshot_state(s, live, log_))
            position = _at_most(s.position(), end)
            parts.append(e.head)
            parts.append(pack(position))
            e.position = position
            entries[cid] = e
        self._entries = entries
        if router.replication is not None:  # the same state goes to the log's followers
            router.replication.sessions_changed({cid: e.full() for cid, e in entries.items()})
        return b"".join([
            _SNAPSHOT_HEAD, pack("version"), pack(SNAPSHOT_VERSION), pack("router"), pack(router.router_id),
            pack("log_offset"), pack(end), pack("sessions"), _map_header(len(entries)), *parts,
            pack("retained"), pack([m.to_list() for m in router.retained if not m.topic.startswith(SYS_PREFIX)]),
            pack("fenced"), pack({rid: sorted(cids) for rid, cids in router.fenced.items() if cids}),
            pack("fenced_wills"), pack({rid: sorted(cids) for rid, cids in router.fenced_wills.items() if cids}),
        ])

    def write_now(self) -> None:
        """Write synchronously (start-up, graceful stop): after a write under way in a thread,
        never beside or before it."""
        self.file.write(self.snapshot(), self.file.ticket())
        self.dirty = False

    def durable(self) -> asyncio.Future:
        """A future done (True, or False if the write failed) once the state as it is now is on
        disk: a session taken over from another router of this node must be in this snapshot
        before the old one drops it from its own, or a crash of the node in between loses it."""
        fut = asyncio.get_event_loop().create_future()
        self._waiters.append(fut)
        self.mark(soon=True)
        return fut

    def mark(self, soon: bool = False) -> None:
        """Something changed: write within ``interval_s`` (``soon``: at the next iteration)."""
        self.dirty = True
        if soon and self._writing:
            self._soon = True
        if soon and self._timer is not None and not self._writing:
            self._timer.cancel()
            self._timer = None
        if self._timer is None and not self._writing:
            self._timer = self.router.clock.call_later(0 if soon else self.interval_s, self._write_async)

    def _write_async(self) -> None:
        self._timer = None
        if not self.dirty:
            return
        data = self.snapshot()  # built on the loop: the state is the loop's
        self.dirty = False
        self._writing = True
        self._writing_for, self._waiters = self._waiters, []
        # The file is written in a thread (the loop's: I/O, not time), its end told on the loop.
        fut = asyncio.get_event_loop().run_in_executor(None, self.file.write, data, self.file.ticket())
        fut.add_done_callback(self._written)

    def _written(self, fut: asyncio.Future) -> None:
        self._writing = False
        exc = fut.exception()
        if exc is not None:
            log.error("cannot write the session snapshot %s: %s", self.path, exc)
            self.dirty = True
        done, self._writing_for = self._writing_for, []
        for waiter in done:
            if not waiter.done():
                waiter.set_result(exc is None)
        if self.dirty:
            soon, self._soon = self._soon, False  # (``durable`` asks soon: its waiters set it)
            self.mark(soon)

    def _moves(self) -> tuple[int, ...]:
        """What changes persistent sessions without marking the snapshot at once
        (``Router.session_moves``; subscription changes, takeovers and fences mark it themselves)."""
        return self.router.session_moves()

    def periodic(self) -> None:
        """Refresh the snapshot once a second while persistent sessions' positions may have moved
        since it was built. Not otherwise: rewriting it every second regardless cost an idle
        worker with 6,000 persistent sessions 17 ms of CPU a second and 600 KB of disk writes."""
        moves = self._moves()
        if moves == self._built or moves == self._none_persistent:
            return
        if any(s.persistent for s in self.router.sessions.values()):
            self.mark()
        else:  # none (a fleet of clean sessions): not looked for again until something moves
            self._none_persistent = moves

    # -- loading --------------------------------------------------------------------------------------

    def load(self, will_grace: float = 0.0) -> tuple[int, int]:
        """Restore sessions and retained messages; returns (sessions, retained) counts. A restored
        delayed will waits at least ``will_grace`` seconds (one that fell due while this router was
        down, that long; so does the will of a client that was connected when it crashed): in a cluster, the holder of this router's replica may have published it
        meanwhile, and says so when it meets this router again (``Router.wills_published_elsewhere``)."""
        router = self.router
        state: dict[str, Any] = {}
        try:
            with open(self.path, "rb") as f:
                state = msgpack.unpackb(f.read(), strict_map_key=False)
        except FileNotFoundError:
            pass
        except (OSError, ValueError, msgpack.UnpackException) as exc:
            log.error("session snapshot %s unreadable (%s): starting without it", self.path, exc)
        if state and state.get("version") != SNAPSHOT_VERSION:
            log.error("session snapshot %s has version %s, expected %d: ignored", self.path,
                      state.get("version"), SNAPSHOT_VERSION)
            state = {}
        router.fenced = {rid: set(cids) for rid, cids in state.get("fenced", {}).items()}
        router.fenced_wills = {rid: set(cids) for rid, cids in state.get("fenced_wills", {}).items()}
        for values in state.get("retained", ()):
            router.retained.set(Message.from_list(values))
        log_ = router.commit_log
        replayed = 0
        if log_ is not None:
            # Retained messages logged after the snapshot: replay them in order.
            for rec in _records(log_, max(state.get("log_offset", 0), log_.start_offset)):
                if rec.retain:
                    router.retained.set(Message.from_record(rec))
                    replayed += 1
        router.stats.retained_count = len(router.retained)
        start = log_.start_offset if log_ is not None else None
        for cid, st in state.get("sessions", {}).items():
            router.qos2_sweeper.arrived(router.life.restore(cid, st, start, will_grace))
        return len(state.get("sessions", {})), len(router.retained)


_SNAPSHOT_HEAD = b"\x87"  # a map of the 7 keys ``snapshot`` writes
_POSITION = msgpack.packb("position")


def _map_header(n: int) -> bytes:
    """The msgpack header of a map of ``n`` entries (the sessions' map is written in parts)."""
    if n < 16:
        return bytes((0x80 | n,))
    if n < 1 << 16:
        return b"\xde" + n.to_bytes(2, "big")
    return b"\xdf" + n.to_bytes(4, "big")


class _Entry:
    """One session's encoding in the snapshot: its client id and state (a map whose last entry,
    the position, is written apart: ``head`` ends with that key), the ``snapshot_key`` it was made
    from, and the state with its position for the followers (``full``, made again only when the
    position moved: an unchanged session is the same dict, which replication compares)."""

    __slots__ = ("session", "key", "state", "head", "position", "_full")

    def __init__(self, cid: str, session: Session, key: tuple | None, state: dict) -> None:
        self.session = session
        self.key = key
        self.state = state
        body = msgpack.packb(state)
        n = len(state) + 1  # and the position
        assert n < 16 and body[0] == 0x80 | (n - 1)  # a fixmap: its header is one byte
        self.head = msgpack.packb(cid) + bytes((0x80 | n,)) + body[1:] + _POSITION
        self.position: int | None = None
        self._full: dict | None = None

    def full(self) -> dict:
        full = self._full
        if full is None or full["position"] != self.position:
            full = self._full = {**self.state, "position": self.position}
        return full


def _at_most(position: int | None, end: int) -> int | None:
    return position if position is None or position <= end else end


def _records(source: Any, offset: int, batch: int = 4096) -> Iterator[Any]:
    """Every record of a ``CommitLog`` or ``LogReader`` from ``offset`` on, read in batches."""
    while True:
        records = source.read(offset, max_records=batch)
        if not records:
            return
        yield from records
        offset = records[-1].offset + 1


class SnapshotFile:
    """A file replaced whole, written both from threads (as things change) and on the loop (at a
    stop): the writes take turns, and one asked for before the last one done is skipped. Before,
    a graceful stop's write and a periodic one still under way in a thread wrote the same
    temporary file: the stop's rename failed (logged), and the file left could hold the older
    state, or parts of both."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._asked = 0  # tickets handed out, on the loop
        self._done = 0  # the ticket of the newest write done

    def ticket(self) -> int:
        """Called where the data is built (the loop): the order in which writes count."""
        self._asked += 1
        return self._asked

    def write(self, data: bytes, ticket: int) -> bool:
        """Replace the file with ``data`` unless a later ticket's write is done already."""
        with self._lock:
            if ticket <= self._done:
                return False
            atomic_write(self.path, data)
            self._done = ticket
            return True


def atomic_write(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data``, durably: a crash leaves the old file or the new one."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # sessions, retained messages
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def restore_missing_copies(router: Router, node_dir: str, own_name: str, margin_ms: int = 2000) -> int:
    """After a crash, put back the copies this router's log should hold but does not.

    A message published on another worker of this node is acknowledged once *that* router's log
    has it; the copy forwarded here is logged a moment later. A crash in between loses the copy,
    and with it what an offline persistent session here would catch up from, although the original
    is safe in the other router's log. So, at start, read the other local routers' logs (read-only,
    from disk) from shortly before the oldest catch-up position on, and append every original that
    a persistent session here subscribes to and that this log lacks. Returns how many were restored.
    """
    log_ = router.commit_log
    sessions = [s for s in router.sessions.values() if s.persistent and s.subscriptions]
    if log_ is None or not sessions:
        return 0
    cursors = [s.cursor for s in sessions if s.cursor is not None]
    start = min(cursors) if cursors else log_.next_offset
    # What is already here (copies by origin), and from when on messages can be missing.
    have: set[tuple[str, int]] = set()
    since_ms = 0
    before = log_.read(max(start - 1, log_.start_offset), max_records=1)
    if before and before[0].offset < start:
        since_ms = before[0].timestamp_ms - margin_ms
    have.update((r.origin_router, r.origin_offset) for r in _records(log_, max(start - 10_000, log_.start_offset)))
    filters = {f for s in sessions for f in s.subscriptions}
    node = router.router_id.rsplit("/", 1)[0]
    restored = 0
    for name in sorted(os.listdir(node_dir)):
        path = os.path.join(node_dir, name)
        if name == own_name or name.startswith(("_", ".")) or not os.path.isdir(path):
            continue  # (``_replicas``: other nodes' logs, not this node's routers)
        origin = f"{node}/{name}"
        try:
            reader = LogReader(path)
        except OSError:
            continue
        with reader:
            pos = reader.offset_for_time(since_ms) if since_ms else reader.start_offset
            for r in _records(reader, pos) if pos is not None else ():
                if (r.origin_router == origin and (origin, r.origin_offset) not in have and r.qos
                        and any(filter_matches(f, r.topic) for f in filters)):
                    log_.append_record(r)
                    restored += 1
    if restored:
        log.warning("restored %d message(s) acknowledged by other workers whose copies this log lost "
                    "in a crash", restored)
    return restored
