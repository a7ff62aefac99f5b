"""Takeover, the asking side: a CONNECT asks every live peer for its client's session, waits for
the answers (bounded), settles on one offer and confirms or aborts it.

The routers of this node are always asked (one that is down is waited for, ``LOCAL_DOWN_WAIT_S``);
a silent router of another node is not, but with replication its follower answers for it once
it counts as gone. An offer is confirmed (TAKEOVER_DONE true) once the session is in this
router's snapshot and its interest is known everywhere (``confirm``), at the latest
``CONFIRM_S`` after it arrived; the old owner keeps it until then, and the copies it hands on
meanwhile wait here (``hold_early``). The asks of one loop turn go together at its end, one
frame a peer, and while a peer has not answered the last frame the asks of later turns wait for
its answers (``_send_asks``): a connect storm paid a ZeroMQ send per CONNECT, each way. A
CONNECT's answer comes to a callback (``takeover_then``): no task unless there is more to wait
for. The answering side, and sessions arriving in chunks, are ``transfer``; what reaches the old
owner after the move, ``handon``.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, NamedTuple

from brokerd.router.mesh_format import TAKEOVER_ASKS, TAKEOVER_DONE, TAKEOVER_REQ
from brokerd.router.ownership import refused_by
from brokerd.router.ports import TAKEOVER_FAILED, TAKEOVER_UNAVAILABLE
from brokerd.router.spool import drop_named

from ..agreement.owners import SessionOwners
from ..agreement.state import SESSION
from . import membership, offer
from .framing import one_or_batch
from .limits import ACK_HOLD_S, ACK_TIMEOUT_S, CONFIRM_S, LOCAL_DOWN_WAIT_S, drop_older, log
from .waiter import Deadlines, Requests, Waiter

AGREED_READ_S = 0.5  # how long a takeover with several offers waits for its agreed owner's name

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine

    from brokerd.connection.batching import EndOfTick
    from brokerd.router.router import Router

    from ..config import Config
    from ..replication import Replication
    from .handon import Handons
    from .peer import Peer
    from .transfer import Transfers


class Roster(NamedTuple):
    """What asking for a session needs of membership (``members``): the routers of this node
    that are down, a wait until one is back (True) or ``deadline`` (False), the routers of other
    nodes parked so recently that others may not count them as gone, and a wait until
    ``routers`` count as gone everywhere."""

    local_down: Callable[[], set[str]]
    local_back: Callable[[float], Awaitable[bool]]
    just_parked: Callable[[], list[Peer]]
    gone: Callable[[set[str]], Awaitable[None]]


class Takeovers:
    """The ``Mesh``'s takeover requests, settled and confirmed here, owned: the sessions taken
    and not confirmed yet (``_unconfirmed``), the copies handed on for them meanwhile
    (``_early``), and the confirmations said (``_confirmed``)."""

    def __init__(self, config: Config, loop: asyncio.AbstractEventLoop, router: Router, peers: dict[str, Peer],
                 requests: Requests, roster: Roster, transfers: Transfers, handons: Handons,
                 send: Callable[[Peer, int, Any], None], flush: Callable[[], None], tick: EndOfTick,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock  # the mesh's monotonic clock: the wait for this node's routers, confirmations' age
        self.loop = loop
        self.router = router
        self.node_id = config.node_id
        self.peers = peers
        self.requests = requests
        self.roster = roster
        self.transfers = transfers  # (``transfer``) sessions arriving: a request waits for them
        self.handons = handons  # (``handon``) a confirmed session's hand-on
        self._send = send  # (framing) a frame to one peer
        self._flush = flush  # (forwarding) what this tick collected goes first
        self._tick = tick  # the worker's end-of-iteration pass: the turn's asks are an end-only item
        self.replication: Replication | None = None  # set with the ``Mesh``'s
        self.closed = False
        # Takeovers this router confirmed to a live router: its id → {request: when}. Said again
        # when that router is heard after a silence (``confirm_again``): the first may be lost.
        self._confirmed: dict[str, dict[int, float]] = {}
        # Sessions taken over here from a live router, not confirmed to it yet: client id →
        # (old owner, request, the timer that confirms at the latest, the header's ``handon_from``,
        # the silent router whose replica it came from, if so).
        self._unconfirmed: dict[str, tuple[str | None, int, asyncio.TimerHandle, Any, str | None]] = {}
        # Copies handed on for a session whose takeover here is not settled yet (its CONNECT still
        # waits for the agreement, the session not imported): delivered once it is.
        self._early: dict[str, list] = {}
        # The offers a takeover passed over, and the silent routers whose replicas' copies that
        # makes stale: client id -> (offers, stale). Dropped and fenced only once the move is
        # confirmed; an aborted one leaves them held where they are (``_passed_over``).
        self._passed: dict[str, tuple[list[offer.Offer], list[str]]] = {}
        # The requests asked and not answered yet, expired on one timer (``_expire``).
        self._deadlines = Deadlines(loop, self._expire)
        # The asks made in this loop turn, by peer, sent at its end (``_send_asks``); None: none yet.
        self._asks: dict[str, list[list]] | None = None
        # Peers with an ask frame out and no answer frame from them since: router id -> when it
        # went (the loop's clock). The asks of later turns wait for that answer (``_held``).
        self._out: dict[str, float] = {}
        self._held: dict[str, list[list]] = {}
        self._hold_timer: asyncio.TimerHandle | None = None

    @property
    def _replicating(self) -> Replication:
        """The replication, where there is one for sure: a session taken from this router's
        own replica."""
        assert self.replication is not None
        return self.replication

    def takeover(self, client_id: str, claim: list | None = None,
                 answered: set[str] | None = None) -> Awaitable[dict | None]:
        """Ask every live peer for ``client_id``'s session, for a CONNECT making ``claim``
        (``[user name, refuse?]``, ``router.ownership``): a live router holding another
        identity's session refuses before it lets anything go, and a copy offered by a replica
        (or held here) is checked here; a refusal leaves every offer where it was. The routers of
        this node are always asked: while one is down (crashed and being restarted by the supervisor, or stopped) the
        request waits for it, bounded by ``LOCAL_DOWN_WAIT_S``, and is asked again when one fell
        silent instead of answering, since the sessions it restores from its disk would
        otherwise exist twice. Routers of other nodes that are parked are not waited for (a
        silent node may never come back; docs/guarantees.md: "Not guaranteed yet").

        The ask is made now, not when the caller first awaits: the asks of one loop turn go
        together (``_send_asks``)."""
        first = None if self.closed or self.roster.local_down() else self._asked(client_id, claim)
        return self._takeover(client_id, claim, answered, first)

    def takeover_then(self, client_id: str, claim: list | None, answered: set[str] | None,
                      then: Callable[[dict | None], None]) -> None:
        """``takeover``, its result handed to ``then`` instead of awaited. Where the first asks'
        answers settle it (every peer answered, none offered a session or refused, no replica
        to look into: a client id no other router holds, a connect storm's every CONNECT),
        ``then`` runs from their future's callback, and no task or coroutine is made for it;
        otherwise ``takeover``'s waits go on from those answers in a task."""
        if self.closed or self.roster.local_down():
            self._then(self._takeover(client_id, claim, answered, None), then)
            return
        first = self._asked(client_id, claim)
        first[1].future.add_done_callback(lambda _: self._first_answers(client_id, claim, answered, then, first))

    def _first_answers(self, client_id: str, claim: list | None, answered: set[str] | None,
                       then: Callable[[dict | None], None], first: tuple[int, Waiter, set[str]]) -> None:
        """(``takeover_then``) the first asks are answered: ``_takeover``'s last return where
        nothing more is to be done, else ``_takeover`` from here, in a task."""
        req, waiter, asked = first
        if waiter.result is None and not waiter.offers and not waiter.missed and self.replication is None \
                and not self.closed:
            self._deadlines.discard(req)
            if answered is not None:
                answered |= asked
            then(None)
            return
        self._then(self._takeover(client_id, claim, answered, first), then)

    def _then(self, waits: Coroutine[Any, Any, dict | None], then: Callable[[dict | None], None]) -> None:
        """``waits`` in a task, whose result goes to ``then`` (not where the task is cancelled:
        the loop is closing)."""
        task = self.loop.create_task(waits)
        task.add_done_callback(lambda done: None if done.cancelled() else then(done.result()))

    def _asked(self, client_id: str, claim: list | None) -> tuple[int, Waiter, set[str]]:
        """``_ask``, with the peers asked (its waiter's ``waiting`` empties as they answer)."""
        req, waiter = self._ask(client_id, claim)
        return req, waiter, set(waiter.waiting)

    async def _takeover(self, client_id: str, claim: list | None, answered: set[str] | None,
                        first: tuple[int, Waiter, set[str]] | None) -> dict | None:
        """``takeover``'s waits, from its first ask (None: not made yet)."""
        deadline = self._clock() + LOCAL_DOWN_WAIT_S
        asked_again = False
        roster = self.roster
        while not self.closed:
            if first is None:
                down = roster.local_down()
                if down:
                    if not await roster.local_back(deadline):
                        log.warning("mesh: client %r refused: router(s) %s of this node, which may hold its "
                                    "session, stayed down for %g s", client_id, ", ".join(sorted(down)),
                                    LOCAL_DOWN_WAIT_S)
                        return TAKEOVER_UNAVAILABLE
                    continue
                first = self._asked(client_id, claim)
            req, waiter, asked = first
            first = None
            result = await waiter.future
            self._deadlines.discard(req)
            if answered is not None:
                answered |= asked - waiter.missed - waiter.waiting
            if result is not None:  # a transfer broke off: that router keeps the session
                self._settle(client_id, waiter.offers, failed=True)
                return result
            if waiter.offers:
                agreed = await self._agreed_owner(client_id, waiter.offers)
                return self._settle(client_id, waiter.offers, claim=claim, agreed=agreed)
            if any(self.peers[rid].node_id == self.node_id for rid in waiter.missed):
                continue
            if self.replication is not None and not asked_again and (waiter.missed or roster.just_parked()):
                # A router of another node fell silent instead of answering, or a moment ago: once
                # it counts as gone everywhere, the follower holding its sessions answers for it.
                asked_again = True
                await roster.gone(waiter.missed)
                continue
            if self.replication is not None:  # the follower holding it may be this router
                return self._take_local_replica(client_id, claim)
            return result
        return None

    async def _agreed_owner(self, client_id: str, offers: list[offer.Offer]) -> str | None:
        """The router this node's agreement member names as the session's owner, where several
        offers leave a choice (``offer.choose``; a replica this router holds of a silent router's
        session counts as one: ``_replicas_of``); None where it is not known: no ``--agreement``,
        one offer, or no answer within ``AGREED_READ_S`` (the choice is then the rule without it).
        The member's own view, maybe stale: the claim that follows checks it with a majority."""
        owners = self.router.owners
        if not isinstance(owners, SessionOwners) or (len(offers) < 2 and not self._replicas_of(client_id)):
            return None  # (this router's own replica of a silent owner's session counts as an offer)
        try:
            owner, _ = await asyncio.wait_for(owners.client.read(SESSION, client_id), AGREED_READ_S)
        except Exception:  # noqa: BLE001 - NoAgreement, a timeout, the service restarting: not known
            return None
        return owner

    def _replicas_of(self, client_id: str) -> list[str]:
        """The silent routers whose session ``client_id`` this router holds a replica of."""
        return self.replication.restorer.replicas_of(client_id) if self.replication is not None else []

    def _settle(self, client_id: str, offers: list[tuple[str | None, int, dict]], failed: bool = False,
                claim: list | None = None, agreed: str | None = None) -> dict:
        """Every router asked has answered a takeover; pick the session state this router takes.
        Normally one router offers it. More than one when replicas of silent routers hold
        copies beside the live one, or beside each other, and two live routers for a moment
        after a partition healed (before the fence reached the side that was cut off): a copy a
        live router offers is the session, the most recent of them (``recency``: the highest
        ownership epoch) where there are two; among replicas' copies, the most recent. Every
        router that offered one drops its copy (TAKEOVER_DONE true: the one taken and the older
        ones alike); the silent routers whose copies were passed over are fenced
        (``Replication.fence``), the one taken by ``Replication.adopted``. The older ones are
        dropped and fenced only once the move is confirmed: a move the agreement then refuses
        (the copy taken was a stale one, its router not the agreed owner) leaves every copy
        where it was, the agreed owner's replica too (partition seed 315: dropped at once, it
        left nobody to serve the session until its silent owner came back, 20 s). ``failed``:
        a transfer broke off, nothing is taken and every offer stays where it is; so does a
        ``claim`` the chosen copy's owner refuses (``ownership.refused_by``). ``agreed``: the
        session's agreed owner, where known (``_agreed_owner``): its copy, or a replica's copy of
        it, is taken before a live router's that is not the owner (``offer.choose``); this
        router's own replica of it too, taken from the replication only then
        (``offer.takes_own_replica``)."""
        if failed:
            for rid, req, state in offers:
                self._done(rid, req, False)
                if rid is None:  # this router's own replica: it stays held here
                    self._replicating.replica_moved(client_id, False)
                drop_named(state)
            return TAKEOVER_FAILED
        live = offer.live(offers)
        if self.replication is not None and offer.takes_own_replica(
                offers, agreed, lambda: self._replicas_of(client_id)):
            # This router may hold a newer copy, or the agreed owner's beside a stale live one.
            local = self.replication.take_replica(client_id)
            if local is TAKEOVER_FAILED:  # (its copies could not be spooled: it stays held here)
                return self._settle(client_id, offers, failed=True)
            if local is not None:
                offers.append((None, 0, local))
        best = offer.choose(offers, agreed)
        chosen = best[2]
        refused = refused_by(claim, chosen, best[0] or chosen.get("replica"))
        if refused is not None:
            self._settle(client_id, offers, failed=True)
            return refused
        if live and chosen.get("replica"):
            log.warning("mesh: session %s: the copy of its agreed owner %s is taken, not the one of live router(s) "
                        "%s (stale: dropped)", client_id, agreed, ", ".join(sorted(str(o[0]) for o in live)))
        elif len(live) > 1:
            log.warning("mesh: session %s was offered by %d live routers (%s): the %s copy is taken, the others "
                        "dropped", client_id, len(live), ", ".join(sorted(str(o[0]) for o in live)),
                        "agreed owner's" if offer.source(best) == agreed else "most recent")
        stale = offer.passed_over(offers, chosen)
        for rid, req, state in offers:
            if state is not chosen:
                continue
            if rid is not None:
                state["offered_by"] = rid  # (the agreement's claim checks it against the record)
            # Confirmed once its interest is known everywhere and it is in this router's snapshot
            # (``confirm``): a live router then hands on all that still reaches it; a replica's
            # holder (this router's included) drops its copy only when this one is durable.
            self._await_confirm(client_id, rid, req, state.get("handon_from"), state.get("replica"))
        passed = [o for o in offers if o[2] is not chosen]
        if passed or stale:
            self._passed[client_id] = (passed, stale)
        return chosen

    def _passed_over(self, client_id: str, taken: bool) -> None:
        """The offers a takeover of ``client_id`` passed over (``_settle``), now that its move is
        confirmed (``taken``: each drops its copy, TAKEOVER_DONE true, and the silent routers'
        stale replicas are fenced) or aborted (each keeps its copy, as the one chosen does)."""
        passed = self._passed.pop(client_id, None)
        if passed is None:
            return
        offers, stale = passed
        for rid, req, state in offers:
            if rid is None:  # this router's own replica: an older copy dropped, or kept held
                self._replicating.replica_moved(client_id, taken)
            else:
                self._done(rid, req, taken)
            drop_named(state)
        if taken and stale and self.replication is not None:
            log.warning("mesh: session %s: copies of it held for silent router(s) %s are older than the one "
                        "taken; passed over", client_id, ", ".join(sorted(set(stale))))
            self.replication.fence(client_id, stale)

    def _await_confirm(self, client_id: str, rid: str | None, req: int, handon_from: Any = None,
                       replica: str | None = None) -> None:
        """The session taken from router ``rid`` (None: this router's replica) is confirmed by
        ``confirm``, at the latest ``CONFIRM_S`` from now. ``handon_from``: where the
        old owner's logs stood when it exported the session (``Transfers.release``), or, from the
        replica of silent router ``replica``, where that replica ended."""
        self.confirm(client_id)  # a confirmation still due for an earlier one
        timer = self.loop.call_later(CONFIRM_S, self.confirm, client_id)
        self._unconfirmed[client_id] = (rid, req, timer, handon_from, replica)

    def confirm(self, client_id: str, acked: list | None = None) -> None:
        """A session taken over (``_settle``) is here, in this router's snapshot, and the interest
        its subscriptions announced has been acknowledged (``acked``: the results of those waits,
        each {router: its log end when it took the announcement in}; None: nothing waited):
        tell its old owner, TAKEOVER_DONE (a live router then hands on what still reaches it for
        the session, ``Router.hand_on``; a replica's holder, this router's included, drops its
        copy). What was handed on for it meanwhile is delivered now, and from which offset of
        each router's log its messages come here directly is noted (``Handons.moved_here``)."""
        pending = self._unconfirmed.pop(client_id, None)
        early = self._early.pop(client_id, None)
        if early:
            self.router.take_copies(client_id, early)
        if pending is None:
            return
        self._passed_over(client_id, True)
        rid, req, timer, handon_from, replica = pending
        timer.cancel()
        self.handons.moved_here(client_id, rid, handon_from, replica, acked)
        if rid is None:
            self._replicating.replica_moved(client_id, True)
        else:
            self._done(rid, req, True)

    def hold_early(self, client_id: str, items: list) -> bool:
        """Copies handed on for ``client_id`` before this router imported it: held until its
        takeover here is confirmed (``confirm``), dropped if it is aborted. False where no
        takeover of it is pending here (the copies are for the router to take now)."""
        if client_id not in self._unconfirmed:
            return False
        self._early.setdefault(client_id, []).extend(items)
        return True

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

    def abort(self, client_id: str) -> None:
        """See ``MeshPort.abort_takeover``: the router that offered the session keeps it (told
        TAKEOVER_DONE false), or this router's replica keeps holding it."""
        pending = self._unconfirmed.pop(client_id, None)
        early = self._early.pop(client_id, None)
        if early:
            log.warning("mesh: %d message(s) handed on for session %s, whose move here was not agreed, dropped "
                        "(the old owner keeps the session)", len(early), client_id)
        self._passed_over(client_id, False)
        if pending is None:
            return
        rid, req, timer, _, _ = pending
        timer.cancel()
        if rid is None:
            self._replicating.replica_moved(client_id, False)
        else:
            self._done(rid, req, False)

    def _ask(self, client_id: str, claim: list | None = None) -> tuple[int, Waiter]:
        """Ask every live peer for ``client_id``'s session: the request's number (0: nobody to
        ask, answered already) and what waits for its answers, bounded (``_expire``). Sent at the
        end of this loop turn with the turn's other asks (``_send_asks``)."""
        alive = membership.alive(self.peers)
        waiter = Waiter(self.loop, alive)
        if not alive:
            waiter.future.set_result(None)
            return 0, waiter
        req = self.requests.open(waiter)
        # Whether this router spools the copies of a backlog moved to it (``router.spool``: it
        # has a log): then the old router sends all of it, else at most max_queued.
        body = [req, client_id, self.router.commit_log is not None]
        if claim is not None:
            body.append(claim)
        asks = self._asks
        if asks is None:
            asks = self._asks = {}
            self._tick.mark_end(self)
        for rid in alive:
            asks.setdefault(rid, []).append(body)
        self._deadlines.add(req, ACK_TIMEOUT_S + 1.0)
        return req, waiter

    def flush(self) -> None:
        """(An end-only item of the worker's ``EndOfTick``) ``_send_asks``."""
        self._send_asks()

    def _send_asks(self) -> None:
        """The end of the loop turn: the asks made in it go, one frame a peer (TAKEOVER_REQ for
        one, TAKEOVER_ASKS for more), after what this tick collected: a message published here
        before a CONNECT reaches the session before it moves. A peer that fell silent meanwhile
        is not asked: it counts as missed already (``Requests.peer_gone``).

        One ask frame a peer is out at a time, as Nagle's rule has one small segment out: while
        a peer has not answered the last frame, for at most ``ACK_HOLD_S``, the asks of later
        turns wait and go together when its answers come (``heard_answers``). A connect storm's
        asks then fill frames however the CONNECTs fall into loop turns: every frame costs both
        workers a wake-up and ZeroMQ's threads two hand-offs; a lone CONNECT waits for nothing."""
        asks, self._asks = self._asks, None
        if not asks or self.closed:
            return
        flushed = False
        now = self.loop.time()
        out = self._out
        for rid, bodies in asks.items():
            peer = self.peers.get(rid)
            if peer is None or not peer.alive:
                continue
            sent = out.get(rid)
            if sent is not None and now - sent < ACK_HOLD_S:
                self._hold(rid, bodies, sent + ACK_HOLD_S)
                continue
            if not flushed:
                self._flush()
                flushed = True
            self._send(peer, *one_or_batch(TAKEOVER_REQ, TAKEOVER_ASKS, bodies))  # (numbered for each)
            out[rid] = now

    def _hold(self, rid: str, bodies: list[list], until: float) -> None:
        """``bodies`` wait for ``rid``'s answers to the frame it has, until ``until`` at most."""
        held = self._held.get(rid)
        if held is None:
            self._held[rid] = bodies
        else:
            held += bodies
        if self._hold_timer is None:
            self._hold_timer = self.loop.call_at(until, self._hold_over)

    def heard_answers(self, peer: Peer) -> None:
        """A frame of answers from ``peer`` (``Transfers``): the asks that waited for it go at the
        end of this loop turn, with the turn's own."""
        rid = peer.router_id
        if self._out.pop(rid, None) is not None:
            self._release(rid)

    def _hold_over(self) -> None:
        """``ACK_HOLD_S`` passed without an answer frame from a peer whose asks wait: they go at
        the end of this loop turn (a slow or silent peer holds them no longer)."""
        self._hold_timer = None
        for rid in list(self._held):
            self._out.pop(rid, None)
            self._release(rid)

    def _release(self, rid: str) -> None:
        held = self._held.pop(rid, None)
        if not held:
            return
        asks = self._asks
        if asks is None:
            asks = self._asks = {}
            self._tick.mark_end(self)
        mine = asks.get(rid)
        if mine is None:
            asks[rid] = held
        else:
            held += mine
            asks[rid] = held  # (the asks held first: a peer reads asks in the order they were made)
        if not self._held and self._hold_timer is not None:
            self._hold_timer.cancel()
            self._hold_timer = None

    def _expire(self, req: int) -> None:
        """Takeover ``req`` is past its deadline: whoever has not answered counts as missed."""
        if self.transfers.arriving(req):  # a session is still arriving, chunk by chunk
            self._deadlines.add(req, ACK_TIMEOUT_S)
            return
        self.requests.expire(req, "takeover")

    def _done(self, rid: str | None, req: int, ok: bool) -> None:
        """Tell router ``rid`` (None: this one, nothing to tell) whether the session it offered
        for takeover ``req`` was taken. A confirmation is remembered, to be said again if that
        router turns out to have taken this one for silent meanwhile (``confirm_again``)."""
        peer = self.peers.get(rid) if rid is not None else None
        if peer is None:
            return
        if ok:
            now = self._clock()
            sent = self._confirmed.setdefault(peer.router_id, {})
            drop_older(sent, now - self.config.mesh_forget, lambda when: when)
            sent[req] = now
        if peer.alive:
            self._send(peer, TAKEOVER_DONE, [req, ok])

    def forget_confirmed(self, router_id: str) -> None:
        """``router_id`` is a new incarnation: its request numbers start again, so what we
        confirmed to the old one is not said to the new one."""
        self._confirmed.pop(router_id, None)

    def confirm_again(self, peer: Peer) -> None:
        """``peer`` is heard again after a silence (on either side): the takeovers confirmed to
        it lately are confirmed again. One it missed, or never got because it was silent here,
        left it keeping the session it gave, in doubt (``Transfers.move_expired``); one it had
        already is ignored there."""
        sent = self._confirmed.get(peer.router_id)
        if not sent:
            return
        drop_older(sent, self._clock() - self.config.mesh_forget, lambda when: when)
        for req in sent:
            self._send(peer, TAKEOVER_DONE, [req, True])
