"""Forwarding: what this router sends its peers, collected per loop iteration, numbered, kept
for a silent peer, read back from the log; and the PUBLISH and RETAINED frames it receives.

``forward`` / ``forward_to`` put a publish in each wanting peer's batch; the end of the loop
iteration (``flush``: the mesh is an end-only item of the worker's ``EndOfTick``) makes each batch
one numbered PUBLISH frame (``framing``), into the peer's ring until confirmed, or into its
backlog while it is parked (the rules: ``delivery``).
A backlog that overflows is read back from this router's log when the peer returns (``_replay``),
by its plain interest: the shared groups' copies it would not take go to another router of their
group at once (``to_other_members``), as do those a forgotten peer never confirmed (``Members``).
A peer's CATCHUP after this router restarted is read back the same way; when the asker is a router
of a shared group, this router's own QoS 1/2 messages from its mark go to the groups again
(``_groups_back``): the copies chosen for it died with the old incarnation's ring.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from brokerd.router.mesh_format import RETAINED, to_mesh, to_mesh_shared
from brokerd.router.message import Message

from . import delivery
from .limits import LINGER_BELOW, log

if TYPE_CHECKING:
    import asyncio

    import msgpack

    from brokerd.connection.batching import EndOfTick
    from brokerd.router.ports import Source
    from brokerd.router.router import Router

    from ..config import Config
    from .interest import Interest
    from .peer import Peer


def to_other_members(router: Router, copies: list[delivery.GroupCopy], not_to: str) -> None:
    """Group copies chosen for router ``not_to`` that it will not get (forgotten, or beyond its
    backlog): each to one member of its group elsewhere, for that group alone (MQTT 5.0 4.8.2:
    a message a member's session ended without acknowledging goes to another member)."""
    if not copies:
        return
    log.warning("mesh: %d shared-group message(s) chosen for router %s, which will not get them, go to "
                "another router of their groups", len(copies), not_to)
    shared = router.shared
    for msg, groups in copies:
        for key in groups:
            shared.to_another_member(msg, key, not_to)


def in_a_group(router: Router, router_id: str) -> bool:
    """Whether ``router_id`` has announced members of any shared group (a group's copies may
    have been chosen for it)."""
    return any(router_id in route.routers for route in router.shared.routes.values())


class ForwardingMixin:
    """The ``Mesh``'s outbound publishes and their delivery."""

    config: Config
    loop: asyncio.AbstractEventLoop
    router: Router
    router_id: str
    peers: dict[str, Peer]
    closed: bool
    _dirty: bool  # marked on ``end_of_tick``: what was collected waits for the iteration's end
    _lingered: bool
    _packer: msgpack.Packer
    interest: Interest
    end_of_tick: EndOfTick  # the worker's end-of-iteration pass, given to the ``Mesh`` when made
    # The lowest offset of this incarnation's log that went to the shared groups again on a
    # peer's catch-up (``_groups_back``); None: none yet.
    _groups_low: int | None = None

    if TYPE_CHECKING:  # the other parts' methods this one calls (the ``Mesh`` is their union)
        def _send(self, peer: Peer, kind: int, body: Any) -> None: ...
        def _publish_frames(self, peer: Peer, batch: list, mark: int, packed: bool = False
                            ) -> list[tuple[int, bytes, int]]: ...
        def _numbered(self, peer: Peer, kind: int, body: Any) -> tuple[int, bytes]: ...

    def forward(self, router_id: str, msg: Message, source: Source | None = None, groups: list[str] | None = None,
                only: bool = False) -> None:
        if groups is None:
            self.forward_to((router_id,), msg, source)
            return
        peer = self.peers.get(router_id)
        if peer is None or self.closed or not (peer.alive or peer.parked):
            return
        peer.batch.append(to_mesh_shared(msg, groups, only))
        if source is not None:
            peer.batch_sources.add(source)
        if not self._dirty:
            self._mark()

    def forward_to(self, router_ids: tuple[str, ...], msg: Message, source: Source | None = None) -> None:
        """Once per publish that other routers want. For one router the message's values join
        its batch, packed with the whole frame by one msgpack call; for several it is packed
        once and every one of those frames takes the same bytes (a fan-out over eight workers
        packed it seven times: 1.93 -> 0.35 us a message in-process; packing each message on
        its own for one router cost ~4 % of cross-worker p2p)."""
        if self.closed:
            return
        peers = self.peers
        item: Any = None
        for router_id in router_ids:
            peer = peers.get(router_id)
            if peer is None or not (peer.alive or peer.parked):
                continue
            if item is None:
                item = to_mesh(msg) if len(router_ids) == 1 else self._packer.pack(to_mesh(msg))
            if item.__class__ is bytes:
                peer.batch_packed = True
            peer.batch.append(item)
            if source is not None:
                peer.batch_sources.add(source)
        if item is not None and not self._dirty:
            self._mark()

    def retained_update(self, msg: Message) -> None:
        if self.closed:
            return
        self._flush_collected()  # retained updates travel after this tick's publishes, in order
        body = [msg.to_list()]
        for peer in self.peers.values():
            if peer.alive:
                self._send(peer, RETAINED, body)  # (numbered for each peer: ``framing``)
            elif peer.parked:
                self._keep_frame(peer, RETAINED, body, 1)

    def _flush_collected(self) -> None:
        """What this loop iteration collected goes now, before a frame that must follow it."""
        if self._dirty:
            self._flush()

    def _mark(self) -> None:
        """Something to send at the end of this loop iteration (``flush``)."""
        if not self._dirty and not self.closed:
            self._dirty = True
            self.end_of_tick.mark_end(self)

    def flush(self) -> None:
        """The end of the loop iteration (``EndOfTick``'s end-only item; ``_flush`` sends now):
        send what this loop iteration collected; publishes alone and fewer than
        ``LINGER_BELOW`` wait for one more iteration first, once. Under load that iteration is
        the next turn of reads (the turn budget keeps turns short), so frames carry about twice
        as many messages and every per-frame cost (ZeroMQ's threads, wake-ups, framing) halves;
        when the loop is idle it is a poll that returns at once. Interest changes and barriers
        never wait."""
        if not self._dirty:
            return  # flushed meanwhile (a takeover or retained update flushes first)
        interest = self.interest
        if not self._lingered and not interest.batch and interest.waiter is None:
            n = 0
            for peer in self.peers.values():
                n += len(peer.batch)
            if n < LINGER_BELOW:
                self._lingered = True
                self.end_of_tick.mark_next(self)
                return
        self._flush()

    def _flush(self) -> None:
        """One publish frame per peer, one interest frame for all."""
        self._dirty = False
        self._lingered = False
        if self.closed:
            return
        stats = self.router.stats
        commit_log = self.router.commit_log
        # Every message of ours logged so far that a peer's interest matched is in its batch now
        # (``Router.publish`` logs, then forwards, in one call): the log's end is each frame's mark.
        mark = commit_log.next_offset if commit_log is not None else -1
        for peer in self.peers.values():
            batch = peer.batch
            if not batch:
                continue
            peer.batch = []
            packed, peer.batch_packed = peer.batch_packed, False
            sources = peer.batch_sources
            peer.batch_sources = set()
            if peer.link is None:
                continue
            for seq, frame, n in self._publish_frames(peer, batch, -1 if peer.replaying else mark, packed):
                peer.stats[0] += n
                peer.stats[1] += len(frame)
                stats.mesh_msgs_out += n
                stats.mesh_bytes_out += len(frame)
                stats.mesh_frames_out += 1
                if peer.alive:
                    self._unconfirmed(peer, seq, frame)
                    peer.link.send(frame, sources)
                else:
                    self._keep(peer, frame, n, seq)
        interest = self.interest
        if interest.batch or interest.waiter is not None:  # changes, or a barrier
            interest.flush()

    def _unconfirmed(self, peer: Peer, seq: int, frame: bytes) -> None:
        """A numbered frame handed to ``peer``'s link: in its ring until confirmed (``delivery``)."""
        delivery.unconfirmed(peer, seq, frame, self.config.mesh_backlog)

    def _keep_frame(self, peer: Peer, kind: int, body: Any, n: int) -> None:
        """A frame of a ``NUMBERED`` kind for a parked peer, numbered and kept with its publishes,
        in order (``_keep``): it enters the peer's ring when it is sent at last."""
        seq, frame = self._numbered(peer, kind, body)
        self._keep(peer, frame, n, seq)

    def _keep(self, peer: Peer, frame: bytes, n: int, seq: int = 0) -> None:
        """A frame for a parked peer: into its backlog; once that is full, left to this router's
        log (read back when the peer returns), or without a log dropped and counted. ``seq``: a
        PUBLISH frame's number (it enters the ring when it is sent: ``Members.rejoin``)."""
        commit_log = self.router.commit_log
        done = delivery.keep(peer, frame, n, self.config.mesh_backlog,
                             commit_log.next_offset if commit_log is not None else None,
                             commit_log is not None and commit_log.error is None, seq)
        if done is not delivery.KEPT and seq and self.router.shared.active:
            to_other_members(self.router, delivery.dropped_group_copies(frame, self.router_id), peer.router_id)
        if done is delivery.TO_LOG:
            log.warning("mesh: router %s is silent and the %d bytes kept for it (--mesh-backlog) are "
                        "used: what it would get from here on is read back from this router's log "
                        "when it returns", peer.router_id, peer.backlog_bytes)
        elif done is delivery.DROPPED:
            self.router.stats.drop_mesh_peer_gone += n
            if peer.dropped == n:
                log.warning("mesh: router %s is silent and the %d bytes kept for it (--mesh-backlog) are "
                            "used: dropping what it would get until it returns (counted as drop "
                            "mesh_peer_gone)", peer.router_id, peer.backlog_bytes)

    def _start_replay(self, peer: Peer, offset: int, why: str) -> None:
        """Read this router's log back to ``peer`` from ``offset`` to its end now (``_replay``);
        until that is done, live frames to it claim no mark."""
        commit_log = self.router.commit_log
        if commit_log is None or offset >= commit_log.next_offset:
            return
        if offset < commit_log.start_offset:
            log.warning("mesh: router %s asks for this router's log from offset %d (%s), but it starts at "
                        "%d now (retention): the %d record(s) before are gone", peer.router_id, offset, why,
                        commit_log.start_offset, commit_log.start_offset - offset)
            offset = commit_log.start_offset
        log.info("mesh: reading this router's log back to router %s from offset %d to %d (%s)",
                 peer.router_id, offset, commit_log.next_offset, why)
        peer.replaying += 1
        self._replay(peer, offset, commit_log.next_offset)

    def _replay(self, peer: Peer, offset: int, end: int, sent: int = 0) -> None:
        """Forward again, by the peer's interest, the messages published here (records whose
        origin is this router: copies from other routers are theirs to replay) in ``[offset,
        end)`` of this router's log, 256 records per loop iteration, as the link drains. Each
        frame's mark is the offset after its last record: a crash midway is resumed from there."""
        if not peer.alive or self.closed or peer.link is None:
            peer.replaying -= 1
            return
        if peer.link.pending:
            self.loop.call_later(0.005, self._replay, peer, offset, end, sent)
            return
        commit_log = self.router.commit_log
        assert commit_log is not None  # (``_start_replay`` starts only with a log, which stays)
        records = [r for r in commit_log.read(offset, max_records=256) if r.offset < end]
        if not records:
            peer.replaying -= 1
            log.info("mesh: %d message(s) read back from the log for router %s", sent, peer.router_id)
            return
        rid = peer.router_id
        me = self.router_id
        batch = []
        for rec in records:
            if (rec.origin_router and rec.origin_router != me) or not any(
                    r == rid for r, _ in self.router.interest.match(rec.topic)):
                continue
            msg = Message.from_record(rec)
            msg.origin_router, msg.origin_offset = self.router_id, rec.offset
            batch.append(to_mesh(msg))
            if rec.retain:
                self._send(peer, RETAINED, [msg.to_list()])
        for seq, frame, n in self._publish_frames(peer, batch, records[-1].offset + 1) if batch else ():
            self.router.stats.mesh_msgs_out += n
            self._unconfirmed(peer, seq, frame)
            peer.link.send(frame)
        self.loop.call_soon(self._replay, peer, records[-1].offset + 1, end, sent + len(batch))

    # -- frames received ------------------------------------------------------------------------

    def _on_publish(self, peer: Peer, body: Any, size: int) -> None:
        seq, batch, mark = body
        if not delivery.first_receipt(peer, seq, mark):
            return  # sent again to a new incarnation of ours, or twice: we have it
        router = self.router
        stats = router.stats
        stats.mesh_frames_in += 1
        stats.mesh_msgs_in += len(batch)
        stats.mesh_bytes_in += size
        peer.stats[2] += len(batch)
        peer.stats[3] += size
        bad = router.deliver_forwarded(batch, peer.router_id)
        if bad:
            log.error("mesh: dropped %d malformed message(s) from %s", bad, peer.router_id)
        if router.commit_log is not None:
            delivery.logged(peer, seq, router.commit_log.next_offset - 1)

    def _on_retained(self, peer: Peer, body: Any, size: int) -> None:
        for t in body:
            self.router.peer_retained(Message.from_list(t))

    def _on_sync_req(self, peer: Peer, body: Any, size: int) -> None:
        snapshot = self.router.retained_snapshot()
        for i in range(0, len(snapshot), 1000):
            self._send(peer, RETAINED, [m.to_list() for m in snapshot[i:i + 1000]])

    def _on_catchup(self, peer: Peer, body: Any, size: int) -> None:
        self._start_replay(peer, body, "it restarted and asks for what it may have missed")
        self._groups_back(peer, body)

    # -- the shared groups' part of a catch-up (this router restarted) ----------------------------

    def _groups_back(self, peer: Peer, offset: int) -> None:
        """A restarted router's catch-up reads its log back by the asker's plain interest; the
        group copies it had chosen for the asker died in its ring or backlog (partition seed 505:
        43 lost when a one-way cut kept them there and the node was SIGKILLed). So a router of a
        group asking from ``offset`` has this router's own QoS 1/2 messages from there go to the
        groups again (``Router.to_groups``), up to the log's end at the first catch-up (later
        ones went to the groups live); a lower offset asked later extends the range downwards.
        At least once: a group may get again what reached it before the crash."""
        router = self.router
        commit_log = router.commit_log
        if commit_log is None or not router.has_shared or not in_a_group(router, peer.router_id):
            return
        low = self._groups_low
        if low is not None and offset >= low:
            return
        end = commit_log.next_offset if low is None else low
        self._groups_low = offset
        self._groups_step(max(offset, commit_log.start_offset), end, 0)

    def _groups_step(self, offset: int, end: int, sent: int) -> None:
        """One step of ``_groups_back`` (256 records per loop iteration)."""
        commit_log = self.router.commit_log
        assert commit_log is not None  # (``_groups_back`` starts only with a log, which stays)
        records = [r for r in commit_log.read(offset, max_records=256) if r.offset < end]
        if not records:
            if sent:
                log.info("mesh: %d message(s) of this router's log read back to the shared groups (a router "
                         "of theirs asked for what it may have missed)", sent)
            return
        me = self.router_id
        for rec in records:
            if rec.qos > 0 and (not rec.origin_router or rec.origin_router == me):
                msg = Message.from_record(rec)
                msg.origin_router, msg.origin_offset = me, rec.offset
                if self.router.to_groups(msg):
                    sent += 1
        self.loop.call_soon(self._groups_step, records[-1].offset + 1, end, sent)
