"""Session transfers: the old owner's side (``release``: the header, then the copies streamed
in chunks, one per loop iteration; kept until TAKEOVER_DONE, in doubt if never confirmed; the
answers of one loop turn in one frame a peer, ``_answer``) and
the new owner's (``_arrived``: chunks into a spool file or the queue; ``_take``: a whole session
is an offer for ``Takeovers._settle``). A transfer that stops (no progress for ``ACK_TIMEOUT_S``,
or either side falls silent) fails: the session stays where it was.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from brokerd.router.mesh_format import MOVING, TAKEOVER_ANSWERS, TAKEOVER_CHUNK, TAKEOVER_DONE, TAKEOVER_RESP
from brokerd.router.ownership import refusal
from brokerd.router.ports import TAKEOVER_FAILED
from brokerd.router.spool import SpoolWriter, drop_named

from .framing import one_or_batch
from .limits import ACK_TIMEOUT_S, MOVE_TIMEOUT_S, drop_older, log

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable

    from brokerd.connection.batching import EndOfTick
    from brokerd.router.router import Router

    from ..config import Config
    from ..replication import Replication
    from .peer import Peer
    from .waiter import Requests


def _each(items: list, handle: Callable[[Any], None]) -> Exception | None:
    """``handle`` each of a batch's items (a frame's asks or answers); the first exception, if
    any, returned once all were handled: one item that cannot be handled leaves the others
    handled, as when each came in a frame of its own."""
    failed: Exception | None = None
    for item in items:
        try:
            handle(item)
        except Exception as exc:  # noqa: BLE001 - raised by the caller, after the others
            failed = failed or exc
    return failed


class Transfer:
    """A session arriving in chunks (new owner's side); ``spool``: where its copies go
    (``router.spool``), once there are any."""

    __slots__ = ("state", "progress", "spool")

    def __init__(self, state: dict, now: float) -> None:
        self.state = state
        self.progress = now  # when its last chunk arrived
        self.spool: SpoolWriter | None = None


class Transfers:
    """The ``Mesh``'s sessions leaving (``_moves``, ``_in_doubt``) and arriving (``_incoming``),
    owned; the requests they answer are ``requests``'."""

    def __init__(self, config: Config, loop: asyncio.AbstractEventLoop, router: Router, peers: dict[str, Peer],
                 requests: Requests, send: Callable[[Peer, int, Any], None], flush: Callable[[], None],
                 silent_since: Callable[[Peer], float], tick: EndOfTick,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self.config = config
        self._clock = clock  # the mesh's monotonic clock: a test's own moves a transfer's time
        self._wall = wall  # the mesh's Unix clock: when a session left, as its new owner is told
        self.loop = loop
        self.router = router
        self.router_id = router.router_id
        self.node_id = config.node_id
        self.peers = peers
        self.requests = requests
        self._send = send  # (framing) a frame to one peer
        self._flush = flush  # (forwarding) what this tick collected goes first
        self._tick = tick  # the worker's end-of-iteration pass: the turn's answers are an end-only item
        self._silent_since = silent_since  # (members) when a parked peer fell silent
        self.replication: Replication | None = None  # set with the ``Mesh``'s
        self.closed = False
        self._incoming: dict[tuple[int, str], Transfer] = {}  # (request, sender) → session arriving
        self._moves: dict[tuple[str, int], str] = {}  # (new owner, its request) → client id leaving
        # Moves given up unconfirmed (the new owner fell silent): key as ``_moves`` → (client id,
        # when); a confirmation that comes later settles them (``Router.moved_after_all``).
        self._in_doubt: dict[tuple[str, int], tuple[str, float]] = {}
        # The answers of this loop turn to asks read from frames, by asker, sent at its end
        # (``_answer``); None: none yet. ``_reading``: an ask from a frame is being released.
        self._answers: dict[str, tuple[Peer, list[list]]] | None = None
        self._reading = False
        # (``Takeovers.heard_answers``, wired by the ``Mesh``) a frame of answers came from a peer.
        self.heard_answers: Callable[[Peer], None] = lambda peer: None

    def release(self, peer: Peer, req: int, client_id: str, spools: bool = False, claim: list | None = None,
                 until: float | None = None) -> None:
        """``peer`` takes ``client_id`` over: answer with the session's header and its first
        chunk of copies, then stream the rest, one chunk per loop iteration. All of them where
        ``peer`` spools them (``router.spool``); else at most max_queued.

        A session being moved already (an earlier request, which its router may have given up
        while this one was stopped or silent) is answered once that move settles, bounded by
        ``ACK_TIMEOUT_S``: answered at once, "no session" would have the asker make a new,
        empty one while the session stays here (chaos seed 1745875908). A move still unsettled
        then is answered as such (``MOVING``): the asker refuses its CONNECT for now, the client
        retries (partition seed 378: the asker, told "no session" while the session waited here
        for a confirmation a slow link held back, gave the client a new, empty one)."""
        if client_id in self.router.moving and peer.alive and not self.closed:
            now = self._clock()
            until = now + ACK_TIMEOUT_S if until is None else until
            if now < until:
                self.loop.call_later(0.01, self.release, peer, req, client_id, spools, claim, until)
                return
            self._answer(peer, [req, None, False, None, MOVING])
            return
        if claim is not None:  # the asker's CONNECT is another identity's: nothing is let go
            owner = self.router.claim_refused(client_id, claim[0], claim[1])
            if owner is not None:
                self._answer(peer, [req, None, False, owner])
                return
        limit = None if spools else -1
        released = self.router.release_session(client_id, peer.node_id == self.node_id, limit)
        if released is None and self.replication is not None:
            released = self.replication.release_replica(client_id, limit)  # its router is silent
        if released is None:
            self._answer(peer, [req, None, False], flush=True)
            return
        header, chunks = released
        if not header.get("replica"):
            # Routers silent here may hold, for this router, messages they routed to the session
            # here; they arrive after it left when they are heard again (a partition that cut
            # only this link: the new owner may hear them all along). It asks them for what they
            # published since (``Replication.moved_past_silence``).
            silent = {rid: int(self._silent_since(p) * 1000) for rid, p in self.peers.items() if p.parked}
            if silent:
                header["silent"] = silent
            # Where this router stood in each log when the session left: what reaches it for the
            # session from there on is handed on, or, should this router die first, read back
            # (``Handons.peer_gone``): [now (Unix ms), {router: its log's offset as seen here}].
            seen = {rid: p.origin_mark for rid, p in self.peers.items() if p.origin_mark >= 0}
            commit_log = self.router.commit_log
            if commit_log is not None:
                seen[self.router_id] = commit_log.next_offset
            header["handon_from"] = [int(self._wall() * 1000), seen]
        header["queue"] = next(chunks, [])
        following = next(chunks, None)
        key = (peer.router_id, req)
        self._moves[key] = client_id
        self.loop.call_later(MOVE_TIMEOUT_S, self.move_expired, key)
        self._answer(peer, [req, header, following is not None], flush=True,
                     alone=bool(header["queue"]) or following is not None)
        if following is not None:
            self._stream(peer, key, chunks, following)

    def _answer(self, peer: Peer, answer: list, flush: bool = False, alone: bool = False) -> None:
        """Answer a takeover request. One read from a frame waits for the end of this loop turn
        and goes with the turn's other answers to ``peer``, in one frame (``flush``); one
        called for directly (a session that was moving, asked again) goes at once, after what
        this tick collected where ``flush`` (what this router sent before the session left goes
        first: so do the answers of a turn). An answer that carries copies (``alone``) goes at
        once with those before it: a frame then holds at most one chunk of copies, and its
        TAKEOVER_CHUNK frames follow it."""
        if not self._reading:
            if flush:
                self._flush()
            self._send(peer, TAKEOVER_RESP, answer)
            return
        turn = self._answers
        if turn is None:
            turn = self._answers = {}
            self._tick.mark_end(self)
        answers = turn.get(peer.router_id)
        if answers is None:
            answers = turn[peer.router_id] = (peer, [])
        answers[1].append(answer)
        if alone:
            self._answer_now(peer, answers[1])

    def flush(self) -> None:
        """(An end-only item of the worker's ``EndOfTick``) the end of the loop turn: its answers,
        one frame a peer, after what it collected (``_answer``)."""
        turn, self._answers = self._answers, None
        if turn and not self.closed:
            for peer, answers in turn.values():
                self._answer_now(peer, answers)

    def _answer_now(self, peer: Peer, answers: list[list]) -> None:
        """``answers`` to ``peer`` in one frame (emptied), after what this tick collected."""
        if not answers:
            return
        self._flush()
        self._send(peer, *one_or_batch(TAKEOVER_RESP, TAKEOVER_ANSWERS, answers))
        answers.clear()

    def _stream(self, peer: Peer, key: tuple[str, int], chunks: Any, chunk: list) -> None:
        if key not in self._moves or not peer.alive or peer.link is None or self.closed:
            return  # the transfer failed meanwhile (the session stayed here)
        if peer.link.pending:  # wait for the link to drain: chunks are never dropped
            self.loop.call_later(0.005, self._stream, peer, key, chunks, chunk)
            return
        following = next(chunks, None)
        self._send(peer, TAKEOVER_CHUNK, [key[1], chunk, following is None])
        if following is not None:
            self.loop.call_soon(self._stream, peer, key, chunks, following)

    def move_expired(self, key: tuple[str, int]) -> None:
        """The new owner of an exported session fell silent, or never confirmed: it stays here,
        in doubt until that router, heard again, confirms (or a client resumes it here)."""
        client_id = self._moves.pop(key, None)
        if client_id is None:
            return
        now = self._clock()
        drop_older(self._in_doubt, now - self.config.mesh_forget, lambda entry: entry[1])
        self._in_doubt[key] = (client_id, now)
        self._moved(client_id, False, key[0], doubt=True)

    def _moved(self, client_id: str, ok: bool, to: str | None = None, doubt: bool = False) -> None:
        """A session exported to another router (by this router, or from a replica held here)
        is with its new owner ``to`` (``ok``), or stays here (``doubt``: for now)."""
        self.router.moved(client_id, ok, to, doubt)
        if self.replication is not None:
            self.replication.replica_moved(client_id, ok)

    def _arrived(self, peer: Peer, req: int, transfer: Transfer, items: list, last: bool) -> None:
        """Copies of a session arriving. Where this router has a log, all go to a spool file
        (``router.spool``: synced before the session is taken, so before its old router lets it
        go; read back as the session drains, kept across a restart, any number in bounded
        memory); a spool that cannot be written (a full disk) fails the transfer, and the
        session stays where it was. Without a log: up to max_queued into its queue, the rest
        dropped and counted (as a session without a log keeps no more)."""
        key = (req, peer.router_id)
        commit_log = self.router.commit_log
        if commit_log is None:
            queue = transfer.state["queue"]
            room = max(self.config.max_queued - len(queue), 0)
            if len(items) > room:
                self.router.stats.drop_queue_full += len(items) - room
                items = items[:room]
            queue += items
        elif items:
            try:
                if transfer.spool is None:
                    transfer.spool = SpoolWriter(commit_log.directory)
                transfer.spool.add(items)
            except OSError as exc:
                self.failed(key, f"its queued copies could not be spooled: {exc}")
                return
        if not last:
            return
        spool = transfer.spool
        if spool is not None:
            try:
                spool.finish_into(transfer.state)
            except OSError as exc:
                self.failed(key, f"its spooled copies could not be synced: {exc}")
                return
            transfer.spool = None
            if spool.count > self.config.max_queued:
                log.info("mesh: session %s from %s: %d queued copies (more than --max-queued %d) spooled to disk",
                         transfer.state.get("client_id"), peer.router_id, spool.count, self.config.max_queued)
        del self._incoming[key]
        self._take(peer, req, transfer.state)

    def _take(self, peer: Peer, req: int, state: dict) -> None:
        """A whole session arrived: an offer, settled (TAKEOVER_DONE) once every router asked
        has answered (``Takeovers._settle``); if the request is over, it stays where it was."""
        waiter = self.requests.get(req)
        if waiter is None or waiter.future.done():
            self._send(peer, TAKEOVER_DONE, [req, False])
            drop_named(state)
            return
        waiter.offers.append((peer.router_id, req, state))
        self.requests.answer(req, peer.router_id)

    def arriving(self, req: int) -> bool:
        """Whether a session for request ``req`` is still arriving, chunk by chunk (progress
        within ``ACK_TIMEOUT_S``); if not, its transfers, if any, fail."""
        keys = [k for k in self._incoming if k[0] == req]
        if not keys:
            return False
        now = self._clock()
        if any(now - self._incoming[k].progress < ACK_TIMEOUT_S for k in keys):
            return True
        for key in keys:
            self.failed(key, "no progress")
        return False

    def peer_gone(self, router_id: str, why: str) -> None:
        """``router_id`` fell silent, left or restarted: what it was sending stops arriving, and
        the sessions it was taking stay here (it may never confirm)."""
        for key in [k for k in self._incoming if k[1] == router_id]:
            self.failed(key, why)
        for move in [k for k in self._moves if k[0] == router_id]:
            self.move_expired(move)

    def peer_restarted(self, router_id: str) -> None:
        """``router_id`` is a new incarnation: its request numbers start again, so what was in
        doubt with the old one cannot be told from the new one's."""
        for key in [k for k in self._in_doubt if k[0] == router_id]:
            del self._in_doubt[key]

    def failed(self, key: tuple[int, str], why: str) -> None:
        """A session stopped arriving: its old owner keeps it, and the CONNECT waiting for it is
        refused rather than given an empty session."""
        transfer = self._incoming.pop(key, None)
        if transfer is not None and transfer.spool is not None:
            transfer.spool.discard()
        req, sender = key
        log.warning("mesh: session transfer %d from %s failed (%s); it stays there", req, sender, why)
        peer = self.peers.get(sender)
        if peer is not None and peer.alive:
            self._send(peer, TAKEOVER_DONE, [req, False])
        waiter = self.requests.get(req)
        if waiter is not None and waiter.result is None:
            waiter.result = TAKEOVER_FAILED

    # -- frames received ------------------------------------------------------------------------

    def on_takeover_req(self, peer: Peer, body: Any, size: int) -> None:
        self.on_takeover_asks(peer, [body], size)

    def on_takeover_asks(self, peer: Peer, body: Any, size: int) -> None:
        """Asks of ``peer`` (``Takeovers``: those of one of its loop turns): each released, the
        answers sent at the end of this loop turn (``_answer``). One that cannot be handled
        leaves the others answered; it is raised after them, to be logged as a bad frame."""
        self._reading = True
        try:
            failed = _each(body, lambda ask: self.release(peer, *ask))
        finally:
            self._reading = False
        if failed is not None:
            raise failed

    def on_takeover_answers(self, peer: Peer, body: Any, size: int) -> None:
        """The answers to a TAKEOVER_ASKS frame, each read as a TAKEOVER_RESP is (one that
        cannot be handled is raised after the others)."""
        self.heard_answers(peer)
        failed = _each(body, lambda answer: self._answered(peer, answer))
        if failed is not None:
            raise failed

    def on_takeover_resp(self, peer: Peer, body: Any, size: int) -> None:
        self.heard_answers(peer)
        self._answered(peer, body)

    def _answered(self, peer: Peer, body: Any) -> None:
        """One answer of ``peer`` to a takeover request: none there, another identity's,
        moving there, or the session's header and first chunk (``release``)."""
        sender = peer.router_id
        req, state, more = body[:3]
        if state is None:  # none there, or (a fourth value, [owner]) another identity's, or moving there
            if len(body) > 4 and body[4] == MOVING:  # (it stays there: nothing is taken, the CONNECT waits)
                self.requests.answer(req, sender, TAKEOVER_FAILED)
                return
            self.requests.answer(req, sender, refusal(body[3][0], sender) if len(body) > 3 and body[3] else None)
            return
        state.pop("spool", None)  # (this router's to name, never a peer's)
        state.pop("spool_marks", None)
        waiter = self.requests.get(req)
        if waiter is None or waiter.future.done():
            self._send(peer, TAKEOVER_DONE, [req, False])  # nobody here takes it: it stays there
            return
        items, state["queue"] = state["queue"], []
        transfer = Transfer(state, self._clock())
        self._incoming[(req, sender)] = transfer
        self._arrived(peer, req, transfer, items, not more)

    def on_takeover_chunk(self, peer: Peer, body: Any, size: int) -> None:
        req, items, last = body
        transfer = self._incoming.get((req, peer.router_id))
        if transfer is None:
            if last:
                self._send(peer, TAKEOVER_DONE, [req, False])
            return
        transfer.progress = self._clock()
        self._arrived(peer, req, transfer, items, last)

    def on_takeover_done(self, peer: Peer, body: Any, size: int) -> None:
        sender = peer.router_id
        req, ok = body
        client_id = self._moves.pop((sender, req), None)
        if client_id is not None:
            self._moved(client_id, ok, sender)
            return
        doubt = self._in_doubt.pop((sender, req), None)
        if doubt is not None and ok:
            self.router.moved_after_all(doubt[0], sender)
