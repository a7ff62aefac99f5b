"""The wills of a silent router's sessions, held with its session replicas.

They go out from a holder of its sessions when they fall due (the holders stagger by
``WILL_STAGGER_S`` in router-id order; the first tells the others and, when it returns, the
router: SESSION_GONE's third list), unless the session is taken over first or the router is
heard again: the delayed will of an offline session at its time, and the will of a session
whose client was connected (the snapshot's ``live_will``) its Will Delay Interval after the
silence began, once a majority takes the router for gone.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from brokerd.router.message import Message

from .part import Part

if TYPE_CHECKING:
    from .majority import MajorityPart
    from .sessions import SessionsPart

log = logging.getLogger(__package__)  # (the package's name: the log lines name it as before)

WILL_STAGGER_S = 0.5  # between the holders of a silent router's sessions publishing its delayed wills


class WillsPart(Part):
    """Timers for the held wills of silent routers' sessions."""

    # The other parts it calls (set by ``Replication``).
    session_part: SessionsPart
    quorum: MajorityPart

    def __init__(self, shared: Part) -> None:
        super().__init__(shared)
        self.will_timers: dict[tuple[str, str], asyncio.TimerHandle] = {}  # (partition, client id)

    def arm_wills(self, partition: str) -> None:
        """``partition``'s router fell silent: each will of its sessions held here goes out when
        due (``_will_due``), this router's turn among the live holders of its replica later by
        ``WILL_STAGGER_S`` each: a delayed will of an offline session at its time, the will of a
        session whose client was connected (``live_will``) its Will Delay Interval after the
        silence began (that connection is lost with its node, or sent away from a minority)."""
        held = self.session_part.sessions.get(partition)
        if not held:
            return
        holders = sorted({self.partition, *(p.router_id for p in self.net.peers()
                                            if p.alive and partition in p.replicas)})
        stagger = holders.index(self.partition) * WILL_STAGGER_S
        now = self.wall()
        for cid, st in held.items():
            due = self.held_will_due(partition, st)
            if due is not None and (partition, cid) not in self.will_timers:
                delay = max(0.0, due - now) + stagger
                self.will_timers[(partition, cid)] = self.loop.call_later(delay, self._will_due, partition, cid)

    def held_will_due(self, partition: str, st: dict) -> float | None:
        """When the will held with session state ``st`` of silent ``partition`` falls due (Unix
        time; None: it has none): a delayed will at its time, a connected client's will its
        delay after the silence began."""
        if st.get("will"):
            return float(st["will"][1]) / 1000
        live = st.get("live_will")
        return self.session_part.silent_since_ms(partition) / 1000 + live[1] if live else None

    def drop_users_wills(self, users: set[str]) -> list[tuple[str, str]]:
        """The wills held here with other routers' sessions of ``users`` (a reload removed them
        from the password file): dropped, as the router's own are (``router.access``); each is a
        publish as that user, later. Returns the (partition, client id) of each."""
        dropped = []
        for partition, held in self.session_part.sessions.items():
            for cid, st in held.items():
                if st.get("username") in users and (st.get("will") or st.get("live_will")):
                    st["will"] = st["live_will"] = None
                    self.disarm_will(partition, cid)
                    self.session_part.replica_changed(partition)
                    dropped.append((partition, cid))
        return dropped

    def disarm_will(self, partition: str, cid: str) -> None:
        timer = self.will_timers.pop((partition, cid), None)
        if timer is not None:
            timer.cancel()

    def _will_due(self, partition: str, cid: str) -> None:
        """Publish the will of ``cid`` (of silent ``partition``) unless its router is back or
        the session was taken over; without a majority (the router may be alive on the other
        side of a partition), look again in a second."""
        self.will_timers.pop((partition, cid), None)
        st = self.session_part.sessions.get(partition, {}).get(cid)
        if st is None or not (st.get("will") or st.get("live_will")) or self.net.hears(partition):
            return
        if self.quorum.in_minority or cid in self.session_part.store.handing or not self.quorum.gone_for_majority(partition):
            # (a takeover may resume it; another node may still hear its router)
            self.will_timers[(partition, cid)] = self.loop.call_later(1.0, self._will_due, partition, cid)
            return
        self.publish_held_will(partition, cid, st)

    def publish_held_will(self, partition: str, cid: str, st: dict) -> None:
        """Publish the will held in ``st`` (session ``cid`` of silent ``partition``) from this
        router, once: the other holders and, when it returns, the router are told."""
        self.disarm_will(partition, cid)
        delayed = bool(st.get("will"))
        will = st.get("will") or st["live_will"]
        st["will"] = st["live_will"] = None
        self.session_part.replica_changed(partition)
        kind = "delayed will" if delayed else "will"
        try:
            msg = Message.from_list(will[0])
        except (TypeError, ValueError, IndexError) as exc:
            log.error("replication: the %s of session %s of %s cannot be read: %s", kind, cid, partition, exc)
            return
        self.router.publish_will(msg, st.get("username"))  # as its owner: a revoked grant stops it
        self.router.fenced_wills.setdefault(partition, set()).add(cid)
        if self.router.state is not None:
            self.router.state.mark(soon=True)
        notice = [partition, [], [cid]]
        for peer in self.net.peers():
            if peer.alive:
                self.net.send(peer, "gone", notice)
        log.info("replication: the %s of session %s of silent router %s published here%s", kind, cid, partition,
                 "" if delayed else " (its client was connected to it)")
