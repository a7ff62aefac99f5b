"""Where ``router.auth`` meets a client connection: CONNECT's authentication (maybe waiting for
a plugin), PUBLISH and SUBSCRIBE refusals, installing and reloading a router's ``auth.Auth``.

Each check returns a decision (``Access``: allowed, refused with a reason and why, or pending
on a plugin's answer); ``router.client.Client`` acts on it (refuses, holds what the client
sends while a plugin is asked, goes on). The rules are ``router.auth``'s; nothing here writes
to a client.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from brokerd.connection.codec import encode
from brokerd.connection.packets import MQTT_5, Connect, Puback, Publish, Pubrec
from brokerd.connection.ratelimit import REFUSED_FILTERS
from brokerd.connection.reasons import Reason

from .auth import Auth
from .shared import parse_share

if TYPE_CHECKING:
    from brokerd.connection.protocol import Connection

    from .ports import ClientHandle
    from .router import Router
    from .session import Session

log = logging.getLogger(__name__)

AUTHENTICATING = "authenticating"  # the pause_reading cause while a plugin is asked


@dataclass(frozen=True, slots=True)
class Access:
    """A decision on a CONNECT. ``refused``: the CONNACK's reason (``why`` for the log, never a
    password); ``pending``: a plugin's answer to wait for (``plugin_reason``, then ``decided``); ``anonymous``: allowed, with the user name dropped (nothing verifies it)."""

    refused: Reason | None = None
    why: str = ""
    pending: Awaitable[Reason | None] | None = None
    anonymous: bool = False


ALLOWED = Access()
ANONYMOUS = Access(anonymous=True)


def install_auth(router: Router, auth: Auth | None) -> None:
    """Make ``auth`` the router's (at start, and on reload: connected clients stay, unless their
    user left the password file, and then their wills and that user's delayed wills go too; the
    new rules apply to what they do and get from now on: routes are folded again, and what
    sessions hold is checked as it goes out)."""
    before = router.auth.passwords if router.auth is not None else None
    router.auth = auth if auth is not None and (auth.authenticates or auth.authorizes) else None
    acl = auth if auth is not None and auth.authorizes else None
    if router.acl is not acl:
        router.acl = acl
        for session in router.sessions.values():
            session.acl = acl
        router._routes.clear()  # folded with the old rules
    if auth is not None and auth.passwords is not None and auth.plugin is None:
        for client in list(router.clients.values()):
            user = removed_user(client, auth.passwords)
            if user is not None:
                log.warning("client %s disconnected: user %r is no longer in the password file", client.client_id,
                            user)
                client.identity_revoked()
        if before is not None:
            drop_removed_users_wills(router, before, auth.passwords)


def drop_removed_users_wills(router: Router, before: dict[str, str], now: dict[str, str]) -> None:
    """The delayed wills waiting with offline sessions of users this reload removed: dropped, as
    a connected client's (``identity_revoked``): each would be a publish as that user, later.
    Only a user that was in the previous file counts as removed: an offline session does not say
    which listener it came from, and a certificate's identity is never in the file.

    The snapshot is written again at once, not within the second: it is what tells the log's
    followers (cluster.replication sends them each session's state as the snapshot holds it), and
    a follower whose copy still had the will would publish it if this node died meanwhile."""
    dropped = False
    for session in router.sessions.values():
        user = session.username
        if session.will is not None and session.conn is None and user in before and user not in now:
            log.warning("delayed will of %s dropped: user %r is no longer in the password file", session.client_id,
                        user)
            router.cancel_will(session.client_id)
            dropped = True
    if dropped and router.state is not None:
        router.state.mark(soon=True)
    if router.replication is not None:  # the wills held here with other routers' sessions
        for partition, cid in router.replication.drop_users_wills(before.keys() - now.keys()):
            log.warning("delayed will of %s (a session of %s held here) dropped: its user is no longer in the "
                        "password file", cid, partition)


def removed_user(client: ClientHandle, passwords: dict[str, str]) -> str | None:
    """A connected client's user when it is no longer in the password file: the client is
    disconnected, as Mosquitto does on a reload (the identity it proved is gone). None for one
    whose user is there, one whose certificate is its login, and one closing already."""
    session = client.session
    if session is None:  # its CONNECT still waits for the other routers' answer: it proved this identity
        user = client.username
    else:
        user = session.username if session.conn is client.conn else None
    listener = getattr(client.conn, "listener", None)
    if user is None or user in passwords or client.conn.closing or (
            listener is not None and listener.use_identity_as_username):
        return None
    return user


def anonymous_check(auth: Auth | None, conn: Connection, connect: Connect) -> Access:
    """The listener's rules, before any password is checked.

    On a ``use_identity_as_username`` listener the user name is the certificate's (set by the
    connection); a certificate without CN or SAN is refused, never replaced by the CONNECT's user
    name (Mosquitto). Elsewhere, where no password file or plugin can verify a user name, the name is
    only a claim: the client is anonymous (no ACL section or ``%u`` pattern of that name applies to
    it: ``ANONYMOUS``). A client that is anonymous is refused, not authorized, on a listener that
    does not allow anonymous clients (one on a non-loopback address, unless the operator allowed
    them: Mosquitto 2's secure default). The password file or plugin may refuse it too."""
    listener = getattr(conn, "listener", None)
    if listener is not None and listener.use_identity_as_username:
        if getattr(conn, "tls_identity", None) is not None:
            return ALLOWED
        return Access(Reason.NOT_AUTHORIZED, f"its certificate has no CN and no subject alternative name, "
                      f"and {listener.url} takes the user name from it")
    allowed = listener is None or bool(listener.allow_anonymous)
    if connect.username is not None and (auth is None or not auth.checks_passwords):
        if allowed and (auth is None or auth.allow_anonymous):
            log.debug("client %r: user name %r ignored (no password file or auth plugin verifies it): "
                      "anonymous", connect.client_id, connect.username)
            return ANONYMOUS
        where = listener.url if listener is not None else "this listener"
        return Access(Reason.NOT_AUTHORIZED, f"anonymous clients not allowed on {where}, and no password "
                      "file or auth plugin checks user names: every client is refused")
    if connect.username is not None or allowed:
        return ALLOWED
    # (mypy: a listener was given (no listener returned above))
    return Access(Reason.NOT_AUTHORIZED, f"anonymous clients not allowed on {listener.url} "  # type: ignore[union-attr]
                  "(--allow-anonymous on, or allow_anonymous = true for the listener, to allow them)")


def authenticate(auth: Auth, acl: Auth | None, conn: Connection, connect: Connect) -> Access:
    """CONNECT with ``router.auth`` set: the password file's answer, or a plugin's to wait for."""
    listener = getattr(conn, "listener", None)
    answer = auth.authenticate(connect.client_id, connect.username, connect.password, conn.peer,
                               anonymous=listener is None or bool(listener.allow_anonymous),
                               certified=listener is not None and bool(listener.use_identity_as_username))
    if answer is None or isinstance(answer, Reason):
        return decided(acl, connect, answer)
    return Access(pending=answer)


async def plugin_reason(connect: Connect, pending: Awaitable[Reason | None]) -> Reason | None:
    """A plugin's answer (``decided`` makes it a decision, with the ACL as it is then); a broken
    plugin refuses, it does not crash the router."""
    try:
        return await pending
    except Exception as exc:  # noqa: BLE001
        log.error("auth plugin failed for client %r: %s", connect.client_id, exc)
        return Reason.NOT_AUTHORIZED


def decided(acl: Auth | None, connect: Connect, reason: Reason | None) -> Access:
    """An authentication's answer as a decision: refused with a reason that never names the
    password; allowed only if the will, if any, is on a topic its user may write to."""
    user = connect.username
    if reason is None and connect.will is not None and acl is not None and not acl.may_publish(
            user, connect.client_id, connect.will.topic):
        return Access(Reason.NOT_AUTHORIZED, f"will topic {connect.will.topic!r} not writable by user {user!r}")
    if reason is None:
        return ALLOWED
    return Access(reason, "anonymous clients not allowed" if user is None else
                  f"bad user name or password (user {user!r})" if reason == Reason.BAD_USER_NAME_OR_PASSWORD
                  else f"user {user!r} not authorized")


def publish_refusal(client_id: str, level: int, p: Publish) -> bytes | None:
    """What answers a PUBLISH the client may not make (ACL, ``$SYS/``): MQTT 5 gets 0x87 for QoS
    1/2; MQTT 3.1.1 has no way to say it, so the message is dropped and acknowledged, as
    Mosquitto does. None for QoS 0: nothing."""
    log.debug("client %s: publish to %r denied", client_id, p.topic)
    if p.qos == 0:
        return None
    ack = Puback if p.qos == 1 else Pubrec
    # (mypy: a QoS 1/2 PUBLISH has a packet id)
    return encode(ack(p.packet_id, Reason.NOT_AUTHORIZED if level >= MQTT_5 else 0), level)  # type: ignore[arg-type]


def may_subscribe(session: Session, topic_filter: str, shared: bool) -> bool:
    """Whether the session's identity may subscribe to ``topic_filter`` (``$share/G/F`` is
    checked as F); a refusal is logged (rate-limited), the caller counts it."""
    f = topic_filter
    if shared:
        parsed = parse_share(f)
        f = parsed[1] if parsed is not None else f
    if session.acl.may_subscribe(session.username, session.client_id, f, shared):  # type: ignore[union-attr]  # the caller tests acl
        return True
    REFUSED_FILTERS.log(log, "client %s: subscription to %r not authorized", session.client_id, topic_filter[:200])
    return False
