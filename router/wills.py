"""Wills: one published (its stamp and its expiry start then, its identity's write grant checked
then), and a delayed one waiting with its offline session (MQTT 5 Will Delay Interval, 3.1.3.2.2).

A part the session life owns (``SessionLife.wills``; the router answers its callers with it). A
delayed will goes out when its delay runs out or its session ends, whichever comes first, and
never if a connection resumes the session before, here or on another router by a takeover. Its
timer is the router's clock's: tests/unit/test_will_delay_clock.py drives it with a fake one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from .message import Message, expiry_deadline
from .ownership import name

if TYPE_CHECKING:
    from .clock import Clock, Timer
    from .session import Session
    from .stats import RouterStats
    from .wiring import Wiring

__all__ = ["Wills"]

log = logging.getLogger("brokerd.router.session_life")  # (where these lines were always logged)


class Wills:
    def __init__(self, sessions: dict[str, Session], stats: RouterStats, clock: Clock, wiring: Wiring,
                 publish: Callable[[Message], None]) -> None:
        self.sessions = sessions  # the router's (a will is cancelled by its client id)
        self.stats = stats
        self.clock = clock
        self.wiring = wiring  # its ACL: whether a will's identity may still publish there
        self.publish = publish
        self._timers: dict[str, Timer] = {}  # delayed wills of offline sessions

    def publish_will(self, will: Message, username: str | None) -> None:
        """Publish a will (counted); a QoS 1/2 will the commit log cannot take is lost, logged.
        It is published now, not when its CONNECT came: its timestamp, and with it the start of
        its Message Expiry Interval (MQTT 5 3.1.3.2.4), are now; so is the write grant of its
        client's identity (``username``), which a reload may have revoked since."""
        acl = self.wiring.acl
        if acl is not None and not acl.may_publish(username, will.client_id, will.topic):
            log.warning("will of %s on %r not published: user %s may no longer publish there", will.client_id,
                        will.topic, name(username))
            return
        will.timestamp_ms = now = int(self.clock.unix() * 1000)
        will.expires_ms = expiry_deadline(will.properties, now)
        self.stats.wills_published += 1
        try:
            self.publish(will)
        except Exception as exc:  # noqa: BLE001 - LogUnavailable: nobody waits for a will's ack
            log.warning("will of %s on %r not published: %s", will.client_id, will.topic, exc)

    def delay_will(self, session: Session, will: Message, delay: float) -> None:
        """The will waits with the offline session for ``delay`` seconds (or until it ends)."""
        self.cancel_will(session.client_id)
        session.will = will
        session.will_due_ms = int(self.clock.unix() * 1000 + delay * 1000)
        self._timers[session.client_id] = self.clock.call_later(delay, self._due, session)

    def rearm_will(self, session: Session, at_least: float = 0.0) -> None:
        """An offline session that came with a delayed will (a takeover that broke off, a
        session left here by a connection that went away while it moved, a restart): the will
        waits for the rest of its delay, and at least ``at_least`` seconds."""
        if session.will is not None:
            self.delay_will(session, session.will, max(at_least, session.will_due_ms / 1000 - self.clock.unix()))

    def wills_published_elsewhere(self, client_ids: list[str]) -> None:
        """The delayed wills of these sessions went out from a replica of this router while it
        was taken for dead (cluster.replication): not again from here."""
        for cid in client_ids:
            session = self.sessions.get(cid)
            if session is not None and session.will is not None:
                log.info("session %s: its delayed will was published on another node while this router "
                         "was taken for dead: not again here", cid)
                self.cancel_will(cid)

    def stop_timer(self, client_id: str) -> None:
        """The will stays with the session, without its timer (the session moves with it)."""
        timer = self._timers.pop(client_id, None)
        if timer is not None:
            timer.cancel()

    def cancel_will(self, client_id: str) -> None:
        self.stop_timer(client_id)
        session = self.sessions.get(client_id)
        if session is not None:
            session.will = None

    def _due(self, session: Session) -> None:
        self._timers.pop(session.client_id, None)
        will, session.will = session.will, None
        if will is not None and session.conn is None:
            self.publish_will(will, session.username)
