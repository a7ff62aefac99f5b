"""Hand-on: what reached a session's old router after it moved, passed on to its new one.

The new owner confirms a takeover (``confirm_takeover``) and notes from which offset of each
router's log the session's messages reach it directly (the marks): a copy handed on from there
on came here already and is dropped (``_handed_on``). The old owner hands on until its last
SESSION_HANDON; should it fall silent first, those copies are read back from the logs instead
(``_handons_lost``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from brokerd.router.mesh_format import SESSION_HANDON, handon_from_ok

from .limits import HANDON_ITEMS, HANDON_KEEP_S, log

if TYPE_CHECKING:
    import asyncio

    from brokerd.router.router import Router

    from ..config import Config
    from ..replication import Replication
    from .peer import Peer


class HandonMixin:
    """The ``Mesh``'s confirmations of sessions taken over, and their hand-on."""

    config: Config
    router: Router
    router_id: str
    peers: dict[str, Peer]
    closed: bool
    replication: Replication | None
    _unconfirmed_takeovers: dict[str, tuple[str | None, int, asyncio.TimerHandle, Any, str | None]]
    _early_handons: dict[str, list]
    _handon_marks: dict[str, tuple[dict[str, int], float]]
    _handons_due: dict[str, list]

    if TYPE_CHECKING:  # the other parts' methods this one calls (the ``Mesh`` is their union)
        def _frame(self, kind: int, body: Any) -> bytes: ...
        def _send(self, peer: Peer, kind: int, body: Any) -> None: ...
        def _keep(self, peer: Peer, frame: bytes, n: int, seq: int = 0) -> None: ...
        def _done(self, rid: str | None, req: int, ok: bool) -> None: ...
        @property
        def _replicating(self) -> Replication: ...

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
        rid, req, timer, handon_from, replica = pending
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
        handing = replica if replica.__class__ is str else rid
        if (handing is not None and handon_from_ok(handon_from) and session is not None and session.persistent
                and session.subscriptions):
            # Until the old owner's last SESSION_HANDON, what reached it for the session is there
            # only; should it fall silent first, that is read back (``_handons_lost``). Taken from
            # the replica of a silent router: that router's copy hands on when it is back and
            # fenced (``Router.fence_stale``); should it fall silent again first (partition seed
            # 15: SIGKILLed), what it logged beyond the replica's end is read back the same way.
            due = self._handons_due
            for cid in [c for c, entry in due.items() if entry[3] < now]:
                del due[cid]
            due[client_id] = [handing, handon_from, marks, now + self.config.mesh_forget, False]
            old = self.peers.get(handing)
            if handing == rid and old is not None and not old.alive:
                self._handons_lost(rid)
        if rid is None:
            self._replicating.replica_moved(client_id, True)
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
            body: list[Any] = [client_id, items[i:i + HANDON_ITEMS], last]
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

    def _on_session_handon(self, peer: Peer, body: Any, size: int) -> None:
        self._handed_on(*body[:5])
