"""One router per worker: sessions, the subscription index, retained messages, delivery.

The router is the single owner of the state of the connections it holds; other routers reach it
only through the ``MeshPort`` it is given (``cluster/mesh`` implements it with ZeroMQ; a router with
no peers gets none). It knows nothing of sockets or ZeroMQ: it hands outbound frames to the port
and is called back for inbound ones (``deliver_remote``, ``peer_interest`` ...).

Routing is by interest: the router counts its local subscribers per filter, announces a filter to
its peers when the first one arrives and withdraws it when the last one leaves; it keeps the peers'
filters in a second ``TopicIndex`` and forwards a publish to a peer only when one of the peer's
filters matches, once per peer however many subscribers it has there.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from connection.packets import Subscription

from .log.errors import LogUnavailable
from .message import Message
from .retained import RetainedStore
from .session import Session, SessionLimits
from .stats import RouterStats
from .topics import TopicIndex

if TYPE_CHECKING:
    from .client import Client

log = logging.getLogger(__name__)


class MeshPort(Protocol):
    """What a router needs from the cluster: implemented by ``cluster.mesh.Mesh``."""

    def forward(self, router_id: str, msg: Message, source: Any = None) -> None:
        """Queue ``msg`` for one peer router (batched per loop iteration). ``source`` is the client
        connection it came from: the mesh pauses reading from it while that peer is backed up."""

    def announce_interest(self, topic_filter: str, add: bool) -> Awaitable[None] | None:
        """Tell every peer router that this router gained / lost its interest in a filter; for a
        gain, an awaitable that completes when every live peer has acknowledged it."""

    def retained_update(self, msg: Message) -> None:
        """Tell every peer router about a retained message (an empty payload clears it)."""

    def takeover(self, client_id: str) -> Awaitable[dict | None]:
        """Ask every peer to give up ``client_id``: its session state, or None if nobody had it."""


@dataclass(slots=True)
class RouterConfig:
    router_id: str = "r0"
    node_id: str = "local"
    max_connections: int = 100_000
    max_packet_size: int = 1 << 20
    session: SessionLimits = field(default_factory=SessionLimits)


class Router:
    def __init__(self, config: RouterConfig, mesh: MeshPort | None = None) -> None:
        self.config = config
        self.router_id = config.router_id
        self.mesh = mesh
        self.stats = RouterStats()
        self.sessions: dict[str, Session] = {}
        self.clients: dict[str, Client] = {}  # client id → the live connection's handler
        self.subs: TopicIndex[Session, Subscription] = TopicIndex()
        self.local_filters: dict[str, int] = {}  # filter → number of local sessions subscribed
        self.interest_pending: dict[str, Awaitable[None]] = {}  # announced, not yet acknowledged
        self.interest: TopicIndex[str, None] = TopicIndex()  # peers' filters → router ids
        self.retained = RetainedStore()
        # Folded routes per topic: [(session, qos cap, no_local, retain_as_published)] and the peer
        # routers to forward to. Cleared on any subscription / interest change.
        self._routes: dict[str, list[tuple[Session, int, bool, bool]]] = {}
        self._peer_routes: dict[str, tuple[str, ...]] = {}
        self._expiry: dict[str, asyncio.TimerHandle] = {}
        self.commit_log: Any = None  # router.log.CommitLog when the log is on (attach_log)
        self.ack_when_durable = False
        self.state: Any = None  # router.persistence.StateStore when the log is on
        self._deferred_acks: deque[tuple[int, Any, bytes]] = deque()

    # -- publishing ---------------------------------------------------------------------------------

    def publish(self, msg: Message, source: Any = None) -> None:
        """A message published by a client of this router (or a will): log, retain, deliver, forward.

        Raises ``LogUnavailable`` for a QoS 1/2 message the log cannot take (full or unwritable
        disk): the caller refuses it instead of acknowledging it. QoS 0 still flows, unlogged.
        """
        if self.commit_log is not None and not msg.topic.startswith("$SYS/"):  # metrics stay out
            try:
                msg.origin_offset = self._log(msg, False)
            except LogUnavailable:
                self.stats.refused_log_unavailable += 1
                if msg.qos:
                    raise
        self.stats.msgs_in += 1
        if msg.retain:
            self.retained.set(msg)
            self.stats.retained_count = len(self.retained)
            if self.mesh is not None:
                self.mesh.retained_update(msg)
        self._deliver_local(msg)
        if self.mesh is not None:
            peers = self._peer_routes.get(msg.topic)
            if peers is None:
                peers = self._fold_peers(msg.topic)
            if peers:
                mesh = self.mesh
                for router_id in peers:
                    mesh.forward(router_id, msg, source)

    def deliver_remote(self, msg: Message) -> None:
        """A message another router forwarded here because this router announced interest.

        Logged here too (with its origin), so that this router's sessions can catch up from their
        own log and readers can count each message once by its origin."""
        if self.commit_log is not None and not msg.topic.startswith("$SYS/"):
            try:
                self._log(msg, True)
            except LogUnavailable:
                self.stats.refused_log_unavailable += 1
        self._deliver_local(msg)

    def _log(self, msg: Message, forwarded: bool) -> int:
        """Append ``msg`` to this router's log; a forwarded copy keeps its origin. Returns and
        records the offset; raises ``LogUnavailable`` when the log cannot take it.

        Once per message on the loop, so it calls the positional ``append_fields`` with the
        message's own values (``str`` topic and client id: no encode here, the log's batch encoder
        does it in C), which keeps them as they are until the batch is encoded at flush."""
        msg.log_offset = offset = self.commit_log.append_fields(
            msg.timestamp_ms, msg.origin_router if forwarded else None,
            msg.origin_offset if forwarded else None, msg.client_id, msg.topic, msg.qos, msg.retain,
            msg.packed_properties() if msg.properties else b"", msg.payload)
        return offset

    # -- acknowledgements that wait for the disk (--fsync always) ------------------------------------

    def attach_log(self, log_: Any, ack_when_durable: bool) -> None:
        self.commit_log = log_
        self.ack_when_durable = ack_when_durable
        if ack_when_durable:
            log_.on_durable(self._durable)
            log_.on_error(self._log_failed)

    def defer_ack(self, offset: int, conn: Any, ack: bytes) -> None:
        """Send ``ack`` once the record at ``offset`` is durable."""
        if offset <= self.commit_log.durable_offset:
            conn.send(ack)
        else:
            self._deferred_acks.append((offset, conn, ack))

    def _log_failed(self, error: OSError | None) -> None:
        """Records waiting to become durable never will: refuse them by closing their connections
        (the clients resend after reconnecting); never acknowledge them."""
        if error is None:
            return
        acks, self._deferred_acks = self._deferred_acks, deque()
        for conn in {id(c): c for _, c, _ in acks}.values():
            log.warning("client %s (%s): closing, %d publish(es) could not be made durable: %s",
                        conn.client_id, conn.peer, sum(1 for _, c, _ in acks if c is conn), error)
            conn.close(0x83)  # MQTT 5: implementation specific error

    def _durable(self, durable: int) -> None:
        acks = self._deferred_acks
        while acks and acks[0][0] <= durable:
            _, conn, ack = acks.popleft()
            if not conn.closing:
                conn.send(ack)

    def _deliver_local(self, msg: Message) -> None:
        routes = self._routes.get(msg.topic)
        if routes is None:
            routes = self._fold_routes(msg.topic)
        if not routes:
            return
        qos = msg.qos
        retain = msg.retain
        publisher = msg.client_id
        for session, cap, no_local, rap in routes:
            if no_local and session.client_id == publisher:
                continue
            session.deliver(msg, qos if qos < cap else cap, retain and rap)

    def _fold_routes(self, topic: str) -> list[tuple[Session, int, bool, bool]]:
        """Overlapping subscriptions of one client: deliver once, at the highest granted QoS."""
        folded: dict[Session, tuple[Session, int, bool, bool]] = {}
        for session, sub in self.subs.match(topic):
            prev = folded.get(session)
            if prev is None:
                folded[session] = (session, sub.qos, sub.no_local, sub.retain_as_published)
            else:
                folded[session] = (session, max(prev[1], sub.qos), prev[2] and sub.no_local,
                                   prev[3] or sub.retain_as_published)
        routes = list(folded.values())
        if len(self._routes) > 65536:
            self._routes.clear()
        self._routes[topic] = routes
        return routes

    def _fold_peers(self, topic: str) -> tuple[str, ...]:
        peers = tuple(dict.fromkeys(router_id for router_id, _ in self.interest.match(topic)))
        if len(self._peer_routes) > 65536:
            self._peer_routes.clear()
        self._peer_routes[topic] = peers
        return peers

    # -- subscriptions --------------------------------------------------------------------------------

    def subscribe(self, session: Session, sub: Subscription) -> bool:
        """Index one subscription; True if it is new for this session (not a replacement)."""
        new = sub.topic_filter not in session.subscriptions
        session.subscriptions[sub.topic_filter] = sub
        if session.persistent and self.state is not None:
            self.state.mark(soon=True)
        self.subs.add(sub.topic_filter, session, sub)
        self._routes.clear()
        if new:
            self._ref_filter(sub.topic_filter, +1)
        return new

    def unsubscribe(self, session: Session, topic_filter: str) -> bool:
        if session.subscriptions.pop(topic_filter, None) is None:
            return False
        if session.persistent and self.state is not None:
            self.state.mark(soon=True)
        self.subs.remove(topic_filter, session)
        self._routes.clear()
        self._ref_filter(topic_filter, -1)
        return True

    def _ref_filter(self, topic_filter: str, delta: int) -> None:
        count = self.local_filters.get(topic_filter, 0) + delta
        if count > 0:
            self.local_filters[topic_filter] = count
            if count == 1 and delta > 0 and self.mesh is not None:
                ack = self.mesh.announce_interest(topic_filter, True)
                if ack is not None:
                    self.interest_pending[topic_filter] = ack
                    ack.add_done_callback(lambda _f, f=topic_filter: self.interest_pending.pop(f, None))  # type: ignore[attr-defined]
        else:
            self.local_filters.pop(topic_filter, None)
            if self.mesh is not None:
                self.mesh.announce_interest(topic_filter, False)

    # -- sessions -------------------------------------------------------------------------------------

    def new_session(self, client_id: str, persistent: bool) -> Session:
        session = Session(client_id, persistent, self.config.session, self.stats)
        session.log = self.commit_log
        self.sessions[client_id] = session
        return session

    def drop_session(self, session: Session) -> None:
        """Forget a session and everything it subscribed to."""
        for topic_filter in list(session.subscriptions):
            self.unsubscribe(session, topic_filter)
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
        timer = self._expiry.pop(session.client_id, None)
        if timer is not None:
            timer.cancel()

    def schedule_expiry(self, session: Session) -> None:
        """MQTT 5 session expiry: a finite interval removes the offline session when it runs out."""
        if 0 < session.expiry_s < 0xFFFFFFFF:
            loop = asyncio.get_event_loop()
            self._expiry[session.client_id] = loop.call_later(session.expiry_s, self._expire, session)

    def cancel_expiry(self, client_id: str) -> None:
        timer = self._expiry.pop(client_id, None)
        if timer is not None:
            timer.cancel()

    def _expire(self, session: Session) -> None:
        self._expiry.pop(session.client_id, None)
        if session.conn is None and self.sessions.get(session.client_id) is session:
            log.info("session %s expired", session.client_id)
            self.drop_session(session)

    def import_session(self, client_id: str, state: dict) -> Session:
        """A session handed over by another router (takeover) becomes ours."""
        session = self.new_session(client_id, state["persistent"])
        session.import_state(state)
        for topic_filter, qos, no_local, rap, rh in state["subs"]:
            self.subscribe(session, Subscription(topic_filter, qos, no_local, rap, rh))
        return session

    def release_session(self, client_id: str) -> dict | None:
        """Another router takes ``client_id`` over: close our connection, export, forget."""
        client = self.clients.get(client_id)
        if client is not None:
            client.taken_over()
        session = self.sessions.get(client_id)
        if session is None:
            return None
        state = session.export_state()
        session.detach()
        self.drop_session(session)
        self.stats.takeovers += 1
        return state

    # -- the other routers ----------------------------------------------------------------------------

    def peer_interest(self, router_id: str, topic_filter: str, add: bool) -> None:
        if add:
            self.interest.add(topic_filter, router_id, None)
        else:
            self.interest.remove(topic_filter, router_id)
        self._peer_routes.clear()

    def peer_left(self, router_id: str) -> None:
        """A peer router is gone: forget its interest (it re-announces when it returns)."""
        for topic_filter, rid, _ in list(self.interest.items()):
            if rid == router_id:
                self.interest.remove(topic_filter, rid)
        self._peer_routes.clear()

    def peer_retained(self, msg: Message) -> None:
        """A retained update from another router; the newer of two versions of a topic wins."""
        current = self.retained.get(msg.topic)
        if current is not None and current.timestamp_ms > msg.timestamp_ms:
            return
        self.retained.set(msg)
        self.stats.retained_count = len(self.retained)

    def retained_snapshot(self) -> list[Message]:
        return list(self.retained)
