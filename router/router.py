"""One router per worker: sessions, the subscription index, retained messages, delivery.

The router is the single owner of the state of the connections it holds; other routers reach it
only through the ``MeshPort`` it is given (``router.ports``; ``cluster/mesh`` implements it with
ZeroMQ; a router with no peers has ``NULL_MESH``). It knows nothing of sockets or ZeroMQ: it hands outbound frames to the port
and is called back for inbound ones (``deliver_remote``, ``peer_interest`` ...).

Routing is by interest: the router counts its local subscribers per filter, announces a filter to
its peers when the first one arrives and withdraws it when the last one leaves; it keeps the peers'
filters in a second ``TopicIndex`` and forwards a publish to a peer only when one of the peer's
filters matches, once per peer however many subscribers it has there.

Shared subscriptions (``router.shared``) ride on the same interest announcements, keyed by the
``$share/group/filter`` string with a presence (connected members); the publisher's router picks one
router per group, weighted by presence, and tells that router, in the one copy it sends, which groups it was picked for.

Built from parts it owns (rumqttd's model), each a module: session life, expiry, wills and
takeover (``router.session_life``), shared-subscription routing (``router.shared_routing``), the
acknowledgements that wait (``router.acks``), retained messages (``router.retained``). Each part
is given what it uses; time comes from the injected ``Clock`` (``router.clock``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from brokerd.connection.codec import PUBLISH_QOS0
from brokerd.connection.packets import Subscription
from brokerd.connection.reasons import ProtocolError, Reason

from . import mesh_format
from .acks import AckWaits
from .clock import LOOP_CLOCK, Clock
from .limits import ClientLimits, Qos2Sweeper, may_retain
from .log.errors import LogUnavailable
from .mesh_format import FULL, PLAIN
from .message import Message
from .ports import NULL_MESH, TAKEOVER_FAILED, ClientHandle, MeshPort, ReplicationPort, Source
from .retained import SYS_PREFIX, RetainedStore
from .session import Session, SessionLimits
from .session_life import SessionLife
from .shared import is_shared
from .shared_routing import SharedRoutes
from .stats import RouterStats
from .topics import TopicIndex, remember
from .wiring import OwnersPort, Wiring

if TYPE_CHECKING:
    from brokerd.connection.batching import EndOfTick
    from brokerd.connection.listener import Listener

    from .auth import Auth
    from .log import CommitLog
    from .persistence import StateStore

__all__ = ["TAKEOVER_FAILED", "MeshPort", "Router", "RouterConfig"]

log = logging.getLogger(__name__)


# A folded route: (session, QoS cap, no_local, retain_as_published, the Subscription Identifiers
# of its matching subscriptions or None). A session with identifiers gets each message as a copy
# with them (``Message.with_ids``), which only MQTT 5 needs; the other routes cost nothing more.
# The identifiers in the tuple, not a wrapper in the session's place: the route's first element
# stays a Session, so the compiled router calls it natively.
Route = tuple["Session", int, bool, bool, "tuple[int, ...] | None"]


@dataclass(slots=True)
class RouterConfig:
    router_id: str = "r0"
    node_id: str = "local"
    max_connections: int = 100_000
    workers: int = 1  # routers of the node: a listener's max_connections is shared among them
    max_packet_size: int = 1 << 20
    session: SessionLimits = field(default_factory=SessionLimits)
    limits: ClientLimits = field(default_factory=ClientLimits)
    topic_alias_out: bool = False  # aliases for topics sent to MQTT 5 clients that allow them
    # How long a session taken over from another router is remembered (``moved_in``): a peer
    # silent longer (--mesh-forget) is forgotten, and its catch-up never asked.
    moved_in_keep_s: float = 300.0
    # What a CONNECT of another identity with a session's client id gets (``router.ownership``).
    session_owner: str = "refuse"
    # Whether anything verifies a user name (a password file, an auth plugin, a certificate
    # identity listener): where nothing does, every client is anonymous (``router.access``).
    verifies_identities: bool = False
    # Whether the node agrees on session owners (--agreement): then only the agreed records fence
    # a copy, also before the router has joined (a replica's "taken over elsewhere" is hearsay).
    agreed: bool = False


class Router:
    """The parts it owns, each given what it uses: ``life`` (sessions, expiry, wills, takeover),
    ``shared`` (shared subscriptions), ``acks`` (acknowledgements that wait), ``retained``;
    ``wiring`` holds what is attached after it is made. The methods other packages call on the
    router stay here, the parts' as attributes bound to the part's own (no second layer)."""

    def __init__(self, config: RouterConfig, mesh: MeshPort | None = None, clock: Clock = LOOP_CLOCK) -> None:
        self.config = config
        self.clock = clock  # every rule with a time in it asks this
        self.router_id = config.router_id
        self.mesh: MeshPort = mesh if mesh is not None else NULL_MESH
        self.wiring = Wiring(self.mesh)
        self.stats = RouterStats()
        self.clients: dict[str, ClientHandle] = {}  # client id → the live connection's handler
        # The worker's set of live connections (stats, a stop): each client's connection leaves it
        # as the client goes (``Client.connection_lost``). Not a subclass of Client in the worker:
        # compiled, Client is a native class, which Python code cannot subclass.
        self.live_connections: set[Any] = set()
        self.listener_sockets: dict[Listener, int] = {}  # listener with a max_connections → its open sockets here
        self.subs: TopicIndex[Session, Subscription] = TopicIndex()
        self.local_filters: dict[str, int] = {}  # filter → number of local sessions subscribed
        self.interest_pending: dict[str, Awaitable[None]] = {}  # announced, not yet acknowledged
        # Where each peer router took this router's filters in (its log end then): from there on,
        # its messages that any filter here matches come here directly. Kept by the mesh
        # (``cluster.mesh.announcements.Floors``); a session taken in has marks no lower.
        self.interest_taken: dict[str, int] = {}
        self.interest: TopicIndex[str, None] = TopicIndex()  # peers' filters → router ids
        self.retained = RetainedStore(self.stats, clock)
        # Folded routes per topic: [(session, qos cap, no_local, retain_as_published)] and the peer
        # routers to forward to. Cleared on any subscription / interest change.
        self._routes: dict[str, list[Route]] = {}
        self._peer_routes: dict[str, tuple[str, ...]] = {}
        self.shared = shared = SharedRoutes(self.router_id, self.stats, clock, self.wiring, self._peers,
                                            self._session_changed, self._interest_ack)
        self.life = life = SessionLife(config, self.stats, clock, self.wiring, self.clients, self, shared,
                                       self.publish)
        self.acks = acks = AckWaits()
        self.sessions = life.sessions
        self.moving, self.stale_moving, self.in_doubt, self.moved_in = (life.moving, life.stale_moving,
                                                                        life.in_doubt, life.moved_in)
        self.shared_local, self.shared_routes = shared.local, shared.routes
        self.qos2_sweeper = Qos2Sweeper(self.sessions, self.stats, config.limits.qos2_timeout, clock)
        self.commit_log: CommitLog | None = None  # when the log is on (attach_log)
        self.state: StateStore | None = None  # when the log is on (attach_state)
        # router.auth (set by install_auth): CONNECT's checks, None when nothing is configured;
        # ``acl`` (a property): the same object when topics are restricted, else None.
        self.auth: Auth | None = None
        # Sessions taken here from the replica of a router taken for dead ({router: client ids}):
        # that router drops its stale copies when it is heard again. In the snapshot: a restart
        # of this router in between must not forget them.
        self.fenced: dict[str, set[str]] = {}
        # Delayed wills of a silent router's sessions published here from its replica: that router
        # is told (with the fence) not to publish them again when it returns.
        self.fenced_wills: dict[str, set[str]] = {}
        # What cluster/, connection/ and the tests call on the router, answered by its parts.
        self.new_session, self.end_session, self.drop_session = life.new_session, life.end_session, life.drop_session
        self.yield_to_newer, self.release_session = life.yield_to_newer, life.release_session
        self.moved, self.moved_after_all, self.claim_refused = life.moved, life.moved_after_all, life.claim_refused
        self.schedule_expiry, self.cancel_expiry = life.schedule_expiry, life.cancel_expiry
        wills = life.wills
        self.publish_will, self.delay_will, self.rearm_will = wills.publish_will, wills.delay_will, wills.rearm_will
        self.cancel_will, self.wills_published_elsewhere = wills.cancel_will, wills.wills_published_elsewhere
        self.take_copies, self.hand_on = life.take_copies, life.hand_on
        self.drop_stale_sessions, self.fence_stale = life.drop_stale_sessions, life.fence_stale
        self.subscribe_shared, self.unsubscribe_shared = shared.subscribe, shared.unsubscribe
        self.shared_presence, self.to_groups = shared.presence, shared.to_groups
        self.defer_ack, self.release_acks, self.refuse_acks = acks.defer, acks.send_held, acks.refuse_held

    # -- what is set after the router is made, shared with its parts --------------------------------

    @property
    def owners(self) -> OwnersPort | None:
        """The agreed owners of its persistent sessions (cluster.agreement.owners.SessionOwners,
        with --agreement): a CONNECT resumes a session only once this router is its owner."""
        return self.wiring.owners

    @owners.setter
    def owners(self, owners: OwnersPort | None) -> None:
        self.wiring.owners = owners

    @property
    def acl(self) -> Auth | None:
        return self.wiring.acl

    @acl.setter
    def acl(self, acl: Auth | None) -> None:
        self.wiring.acl = acl

    @property
    def replication(self) -> ReplicationPort | None:
        """cluster.replication.Replication with --replication-factor > 1 (``AckWaits``)."""
        return self.acks.replication

    @replication.setter
    def replication(self, replication: ReplicationPort | None) -> None:
        self.acks.replication = replication

    @property
    def has_shared(self) -> bool:
        return self.shared.active

    # -- publishing ---------------------------------------------------------------------------------

    def publish(self, msg: Message, source: Source | None = None) -> None:
        """A message published by a client of this router (or a will): log, retain, deliver, forward.

        Raises ``LogUnavailable`` for a QoS 1/2 message the log cannot take (full or unwritable
        disk): the caller refuses it instead of acknowledging it. QoS 0 still flows, unlogged.
        """
        if self.commit_log is not None and not msg.topic.startswith(SYS_PREFIX):  # metrics stay out
            try:
                msg.origin_offset = self._log(msg, False)
            except LogUnavailable:
                self.stats.refused_log_unavailable += 1
                if msg.qos:
                    raise
        if msg.retain and may_retain(self.retained, msg, self.config.limits, self.stats):
            self.retained.stamp(msg)
            self.retained.set(msg, local=True)
            self.stats.retained_count = len(self.retained)
            self.mesh.retained_update(msg)
        topic = msg.topic
        routes = self._routes.get(topic)
        if routes is None:
            routes = self._fold_routes(topic)
        if routes:
            self._deliver(msg, routes)
        groups = self.shared
        if groups.active:
            shared = groups.cache.get(topic)
            if shared is None:
                shared = groups.fold(topic)
            if shared:
                groups.publish(msg, shared, source)
                return
        peers = self._peer_routes.get(topic)
        if peers is None:
            peers = self._fold_peers(topic)
        if peers:
            self.mesh.forward_to(peers, msg, source)

    def deliver_remote(self, msg: Message) -> None:
        """A message another router forwarded here because this router announced interest.

        Its origin's log has it. A copy goes into this router's log too (with its origin, so
        readers count each message once) only where something here may need it after this
        moment: a persistent session among its subscribers (it catches up from this log when it
        is offline, and after a crash), or a retained message (restored from the log at start).
        A clean session's copy would serve nothing: the session ends with its connection, a crash
        included."""
        topic = msg.topic
        routes = self._routes.get(topic)
        if routes is None:
            routes = self._fold_routes(topic)
        if self.commit_log is not None and (msg.retain or any(r[0].persistent for r in routes)) \
                and not topic.startswith(SYS_PREFIX):
            try:
                self._log(msg, True)
            except LogUnavailable:
                self.stats.refused_log_unavailable += 1
        if routes:
            self._deliver(msg, routes)

    def deliver_forwarded(self, body: list, sender: str) -> int:
        """The messages of one mesh frame from router ``sender``, in order, each as
        ``deliver_remote`` would. One loop per frame instead of two calls per message: a frame
        carries tens of messages and this is the receiving half of every cross-router delivery.
        Returns how many were malformed and dropped."""
        from_mesh = mesh_format.from_mesh
        routes_get = self._routes.get  # _fold_routes clears this dict in place, never replaces it
        logged = self.commit_log is not None
        bad = 0
        for values in body:
            try:
                n = len(values)
                if n == PLAIN and values[0].__class__ is bytes:
                    # A plain QoS 0 packet: its MQTT 3.1.1 subscribers get it as it came, and a
                    # Message is built only if an MQTT 5 one needs its own encoding, or the log
                    # a copy (a persistent session among its subscribers: ``deliver_remote``).
                    packet, topic = values[0], values[1]
                    if topic.__class__ is not str:
                        raise TypeError("forwarded topic is not a string")
                    if packet[0] != PUBLISH_QOS0:
                        raise ProtocolError("forwarded packet is not a QoS 0 PUBLISH", Reason.MALFORMED_PACKET)
                    msg = None  # delivered below, before ``groups`` is looked at
                    routes = routes_get(topic)
                    if routes is None:
                        routes = self._fold_routes(topic)
                    if logged and any(r[0].persistent for r in routes):
                        msg = from_mesh(values, sender)
                        groups = None
                elif n == PLAIN or n == FULL:
                    msg = from_mesh(values, sender)
                    groups = None
                else:  # it names the shared subscriptions this router was chosen for
                    msg, groups, only = mesh_format.from_mesh_shared(values, sender)
            except (ProtocolError, ValueError, TypeError, IndexError, KeyError):
                bad += 1
                continue
            if msg is None:  # ``routes`` were looked up with the packet above
                publisher = values[2]
                for session, _cap, no_local, _rap, ids in routes:  # type: ignore[union-attr]  # (set with msg None)
                    if no_local and session.client_id == publisher:
                        continue
                    if not session.deliver_packet(packet):  # False for MQTT 5: then ``deliver``
                        if msg is None:
                            msg = from_mesh(values, sender)
                        session.deliver(msg if ids is None else msg.with_ids(ids), 0, False)
                continue
            if groups is not None:
                self.deliver_remote_shared(msg, groups, only, sender)
                continue
            if logged:
                self.deliver_remote(msg)
                continue
            routes = routes_get(msg.topic)
            if routes is None:
                routes = self._fold_routes(msg.topic)
            if routes:
                self._deliver(msg, routes)
        return bad

    def deliver_remote_shared(self, msg: Message, groups: list[str], only: bool = False,
                              sender: str | None = None) -> None:
        """``deliver_remote`` for a message this router was also chosen for by the shared
        subscriptions ``groups`` (by router ``sender``, where it came in a frame): one local
        member of each gets it (``only``: nobody else)."""
        if not only:
            self.deliver_remote(msg)
        for key in groups:
            self.shared.deliver_remote(msg, key, only, sender)

    def _log(self, msg: Message, forwarded: bool) -> int:
        """Append ``msg`` to this router's log; a forwarded copy keeps its origin. Returns and
        records the offset; raises ``LogUnavailable`` when the log cannot take it.

        Once per message on the loop, so it calls the positional ``append_fields`` with the
        message's own values (``str`` topic and client id: no encode here, the log's batch encoder
        does it in C), which keeps them as they are until the batch is encoded at flush."""
        msg.log_offset = offset = self.commit_log.append_fields(  # type: ignore[union-attr]  # logged: attached
            msg.timestamp_ms, msg.origin_router if forwarded else None,
            msg.origin_offset if forwarded else None, msg.client_id, msg.topic, msg.qos, msg.retain,
            msg.packed_properties() if msg.properties else b"", msg.payload)
        return offset

    # -- acknowledgements that wait for the log (written; durable with --fsync always) ---------------

    def session_moves(self) -> tuple[int, ...]:
        """What changes sessions' state without marking anything at once: the log's end (where
        an idle session's position is, and what a session's backlog is refilled from),
        acknowledgements and catch-up reads (``RouterStats.state_moves``), expired messages, and
        the life of sessions and connections (a CONNECT sets a session's expiry, user name and
        will; a close delays its will; a will goes out; a session ends or expires). Equal twice:
        nothing of that kind happened in between (``StateStore.periodic``, the stats snapshot's
        count of queued and in-flight messages)."""
        st = self.stats
        return (self.commit_log.next_offset if self.commit_log is not None else 0,
                st.state_moves, st.drop_expired, st.connects_total, st.connections, st.takeovers,
                st.wills_published, len(self.sessions))

    def import_session(self, client_id: str, state: dict) -> Session:
        """A session handed over by another router (``SessionLife.import_session``); QoS 2 ids it
        brings whose PUBREL never comes are forgotten here (``Qos2Sweeper.arrived``)."""
        session = self.life.import_session(client_id, state)
        self.qos2_sweeper.arrived(session)
        return session

    def attach_mesh(self, mesh: MeshPort) -> None:
        """Join a cluster: the mesh is made after the router (it needs the router to call back)."""
        self.mesh = self.wiring.mesh = mesh

    @property
    def clustered(self) -> bool:
        """Whether other routers exist that may hold sessions or subscribers."""
        return self.mesh is not NULL_MESH

    def attach_state(self, state: StateStore) -> None:
        """Persistent sessions and retained messages survive restarts through ``state``."""
        self.state = self.wiring.state = state

    def attach_log(self, log_: CommitLog, ack_when_durable: bool, end_of_tick: EndOfTick | None = None) -> None:
        """Log what is published here; QoS 1/2 acknowledgements wait for their records
        (``AckWaits.attach``)."""
        self.commit_log = self.wiring.commit_log = log_
        self.acks.attach(log_, ack_when_durable, end_of_tick)

    def _deliver(self, msg: Message, routes: list[Route]) -> None:
        """Hand ``msg`` to this router's subscribers of its topic (``routes``, folded). The callers
        look the routes up themselves: a forwarding router mostly finds none, and the call is
        skipped."""
        if msg.expires_ms and msg.expired(self.clock.unix() * 1000):  # it waited (in a mesh backlog, say) too long
            self.stats.drop_expired += len(routes)
            return
        qos = msg.qos
        retain = msg.retain
        publisher = msg.client_id
        for session, cap, no_local, rap, ids in routes:
            if no_local and session.client_id == publisher:
                continue
            session.deliver(msg if ids is None else msg.with_ids(ids), qos if qos < cap else cap, retain and rap)

    def _fold_routes(self, topic: str) -> list[Route]:
        """Overlapping subscriptions of one client: deliver once, at the highest granted QoS, with
        the Subscription Identifiers of all of them (MQTT-3.3.4-3/-5)."""
        folded: dict[Session, Route] = {}
        ids: dict[Session, tuple[int, ...]] = {}
        acl = self.acl
        for session, sub in self.subs.match(topic):
            if acl is not None and not acl.may_read(session.username, session.client_id, topic):
                continue  # checked once per topic and session: routes are cached until a change
            if sub.sub_id:
                ids[session] = ids.get(session, ()) + (sub.sub_id,)
            prev = folded.get(session)
            if prev is None:
                folded[session] = (session, sub.qos, sub.no_local, sub.retain_as_published, None)
            else:
                folded[session] = (session, max(prev[1], sub.qos), prev[2] and sub.no_local,
                                   prev[3] or sub.retain_as_published, None)
        for session, sub_ids in ids.items():
            _, cap, no_local, rap, _ = folded[session]
            folded[session] = (session, cap, no_local, rap, sub_ids)
        routes = list(folded.values())
        remember(self._routes, topic, routes)
        return routes

    def _peers(self, topic: str) -> tuple[str, ...]:
        """The peer routers interested in ``topic`` (folded once per topic)."""
        peers = self._peer_routes.get(topic)
        return peers if peers is not None else self._fold_peers(topic)

    def _fold_peers(self, topic: str) -> tuple[str, ...]:
        peers = tuple(dict.fromkeys(router_id for router_id, _ in self.interest.match(topic)))
        remember(self._peer_routes, topic, peers)
        return peers

    def interest_announcements(self) -> list[tuple[str, bool | int]]:
        """Everything this router announces, for a peer that (re)joins: filters and presence."""
        out: list[tuple[str, bool | int]] = [(f, True) for f in self.local_filters]
        out += self.shared.announcements()
        return out

    # -- subscriptions --------------------------------------------------------------------------------

    def subscribe(self, session: Session, sub: Subscription) -> bool:
        """Index one subscription; True if it is new for this session (not a replacement)."""
        new = sub.topic_filter not in session.subscriptions
        session.own_subscriptions()[sub.topic_filter] = sub
        self._session_changed(session)
        self.subs.add(sub.topic_filter, session, sub)
        self._routes.clear()
        if new:
            self._ref_filter(sub.topic_filter, +1)
        return new

    def unsubscribe(self, session: Session, topic_filter: str) -> bool:
        if session.subscriptions.pop(topic_filter, None) is None:
            return False
        self._session_changed(session)
        self.subs.remove(topic_filter, session)
        self._routes.clear()
        self._ref_filter(topic_filter, -1)
        return True

    def _ref_filter(self, topic_filter: str, delta: int) -> None:
        count = self.local_filters.get(topic_filter, 0) + delta
        if count > 0:
            self.local_filters[topic_filter] = count
            if count == 1 and delta > 0:
                self._interest_ack(topic_filter, self.mesh.announce_interest(topic_filter, True))
        else:
            self.local_filters.pop(topic_filter, None)
            self.mesh.announce_interest(topic_filter, False)

    def _session_changed(self, session: Session) -> None:
        """A persistent session's subscriptions changed: snapshot soon, not per packet."""
        if session.persistent and self.state is not None:
            self.state.mark(soon=True)

    def _interest_ack(self, key: str, ack: Awaitable[None] | None) -> None:
        """Remember an announcement the peers have not acknowledged yet (a SUBACK waits for it)."""
        if ack is None:
            return
        self.interest_pending[key] = ack
        pending = self.interest_pending

        def done(_f: object, key: str = key, ack: Awaitable[None] = ack) -> None:
            if pending.get(key) is ack:
                del pending[key]

        ack.add_done_callback(done)  # type: ignore[attr-defined]  # MeshPort's Awaitable is a Future

    # -- the other routers ----------------------------------------------------------------------------

    def peer_interest(self, router_id: str, topic_filter: str, add: bool | int) -> None:
        if is_shared(topic_filter):
            self.shared.route_presence(topic_filter, router_id, int(add))
            return
        if add:
            self.interest.add(topic_filter, router_id, None)
        else:
            self.interest.remove(topic_filter, router_id)
        self._peer_routes.clear()

    def peer_left(self, router_id: str) -> None:
        """A peer router is gone for good, or is about to send all its interest again (a full
        announcement replaces what it said before): forget its interest and presence."""
        for topic_filter, rid, _ in list(self.interest.items()):
            if rid == router_id:
                self.interest.remove(topic_filter, rid)
        self._peer_routes.clear()
        self.shared.peer_left(router_id)

    def peer_silent(self, router_id: str) -> None:
        """A peer router fell silent (stopped, partitioned, restarting): its filter interest stays,
        so what its subscribers would get keeps being forwarded (the mesh holds it, bounded, until
        the peer is heard again), and its shared-group members become the last resort: a group's
        messages go to members that can take them now, and to those behind the silent router only
        when there are none (they wait in the mesh's backlog for it). Its next full announcement
        (``peer_left``, then its presence again) makes it an ordinary member router again."""
        self.shared.peer_silent(router_id)

    def peer_retained(self, msg: Message) -> None:
        """A retained update from another router: kept if it is a newer version of its topic than
        this router's (``retained.version``: all routers keep the same one). Kept as its origin
        took it: --max-retained and --max-retained-bytes are checked once, where the message was
        published (``may_retain``). Checked again here, two routers at the limit would each keep
        their own clients' message and refuse the other's, and never agree again; so a router may
        hold more than the limit for a while, by the updates that crossed, and refuses new topics
        of its own clients until some are cleared."""
        if not self.retained.newer(msg):
            return
        self.retained.set(msg)
        self.stats.retained_count = len(self.retained)

    def retained_snapshot(self) -> list[Message]:
        return list(self.retained)
