"""Hand-on: what reached a session's old router after it moved, passed on to its new one.

The new owner confirms a takeover (``Takeovers.confirm``) and notes (``moved_here``) from which offset of each
router's log the session's messages reach it directly (the marks): a copy handed on from there
on came here already and is dropped (``_handed_on``). The old owner hands on until its last
SESSION_HANDON; should it fall silent first, those copies are read back from the logs instead
(``peer_gone``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from brokerd.router.mesh_format import SESSION_HANDON, handon_from_ok

from .delivery import in_doubt
from .limits import HANDON_ITEMS, HANDON_KEEP_S, HANDON_YOUNG_S, log
from .marks import directly_from, named_unheard, not_direct, to_ask

if TYPE_CHECKING:
    from collections.abc import Callable

    from brokerd.router.router import Router

    from ..config import Config
    from ..replication import Replication
    from .peer import Peer


class Handons:
    """The ``Mesh``'s hand-on of sessions moved, owned: the marks that filter the copies handed
    on (``_marks``) and the hand-ons still due from old owners (``_due``)."""

    def __init__(self, config: Config, router: Router, peers: dict[str, Peer],
                 send: Callable[[Peer, int, Any], None], keep: Callable[[Peer, int, Any, int], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock  # the mesh's monotonic clock: the young window, how long marks and dues are kept
        self.router = router
        self.router_id = router.router_id
        self.peers = peers
        self._send = send  # (framing) a frame to one peer
        self._keep = keep  # (forwarding) a frame (kind, body) kept for a parked peer, in order with its publishes
        # (takeover) copies for a session whose takeover here is pending: held there (True), or
        # not (False: none is); set by the ``Mesh`` once both parts exist.
        self.hold_early: Callable[[str, list], bool] = lambda client_id, items: False
        self.replication: Replication | None = None  # set with the ``Mesh``'s
        self.closed = False
        # Until when this incarnation is young: restarted on a log of its own (a worker or node back
        # after a crash or a stop), the others send it again what its old one never confirmed, each
        # as its link comes up (``hand_on``). A first start has nothing to be sent again.
        log_ = router.commit_log
        ran_before = log_ is not None and log_.next_offset > 0
        self.young_until = self._clock() + HANDON_YOUNG_S if ran_before else 0.0
        # Sessions that moved here: client id → ({router: offset of its log from which its
        # messages reach this router directly}, until when): what the old owner hands on from
        # there is here already (``_handed_on``).
        self._marks: dict[str, tuple[dict[str, int], float]] = {}
        # Sessions moved here from a live router that has not ended its hand-on yet (its last
        # SESSION_HANDON): client id → [old owner, its ``handon_from``, the marks above, until
        # when, whether its own log is still to be read]. Should the old owner fall silent
        # first, what it held for the session is read back instead (``peer_gone``).
        self._due: dict[str, list] = {}

    def moved_here(self, client_id: str, rid: str | None, handon_from: Any, replica: str | None,
                   acked: list | None) -> None:
        """Session ``client_id``, taken from router ``rid`` (None: this router's replica of
        ``replica``), is confirmed (``Takeovers.confirm``; ``acked``: its interest waits'
        results): remember from which offset of each router's log its messages come here
        directly (``marks.directly_from``), so that the copies handed on are not delivered
        twice; and wait for the old owner's hand-on, or read it back should that owner fall
        silent first."""
        commit_log = self.router.commit_log
        marks = directly_from(((rid, p.origin_mark) for rid, p in self.peers.items()), acked,
                              (self.router_id, commit_log.next_offset) if commit_log is not None else None)
        now = self._clock()
        kept = self._marks
        for cid in [c for c, (_, until) in kept.items() if until < now]:
            del kept[cid]
        kept[client_id] = (marks, now + HANDON_KEEP_S)
        session = self.router.sessions.get(client_id)
        handing = replica if replica.__class__ is str else rid
        if (handing is not None and handon_from_ok(handon_from) and session is not None and session.persistent
                and session.subscriptions):
            # Until the old owner's last SESSION_HANDON, what reached it for the session is there
            # only; should it fall silent first, that is read back (``peer_gone``). Taken from
            # the replica of a silent router: that router's copy hands on when it is back and
            # fenced (``Router.fence_stale``); should it fall silent again first (partition seed
            # 15: SIGKILLed), what it logged beyond the replica's end is read back the same way.
            due = self._due
            for cid in [c for c, entry in due.items() if entry[3] < now]:
                del due[cid]
            due[client_id] = [handing, handon_from, marks, now + self.config.mesh_forget, False]
            old = self.peers.get(handing)
            if handing == rid and old is not None and not old.alive:
                self.peer_gone(rid)

    def hand_on(self, router_id: str, client_id: str, items: list, answered: dict | None = None,
                stale: bool = False) -> None:
        """Copies for ``client_id``, which moved to ``router_id``, that reached this router
        after it was handed over (``Router.hand_on``); the last frame says so, even with none
        (the new owner stops waiting for them: ``peer_gone``). The last frame also names the
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
        # The routers that did not answer, with how far this router had seen their logs; those
        # that did, with None: the new owner asks those named neither way too (``marks.to_ask``).
        # A young incarnation (just restarted on its log) names every router with -1, from a time:
        # what the others send it again (frames its old incarnation never confirmed) comes as each
        # link comes up, may follow a barrier's answer, and lies below the marks of their first
        # HELLOs (chaos seed 1240224720 beside the CPU hog, after the first fix).
        # A router that answered but whose frames are missed here, or may be (lost on the way, to
        # be sent again after the hand-on), is named as one that did not (``marks.named_unheard``).
        unheard: dict[str, int | None] | None = None
        if answered is not None:
            unheard = named_unheard(answered, ((rid, p.origin_mark, in_doubt(p)) for rid, p in self.peers.items()),
                                    router_id, self._clock() < self.young_until)
        for i in range(0, max(len(items), 1), HANDON_ITEMS):
            last = i + HANDON_ITEMS >= len(items)
            body: list[Any] = [client_id, items[i:i + HANDON_ITEMS], last]
            if stale:
                body = [*body, unheard if last else None, True]
            elif last and unheard is not None:
                body = [*body, unheard]
            if not parked:
                self._send(peer, SESSION_HANDON, body)
                continue
            # Silent here (a fenced copy hands on as the partition heals, before the mesh hears
            # the new owner again): kept for it, with the publishes it is owed, in order.
            self._keep(peer, SESSION_HANDON, body, len(body[1]))
            if peer.replay_from is not None and body[1]:
                log.warning("mesh: %d message(s) for session %s not handed on: the backlog kept for its new "
                            "router %s is full", len(body[1]), client_id, router_id)

    def peer_gone(self, router_id: str) -> None:
        """Router ``router_id`` fell silent (or restarted) before it had handed on all that
        reached it for sessions that moved here from it: those copies are in logs, its own
        (read from its replica, or from it once back) from where it stood at the export, and
        each origin's from where the old owner had seen it to where its messages came here
        directly (``Replication.read_back_handon``). At least once."""
        if self._due:
            self._read_handons(router_id, False)

    def peer_back(self, router_id: str) -> None:
        """``router_id`` is heard again: its own log's part of the hand-ons ``peer_gone`` read
        back, which neither it nor a replica could be asked for while it was silent (a router
        of this node, whose log has no replica elsewhere, restarted), now from it."""
        if self._due:
            self._read_handons(router_id, True)

    def _read_handons(self, router_id: str, back: bool) -> None:
        due = self._due
        now = self._clock()
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
        or beyond the marks of ``moved_here``) are dropped, the rest delivered. With the
        last: ``unheard``, the routers that had not answered the old router's barrier, {router:
        how far it had seen that router's log}: their copies between there and where they send
        here directly (the marks) are read back from their logs (SESSION_CATCHUP). At least once.
        ``stale``: from a copy the agreement fenced: all are delivered (no marks apply)."""
        if last:
            entry = self._due.pop(client_id, None)
            if unheard.__class__ is dict and entry is not None:
                known = () if stale is True else [rid for rid, p in self.peers.items() if p.origin_mark >= 0]
                ask = to_ask(unheard, known, entry[0])
                if ask:
                    self._ask_unheard(client_id, entry, ask)
        marks = self._marks.get(client_id, ({}, 0.0))[0]
        if marks and stale is not True:
            items = not_direct(items, marks)
        if not items:
            return
        if client_id not in self.router.sessions and self.hold_early(client_id, items):
            # Its old copy was fenced (its node learnt of the agreed move) before this router
            # imported the session: held until it has (``Takeovers.confirm``).
            return
        self.router.take_copies(client_id, items)

    def _ask_unheard(self, client_id: str, entry: list, unheard: dict) -> None:
        _, (since_ms, _seen), marks, _, _ = entry
        session = self.router.sessions.get(client_id)
        if session is None or self.replication is None or not session.subscriptions:
            return
        asked = self.replication.read_back_unheard(session, since_ms, unheard, marks)
        if asked:
            log.info("mesh: session %s: router(s) %s had not answered its old router when it handed on (or it "
                     "had not heard them yet): asked for what they sent there before they knew of the move",
                     client_id, ", ".join(asked))

    def on_session_handon(self, peer: Peer, body: Any, size: int) -> None:
        self._handed_on(*body[:5])
