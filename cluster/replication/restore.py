"""A router back on an empty disk: its log continued beyond what the other nodes hold, and its
persistent sessions sent back by its followers (SESSION_RESTORE, SESSION_RESTORED).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING

from brokerd.router.session import recency
from brokerd.router.spool import note_span, valid_spans

from .part import Part
from .rules import LeaderState

if TYPE_CHECKING:

    from ..mesh import Peer
    from .catchup import CatchupPart
    from .follower import FollowerPart
    from .history import HistoryPart
    from .leader import LeaderPart
    from .sessions import SessionsPart

log = logging.getLogger(__package__)  # (the package's name: the log lines name it as before)

READY_WAIT_S = 2.0  # an empty log waits at most this long for other nodes to say where it continues
RESTORE_WAIT_S = 10.0  # ... and at most this long for its followers to send its sessions back


class RestorePart(Part):
    """An empty log's continuation, and sessions restored from the followers."""

    # The other parts it calls (set by ``Replication``).
    lead: LeaderPart
    follow: FollowerPart
    histories: HistoryPart
    session_part: SessionsPart
    catchups: CatchupPart

    def __init__(self, shared: Part) -> None:
        super().__init__(shared)
        # Back on an empty disk: the followers asked for this router's sessions (``_restore``).
        self._restoring: set[str] = set()
        self._restored_from: dict[str, tuple[int, int]] = {}  # client id → recency of the copy restored
        self._restore_done: asyncio.Future | None = None
        self._restored = 0

    def replicas_of(self, client_id: str) -> list[str]:
        """The silent routers whose session ``client_id`` this router holds a replica of; read
        only (nothing is taken): a takeover asked here counts that copy as an offer before it
        chooses (``Takeovers._agreed_owner``), and takes it only once it is the one chosen."""
        return [partition for partition, _ in self.session_part.store.found(client_id, self.net.hears)]

    async def continue_log(self) -> None:
        loop = self.loop
        deadline = loop.time() + READY_WAIT_S
        heard = None
        own = self.config.node_id
        while loop.time() < deadline:
            if heard is None and any(p.alive and p.node_id != own for p in self.net.peers()):
                heard = loop.time()  # a node answered: one more HELLO round meets the routers it knows
            if heard is not None and loop.time() - heard > 0.6:
                break
            await asyncio.sleep(0.05)
        start = 0
        for peer in self.net.peers():
            if peer.node_id != own:
                start = max(start, peer.seen_of_me, peer.replicas.get(self.partition, -1) + 1)
        if start > 0:
            log.warning("replication: this router's log is empty, but other nodes have it up to offset %d "
                        "(a lost or replaced disk?): it continues at %d; what came before stays on its "
                        "replicas", start - 1, start)
            self.log.start_at(start)
            self.lead.flushed = start - 1
            self.lead.leader = LeaderState(self.lead.followers, self.lead.leader.min_insync, self.config.replica_lag,
                                      self.config.replica_timeout, self.clock, start - 1)
        holders = [p for p in self.net.peers()
                   if p.alive and p.node_id != own and self.partition in p.replicas]
        if start > 0 and holders:  # its records below ``start`` are fetched back from them (``ready``)
            os.makedirs(self.histories.history_dir(self.log), mode=0o700, exist_ok=True)
        if holders:
            await self._restore(holders)

    async def _restore(self, holders: list[Peer]) -> None:
        """The persistent sessions of this router that its followers hold, with what each is
        owed from their replicas, come back before it serves (a lost disk loses no session that
        was not taken over elsewhere meanwhile). Bounded by ``RESTORE_WAIT_S``."""
        self._restoring = {p.router_id for p in holders}
        done = self._restore_done = self.loop.create_future()
        for peer in holders:
            self.net.send(peer, "restore", self.partition)
        try:
            await asyncio.wait_for(done, RESTORE_WAIT_S)
        except TimeoutError:
            log.warning("replication: %s did not send this router's sessions back within %g s: serving with "
                        "the %d restored so far", ", ".join(sorted(self._restoring)), RESTORE_WAIT_S,
                        self._restored)
        else:
            log.warning("replication: %d persistent session(s) of this router restored from its followers",
                        self._restored)
        self._restoring = set()
        self._restored_from = {}

    def restore_sessions(self, peer: Peer, partition: str) -> None:
        """``peer`` came back on an empty disk and asks for its sessions held here: one
        SESSION_RESTORED frame per session (its header and copies from the replica), one
        session per loop iteration, then a last, empty one."""
        if partition != peer.router_id:
            raise ValueError(f"session-restore: {peer.router_id} asked for the sessions of {partition}")
        self._restore_step(peer, partition, list(self.session_part.sessions.get(partition, {})), 0, 0)

    def _restore_step(self, peer: Peer, partition: str, client_ids: list[str], i: int, sent: int) -> None:
        if not peer.alive:
            return
        while i < len(client_ids):
            cid = client_ids[i]
            i += 1
            st = self.session_part.sessions.get(partition, {}).get(cid)
            if st is None or partition not in self.follow.replicas:
                continue
            header = self._restore_header(cid, partition, st)
            if header is None:
                continue
            self.net.send(peer, "restored", [partition, header, False])
            self.loop.call_soon(self._restore_step, peer, partition, client_ids, i, sent + 1)
            return
        self.net.send(peer, "restored", [partition, None, True])
        log.info("replication: %d session(s) of %s sent back to it from the replica here", sent, partition)

    def _restore_header(self, client_id: str, partition: str, st: dict) -> dict | None:
        """A session of ``partition`` held here, for its router back on an empty disk: its
        header, without copies; ``copies`` names what it is to read back instead (``restored``):
        the replica from the session's position, and what its router held for it outside its
        log (``Session.copy_spans``). Before, the copies came in the header, at most
        ``--max-queued`` of them. None (logged) when its held state cannot be read back."""
        rebuilt = self.session_part.replica_header(client_id, partition, st)
        if rebuilt is None:
            return None
        session, header, _ = rebuilt
        spans = valid_spans(st.get("copies"))
        for rng in session.ranges:  # the replica, from the session's position
            if rng.start < rng.end:
                note_span(spans, partition, rng.start)
                note_span(spans, partition, rng.end - 1)
        header["copies"] = {origin: span[:2] for origin, span in spans.items()}
        return header

    def restored(self, sender: str, partition: str, header: dict | None, last: bool) -> None:
        """A session of this router sent back by a follower (``_restore``)."""
        if partition != self.partition or sender not in self._restoring:
            return
        router = self.router
        if header is not None:
            cid = header["client_id"]
            had = router.sessions.get(cid)
            earlier = self._restored_from.get(cid)
            # Two holders may answer: a former follower's copy can be older than the current
            # follower's (this router clears it only once it serves: ``place``). The newer counts.
            if had is None or (earlier is not None and earlier < recency(header)):
                if had is not None:
                    router.drop_session(had)
                else:
                    self._restored += 1
                session = router.import_session(cid, header)
                # Back with its own router, as the holder had it: not a move.
                session.epoch = header.get("epoch", 0)
                session.arrived_ms = header.get("arrived") or session.arrived_ms
                self._restored_from[cid] = recency(header)
                router.schedule_expiry(session)
                router.rearm_will(session)
                # What waited for it in this router's lost log, read back from the sender's
                # replica, all of it (spooled here); then what it held outside the log.
                copies = valid_spans(header.get("copies"))
                own = copies.pop(self.partition, None)
                peer = self.net.peer(sender)
                if own is not None and peer is not None:
                    body = self.catchups.catchup_body(session, self.partition, own[0], 0, own[1] + 1)
                    self.net.send(peer, "session_catchup", body)
                self.catchups.read_back_copies(session, copies)
        if last:
            self._restoring.discard(sender)
            done = self._restore_done  # (set by ``_restore`` with ``_restoring``)
            if not self._restoring and done is not None and not done.done():
                done.set_result(None)
