"""A session's move to another router, as plain values: the header (what a new owner needs besides
the copies), the queued copies in chunks, and the import of both on the new owner.

Why apart from ``router.session``: a move is not delivery. These read and fill a ``Session`` the
way its own methods would (``Session.export_header``, ``export_copies`` and ``import_state`` call
them). The header is the fields every copy of a session carries (``router.session_state``, under
the names a snapshot gives them) and what only a move carries: the messages in flight, the queue,
the next packet id and the log positions. It travels on the mesh (TAKEOVER_RESP, and
SESSION_RESTORED from a replica), whose version changes with it (``router.mesh_format``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from .inflight import RANGED, Inflight
from .message import Message
from .ranges import Range, make_range
from .session_state import common_state, restore_common
from .spool import SpoolRange, spool_dir

if TYPE_CHECKING:
    from .session import Session

log = logging.getLogger("brokerd.router.session")  # (where these lines were always logged)


def export_header(session: Session, same_node: bool) -> dict:
    """What a new owner needs besides the queued copies, as plain values (msgpack-able).
    On the same node the offline backlog in the logs travels as positions (``log``)."""
    # From the oldest message read from them still unacknowledged (``range_values``): the
    # queue's such messages are not copied (``export_copies``), and the new owner's snapshot
    # then covers those in flight too (they may come twice).
    ranges = session.range_values()
    if session.cursor is not None and session.log is not None:
        # Absolute: the position must mean the same after a restart from another directory.
        ranges.append([os.path.abspath(session.log.directory), session.cursor, session.log.next_offset])
    return {
        "client_id": session.client_id,
        "persistent": session.persistent,
        **common_state(session),
        "inflight": [(pid, e.qos, e.retain, e.state, e.msg.to_list() if e.msg is not None else None)
                     for pid, e in session.inflight.items()],
        "queue": [],
        "log": ranges if same_node else [],
        "next_pid": session.next_pid,
    }


def export_copies(session: Session, same_node: bool, chunk_bytes: int = 1 << 20,
                  limit: int | None = -1) -> Iterator[list]:
    """The queued messages as copies, in chunks of about ``chunk_bytes``: the queue, then (to
    another node, where this node's logs cannot be read) the offline backlog read from the
    logs and spools. ``limit``: at most this many copies in all, what is beyond counted as
    dropped (queue full) and logged; -1 (the default): ``max_queued``, the bound of a
    session without a log; None: all of them (a new owner that spools them:
    ``router.spool``).

    What it copies is fixed now, at the call: the queue's entries (the first
    ``len(session.queue)``), the ranges and the log's end (where the hand-on after the move
    starts). The chunks are read later, one per loop turn (``cluster.mesh.transfer``), and a
    moving session stays subscribed until its new owner confirms: deliveries go on joining its
    queue meanwhile. Read from the queue itself, one between two chunks broke the export (a
    deque changed while read: the transfer failed, the CONNECT was refused); what joins it
    after this call is handed on instead (``SessionLife._hand_on_later``)."""
    if limit == -1:
        limit = session.limits.max_queued
    if same_node:  # the logs and spools go as positions (``export_header``); what was read
        # from a range is read from it again there
        queued = [item for item in session.queue if item[0].log_offset > RANGED]
        return _chunks(session, queued, [], None, 0, chunk_bytes, limit)
    ranges = [r.for_export() for r in session.ranges]
    at, end = (session.cursor, session.log.next_offset) if session.log is not None else (None, 0)
    return _chunks(session, list(session.queue), ranges, at, end, chunk_bytes, limit)


def _chunks(session: Session, queued: list[tuple[Message, int, bool]], ranges: list[Range], at: int | None,
            end: int, chunk_bytes: int, limit: int | None) -> Iterator[list]:
    """``export_copies``' chunks: ``queued``, then ``ranges`` and the log from ``at`` to ``end``."""
    chunk: list = []
    size = 0
    n = 0

    def items() -> Iterator[tuple[Message, int, bool]]:
        yield from queued
        for rng in ranges:
            while (records := rng.read(256, session.clock.now())) is not None and records:
                if rng.copies:
                    for _, (qos, retain, values) in records:
                        yield Message.from_list(values), qos, retain
                else:
                    yield from session.matching(records)
            rng.close()
        if at is not None:
            # Its own log is read through the log, not its files: the last records may still
            # be with the writer thread (a reader of the files would stop short of them, and
            # the hand-on after the move starts at the log's end).
            pos = at
            while pos < end and (records := session.log.read(pos, 256)):
                yield from session.matching([r for r in records if r.offset < end])
                pos = records[-1].offset + 1

    dropped = 0
    for msg, qos, retain in items():
        if msg.expires_ms and msg.expired(session.clock.unix() * 1000):
            session.stats.drop_expired += 1
            continue
        if limit is not None and n >= limit:
            dropped += 1
            continue
        n += 1
        chunk.append((qos, retain, msg.to_list()))
        size += len(msg.payload) + len(msg.topic) + 32
        if size >= chunk_bytes:
            yield chunk
            chunk, size = [], 0
    if dropped:
        session.stats.drop_queue_full += dropped
        log.warning("session %s moved to another node: %d queued message(s) beyond --max-queued %d "
                    "dropped (this node's log cannot be read there)", session.client_id, dropped, limit)
    yield chunk


def import_state(session: Session, state: dict) -> None:
    """Load the state exported by another router (subscriptions are indexed by the caller)."""
    session.persistent = state["persistent"]
    arrived_ms = session.arrived_ms  # (when this router took it on: the caller made it now)
    restore_common(session, state)  # (a delayed will too: the importer publishes, drops or re-arms it)
    # A new owner: the copy it came from is older (``router.session.recency``).
    session.epoch += 1
    session.arrived_ms = arrived_ms
    for pid, qos, retain, st, m in state["inflight"]:
        entry = Inflight(Message.from_list(m) if m is not None else None, qos, retain)
        entry.state = st
        session.inflight[pid] = entry
    for qos, retain, m in state["queue"]:
        session._queue().append((Message.from_list(m), qos, retain))
    session.next_pid = state.get("next_pid", 1)
    # The copies the new owner spooled (``router.spool``: read after the queue, which is then
    # empty), then the other logs' ranges (same node).
    ranges = ([state["spool"]] if state.get("spool") else []) + (state.get("log") or [])
    if ranges:
        session.ranges = [make_range(*r) for r in ranges]
        if any(r.copies for r in session.ranges):
            own = spool_dir(session.log.directory) if session.log is not None else None
            for rng in [r for r in session.ranges if isinstance(r, SpoolRange)]:  # (the copies)
                if own is None or os.path.dirname(rng.directory) != own:
                    # Only this node's spool directory is read (and its files deleted).
                    log.error("session %s: spool %s is not in %s: ignored", session.client_id, rng.directory, own)
                    session.ranges.remove(rng)
                else:
                    rng.adopt(session.log.directory)  # this router's file now (a same-node move)
        if session.log is not None and session.cursor is None:
            # Live messages from here on wait in this router's log, read after the ranges.
            session.cursor = session.log.next_offset
