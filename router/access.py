"""Where ``router.auth`` meets a client connection (``router.client.Client``): CONNECT's
authentication (maybe waiting for a plugin), PUBLISH and SUBSCRIBE refusals, installing and
reloading a router's ``auth.Auth``. The decisions are ``router.auth``'s; the MQTT answers are here.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from brokerd.connection.codec import encode
from brokerd.connection.packets import MQTT_5, Connect, Puback, Publish, Pubrec
from brokerd.connection.ratelimit import REFUSED_FILTERS
from brokerd.connection.reasons import Reason

from .auth import Auth
from .shared import parse_share

if TYPE_CHECKING:
    from .client import Client
    from .router import Router

log = logging.getLogger(__name__)

AUTHENTICATING = "authenticating"  # the pause_reading cause while a plugin is asked


def install_auth(router: Router, auth: Auth | None) -> None:
    """Make ``auth`` the router's (at start, and on reload: connected clients stay, unless their
    user left the password file; the new rules apply to what they do and get from now on:
    routes are folded again, and what sessions hold is checked as it goes out)."""
    router.auth = auth if auth is not None and (auth.authenticates or auth.authorizes) else None
    acl = auth if auth is not None and auth.authorizes else None
    if router.acl is not acl:
        router.acl = acl
        for session in router.sessions.values():
            session.acl = acl
        router._routes.clear()  # folded with the old rules
    if auth is not None and auth.passwords is not None and auth.plugin is None:
        for client in list(router.clients.values()):
            _drop_if_removed(client, auth.passwords)  # type: ignore[arg-type]


def _drop_if_removed(client: Client, passwords: dict[str, str]) -> None:
    """A connected client whose user is no longer in the password file is disconnected, as
    Mosquitto does on a reload: the identity it proved is gone. Its will goes with it (nobody
    may publish as that user now); its session stays, for the user if it is added again."""
    session = client.session
    user = session.username if session is not None and session.conn is client.conn else None
    listener = getattr(client.conn, "listener", None)
    if user is None or user in passwords or client.conn.closing or (
            listener is not None and listener.use_identity_as_username):  # its certificate is its login
        return
    log.warning("client %s disconnected: user %r is no longer in the password file", client.client_id, user)
    client.will = None
    client.conn.close(Reason.NOT_AUTHORIZED)


def anonymous_refused(client: Client, connect: Connect) -> bool:
    """The listener's rules, before any password is checked: True when the client was refused.

    On a ``use_identity_as_username`` listener the user name is the certificate's (set by the
    connection); a certificate without CN or SAN is refused, never replaced by the CONNECT's user
    name (Mosquitto). Elsewhere, where no password file or plugin can verify a user name, the name is
    only a claim: the client is anonymous (no ACL section or ``%u`` pattern of that name applies to
    it). A client that is anonymous is refused, not authorized, on a listener that does not allow
    anonymous clients (one on a non-loopback address, unless the operator allowed them: Mosquitto 2's
    secure default). The password file or plugin may refuse it too."""
    listener = getattr(client.conn, "listener", None)
    if listener is not None and listener.use_identity_as_username:
        if getattr(client.conn, "tls_identity", None) is not None:
            return False
        return _refuse_early(client, connect, f"its certificate has no CN and no subject alternative name, "
                             f"and {listener.url} takes the user name from it")
    allowed = listener is None or bool(listener.allow_anonymous)
    auth = client.router.auth
    if connect.username is not None and (auth is None or not auth.checks_passwords):
        if allowed and (auth is None or auth.allow_anonymous):
            log.debug("client %r: user name %r ignored (no password file or auth plugin verifies it): "
                      "anonymous", connect.client_id, connect.username)
            connect.username = connect.password = None
            return False
        where = listener.url if listener is not None else "this listener"
        return _refuse_early(client, connect, f"anonymous clients not allowed on {where}, and no password "
                             "file or auth plugin checks user names: every client is refused")
    if connect.username is not None or allowed:
        return False
    return _refuse_early(client, connect, f"anonymous clients not allowed on {listener.url} "  # type: ignore[union-attr]
                         "(--allow-anonymous on, or allow_anonymous = true for the listener, to allow them)")


def _refuse_early(client: Client, connect: Connect, why: str) -> bool:
    client.level = connect.protocol_level
    client.client_id = connect.client_id
    client.router.stats.auth_failures += 1
    client._refuse(Reason.NOT_AUTHORIZED, why)
    return True


def start_connect(client: Client, connect: Connect) -> None:
    """CONNECT with ``router.auth`` set: authenticate, then go on as without it."""
    auth = client.router.auth
    client.level = connect.protocol_level
    client.client_id = connect.client_id
    listener = getattr(client.conn, "listener", None)
    answer = auth.authenticate(connect.client_id, connect.username, connect.password, client.conn.peer,
                               anonymous=listener is None or bool(listener.allow_anonymous),
                               certified=listener is not None and bool(listener.use_identity_as_username))
    if answer is None or isinstance(answer, Reason):
        _decided(client, connect, answer)
        return
    # A plugin is asked: hold what the client sends meanwhile, read no more until it answers.
    client._pending = []
    client.conn.pause_reading(AUTHENTICATING)
    asyncio.ensure_future(_wait(client, connect, answer))


async def _wait(client: Client, connect: Connect, answer: Any) -> None:
    try:
        reason = await answer
    except Exception as exc:  # noqa: BLE001 - a broken plugin refuses, it does not crash the router
        log.error("auth plugin failed for client %r: %s", connect.client_id, exc)
        reason = Reason.NOT_AUTHORIZED
    if client.conn.closing:
        return
    _decided(client, connect, reason)
    client.conn.resume_reading(AUTHENTICATING)


def _decided(client: Client, connect: Connect, reason: Reason | None) -> None:
    router = client.router
    user = connect.username
    if reason is None and connect.will is not None and router.acl is not None and not router.acl.may_publish(
            user, connect.client_id, connect.will.topic):
        reason = Reason.NOT_AUTHORIZED
        why = f"will topic {connect.will.topic!r} not writable by user {user!r}"
    elif reason is not None:
        why = ("anonymous clients not allowed" if user is None else
               f"bad user name or password (user {user!r})" if reason == Reason.BAD_USER_NAME_OR_PASSWORD
               else f"user {user!r} not authorized")
    if reason is not None:
        router.stats.auth_failures += 1
        client._pending = None
        client._refuse(reason, why)  # never the password
        return
    client._start_connect(connect)


def refuse_publish(client: Client, p: Publish) -> None:
    """A PUBLISH the client may not make (ACL, ``$SYS/``): MQTT 5 gets 0x87 for QoS 1/2; MQTT 3.1.1
    has no way to say it, so the message is dropped and acknowledged, as Mosquitto does."""
    client.router.stats.acl_denied += 1
    log.debug("client %s: publish to %r denied", client.client_id, p.topic)
    if p.qos == 0:
        return
    if client.level >= MQTT_5:
        ack = Puback if p.qos == 1 else Pubrec
        client.conn.send(encode(ack(p.packet_id, Reason.NOT_AUTHORIZED), client.level))  # type: ignore[arg-type]
        return
    ack = Puback if p.qos == 1 else Pubrec
    client.conn.send(encode(ack(p.packet_id, 0), client.level))  # type: ignore[arg-type]


def may_subscribe(client: Client, topic_filter: str, shared: bool) -> bool:
    """Whether the client may subscribe to ``topic_filter`` (``$share/G/F`` is checked as F)."""
    session = client.session
    assert session is not None
    f = topic_filter
    if shared:
        parsed = parse_share(f)
        f = parsed[1] if parsed is not None else f
    if session.acl.may_subscribe(session.username, session.client_id, f, shared):
        return True
    client.router.stats.acl_denied += 1
    REFUSED_FILTERS.log(log, "client %s: subscription to %r not authorized", client.client_id, topic_filter[:200])
    return False
