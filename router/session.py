"""A client's session: its subscriptions, outgoing QoS 1/2 state and the queue behind it.

A session outlives its connection when the client asked for it (clean session 0 / MQTT 5 session
expiry). Delivery is bounded everywhere: at most ``max_inflight`` unacknowledged QoS 1/2 messages on
the wire, at most ``max_queued`` waiting behind them (or while offline), and QoS 0 messages to a
client whose socket is not draining are dropped and counted rather than buffered. A subscriber that
does not read therefore costs a bounded amount of memory and never slows anyone else.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Any

from brokerd.connection.codec import encode
from brokerd.connection.packets import MQTT_5, Pubrel, Subscription

from . import session_transfer
from .clock import LOOP_CLOCK, Clock
from .inflight import AWAIT_ACK as AWAIT_ACK
from .inflight import AWAIT_COMP as AWAIT_COMP
from .inflight import RANGED, held_back, resend_held_back
from .inflight import Inflight as Inflight
from .message import Message
from .ranges import LogRange as LogRange
from .ranges import Range, log_router_id
from .ranges import router_log_dir as router_log_dir
from .spool import SpoolRange, is_spool, note_span
from .topics import filter_matches

if TYPE_CHECKING:
    from brokerd.connection.protocol import Connection

    from .auth import Auth
    from .stats import RouterStats

log = logging.getLogger(__name__)

@dataclass(slots=True)
class SessionLimits:
    max_inflight: int = 20
    max_queued: int = 1000


# An idle session holds no queue and no set of QoS 2 ids: these empty stand-ins (a deque is
# 760 bytes, a set 216) are replaced by real ones on the first message that needs them.
NO_QUEUE: tuple[()] = ()
NO_IDS: frozenset[int] = frozenset()


def _no_entries() -> dict[Any, Any]:
    """``NO_ENTRIES``: an empty dict that refuses entries, so that a writer which did not make
    the session's own table first (``Session.own_subscriptions``...) raises TypeError instead of
    giving every idle session its entry. Made by ``type()``: mypyc compiles this module, and
    a compiled class cannot subclass dict; its compiled dict operations fall back to the
    methods of a dict that is not exactly a dict, so these refusals hold there too."""
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise TypeError("a session's shared empty table written to: write to Session.own_...() instead")

    adders = ("__setitem__", "__ior__", "setdefault", "update")
    empty: dict[Any, Any] = type("NoEntries", (dict,), {"__slots__": (), "__module__": __name__, **dict.fromkeys(adders, refuse)})()
    return empty


# An idle session's subscriptions, shared subscriptions and in-flight window until their first
# entry: this one empty table, not three dicts of its own (64 bytes each). Readers read it as
# any dict; writers write to ``Session.own_subscriptions()``, ``own_shared()``, ``own_inflight()``.
NO_ENTRIES: dict[Any, Any] = _no_entries()


def recency(state: dict) -> tuple[int, int]:
    """Which of two copies of a session (a takeover header, or its state in a snapshot) is the
    current one: the higher (ownership epoch, arrival time at its router). The epoch orders
    every chain of moves without clocks; the time orders copies of one epoch (a session created
    anew on two routers) by wall clock."""
    return state.get("epoch", 0), state.get("arrived", 0)


class Session:
    __slots__ = ("client_id", "persistent", "subscriptions", "conn", "inflight", "queue",
                 "inbound_qos2", "limits", "stats", "next_pid", "receive_max", "expiry_s",
                 "will", "will_due_ms", "dropped", "log", "cursor", "shared", "ranges", "username", "acl",
                 "arrived_ms", "epoch", "owner_known", "clock", "unsent")

    def __init__(self, client_id: str, persistent: bool, limits: SessionLimits, stats: RouterStats,
                 clock: Clock = LOOP_CLOCK) -> None:
        self.client_id = client_id
        self.persistent = persistent
        self.subscriptions: dict[str, Subscription] = NO_ENTRIES  # own_subscriptions() to add
        self.conn: Connection | None = None
        self.inflight: dict[int, Inflight] = NO_ENTRIES  # own_inflight() to add
        self.queue: deque[tuple[Message, int, bool]] | tuple[()] = NO_QUEUE  # a deque once used
        # QoS 2 packet ids received, PUBREL not yet seen: a set once used
        self.inbound_qos2: set[int] | frozenset[int] = NO_IDS
        self.limits = limits
        self.stats = stats
        self.clock = clock  # its router's: when a message it holds has expired
        self.next_pid = 1
        self.receive_max = limits.max_inflight
        self.expiry_s = 0
        self.will: Message | None = None  # a delayed will, waiting with the offline session
        self.will_due_ms = 0  # when it goes out (ms since the epoch)
        self.username: str | None = None  # the identity it connected with (ACLs apply to it)
        # Whether ``username`` is its owner's (``router.ownership``): False for a session kept by a
        # version that did not record it, which no identity may resume.
        self.owner_known = True
        self.acl: Auth | None = None  # the router's when topics are restricted (router.acl)
        self.dropped = 0  # messages dropped for it, every reason (the stats' sessions that drop most)
        # With the commit log on, a persistent session that is offline (or catching up) keeps a
        # position in its router's log instead of copies: ``cursor`` is the next offset to read.
        self.log: Any = None
        self.cursor: int | None = None
        # Shared subscriptions ($share/group/filter → subscription), apart from ``subscriptions``
        # so that catching up from the log never replays a group's messages: other members got them.
        self.shared: dict[str, Subscription] = NO_ENTRIES  # own_shared() to add
        # Ranges of other routers' logs (this node) still to read, before ``cursor``: a session
        # moved here by a takeover brings its backlog as positions.
        self.ranges: list[Range] | tuple[()] = ()
        # Its ownership epoch (one more at every move to another router; kept across a restart)
        # and when this router took it on: of two copies held after a failure, the one of the
        # highest epoch is the current state, the later arrival among equals (``recency``).
        self.epoch = 0
        self.arrived_ms = 0
        # What a resume found in flight and has not sent again yet (``attach``): packet id →
        # entry, in order, each still in ``inflight``. They go out, before the queue, as
        # acknowledgements free the window (``pump``); one the client acknowledges meanwhile
        # leaves it (``_done``, ``pubrec``). An OrderedDict while any waits (each step O(1)).
        self.unsent: OrderedDict[int, Inflight] | tuple[()] = ()

    # -- delivery -------------------------------------------------------------------------------------

    def deliver(self, msg: Message, qos: int, retain: bool) -> None:
        """Send now if the window allows, else queue (bounded); QoS 0 never waits. A message that
        expired before it got here is the caller's to drop (once per message, not per session:
        ``Router._deliver``); one that expires while it waits here is dropped in ``pump``."""
        conn = self.conn
        if qos == 0:
            if conn is None:
                return
            if conn.write_paused:
                self.stats.drop_slow_consumer += 1
                self.dropped += 1
                return
            outbound = conn.outbound
            if outbound is None:
                conn.send(msg.encoded(conn.protocol_level, 0, retain, self.clock)[0])
            else:
                parts = outbound.parts(msg, 0, retain, self.clock)
                if parts is None:
                    self.stats.drop_too_large += 1
                    self.dropped += 1
                    return
                conn.send(parts[0])
            conn.counters.msgs_out += 1
            conn.traffic.msgs_out += 1
            return
        if self.cursor is not None and msg.log_offset >= 0:
            return  # the log holds it at or after the cursor: catch-up delivers it, in order
        if conn is not None and not self.queue and len(self.inflight) < self.receive_max:
            self._send_new(conn, msg, qos, retain)
            return
        self._enqueue(msg, qos, retain)

    def deliver_packet(self, packet: bytes) -> bool:
        """``deliver`` at QoS 0 for a forwarded plain QoS 0 PUBLISH as MQTT 3.1/3.1.1 frames it,
        without a ``Message``: the receiving router's commonest delivery. Returns False, sending
        nothing, when the connection speaks MQTT 5 and needs its own encoding."""
        conn = self.conn
        if conn is None:
            return True
        if conn.protocol_level >= MQTT_5:
            return False
        if conn.write_paused:
            self.stats.drop_slow_consumer += 1
            self.dropped += 1
            return True
        conn.send(packet)
        conn.counters.msgs_out += 1
        conn.traffic.msgs_out += 1
        return True

    def deliver_copy(self, msg: Message, qos: int, retain: bool) -> None:
        """A QoS 1/2 copy read back or handed on for this session (the catch-up of a session
        taken from a replica, a hand-on after a move): as ``deliver``, but not bounded by
        ``max_queued``. What such copies bring is bounded where it is read (``max_queued`` per
        router asked by a router without a log; one with a log spools them instead:
        ``Router.take_copies``), each was acknowledged to its publisher, and they come in bursts from
        several routers at once while the session drains a backlog: the bound dropped the last
        router's (chaos seed 1657827226 lost 84 when three read-backs of 1,209 met)."""
        conn = self.conn
        if conn is not None and not self.queue and len(self.inflight) < self.receive_max:
            self._send_new(conn, msg, qos, retain)
            return
        self._queue().append((msg, qos, retain))

    def _enqueue(self, msg: Message, qos: int, retain: bool) -> None:
        """Behind the window or offline: queue, bounded by ``max_queued`` (newer are dropped)."""
        if len(self.queue) >= self.limits.max_queued:
            self.stats.drop_queue_full += 1
            self.dropped += 1
            return
        self._queue().append((msg, qos, retain))

    def _queue(self) -> deque[tuple[Message, int, bool]]:
        """The queue, made on first use."""
        queue = self.queue
        if queue.__class__ is deque:
            return queue
        queue = self.queue = deque()
        return queue

    def own_subscriptions(self) -> dict[str, Subscription]:
        """``subscriptions`` to add to: made at the first (reading needs no dict of its own)."""
        subs = self.subscriptions
        if subs is NO_ENTRIES:
            subs = self.subscriptions = {}
        return subs

    def own_shared(self) -> dict[str, Subscription]:
        """``shared`` to add to: made at the first."""
        shared = self.shared
        if shared is NO_ENTRIES:
            shared = self.shared = {}
        return shared

    def own_inflight(self) -> dict[int, Inflight]:
        """``inflight`` to add to: made at the first message sent at QoS 1 or 2."""
        inflight = self.inflight
        if inflight is NO_ENTRIES:
            inflight = self.inflight = {}
        return inflight

    def qos2_ids(self) -> set[int]:
        """The set of inbound QoS 2 ids awaiting PUBREL, made on first use (to add to it; reading
        ``inbound_qos2`` needs no set)."""
        ids = self.inbound_qos2
        if ids.__class__ is set:
            return ids
        ids = self.inbound_qos2 = set()
        return ids

    def deliver_shared(self, msg: Message, qos: int, retain: bool) -> None:
        """A message this session was chosen for as a member of a shared subscription. Unlike
        ``deliver``, a QoS 1/2 message is kept even while the session reads from the log (offline
        or catching up): catch-up replays only normal subscriptions, so the log is no copy of it.
        The caller picked a member that may read it (``SharedRouting._to_member``)."""
        if qos == 0 or self.cursor is None:
            self.deliver(msg, qos, retain)
            return
        self._enqueue(msg, qos, retain)

    def readable(self, msg: Message) -> bool:
        """Whether this session's identity may read ``msg`` now (the caller tests ``acl`` first:
        without an ACL nothing is checked). Routes are checked when folded; this is for what
        reaches a session by other ways: queued, in flight, read back, handed on, a group's."""
        return self.acl.may_read(self.username, self.client_id, msg.topic)  # type: ignore[union-attr]  # (see above)

    def _alloc_pid(self) -> int:
        pid = self.next_pid
        inflight = self.inflight
        while pid in inflight:
            pid = pid + 1 if pid < 65535 else 1
        self.next_pid = pid + 1 if pid < 65535 else 1
        return pid

    def _send_new(self, conn: Connection, msg: Message, qos: int, retain: bool) -> None:
        outbound = conn.outbound
        if outbound is None:
            head, tail = msg.encoded(conn.protocol_level, qos, retain, self.clock)
        else:
            parts = outbound.parts(msg, qos, retain, self.clock)
            if parts is None:  # beyond the client's Maximum Packet Size: discarded for it
                self.stats.drop_too_large += 1
                self.dropped += 1
                return
            head, tail = parts
        inflight = self.inflight
        if inflight is NO_ENTRIES:  # (``own_inflight``, inline: once per QoS 1/2 message)
            inflight = self.inflight = {}
        pid = self._alloc_pid()
        inflight[pid] = Inflight(msg, qos, retain)
        # Three shared/tiny chunks; the connection joins a tick's chunks once, so the payload is
        # copied once, on its way to the socket.
        conn.send(head)
        conn.send(pid.to_bytes(2, "big"))
        conn.send(tail)
        conn.counters.msgs_out += 1
        conn.traffic.msgs_out += 1

    def pump(self) -> None:
        """Move queued messages (then log records, when catching up) into the inflight window,
        after what a resume held back (``unsent``)."""
        conn = self.conn
        if self.unsent and (conn is None or not resend_held_back(self, conn)):
            return
        queue = self.queue
        refills = 0
        while conn is not None and len(self.inflight) < self.receive_max:
            if not queue:
                if self.cursor is None and not self.ranges:
                    return
                if refills == 16:  # a long catch-up: let other connections run, then go on
                    self.clock.call_soon(self.pump)
                    return
                refills += 1
                if not self._refill():  # another router's records not on disk yet: soon
                    self.clock.call_later(0.05, self.pump)
                    return
                queue = self.queue  # the refill may have made it
                continue
            msg, qos, retain = queue.popleft()
            if msg.expires_ms and msg.expired(self.clock.unix() * 1000):  # MQTT-3.3.2-5: not delivered once expired
                self.stats.drop_expired += 1
                self.dropped += 1
                continue
            if self.acl is not None and not self.readable(msg):
                self.stats.drop_revoked += 1  # queued before a read grant was revoked (SIGHUP), or from another owner
                self.dropped += 1
                continue
            self._send_new(conn, msg, qos, retain)

    def _refill(self, batch: int = 256) -> bool:
        """Read the next records (of the ranges brought by a takeover, then after ``cursor``) and
        queue those this session subscribes to. False when a range's next records are not
        readable yet (try again later)."""
        self.stats.state_moves += 1
        if self.ranges:
            rng = self.ranges[0]
            records = rng.read(batch, self.clock.now())
            if records is None:
                if any(e.msg is not None and e.msg.log_offset <= RANGED for e in self.inflight.values()):
                    return False  # what it gave is not all acknowledged: the snapshot still names it
                self.ranges.pop(0)
                rng.discard()
                return True
            if not records:
                return False
            if rng.copies:  # a spool: queue entries as the old router had them
                queue = self._queue()
                for pos, (qos, retain, values) in records:
                    msg = Message.from_list(values)
                    msg.log_offset = RANGED - pos
                    queue.append((msg, qos, retain))
            else:
                self._queue_matching(records, ranged=True)
            return True
        records = self.log.read(self.cursor, max_records=batch)
        if not records:
            self.cursor = None  # caught up: from here on, live delivery
            return True
        self._queue_matching(records)
        self.cursor = records[-1].offset + 1
        return True

    def _queue_matching(self, records: list, ranged: bool = False) -> None:
        """Queue the QoS 1/2 records this session's normal subscriptions match (expired ones are
        dropped when they reach the window, as any queued message). ``ranged``: records of a
        range (``RANGED``), not of this router's log."""
        for item in self.matching(records, ranged):
            self._queue().append(item)  # (the queue is made only if something matches)

    def matching(self, records: list, ranged: bool = False) -> Iterator[tuple[Message, int, bool]]:
        """The QoS 1/2 records this session's normal subscriptions match, as queue entries."""
        for rec in records:
            if rec.qos > 0:
                best, ids = self._best_qos(rec)
                if best > 0:
                    msg = Message.from_record(rec)
                    if ranged:
                        msg.log_offset = RANGED - rec.offset
                    yield msg.with_ids(ids) if ids else msg, min(best, rec.qos), False

    def range_values(self) -> list[list]:
        """The ranges still to read, as plain values for the snapshot: the first from the oldest
        of its messages this session still holds unacknowledged (queued or in flight), so a
        restart delivers those again rather than losing them (at least once). A range is let go
        only once all it gave is acknowledged (``_refill``): what is held is the first one's."""
        out = [r.to_list() for r in self.ranges]
        if out:
            held = [e.msg.log_offset for e in self.inflight.values() if e.msg is not None]
            held += [m.log_offset for m, _, _ in self.queue]
            held = [RANGED - o for o in held if o <= RANGED]
            if held:
                out[0][1] = min(out[0][1], *held)
        return out

    def add_range(self, rng: SpoolRange) -> None:
        """Copies spooled for this session here (a read-back's answers: ``Router.take_copies``),
        read after the ranges it has. Live messages then wait in the log (the cursor, from its
        end) and come after them, as after a move that brought ranges."""
        if self.log is not None and self.cursor is None:
            self.cursor = self.log.next_offset
        self.ranges = [*self.ranges, rng]
        self.stats.state_moves += 1  # the snapshot names the range
        if self.conn is not None and len(self.inflight) < self.receive_max:
            self.pump()

    def held_copies(self) -> list[list]:
        """The copies this session holds in memory only, unacknowledged, as queue entries: read
        from no log and no spool (the in-flight window a move from another router brought,
        hand-ons, a read-back without a log). The snapshot keeps them (``held``), so a restart
        of this router delivers them again (at least once) rather than losing them."""
        out = [[e.qos, e.retain, e.msg.to_list()] for e in self.inflight.values()
               if e.state == AWAIT_ACK and e.msg is not None and e.msg.log_offset == -1]
        out += [[qos, retain, m.to_list()] for m, qos, retain in self.queue if m.log_offset == -1]
        return out

    def copy_spans(self, ranges: list[list] | None = None) -> dict[str, list]:
        """Where the copies this session holds outside its router's log lie in their origins'
        logs ({origin router: [lowest, highest offset]}): those held unacknowledged (a moved
        session's, read-back answers, hand-ons), a spool's entries not read yet, and the ranges
        of this node's other logs it has still to read. They are on this node only (in memory,
        a spool file, another router's log here); its replicated state names them, so the
        router that takes the session from a replica after this node's loss reads them back
        from those logs (``Replication.read_back_copies``). Empty for a session fed from its
        own log. ``ranges``: its ``range_values()``, where the caller has them (the snapshot)."""
        spans: dict[str, list] = {}
        for directory, start, end, *rest in self.range_values() if ranges is None else ranges:
            if is_spool(directory):  # its entries not read yet (``SpoolRange.spans``)
                for origin, (lo, hi, _) in rest[0].items():
                    note_span(spans, origin, lo)
                    note_span(spans, origin, hi)
            elif start < end:
                # Another router's log on this node (a move between its workers), from the
                # oldest record read from it and held: lost with this node too. Read back from
                # its replica, the span whole (what that router logged for other origins too).
                origin = log_router_id(directory)
                note_span(spans, origin, start)
                note_span(spans, origin, end - 1)
        for e in self.inflight.values():
            if e.msg is not None and e.msg.log_offset < 0:
                note_span(spans, e.msg.origin_router, e.msg.origin_offset)
        for m, _, _ in self.queue:
            if m.log_offset < 0:
                note_span(spans, m.origin_router, m.origin_offset)
        return {origin: span[:2] for origin, span in spans.items()}

    def position(self) -> int | None:
        """Where a catch-up must start to lose nothing unacknowledged (for snapshots)."""
        if self.log is None:
            return None
        # (mypy: the inflight entries of a logged session carry their messages)
        offsets = [e.msg.log_offset for e in self.inflight.values()  # type: ignore[union-attr]
                   if e.state == AWAIT_ACK]  # (AWAIT_ACK: its message is kept)
        offsets += [m.log_offset for m, _, _ in self.queue]
        if self.cursor is not None:
            offsets.append(self.cursor)
        offsets = [o for o in offsets if o >= 0]
        return min(offsets) if offsets else self.log.next_offset

    # -- acknowledgements from the client -----------------------------------------------------------

    def puback(self, pid: int) -> bool:
        entry = self.inflight.get(pid)
        if entry is None or entry.qos != 1:
            return False
        self._done(pid)
        return True

    def pubrec(self, pid: int, reason: int = 0) -> bool:
        """PUBREC for a QoS 2 message sent; an error reason code (0x80 and up) ends the flow
        there: no PUBREL, the packet id is free again (MQTT 5 4.3.3)."""
        entry = self.inflight.get(pid)
        if entry is None or entry.qos != 2:
            return False
        if reason >= 0x80:
            self._done(pid)
            return True
        entry.state = AWAIT_COMP
        if self.unsent:
            self.unsent.pop(pid, None)  # (it had it from before: in the window now, as PUBREL)
        self.stats.state_moves += 1  # no longer awaiting its acknowledgement: the position moves
        entry.msg = None  # the payload is no longer needed
        if self.conn is not None:
            self.conn.send(encode(Pubrel(pid), self.conn.protocol_level))
        return True

    def pubcomp(self, pid: int) -> bool:
        entry = self.inflight.get(pid)
        if entry is None or entry.state != AWAIT_COMP:
            return False
        self._done(pid)
        return True

    def pubrel(self, pid: int) -> None:
        """PUBREL for a QoS 2 message received: its packet id is free again."""
        ids = self.inbound_qos2
        if pid in ids:
            # (mypy: a set once an id is in it (``NO_IDS``, the frozenset, is empty))
            ids.remove(pid)  # type: ignore[union-attr]
            self.stats.state_moves += 1

    def _done(self, pid: int) -> None:
        """The flow of ``pid`` ended: its place in the window goes to what waits, and the session's
        state changed without the log growing (``RouterStats.state_moves``: the snapshot's cue)."""
        del self.inflight[pid]
        self.stats.state_moves += 1
        unsent = self.unsent
        if unsent:
            unsent.pop(pid, None)  # (a PUBACK for one it had before: not to be sent again)
            self.pump()
        elif self.queue or self.cursor is not None:
            self.pump()

    # -- connection changes ---------------------------------------------------------------------------

    def attach(self, conn: Connection, receive_max: int | None = None) -> None:
        """A connection takes this session: resend what is unacknowledged, then the queue, at
        most its Receive Maximum of PUBLISHes unacknowledged (MQTT-4.9.0-2): a PUBREL goes again
        at once, the PUBLISHes beyond the window wait in ``unsent`` (``inflight.held_back``)."""
        self.conn = conn
        self.receive_max = min(self.limits.max_inflight, receive_max or self.limits.max_inflight)
        self.unsent = held_back(self.inflight, conn)
        self.pump()

    def detach(self) -> None:
        """The connection is gone. A persistent session with a healthy log drops its queue and
        keeps a log position instead, so what it can catch up on is bounded by log retention.

        The position is the lowest of the cursor and the queue's records: a queue can hold
        records below a cursor that is already set, read ahead by a catch-up (``_refill``) or
        queued live before a read-back's spool set the cursor (``add_range``). Dropped with the
        queue and the cursor kept, they were lost (chaos: a session moved on its node, or sent
        away, while it caught up). Retained messages queue in their walk's order, not the log's."""
        self.conn = None
        self.unsent = ()  # (still in flight: the next connection resends them)
        log = self.log
        if not self.persistent or log is None or log.error is not None:
            return
        if self.shared:
            return  # group messages are in no catch-up: keep copies (bounded by max_queued)
        if any(m.log_offset < 0 for m, _, _ in self.queue):
            return  # something not in the log (written while it failed): keep the copies
        lowest = log.next_offset if self.cursor is None else self.cursor
        for m, _, _ in self.queue:
            if m.log_offset < lowest:
                lowest = m.log_offset
        self.cursor = lowest
        self.queue = NO_QUEUE

    def group_orphans(self, since: int = -1) -> list[tuple[Message, str]]:
        """The QoS 1/2 messages sent or queued to this session as a group member and not yet
        received (no PUBACK / PUBREC), with their group, for handing on when the session ends:
        in flight, queued, or in a spool its move brought (read here, once: the session ends).
        ``since``: only those queued from that index of the queue on (a move in doubt settled
        late: ``SessionLife.moved_after_all``).

        Group deliveries are not marked (that would cost every delivery): a message counts as a
        group's when no normal subscription of this session matches it, so that a normal copy is
        never handed to a group; each (message, group) pair is taken once per copy held (one
        message held twice, for two groups, goes to both)."""
        if since >= 0:
            return self._groups_of([m for m, qos, _ in islice(self.queue, since, None) if qos], set())
        held = [e.msg for e in self.inflight.values() if e.state == AWAIT_ACK and e.msg is not None]
        held += [m for m, qos, _ in self.queue if qos]
        taken: set[tuple[int, str]] = set()
        out = self._groups_of(held, taken)
        for rng in self.ranges:
            if rng.copies:  # a move's queue, spooled by the new owner (``router.spool``): a clean
                # start ends the session it brought, and group copies are in no log to read again
                while (entries := rng.read(256)) is not None and entries:
                    out += self._groups_of([Message.from_list(values) for _, (qos, _, values) in entries if qos],
                                           taken)
        return out

    def _groups_of(self, held: list[Message], taken: set[tuple[int, str]]) -> list[tuple[Message, str]]:
        """``group_orphans`` of these copies: each with the first of this session's groups it
        matches not ``taken`` for it yet, unless a normal subscription matches it too."""
        out: list[tuple[Message, str]] = []
        subscriptions = self.subscriptions
        for msg in held:
            topic = msg.topic
            if any(filter_matches(f, topic) for f in subscriptions):
                continue
            for key in self.shared:
                if (id(msg), key) not in taken and filter_matches(key.split("/", 2)[2], topic):
                    taken.add((id(msg), key))
                    out.append((msg, key))
                    break
        return out

    # -- transfer (takeover across routers, persistence) ---------------------------------------------

    def export_state(self, same_node: bool = False) -> dict:
        """Everything a new owner needs, as plain values, in one dict (the header with every copy
        in its queue). For tests and small sessions; takeovers stream ``export_header`` and
        ``export_copies`` in chunks."""
        state = self.export_header(same_node)
        state["queue"] = [item for chunk in self.export_copies(same_node) for item in chunk]
        return state

    def export_header(self, same_node: bool) -> dict:
        """What a new owner needs besides the queued copies (``session_transfer``)."""
        return session_transfer.export_header(self, same_node)

    def export_copies(self, same_node: bool, chunk_bytes: int = 1 << 20,
                      limit: int | None = -1) -> Iterator[list]:
        """The queued messages as copies, in chunks (``session_transfer``)."""
        return session_transfer.export_copies(self, same_node, chunk_bytes, limit)

    def _best_qos(self, rec: Any) -> tuple[int, tuple[int, ...]]:
        """The highest QoS of this session's subscriptions matching a log record (-1: none), and
        their Subscription Identifiers (as live delivery folds overlapping subscriptions)."""
        best = -1
        ids: tuple[int, ...] = ()
        topic = rec.topic
        me = self.client_id
        if self.acl is not None and not self.acl.may_read(self.username, me, topic):
            return best, ids
        for sub in self.subscriptions.values():
            if filter_matches(sub.topic_filter, topic) and not (sub.no_local and rec.client_id == me):
                if sub.qos > best:
                    best = sub.qos
                if sub.sub_id:
                    ids += (sub.sub_id,)
        return best, ids

    def will_state(self) -> list | None:
        """A delayed will and when it is due, as plain values: it is session state (MQTT 5 4.1),
        carried by a takeover and kept across a restart."""
        return [self.will.to_list(), self.will_due_ms] if self.will is not None else None

    def restore_will(self, values: list | None) -> None:
        if values:
            will, self.will_due_ms = values
            self.will = Message.from_list(will)

    def import_state(self, state: dict) -> None:
        """Load the state exported by another router (``session_transfer``)."""
        session_transfer.import_state(self, state)
