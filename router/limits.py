"""Limits one client cannot get around (docs/limits.md): the router's side.

Each is an option; what it takes is decided here and counted in ``RouterStats.limit_<name>``. The
hot path pays only where a limit is on and hit: a length check per CONNECT or SUBSCRIBE filter, a
size check per retained message, a ``len`` per received QoS 2 message. Stale QoS 2 packet ids are
swept by one timer per router (two generations), not one timer per message.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from brokerd.connection.packets import Prop
from brokerd.connection.reasons import Reason

from .auth import is_sys
from .clock import LOOP_CLOCK, Clock, Timer
from .retained import SYS_PREFIX, held_bytes

if TYPE_CHECKING:
    from brokerd.connection.listener import Listener
    from brokerd.connection.packets import Connect
    from brokerd.connection.protocol import Connection

    from .client import Client
    from .message import Message
    from .retained import RetainedStore
    from .router import Router
    from .session import Session
    from .stats import RouterStats


@dataclass(frozen=True)
class ClientLimits:
    max_client_id_length: int = 256
    max_subscriptions: int = 1000
    # Every worker holds every retained message: 200,000 short ones (~1.1 KiB each, as held) fit
    # the 256 MiB that leave most of a 1 GiB worker to its connections (docs/tuning.md).
    max_retained: int = 200_000
    max_retained_bytes: int = 256 << 20
    max_qos2_pending: int = 1024
    qos2_timeout: float = 300.0
    max_keepalive: int = 65535
    max_session_expiry: float = 604800.0
    max_topic_alias: int = 10
    # Aliases the broker gives a client's topics (--topic-alias-out on): each holds its topic for
    # the connection's life, so a client's Topic Alias Maximum (up to 65535) is cut to this.
    max_topic_alias_out: int = 10

    @classmethod
    def from_config(cls, config: Any) -> ClientLimits:
        return cls(**{name: getattr(config, name) for name in cls.__dataclass_fields__})


def retained_size(msg: Message) -> int:
    """What a retained message counts against --max-retained-bytes: the memory it holds in a router
    (``retained.held_bytes``: topic, payload, properties, their encodings, its share of the trie),
    not just its topic and payload, which undercounted 40 to 74 times (docs/tuning.md)."""
    return held_bytes(msg)


def may_retain(store: RetainedStore, msg: Message, limits: ClientLimits, stats: RouterStats) -> bool:
    """Whether ``msg`` may be retained: clearing (an empty payload) always may; a new topic needs room
    in --max-retained, and the store's bytes after it (the old version replaced) must stay within
    --max-retained-bytes. Refused: the message is still delivered, only not retained (counted).
    The limits are the clients' quota: the broker's own ``$SYS/`` topics (a small set it bounds
    itself) neither count against it nor are refused by it, so a full store keeps ``$SYS`` readable
    and ``$SYS`` does not take a client's room (it did, in the first seconds after a start)."""
    if not msg.payload or msg.topic.startswith(SYS_PREFIX):
        return True
    current = store.get(msg.topic)
    if current is None and store.count - store.sys_count >= limits.max_retained:
        stats.limit_retained += 1
        return False
    grow = retained_size(msg) - (retained_size(current) if current is not None else 0)
    if grow > 0 and store.bytes - store.sys_bytes + grow > limits.max_retained_bytes:
        stats.limit_retained += 1
        return False
    return True


def session_expiry(level: int, persistent: bool, asked: int, limits: ClientLimits) -> int:
    """The session expiry interval a CONNECT gets: MQTT 5's cut to --max-session-expiry, and a
    persistent MQTT 3.1.1 session (which would never expire) given it."""
    cap = int(limits.max_session_expiry)
    if level >= 5:
        return min(asked, cap)
    return cap if persistent else 0


class Qos2Sweeper:
    """Forgets received QoS 2 packet ids whose PUBREL has not come within --qos2-timeout.

    A session is tracked when its first id arrives, or when it arrives with ids (a takeover, a
    restart: ``arrived``); every ``timeout`` seconds, the ids that were already there at the
    previous sweep are dropped (so an id goes after one to two timeouts from then). The timer
    runs only while some session is tracked."""

    def __init__(self, sessions: dict[str, Session], stats: RouterStats, timeout: float,
                 clock: Clock = LOOP_CLOCK) -> None:
        self.sessions = sessions
        self.clock = clock
        self.stats = stats
        self.timeout = timeout
        self.tracked: dict[str, tuple[Session, frozenset[int]]] = {}
        self._timer: Timer | None = None

    def track(self, session: Session) -> None:
        if session.client_id not in self.tracked:
            self.tracked[session.client_id] = (session, frozenset())
            if self._timer is None:
                self._timer = self.clock.call_later(self.timeout, self.sweep)

    def arrived(self, session: Session) -> None:
        """A session that came with ids (taken over from another router, restored from a
        snapshot): its ids are timed from here, as if they had just arrived. Its next ids find
        the set not empty and do not track it (``Client``), so it is tracked now or never."""
        if session.inbound_qos2:
            self.track(session)

    def sweep(self) -> None:
        self._timer = None
        for client_id, (session, seen) in list(self.tracked.items()):
            ids = session.inbound_qos2
            if self.sessions.get(client_id) is not session or not ids:
                del self.tracked[client_id]
                continue
            stale = seen & ids
            if stale:
                ids -= stale
                self.stats.limit_qos2_expired += len(stale)
                self.stats.state_moves += 1
            if ids:
                self.tracked[client_id] = (session, frozenset(ids))
            else:
                del self.tracked[client_id]
        if self.tracked:
            self._timer = self.clock.call_later(self.timeout, self.sweep)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def connect_refused(client: Client, connect: Connect, limits: ClientLimits, stats: RouterStats) -> bool:
    """Refuse a CONNECT over a limit (True when refused): a will on a ``$SYS/`` topic (CONNACK
    not authorized, as Mosquitto), an MQTT 3.1 client id outside 1-23
    characters (CONNACK 0x02), a client id longer than
    --max-client-id-length (CONNACK 0x02, MQTT 5: 0x85 client identifier not valid), or an MQTT
    3.1/3.1.1 keepalive above --max-keepalive, which that protocol cannot be told to lower
    (CONNACK 0x02 identifier rejected, as Mosquitto's max_keepalive does)."""
    client_id = connect.client_id
    if connect.protocol_level == 3 and not 0 < len(client_id) <= 23:
        # MQTT 3.1 (MQIsdp) allows 1-23 characters; Mosquitto holds 3.1 clients to it.
        client.client_id = client_id[:32]
        client.refuse(Reason.CLIENT_IDENTIFIER_NOT_VALID, f"MQTT 3.1 client id of {len(client_id)} "
                       "characters (3.1 allows 1-23)")
        return True
    if len(client_id) > limits.max_client_id_length:
        stats.limit_client_id += 1
        client.client_id = client_id[:32] + "..."
        client.refuse(Reason.CLIENT_IDENTIFIER_NOT_VALID, f"client id of {len(client_id)} characters, "
                       f"more than --max-client-id-length {limits.max_client_id_length}")
        return True
    if connect.will is not None and is_sys(connect.will.topic):
        # Clients never publish into $SYS/ (``auth.may_publish``), and a will is a publish made
        # later on the client's behalf: without an ACL nothing else would check its topic, and a
        # retained will there would forge the broker's own numbers for every monitoring client.
        stats.acl_denied += 1
        client.client_id = client_id
        client.refuse(Reason.NOT_AUTHORIZED, f"will topic {connect.will.topic[:200]!r}: clients never "
                      "publish into $SYS/")
        return True
    if connect.protocol_level < 5 and connect.keepalive > limits.max_keepalive:
        stats.limit_keepalive += 1
        client.client_id = client_id
        client.refuse(Reason.CLIENT_IDENTIFIER_NOT_VALID, f"keepalive {connect.keepalive} s, more than "
                       f"--max-keepalive {limits.max_keepalive} (MQTT 3.1.1 has no Server Keep Alive)")
        return True
    return False


def server_keepalive(asked: int, limits: ClientLimits) -> int:
    """The keepalive enforced: the client's, or --max-keepalive when it asked for more or for 0."""
    return limits.max_keepalive if asked == 0 or asked > limits.max_keepalive else asked


def connack_limits(props: dict, keepalive: int, asked_expiry: int, expiry: int, limits: ClientLimits,
                   stats: RouterStats) -> None:
    """MQTT 5 CONNACK properties that tell the client a limit changed what it asked for."""
    if keepalive == 0 or keepalive > limits.max_keepalive:
        props[Prop.SERVER_KEEP_ALIVE] = limits.max_keepalive
        stats.limit_keepalive += 1
    if expiry != asked_expiry:
        props[Prop.SESSION_EXPIRY_INTERVAL] = expiry
        stats.limit_session_expiry += 1


# A client's filters hold at most --max-subscriptions times this many characters in all. A filter
# may have 65,535 bytes, and each is held by its session, its router's index and every other
# router's view of the interest: ten offline sessions of 112 filters of 60 KB grew a worker by
# 223 MB, and another by 63 MB. Only a filter longer than this counts its characters.
FILTER_CHARS_EACH = 256


def over_subscription_quota(session: Session, topic_filter: str, shared: bool, limits: ClientLimits,
                            stats: RouterStats) -> bool:
    """Whether a new filter would take ``session`` beyond --max-subscriptions, or its filters beyond
    ``FILTER_CHARS_EACH`` characters each on average (counted); replacing a filter it has is
    always allowed."""
    if topic_filter in (session.shared if shared else session.subscriptions):
        return False
    if len(session.subscriptions) + len(session.shared) < limits.max_subscriptions and (
            len(topic_filter) <= FILTER_CHARS_EACH
            or _filter_chars(session) + len(topic_filter) <= limits.max_subscriptions * FILTER_CHARS_EACH):
        return False
    stats.limit_subscriptions += 1
    return True


def _filter_chars(session: Session) -> int:
    """The characters of ``session``'s filters (a long filter's SUBSCRIBE only: at most
    --max-subscriptions of them)."""
    n = 0
    for f in session.subscriptions:
        n += len(f)
    for f in session.shared:
        n += len(f)
    return n


# -- a listener's max_connections ([[listener]] tables) ---------------------------------------------

def listener_share(max_connections: int, workers: int) -> int:
    """The sockets of one listener a router accepts: its share of the listener's max_connections
    (each worker binds every listener, the kernel spreads the clients), as with --max-connections."""
    return max(1, math.ceil(max_connections / workers))


def listener_opened(router: Router, conn: Connection) -> Listener | None:
    """Count a new socket against its listener's max_connections; returns the listener when it has
    one (the client gives it back to ``listener_closed``), else None: no cost without the limit."""
    listener: Listener | None = getattr(conn, "listener", None)
    if listener is None or not listener.max_connections:
        return None
    sockets = router.listener_sockets
    sockets[listener] = sockets.get(listener, 0) + 1
    return listener


def listener_closed(router: Router, listener: Listener) -> None:
    sockets = router.listener_sockets
    n = sockets.get(listener, 0) - 1
    if n > 0:
        sockets[listener] = n
    else:
        sockets.pop(listener, None)


def listener_refused(client: Client, listener: Listener) -> bool:
    """Refuse a CONNECT on a listener holding its share of max_connections (True when refused): its
    sockets, this one included, open or not yet CONNECTed, as --max-connections counts them. CONNACK
    0x03 server unavailable (MQTT 5: 0x89 server busy), counted in ``limit_listener_connections``
    and ``refused_connections``."""
    router = client.router
    share = listener_share(listener.max_connections, router.config.workers)  # type: ignore[arg-type]  # it has one (listener_opened)
    if router.listener_sockets.get(listener, 0) <= share:
        return False
    router.stats.limit_listener_connections += 1
    router.stats.refused_connections += 1
    client.refuse(Reason.SERVER_BUSY, f"listener {listener.url} at its max_connections "
                   f"({listener.max_connections}: {share} per worker)")
    return True
