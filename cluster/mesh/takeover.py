"""Takeover, the asking side: a CONNECT asks every live peer for its client's session, waits for
the answers (bounded), settles on one offer and confirms or aborts it.

The routers of this node are always asked (one that is down is waited for, ``LOCAL_DOWN_WAIT_S``);
a silent router of another node is not, but with replication its follower answers for it once
it counts as gone. An offer is confirmed (TAKEOVER_DONE true) once the session is in this
router's snapshot and its interest is known everywhere (``handon.confirm_takeover``), at the
latest ``CONFIRM_S`` after it arrived; the old owner keeps it until then. The answering side,
and sessions arriving in chunks, are ``transfer``.
"""

from __future__ import annotations

import itertools
import time
from typing import TYPE_CHECKING, Any

from brokerd.router.mesh_format import TAKEOVER_DONE, TAKEOVER_REQ
from brokerd.router.ownership import refused_by
from brokerd.router.ports import TAKEOVER_FAILED, TAKEOVER_UNAVAILABLE
from brokerd.router.spool import drop_named

from . import offer
from .limits import ACK_TIMEOUT_S, CONFIRM_S, LOCAL_DOWN_WAIT_S, drop_older, log
from .waiter import Waiter

if TYPE_CHECKING:
    import asyncio

    from brokerd.router.router import Router

    from ..config import Config
    from ..replication import Replication
    from .peer import Peer
    from .transfer import Transfer


class TakeoverMixin:
    """The ``Mesh``'s takeover requests, settled here."""

    config: Config
    loop: asyncio.AbstractEventLoop
    router: Router
    node_id: str
    peers: dict[str, Peer]
    closed: bool
    replication: Replication | None
    _waiters: dict[int, Waiter]
    _req_ids: itertools.count
    _incoming: dict[tuple[int, str], Transfer]
    _takeovers_confirmed: dict[str, dict[int, float]]
    _unconfirmed_takeovers: dict[str, tuple[str | None, int, asyncio.TimerHandle, Any, str | None]]
    _early_handons: dict[str, list]

    if TYPE_CHECKING:  # the other parts' methods this one calls (the ``Mesh`` is their union)
        def _frame(self, kind: int, body: Any) -> bytes: ...
        def _send(self, peer: Peer, kind: int, body: Any) -> None: ...
        def _flush(self) -> None: ...
        def _alive(self) -> set[str]: ...
        def _local_down(self) -> set[str]: ...
        async def _local_back(self, deadline: float) -> bool: ...
        def _just_parked(self) -> list[Peer]: ...
        async def _gone(self, routers: set[str]) -> None: ...
        def _transfer_failed(self, key: tuple[int, str], why: str) -> None: ...
        def confirm_takeover(self, client_id: str, acked: list | None = None) -> None: ...
        @property
        def _replicating(self) -> Replication: ...

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
                    self._replicating.replica_moved(client_id, False)
                drop_named(state)
            return TAKEOVER_FAILED
        live = offer.live(offers)
        if not live and self.replication is not None:
            local = self.replication.take_replica(client_id)  # this router may hold a newer copy
            if local is TAKEOVER_FAILED:  # (its copies could not be spooled: it stays held here)
                return self._settle(client_id, offers, failed=True)
            if local is not None:
                offers.append((None, 0, local))
        best = offer.newest(live or offers)
        chosen = best[2]
        refused = refused_by(claim, chosen, best[0] or chosen.get("replica"))
        if refused is not None:
            self._settle(client_id, offers, failed=True)
            return refused
        if len(live) > 1:
            log.warning("mesh: session %s was offered by %d live routers (%s): the most recent copy is taken, "
                        "the others dropped", client_id, len(live), ", ".join(sorted(str(o[0]) for o in live)))
        stale = offer.passed_over(offers, chosen)
        for rid, req, state in offers:
            if rid is None:  # this router's own replica: its copy is kept until confirmed
                if state is chosen:
                    self._await_confirm(client_id, None, 0, state.get("handon_from"), state.get("replica"))
                else:
                    self._replicating.replica_moved(client_id, True)  # an older copy: dropped
                continue
            if state is chosen:
                state["offered_by"] = rid  # (the agreement's claim checks it against the record)
                # Confirmed once its interest is known everywhere and it is in this router's
                # snapshot (``confirm_takeover``): a live router then hands on all that still
                # reaches it; a replica's holder drops its copy only when this one is durable.
                self._await_confirm(client_id, rid, req, state.get("handon_from"), state.get("replica"))
                continue
            self._done(rid, req, True)
            drop_named(state)
        if stale and self.replication is not None:
            log.warning("mesh: session %s: copies of it held for silent router(s) %s are older than the one "
                        "taken; passed over", client_id, ", ".join(sorted(set(stale))))
            self.replication.fence(client_id, stale)
        return chosen

    def _await_confirm(self, client_id: str, rid: str | None, req: int, handon_from: Any = None,
                       replica: str | None = None) -> None:
        """The session taken from router ``rid`` (None: this router's replica) is confirmed by
        ``confirm_takeover``, at the latest ``CONFIRM_S`` from now. ``handon_from``: where the
        old owner's logs stood when it exported the session (``_release``), or, from the replica
        of silent router ``replica``, where that replica ended."""
        self.confirm_takeover(client_id)  # a confirmation still due for an earlier one
        timer = self.loop.call_later(CONFIRM_S, self.confirm_takeover, client_id)
        self._unconfirmed_takeovers[client_id] = (rid, req, timer, handon_from, replica)

    def _take_local_replica(self, client_id: str, claim: list | None = None) -> dict | None:
        """The session from the replica this router holds (nobody else offered one)."""
        # A session state, None, or TAKEOVER_FAILED (``object`` in take_replica's type, a dict in fact).
        state: dict | None = self._replicating.take_replica(client_id)
        if state is not None and state is not TAKEOVER_FAILED:
            refused = refused_by(claim, state, state.get("replica"))
            if refused is not None:
                self._replicating.replica_moved(client_id, False)  # it stays held here
                drop_named(state)
                return refused
            self._await_confirm(client_id, None, 0, state.get("handon_from"), state.get("replica"))
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
        rid, req, timer, _, _ = pending
        timer.cancel()
        if rid is None:
            self._replicating.replica_moved(client_id, False)
        else:
            self._done(rid, req, False)

    def _ask_takeover(self, client_id: str, claim: list | None = None) -> Waiter:
        alive = self._alive()
        waiter = Waiter(self.loop, alive)
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
            drop_older(sent, now - self.config.mesh_forget, lambda when: when)
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
        drop_older(sent, time.monotonic() - self.config.mesh_forget, lambda when: when)
        for req in sent:
            self._send(peer, TAKEOVER_DONE, [req, True])
