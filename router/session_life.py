"""Session life on a router: creation, the end of a session, expiry, and moving a session to or
from another router (takeover); its wills are a part of their own (``wills``).

A part the router owns (``router.life``; rumqttd's model: the router composes parts, each a
file). It holds the sessions and their moves, and is given what else it uses: the router's
clock, its links (``Wiring``: mesh, log, snapshot store, agreed owners, ACL), its connections
(``clients``), the subscription index (``subscriptions``: the router's ``subscribe`` and
``unsubscribe``), the shared-subscription part, and the router's ``publish`` (for wills).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator
from itertools import islice
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from brokerd.connection.packets import Subscription
from brokerd.connection.ratelimit import CONNECTIONS

from .inflight import AWAIT_ACK
from .message import Message
from .ownership import REFUSE, Claim, decide, name
from .ranges import make_range
from .retained_out import finish as finish_walks
from .session import Session, recency
from .session_state import restore_state
from .spool import spooled
from .wills import Wills

if TYPE_CHECKING:
    from .clock import Clock, Timer
    from .ports import ClientHandle
    from .router import RouterConfig
    from .shared_routing import SharedRoutes
    from .stats import RouterStats
    from .wiring import Wiring

log = logging.getLogger(__name__)

MOVED_IN_MAX = 100_000  # arrival times kept (the oldest go first): a bound, not a rule
FENCE_WAIT_S = 30.0  # a fenced copy waits at most this long for its new owner to be heard again
FENCE_POLL_S = 0.05
# A fence naming a router whose takeover of the session was undone here waits this long: that
# router's claim timed out and committed later (it holds no session), and it moves the record
# back (``SessionOwners.on_owned``); fenced at once, the session would be handed to nobody.
FENCE_DEFER_S = 5.0


class Subscriptions(Protocol):
    """The router's subscription index, as a session's life uses it."""

    def subscribe(self, session: Session, sub: Subscription) -> bool: ...

    def unsubscribe(self, session: Session, topic_filter: str) -> bool: ...


class Doubt(NamedTuple):
    """A move given up without an answer (``SessionLife.moved``, ``doubt``): what a late
    confirmation hands on from (``moved_after_all``)."""

    session: Session
    to: str  # the router it went to
    start: int  # this log's end at the export (-1: no log)
    queued: int  # its queue's length at the export: what joined after it was not exported
    mark: int  # its queue's length when the move was given up: beyond, what came while in doubt
    ranges: int  # its ranges then: those added later (read-backs spooled while in doubt) were not exported


class SessionLife:
    def __init__(self, config: RouterConfig, stats: RouterStats, clock: Clock, wiring: Wiring,
                 clients: dict[str, ClientHandle], subscriptions: Subscriptions, shared: SharedRoutes,
                 publish: Callable[[Message], None]) -> None:
        self.config = config
        self.stats = stats
        self.clock = clock
        self.wiring = wiring
        self.clients = clients  # client id → the live connection's handler (the router's)
        self.subscriptions = subscriptions
        self.shared = shared
        self.sessions: dict[str, Session] = {}
        self.moving: dict[str, Session] = {}  # exported to another router, not yet confirmed there
        # Of those, this router's log end and their queue's length when they were exported: what
        # reaches them from there on, logged or queued, is handed on (``_hand_on_later``).
        self.moving_from: dict[str, tuple[int, int]] = {}
        self.stale_moving: set[str] = set()  # of those, the ones found stale meanwhile (a fence)
        # Exported, then kept: the new owner fell silent before confirming (``Doubt``), until it
        # confirms or a client resumes here.
        self.in_doubt: dict[str, Doubt] = {}
        self.moved_in: dict[str, float] = {}  # sessions taken over from another router: when (Unix time)
        # With agreement: client id -> the router whose takeover of it was undone here (its claim
        # was refused or timed out), until the session moves or a fence naming that router comes.
        self.undone: dict[str, str] = {}
        self._expiry: dict[str, Timer] = {}
        self.wills = Wills(self.sessions, stats, clock, wiring, publish)

    # -- sessions -------------------------------------------------------------------------------------

    def new_session(self, client_id: str, persistent: bool) -> Session:
        session = Session(client_id, persistent, self.config.session, self.stats, self.clock)
        session.log = self.wiring.commit_log
        session.acl = self.wiring.acl
        session.arrived_ms = int(self.clock.unix() * 1000)
        self.sessions[client_id] = session
        return session

    def end_session(self, session: Session) -> None:
        """A session ends for good (clean disconnect, expiry, a clean start replacing it): drop it,
        then hand the QoS 1/2 group messages it had not acknowledged to other members of their
        groups (MQTT 5.0 section 4.8.2: SHOULD). A takeover moves a session instead: not here."""
        orphans = session.group_orphans() if session.shared else []
        self.drop_session(session)
        owners = self.wiring.owners
        if owners is not None:
            owners.ended(session.client_id)  # its agreed record goes too
        for msg, key in orphans:
            self.shared.to_another_member(msg, key)

    def drop_session(self, session: Session) -> None:
        """Forget a session and everything it subscribed to."""
        for topic_filter in list(session.subscriptions):
            self.subscriptions.unsubscribe(session, topic_filter)
        for key in list(session.shared):
            self.shared.unsubscribe(session, key)
        self._forget(session)

    def yield_to_newer(self, client_id: str, state: dict) -> None:
        """A takeover brought a copy of a session this router holds too (the two sides of a
        partition that healed before the fence came; a copy restored here from a disk): of two
        copies the more recent is the session (``recency``, as among the copies a takeover is
        offered), so the one here is dropped if it is older. Before, the one here was kept
        whatever its age, and the newer one's holder was told to drop it."""
        session = self.sessions.get(client_id)
        if (session is not None and session.conn is None and client_id not in self.moving
                and recency(state) > (session.epoch, session.arrived_ms)):
            log.warning("session %s: the copy here (epoch %d) is older than the one %s gave (epoch %d): "
                        "that one is taken", client_id, session.epoch, state.get("replica") or "another router",
                        state.get("epoch", 0))
            self.drop_session(session)

    def _mark_soon(self) -> None:
        """Sessions moved or were fenced: the snapshot is written at the next iteration."""
        state = self.wiring.state
        if state is not None:
            state.mark(soon=True)

    def _forget(self, session: Session) -> None:
        """No longer this router's session: out of ``sessions``, its expiry and will timers
        stopped (its subscriptions are the caller's to end)."""
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
            self.in_doubt.pop(session.client_id, None)  # (a move in doubt ends with it)
        timer = self._expiry.pop(session.client_id, None)
        if timer is not None:
            timer.cancel()
        if session.will is not None:
            self.wills.cancel_will(session.client_id)
        for rng in session.ranges:
            if rng.copies:  # its spool (this router's name of it): ended, or taken elsewhere
                rng.discard()

    def restore(self, client_id: str, st: dict, log_start: int | None, will_grace: float) -> Session:
        """A persistent session as a snapshot kept it (``StateStore.load``), offline, back here.
        ``log_start``: this router's log's first offset (None: no log): no position before it.
        A delayed will waits at least ``will_grace`` seconds (``StateStore.load``)."""
        session = self.new_session(client_id, True)
        restore_state(session, st)
        if not self.config.verifies_identities:
            # Nothing here verifies a user name, so every client is anonymous: a name kept
            # by an earlier version, which took claims at their word, is only a claim, and
            # would lock the session's own client out (``router.ownership``).
            session.username = None
        for values in st["subs"]:
            self.subscriptions.subscribe(session, Subscription.from_values(values))
        for values in st.get("shared", ()):
            self.shared.subscribe(session, Subscription.from_values(values))
        for qos, retain, values in st.get("held", ()):  # copies it held in memory: first
            session.deliver_copy(Message.from_list(values), qos, retain)
        if st.get("ranges"):  # other routers' log ranges a takeover brought, still to read
            session.ranges = [make_range(*r) for r in st["ranges"]]
        pos = st.get("position")
        if log_start is not None and pos is not None:
            session.cursor = max(pos, log_start)
        live = st.get("live_will")
        if live and session.will is None:
            # Its client was connected when this router stopped without closing it (a
            # crash): the connection is gone, so the will is due after its delay from now.
            session.will = Message.from_list(live[0])
            session.will_due_ms = int((self.clock.unix() + live[1]) * 1000)
        self.schedule_expiry(session)
        self.wills.rearm_will(session, will_grace)
        return session

    def schedule_expiry(self, session: Session) -> None:
        """MQTT 5 session expiry: a finite interval removes the offline session when it runs out."""
        if 0 < session.expiry_s < 0xFFFFFFFF:
            self._expiry[session.client_id] = self.clock.call_later(session.expiry_s, self._expire, session)

    def cancel_expiry(self, client_id: str) -> None:
        timer = self._expiry.pop(client_id, None)
        if timer is not None:
            timer.cancel()

    def _expire(self, session: Session) -> None:
        """The expiry timer ran out. Not for a moving session (``release_session`` stops the
        timer; this is for one armed again meanwhile): its new owner has it if the move is
        confirmed, and one that fails arms the timer again (``moved``). Ended here mid-move, its
        spool went while the export read it, its delayed will went out though the will had gone
        with the session, and the confirmation found nothing to hand on."""
        self._expiry.pop(session.client_id, None)
        if session.client_id in self.moving:
            return
        if session.conn is None and self.sessions.get(session.client_id) is session:
            log.info("session %s expired", session.client_id)
            will = session.will
            self.end_session(session)
            if will is not None:  # the session ended before its will's delay did: the will goes now
                self.wills.publish_will(will, session.username)

    # -- moves --------------------------------------------------------------------------------------

    def claim_refused(self, client_id: str, claimant: str | None, refuse: bool) -> list | None:
        """Another router asks for ``client_id``'s session for a CONNECT of ``claimant``: with
        ``refuse`` (its ``--session-owner``) and a session here of another identity, the answer
        is no, ``[the owner]``, given before anything is let go (its client stays connected);
        else None (the takeover goes on)."""
        session = self.sessions.get(client_id)
        if session is None or not refuse or decide(session.owner_known, session.username, claimant,
                                                    REFUSE) is not Claim.REFUSE:
            return None
        CONNECTIONS.log(log, "session %s of user %s not handed over: user %s connected with its client id on "
                        "another router (--session-owner refuse)", client_id, name(session.username), name(claimant))
        return [session.username]

    def _hand_on_later(self, session: Session, to: str, start: int, late: bool = False, queued: int = -1,
                       ranges: int = -1) -> None:
        """A persistent session moved to router ``to``. Messages for it may still reach this
        router: routed here by routers that did not know of its move yet, or frames sent again
        to this router after a restart. Its new owner confirmed only once every router had
        acknowledged its interest, so from then on they send it there too; whatever they sent
        here before is in their frames ahead of their answer to a barrier asked now. So the
        session stays subscribed here (not as a session: a client that connects with its id
        here is another takeover) until that barrier is answered; what it got meanwhile,
        logged from ``start`` on (or queued, without a log), is then handed on (SESSION_HANDON),
        and the new owner drops what came to it directly (``Mesh.confirm_takeover``'s marks).
        At least once; costs one barrier and one read of this log per move. ``late``: a move
        settled after it was given up (``moved_after_all``): without a log, its queue holds what
        came meanwhile, and goes too (with what was exported before: at least once).

        ``queued``: its queue's length at the export (``release_session``). What joined the queue
        after it, while the session moved, was not exported (``Session.export_copies``) and is
        handed on first: without a log all of it, with one the copies this log does not hold
        (hand-ons, read-backs). Dropped with the queue at the confirmation, these were lost
        (acknowledged to their publishers): what this router, or any other not yet told of the
        new owner's interest, sent the session after its last chunk left. Some of them may have
        reached the new owner directly too (once its interest was known here): at least once.
        After a late move with a log, the same: they were dropped with the queue
        (``moved_after_all``). Without a log a late move hands on its whole queue instead.

        ``ranges``: after a late move, how many ranges it had when the move was given up. Those
        added later are spools of copies read back or handed on to it while in doubt
        (``take_copies``), exported nowhere: the hand-on reads them, then they go. Discarded
        with the others, they were lost."""
        later = list(session.ranges[ranges:]) if late and ranges >= 0 else []
        if later:
            session.ranges = list(session.ranges[:ranges])
        self._forget(session)  # (its ranges' spools go: the move took them)
        session.will = None  # it went with the session
        for key in list(session.shared):  # a group's messages go to its other members
            self.shared.unsubscribe(session, key)
        held: list[tuple[Message, int, bool]] = []
        if queued >= 0 and (session.log is not None or not late):
            held = [item for item in islice(session.queue, queued, None)
                    if session.log is None or item[0].log_offset < 0]
        if session.log is not None or not late:
            session.queue = ()
        session.inflight = {}
        session.ranges = later
        session.cursor = start if session.log is not None and start >= 0 else None
        # Without a log the new owner has no offsets to tell a copy that also came to it directly
        # (``Mesh.confirm_takeover``'s marks); two origins are known to have: this router and the
        # new owner routed every publish since the move was confirmed to the new owner too (its
        # interest was taken in here first; the new owner held the session). Not after a late move:
        # its queue holds what came before. Nor for ``held``: it came before the confirmation.
        # So without a log what a router published between the export and the moment it learned
        # of the new owner's interest comes after its newer messages that went there directly,
        # and what it published after that moment comes twice (docs/guarantees.md: at least
        # once). ``held`` is not cut where the new owner's interest reached this router: an
        # announcement names a filter, not the session (another session there may have
        # announced it before this one arrived: what was cut would reach nobody), and one
        # already announced arrives not at all; this router's own publishers would be the
        # only ones spared.
        direct = (self.config.router_id, to) if session.log is None and not late else ()
        barrier = self.wiring.mesh.barrier()
        if barrier is None:
            self.hand_on(session, to, direct=direct, held=held)
        else:
            barrier.add_done_callback(  # type: ignore[attr-defined]  # MeshPort's Awaitable is a Future
                lambda f: self.hand_on(session, to, _answered(f), direct=direct, held=held))

    def hand_on(self, session: Session, to: str, answered: dict | None = None, stale: bool = False,
                direct: tuple[str, ...] = (), held: list[tuple[Message, int, bool]] | None = None) -> None:
        """The end of ``_hand_on_later``: what the moved session got here goes to router ``to``;
        its subscriptions here end (and with them, maybe, this router's interest). ``answered``:
        the routers that answered the barrier (their log ends); what the others sent here before
        they knew of the move may still be on its way (a cut link): the new owner asks them
        (``Mesh.hand_on``). ``held``: what it got while it moved, not exported, first.

        Its ranges still here (a stale copy's, spools a late move's session got while in doubt)
        are read into it, then their spools go. Not bounded by ``--max-queued``: every copy was
        acknowledged to its publisher, the new owner takes them unbounded (``take_copies``), and
        the mesh sends them in frames of ``HANDON_ITEMS``; bounded, a move confirmed late with
        more than that waiting in this log lost the rest."""
        if self.wiring.commit_log is not None:
            self.wiring.commit_log.flush()  # read from the disk
        items = [(qos, retain, msg.to_list()) for msg, qos, retain in held or ()]
        items += [item for chunk in session.export_copies(False, limit=None) for item in chunk
                  if item[2][5] not in direct]  # (``direct``: origins whose copies reached ``to`` too)
        for rng in session.ranges:
            if rng.copies:
                rng.discard()
        session.ranges = ()
        for topic_filter in list(session.subscriptions):
            self.subscriptions.unsubscribe(session, topic_filter)
        if items:
            log.info("session %s: %d message(s) that reached this router after it moved handed on to %s",
                     session.client_id, len(items), to)
        self.wiring.mesh.hand_on(to, session.client_id, items, answered, stale)  # even none: the new owner waits for the end

    def take_copies(self, client_id: str, items: list, read_back: bool = False) -> None:
        """Copies for a session here read back or handed on elsewhere (a catch-up after a
        takeover from a replica, a hand-on from its old router): delivered as they come.

        A read-back (``read_back``) asked by a router with a log is not bounded by
        ``--max-queued`` (``CatchupPart.catchup_body``): what does not fit in the session's
        queue below that bound, and everything once a range is pending (the order stays the
        read's), is written to a spool file of its own (``router.spool``; fsynced with
        ``--fsync always``), which the session reads as a range after what it has: any number,
        in bounded memory, kept across a restart (what waits in memory is in the snapshot too:
        ``Session.held_copies``). A spool that cannot be written leaves them in memory
        (logged). A hand-on that comes while a range is pending (the backlog a move brought,
        still read) is spooled too, after it: delivered at once, it went out ahead of that
        backlog, older messages of its publishers (a takeover with 3 MiB queued while two
        publishers went on: about 670 of each one's 800 came after newer ones)."""
        session = self.sessions.get(client_id)
        if session is None:
            return
        # (Not while the session moves: its spool would be read by neither router; in its queue,
        # what it gets then is handed on, ``_hand_on_later``.)
        if ((read_back or session.ranges) and session.log is not None and session.persistent
                and client_id not in self.moving):
            held = [item for item in items if item[0]]
            if held and (session.ranges or len(session.queue) + len(held) > self.config.session.max_queued):
                try:
                    sync = session.log.fsync_policy == "always"
                    session.add_range(spooled(session.log.directory, held, sync))
                    items = [item for item in items if not item[0]]
                except OSError as exc:
                    log.error("session %s: %d copies read back or handed on could not be spooled (%s): kept in memory",
                              client_id, len(held), exc)
        now_ms = self.clock.unix() * 1000
        for qos, retain, values in items:
            msg = Message.from_list(values)
            if msg.expires_ms and msg.expired(now_ms):
                continue
            if session.acl is not None and not session.readable(msg):
                continue  # read back or handed on from where no ACL of this session's identity applied
            if qos:
                session.deliver_copy(msg, qos, retain)
            else:
                session.deliver(msg, qos, retain)
        self.stats.state_moves += 1  # queued without a log record or a client packet

    def drop_stale_sessions(self, client_ids: list[str]) -> None:
        """Sessions of this router that were taken over elsewhere from a replica while it was
        taken for dead (cluster.replication): the copies restored here are stale. One with a
        client connected to it here is kept (logged): that client is the session's now. With
        agreement on, the agreed record decides instead (``fence_stale``, which hands on what
        the stale copy got meanwhile: dropped here, that would be lost)."""
        if self.config.agreed or self.wiring.owners is not None:
            return  # (also while the router joins: ``SessionOwners.check_restored`` reads the records then)
        for cid in client_ids:
            session = self.sessions.get(cid)
            if session is None:
                continue
            if cid in self.moving:
                # Being handed over (a takeover request that was on its way to this router's
                # previous incarnation, say): dropped if the transfer fails rather than kept.
                self.stale_moving.add(cid)
                continue
            if session.conn is not None:
                log.warning("session %s was taken over on another node while this router was taken for "
                            "dead, but a client is connected to it here: kept", cid)
                continue
            self._drop_stale(session)
        self._mark_soon()

    def fence_stale(self, client_id: str, to: str | None) -> None:
        """The agreement names router ``to`` (None: nobody, a clean start ended it) as the owner of
        ``client_id``'s session at a newer epoch than this router's claim (``cluster.agreement.
        owners``): the copy here is stale (this router was cut off, stopped, or restored an old
        snapshot while the session moved). A client connected to it here is disconnected (its will
        stays with the session it left: not published from a stale copy), and what the copy had
        not delivered (in flight, queued, in its log range) goes to ``to``: what was published on
        this side meanwhile is not lost. At least once. A session being handed over by a takeover
        is left to the takeover."""
        session = self.sessions.get(client_id)
        if session is None or client_id in self.moving:
            return
        client = self.clients.get(client_id)
        attached = client is not None and client.session is session
        if to is not None and self.undone.get(client_id) == to and not attached:
            del self.undone[client_id]
            log.warning("session %s: the cluster names %s its owner, whose takeover of it was undone here (its "
                        "claim committed late): kept here while that router withdraws the claim (at most %g s)",
                        client_id, to, FENCE_DEFER_S)
            self.clock.call_later(FENCE_DEFER_S, self._fence_deferred, client_id, to)
            return
        if client is not None and attached:
            client.will = None
            client.taken_over()
            log.warning("session %s is owned by %s now (the cluster agreed while this router was cut off or "
                        "stopped): its client here was disconnected", client_id, to or "nobody")
        if to is None or not (session.persistent or session.expiry_s) or not session.subscriptions:
            self.drop_session(session)
            return
        unacked = [(e.msg, e.qos, e.retain) for e in session.inflight.values()
                   if e.state == AWAIT_ACK and e.msg is not None]  # (QoS 2 past PUBREC: the client has it)
        if unacked:
            session.inflight = {}
            session.queue = deque([*unacked, *session.queue])
        if session.log is not None and session.queue:
            logged = [m.log_offset for m, _, _ in session.queue if m.log_offset >= 0]
            if logged:  # what the queue held of this log is read again from it, in order
                start = min(logged) if session.cursor is None else min(session.cursor, *logged)
                session.queue = deque(item for item in session.queue if item[0].log_offset < 0)
                session.cursor = start
        log.warning("session %s: a stale copy here (the cluster agreed it is %s's) hands on what it had not "
                    "delivered", client_id, to)
        ranges, session.ranges = session.ranges, ()  # (kept from ``_forget``: they are handed on too)
        self._forget(session)
        session.ranges = ranges
        session.will = None
        for key in list(session.shared):
            self.shared.unsubscribe(session, key)

        def hand_on(f: Any = None) -> None:
            self.hand_on(session, to, _answered(f), stale=True)  # (its spools go once read)

        def when_heard(deadline: float) -> None:
            # The copy stays subscribed (offline: what reaches it waits in the log) until this
            # router hears the new owner again: agreement comes back before the mesh does as a
            # partition heals, and until the new owner's interest is announced here (at its
            # rejoin, ahead of its answer to the barrier) what is published here reaches only
            # this copy. Handed on earlier, that would reach no one.
            if not self.wiring.mesh.hears(to) and self.clock.now() < deadline:
                self.clock.call_later(FENCE_POLL_S, when_heard, deadline)
                return
            barrier = self.wiring.mesh.barrier()
            if barrier is None:
                hand_on()
            else:
                barrier.add_done_callback(hand_on)  # type: ignore[attr-defined]  # a Future (as above)

        when_heard(self.clock.now() + FENCE_WAIT_S)
        self._mark_soon()

    def _fence_deferred(self, client_id: str, to: str) -> None:
        """The end of a deferred fence: kept if the record came back to this router, else fenced."""
        owners = self.wiring.owners
        if owners is not None and owners.owns(client_id):
            log.info("session %s: its record is this router's again; the copy here is the session", client_id)
            return
        self.fence_stale(client_id, to)

    def _drop_stale(self, session: Session) -> None:
        log.warning("session %s was taken over on another node while this router was taken for dead: "
                    "its stale copy here is dropped", session.client_id)
        self.drop_session(session)

    def _moved_away(self, session: Session, to: str | None, start: int, late: bool = False,
                    queued: int = -1, ranges: int = -1) -> None:
        """``session`` is router ``to``'s now: what reaches it here from ``start`` (this log's
        offset) or its queue's entry ``queued`` on is handed on (``_hand_on_later``); one with
        nothing to hand on just goes."""
        if to is not None and session.persistent and session.subscriptions:
            self._hand_on_later(session, to, start, late, queued, ranges)
        else:
            self.drop_session(session)

    def moved_after_all(self, client_id: str, to: str) -> None:
        """Router ``to``, heard again after a silence, confirms a transfer this router had given
        up on (``moved`` with ``doubt``): the session is there, and its client may be too. The
        copy kept here goes, and what reached it meanwhile is handed on, as after any move;
        unless a client resumed the session here in between (then each keeps its own, as the
        two sides of a partition do until the next takeover weighs them)."""
        entry = self.in_doubt.get(client_id)
        if entry is None or entry.to != to:
            return
        del self.in_doubt[client_id]
        session, mark = entry.session, entry.mark
        if self.sessions.get(client_id) is not session or session.conn is not None or client_id in self.moving:
            return
        log.warning("session %s: router %s confirms it took the session over after all; the copy kept here "
                    "goes, with what reached it meanwhile", client_id, to)
        self.stats.takeovers += 1
        # The group copies it was given meanwhile (a member again while in doubt) are in no log:
        # the hand-on reads the log, or the queue (without one) whose copies the new owner may
        # drop as come to it directly (its marks), and a session of groups alone is just dropped.
        # They go to the new owner for their groups instead (once, as a member left them).
        orphans = session.group_orphans(mark) if session.shared else []
        if orphans:
            log.info("session %s: %d group message(s) it got while its move was in doubt go to %s for their groups",
                     client_id, len(orphans), to)
        if orphans:  # (with a log too: the hand-on takes the queue's copies in no log)
            sent = {id(msg) for msg, _ in orphans}
            queue = list(session.queue)
            session.queue = deque(queue[:mark] + [item for item in queue[mark:] if id(item[0]) not in sent])
        self._moved_away(session, to, entry.start, late=True, queued=entry.queued, ranges=entry.ranges)
        self.shared.send_kept(orphans, to)
        self._mark_soon()

    def import_session(self, client_id: str, state: dict) -> Session:
        """A session handed over by another router (takeover) becomes ours. When, is kept
        (``moved_in``): a router silent meanwhile may have sent what it published for the session
        to the old router, which had let it go (cluster.replication ``moved_in_catchup``). Not
        for a session from a replica: that one asks every router at once (``adopted``)."""
        session = self.new_session(client_id, state["persistent"])
        if not state.get("replica"):
            moved = self.moved_in
            now = self.clock.unix()
            moved.pop(client_id, None)
            moved[client_id] = now  # oldest first: the dict's order is their arrival's
            horizon = now - self.config.moved_in_keep_s
            while moved and (len(moved) > MOVED_IN_MAX or moved[next(iter(moved))] < horizon):
                del moved[next(iter(moved))]
        session.import_state(state)
        for values in state["subs"]:
            self.subscriptions.subscribe(session, Subscription.from_values(values))
        for values in state.get("shared", ()):
            self.shared.subscribe(session, Subscription.from_values(values))
        return session

    def release_session(self, client_id: str, same_node: bool,
                        limit: int | None = -1) -> tuple[dict, Iterator[list]] | None:
        """Another router takes ``client_id`` over: close our connection and export the session,
        as a header and its queued copies in chunks (``Session.export_copies``, with its
        ``limit``: None where the new owner spools them, ``router.spool``). The session
        stays here, offline, until the new owner confirms it has it (``moved``): a transfer
        that fails leaves it in one place, this one."""
        client = self.clients.get(client_id)
        if client is not None:
            client.taken_over()
        session = self.sessions.get(client_id)
        if session is None or client_id in self.moving:
            return None
        self.in_doubt.pop(client_id, None)
        # Its expiry waits for the move's end: confirmed, the session is the new owner's; failed,
        # it is offline here again and its interval starts anew (``moved``, ``_expire``).
        self.cancel_expiry(client_id)
        finish_walks(session)  # the retained messages its SUBSCRIBEs still owe it go with it
        session.detach()
        if session.shared:
            # What its groups send here from now on goes to their other members: the session
            # takes what it holds now, and nothing that reaches it later (``SharedRoutes.leave``).
            self.shared.leave(session)
        # A delayed will goes with the session: the new connection publishes it if it starts
        # clean, drops it if it resumes the session; here it waits no more.
        self.wills.stop_timer(client_id)
        if self.wiring.commit_log is not None:
            self.wiring.commit_log.flush()  # the position handed over must be readable from the disk
        self.moving[client_id] = session
        # What this router logs for it from here on, until its new owner's interest is known
        # everywhere, and what joins its queue (the export copies the queue as it is now), is
        # handed on to it (``hand_on``).
        self.moving_from[client_id] = (self.wiring.commit_log.next_offset if self.wiring.commit_log is not None
                                       else -1, len(session.queue))
        return session.export_header(same_node), session.export_copies(same_node, limit=limit)

    def moved(self, client_id: str, ok: bool, to: str | None = None, doubt: bool = False) -> None:
        """The new owner of a session being moved, router ``to``, has it (``ok``), or the
        transfer failed: then the session stays here, offline, as if its client had gone.
        ``doubt``: not an answer, the new owner fell silent (or never answered) before it
        confirmed; it may have the session all the same, and say so when it is heard again
        (``moved_after_all``): until a client resumes the session here, where it left is kept."""
        session = self.moving.pop(client_id, None)
        start, queued = self.moving_from.pop(client_id, (-1, -1))
        stale = client_id in self.stale_moving
        self.stale_moving.discard(client_id)
        if session is None:
            return
        ours = self.sessions.get(client_id) is session
        mark = len(session.queue)  # (what a late confirmation finds beyond came while in doubt)
        if ours and not ok and session.shared:
            self.shared.rejoin(session)  # (left at the export: ``release_session``)
        # The group copies kept for it while it moved (``SharedRoutes.leave``): to its new router,
        # or to its groups here again (itself first).
        kept = self.shared.settled(session)
        if not ours:
            self.shared.send_kept(kept, None)
            return
        if ok:
            self.undone.pop(client_id, None)
            self.stats.takeovers += 1
            self._moved_away(session, to, start, queued=queued)
            self.shared.send_kept(kept, to)
            return
        if to is not None and not doubt and self.wiring.owners is not None:
            undone = self.undone
            undone.pop(client_id, None)
            undone[client_id] = to  # (the newest last: the oldest go first)
            while len(undone) > MOVED_IN_MAX:
                del undone[next(iter(undone))]
        if stale and session.conn is None:
            self._drop_stale(session)
            self.shared.send_kept(kept, None)
            return
        if doubt and to is not None and session.conn is None:
            log.warning("session %s: its new router %s did not confirm the transfer; it stays here until that "
                        "router says it has it", client_id, to)
            doubts = self.in_doubt
            doubts[client_id] = Doubt(session, to, start, queued, mark, len(session.ranges))
            while len(doubts) > MOVED_IN_MAX:
                del doubts[next(iter(doubts))]
        else:
            log.warning("session %s: its transfer to another router failed; it stays here", client_id)
        self.shared.send_kept(kept, None)
        if session.conn is None:
            if session.persistent or session.expiry_s:
                self.cancel_expiry(client_id)
                self.schedule_expiry(session)
                self.wills.rearm_will(session)
            else:
                self.end_session(session)


def _answered(barrier: Any) -> dict | None:
    """The routers that answered a barrier (``MeshPort.barrier``), with their log ends; None if unknown."""
    if barrier is None or barrier.cancelled() or barrier.exception() is not None:
        return None
    result = barrier.result()
    return result if result.__class__ is dict else None
