"""Session catch-ups: what a session that moved may have missed, read back from logs.

After a takeover from a replica (``adopted``), the new owner asks every other router for what
it published that the session may not have had (SESSION_CATCHUP): what was forwarded to the dead
router and not yet in its replica when it died. Each answers from its log (or, for a dead
router, its replica), from the offset after the last of its messages among the copies, or from
shortly before the session's position in time where none was; at least once, as every catch-up.
The same request reads back copies a lost router held outside its log (``read_back_copies``),
what a lost old owner had not handed on (``read_back_handon``, ``read_back_unheard``), and what
a partition kept for a session's old router (``moved_past_silence``, ``moved_in_catchup``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from brokerd.router.log import CommitLog, LogReader
from brokerd.router.mesh_format import handon_from_ok
from brokerd.router.message import Message
from brokerd.router.session import Session
from brokerd.router.spool import valid_spans

from .leader import FETCH_RECORDS
from .link import HERE
from .part import Part

if TYPE_CHECKING:
    from ..mesh import Peer
    from .follower import FollowerPart
    from .read_back import ReadBackPart
    from .sessions import SessionsPart

log = logging.getLogger(__package__)  # (the package's name: the log lines name it as before)

# A session taken over from a replica asks the other routers for their messages from this long
# before its position's time, where the copies it got name none of theirs: what was on its way
# to the dead router when it died (a mesh frame's transit, a backlog kept for a paused peer).
CATCHUP_MARGIN_MS = 10_000
# SESSION_CATCHUP's ``end`` for "to the log's end, the records of every origin" (-1 reads to the
# end, the log's own records only).
LOG_END = 1 << 62
# A SESSION_CATCHUP sent to another router is asked again (of it, or of its replica's holder)
# should that router fall silent, restart or come back from a silence before its last answer
# came: for this long after the first ask.
ASK_KEEP_S = 60.0


class CatchupPart(Part):
    """SESSION_CATCHUP asked and answered (SESSION_COPIES)."""

    # The other parts it calls (set by ``Replication``).
    follow: FollowerPart
    readback: ReadBackPart
    session_part: SessionsPart

    def __init__(self, shared: Part) -> None:
        super().__init__(shared)
        # SESSION_CATCHUPs sent and not answered yet (``_send_ask``): (session, partition asked
        # for) → (the router asked, the body, when first asked).
        self.open_asks: dict[tuple[str, str], tuple[str, list, float]] = {}
        # SESSION_CATCHUPs for a silent router answered by a replica of its log (``_ask_catchup``):
        # (session, that router, start, end) → (the body, when asked). Asked of the router itself
        # once it is heard again (``returned``). One session may ask one router for several
        # ranges (to its log's end, and a span of copies its old router held): each is kept.
        self.via_replica: dict[tuple[str, str, int, int], tuple[list, float]] = {}

    def adopted(self, session: Session, state: dict) -> None:
        """A session came here from the replica of a silent router: make it the only one, and ask
        every other router for what it may have missed (module docstring)."""
        partition = state["replica"]
        cid = session.client_id
        self.session_part.fence(cid, [partition])
        # The copies from the replica (not live ones since): in the queue, or, where they were
        # spooled (``router.spool``), their marks taken as they were written.
        marks: dict[str, int] = dict(state.get("spool_marks") or {})
        for _, _, values in state["queue"]:
            msg = Message.from_list(values)
            if msg.origin_offset >= marks.get(msg.origin_router, -1):
                marks[msg.origin_router] = msg.origin_offset
        since = state.get("since_ms", 0) - CATCHUP_MARGIN_MS
        asked = 0
        for rid in [self.partition, *self.net.ids()]:
            if rid == partition:
                # Its messages came from the replica that served the session, to where that one
                # ended; another holder's may reach further (a follower placed anew while that
                # one was cut off: partition seed 11): asked from there, at least once.
                end = replica_end(state, partition)
                if end is not None:
                    asked += self._ask_catchup(rid, self.catchup_body(session, rid, end, since))
                continue
            start = marks[rid] + 1 if rid in marks else -1
            asked += self._ask_catchup(rid, self.catchup_body(session, rid, start, since))
        spans = self.read_back_copies(session, state.get("copies"))
        log.info("replication: session %s taken over from the replica of %s; asked %d router(s) for what "
                 "was on its way there%s", cid, partition, asked + 1,
                 f", and {spans} for the copies it held" if spans else "")

    def read_back_copies(self, session: Session, copies: Any) -> int:
        """The copies a lost router held for ``session`` outside its log (a spool not read yet,
        copies in memory: ``Session.copy_spans``, named by its replicated state as ``copies``)
        were on that node only: ask each origin router (or, silent, the holder of its replica)
        for its span of them, to the span's end. Returns how many routers were asked."""
        asked = 0
        for rid, (lo, hi, _) in valid_spans(copies).items():
            asked += self._ask_catchup(rid, self.catchup_body(session, rid, lo, 0, hi + 1))
        return asked

    def read_back_handon(self, session: Session, old: str, since_ms: int, seen: dict[str, int],
                         marks: dict[str, int], only_old: bool = False) -> tuple[int, bool]:
        """``session`` moved here from router ``old``, which fell silent before it had handed on
        what reached it for the session after it left (``Handons.peer_gone``). Those copies
        are in logs: ``old``'s own, from where it stood when the session left (``seen``, its
        ``handon_from``) to its end, whatever their origin (it logged the copies other routers
        sent it), read from its replica; and each other router's, from where ``old`` had seen
        it (or ``since_ms``, less a margin, where it had seen nothing) to where its messages
        came here directly (``marks``, as ``Mesh.confirm_takeover`` noted them; its end where
        none), for the copies ``old`` logged and had not replicated. At least once.
        ``only_old``: ``old``'s own log alone. Returns how many routers were asked, and whether
        ``old``'s log was (False: neither it nor a replica of it could be asked now)."""
        asked, old_asked = 0, False
        origins = {old} if only_old else {old, self.partition, *seen, *marks, *self.net.ids()}
        for rid in sorted(origins):
            start = seen.get(rid, -1)
            end = LOG_END if rid == old else marks.get(rid, LOG_END)
            if rid == old and start < 0 or 0 <= end <= start:
                continue  # (old had no log: what it held was in memory, and in the others' logs)
            ok = self._ask_catchup(rid, self.catchup_body(session, rid, start, since_ms - CATCHUP_MARGIN_MS, end))
            asked += ok
            old_asked = old_asked or (ok and rid == old)
        return asked, old_asked

    def read_back_unheard(self, session: Session, since_ms: int, unheard: dict, marks: dict[str, int]) -> list[str]:
        """``session`` moved here from a router that handed on what reached it, but some routers
        had not answered its barrier (``unheard``: {router: how far the old router had seen its
        log}): what they sent the old router before they knew of the move may reach it after the
        session left. Ask each for its copies from there to where it sends here directly
        (``marks``; its log's end where none). Returns the routers asked."""
        asked = []
        for rid, seen in sorted(unheard.items()):
            if rid.__class__ is not str or seen.__class__ is not int:
                continue
            end = marks.get(rid, LOG_END)
            if 0 <= end <= seen:
                continue  # it sends here directly from where the old router had seen it
            if self._ask_catchup(rid, self.catchup_body(session, rid, seen, since_ms - CATCHUP_MARGIN_MS, end)):
                asked.append(rid)
        return asked

    def catchup_body(self, session: Session, rid: str, start: int, since_ms: int, end: int = -1) -> list:
        """SESSION_CATCHUP's body asking router ``rid`` for ``session``'s messages (from
        ``start``, or -1: from ``since_ms``; to ``end``, -1: the log's end), and whether this
        router spools the answers: with a log it does (``Router.take_copies``), and is sent all
        of them; without one, at most ``--max-queued`` (they wait in memory)."""
        return [session.client_id, rid, start, since_ms, [s.to_values() for s in session.subscriptions.values()],
                session.username, end, self.router.commit_log is not None]

    def _ask_catchup(self, rid: str, body: list, first: float | None = None) -> bool:
        """Send SESSION_CATCHUP ``body`` to router ``rid``, to this router itself, or (``rid``
        silent) to the holder of its replica with the highest end; False when none can answer."""
        if rid == self.partition:
            self.session_catchup(None, *body)
            return True
        peer = self.net.peer(rid)
        if peer is None:
            holder = self.readback.holder(rid)[0] if rid in self.follow.replicas else None
        else:
            holder = peer if peer.alive else self.readback.holder(rid)[0]
        if holder is HERE:
            self.session_catchup(None, *body)
        elif holder is not None:
            self._send_ask(holder, body, first)
        else:
            return False
        if peer is not None and holder is not peer:
            self._via_replica(rid, body)
        return True

    def _via_replica(self, rid: str, body: list) -> None:
        """Router ``rid`` was silent and a replica of its log answered ``body`` for it: that
        replica ends where it did then, and the router, silent only to some (a partition that
        healed one way first), may go on logging messages for the session that it sends nobody:
        its old router's copy hands on and unsubscribes, and this router's interest has not
        reached it yet. Asked of the router itself once it is heard again (``returned``), after
        this router's interest (partition seed 315, second run: 3 acknowledged messages lost).
        Keyed by the range too: a takeover from a replica asks the same router to its log's end
        and for the span of copies the old router held (``adopted``), and the span, kept alone,
        left out what the router logged after its replica's end (partition seed 851: 1 lost)."""
        asks = self.via_replica
        now = self.clock()
        asks[(body[0], rid, body[2], body[6])] = (body, now)
        if len(asks) > 4096:  # (a bound: the rest age out with the mesh's forget)
            for key in [k for k, (_, t) in asks.items() if now - t > self.config.mesh_forget]:
                del asks[key]

    def returned(self, peer: Peer) -> None:
        """``peer`` is heard again (after this router's interest went to it): what a replica of
        its log answered for it while it was silent is asked of it, from the same offsets to its
        log's end now (at least once: the replica's part comes twice)."""
        asks = self.via_replica
        now = self.clock()
        again = [(key, body, t) for key, (body, t) in asks.items() if key[1] == peer.router_id]
        for key, body, t in again:
            del asks[key]
            if now - t <= self.config.mesh_forget and key[0] in self.router.sessions:
                self._send_ask(peer, body)
        if again:
            log.info("replication: %d read-back(s) a replica of %s answered while it was silent asked of it now",
                     len(again), peer.router_id)

    def _send_ask(self, target: Peer, body: list, first: float | None = None) -> None:
        """SESSION_CATCHUP ``body`` to ``target``, remembered until its last answer comes
        (``answered``): a frame lost with a broken connection, or a router that dies before it
        answers, would lose what the session missed (partition seed 218: a node killed a second
        after a heal never answered the session that had just moved)."""
        self.net.send(target, "session_catchup", body)
        asks = self.open_asks
        now = self.clock()
        asks[(body[0], body[1])] = (target.router_id, body, now if first is None else first)
        if len(asks) > 4096:  # (a bound: those answered drop out, the rest age out in ASK_KEEP_S)
            for key in [k for k, (_, _, t) in asks.items() if now - t > ASK_KEEP_S]:
                del asks[key]

    def answered(self, client_id: str, partition: str) -> None:
        """The last SESSION_COPIES of an ask for ``client_id``'s messages of ``partition`` came."""
        self.open_asks.pop((client_id, partition), None)

    def ask_again(self, peer: Peer) -> None:
        """``peer`` fell silent, restarted or is heard again: what was asked of it and not
        answered is asked again, of it or of its replica's holder (at least once: the session
        takes copies twice rather than none)."""
        asks = self.open_asks
        now = self.clock()
        again = [(key, body, t) for key, (target, body, t) in asks.items() if target == peer.router_id]
        for key, body, t in again:
            del asks[key]
            if now - t <= ASK_KEEP_S and key[0] in self.router.sessions:
                self._ask_catchup(body[1], body, t)
        if again:
            log.info("replication: %d read-back(s) asked of %s and not answered asked again", len(again),
                     peer.router_id)

    def moved_past_silence(self, session: Session, silent: object) -> None:
        """A session moved here from a live router to which other routers were silent
        (``silent``: {router: when its silence began, Unix ms}, as the old router saw it). What
        they published for the session meanwhile they kept for the old router, which gets it
        after the session left, when they are heard there again: under a partition that cut
        only that link, long after this router (which may hear them all along) took the session.
        Ask each that is alive here for its own messages since (SESSION_CATCHUP, from
        ``CATCHUP_MARGIN_MS`` before the silence): at least once. One silent here too is asked
        when it is heard again (``moved_in_catchup``)."""
        if type(silent) is not dict:  # (as the old router sent it)
            return
        cid = session.client_id
        asked = []
        for rid, since_ms in silent.items():
            if rid.__class__ is not str or since_ms.__class__ is not int or not session.subscriptions:
                continue
            body = self.catchup_body(session, rid, -1, since_ms - CATCHUP_MARGIN_MS)
            peer = self.net.peer(rid)
            if rid == self.partition:
                self.session_catchup(None, *body)
            elif peer is not None and peer.alive:
                self._send_ask(peer, body)
            else:
                continue
            asked.append(rid)
        if asked:
            log.info("replication: session %s moved here from a router to which %s were silent: asked them "
                     "for what they published since", cid, ", ".join(sorted(asked)))

    def moved_in_catchup(self, peer: Peer, silent_since: float) -> None:
        """``peer`` is heard again after a silence that began at ``silent_since`` (Unix time).
        Sessions that moved to this router from another one meanwhile may have missed what it
        published for them: it sent that to their old router, by the interest it knew, and a
        partition can deliver it there after they left. Ask it for those messages
        (SESSION_CATCHUP, from ``CATCHUP_MARGIN_MS`` before the silence): at least once."""
        moved = self.router.moved_in
        horizon = self.wall() - self.config.mesh_forget  # a peer silent longer is forgotten
        for cid in [c for c, t in moved.items() if t < horizon]:
            del moved[cid]
        since_ms = int(silent_since * 1000) - CATCHUP_MARGIN_MS
        asked = 0
        for cid, t in moved.items():
            session = self.router.sessions.get(cid)
            if t < silent_since - self.config.mesh_timeout or session is None or not session.subscriptions:
                continue
            self._send_ask(peer, self.catchup_body(session, peer.router_id, -1, since_ms))
            asked += 1
        if asked:
            log.info("replication: %d session(s) that moved to this router while %s was silent ask it for what "
                     "it published meanwhile", asked, peer.router_id)

    def session_catchup(self, peer: Peer | None, client_id: str, partition: str, start: int, since_ms: int,
                        subs: list, username: str | None, end: int = -1, spools: bool = False) -> None:
        """Read this router's log (or the replica of ``partition``) back for one session taken
        over elsewhere: the QoS 1/2 messages of ``partition`` its subscriptions match, from
        ``start`` (-1: from ``since_ms``), as SESSION_COPIES to ``peer`` (None: this router).
        With an ``end``, the records of ``[start, end)`` whatever their origin: copies a lost
        router held for the session (``read_back_copies``), among them a range of this log it
        had still to read. All of them where the asker ``spools`` the answers; else at most
        ``--max-queued`` (whole steps of ``FETCH_RECORDS // 4`` records)."""
        log_: CommitLog | None
        if partition == self.partition:
            log_ = self.log
        else:
            rep = self.follow.replicas.get(partition)
            log_ = rep.log if rep is not None else None
        if log_ is None:
            return
        if start < 0:
            with LogReader(log_.directory) as reader:
                found = reader.offset_for_time(since_ms)
            start = found if found is not None else log_.next_offset
        session = self.session_part.detached(client_id, subs)
        session.username = username
        stop = log_.next_offset if end < 0 else min(end, log_.next_offset)
        cap = None if spools else self.config.max_queued
        self._catchup_step(peer, session, partition, end >= 0, cap, log_, max(start, log_.start_offset), stop, 0)

    def _catchup_step(self, peer: Peer | None, session: Session, partition: str, whole: bool, cap: int | None,
                      log_: Any, offset: int, end: int, sent: int) -> None:
        if peer is not None and not peer.alive:
            return
        records = [r for r in log_.read(offset, max_records=FETCH_RECORDS // 4) if r.offset < end] \
            if offset < end else []
        items = []
        for rec in records:
            if rec.qos and (whole or rec.origin_router in ("", partition)):
                best, ids = session._best_qos(rec)
                if best > 0:
                    msg = Message.from_record(rec)
                    items.append([min(best, rec.qos), False, (msg.with_ids(ids) if ids else msg).to_list()])
        last = not records or (cap is not None and sent + len(items) >= cap)
        if peer is None:
            self.router.take_copies(session.client_id, items, read_back=True)
        else:
            self.net.send(peer, "copies", [session.client_id, items, last, partition])
        if not last:
            self.loop.call_soon(self._catchup_step, peer, session, partition, whole, cap, log_,
                                records[-1].offset + 1, end, sent + len(items))
        elif sent + len(items):
            log.info("replication: %d message(s) of %s read back for session %s", sent + len(items), partition,
                     session.client_id)


def replica_end(state: dict, partition: str) -> int | None:
    """Where the replica of ``partition`` that served a session ended (its takeover header's
    ``handon_from``, ``SessionsPart._export_replica``); None where the header does not say."""
    handon_from: Any = state.get("handon_from")
    if not handon_from_ok(handon_from):
        return None
    end = handon_from[1].get(partition)
    return end if end.__class__ is int and end >= 0 else None
