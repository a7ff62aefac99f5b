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

Split by concern (rumqttd's model): shared-subscription routing in ``router.shared_routing``,
session life, expiry and takeover in ``router.session_life``; ``Router`` mixes them in and holds
all the state.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from brokerd.connection.codec import PUBACK, PUBLISH_QOS0
from brokerd.connection.packets import Subscription
from brokerd.connection.reasons import ProtocolError, Reason

from . import mesh_format
from .limits import ClientLimits, Qos2Sweeper, may_retain
from .log.errors import LogUnavailable
from .mesh_format import FULL, PLAIN
from .message import Message
from .ports import NULL_MESH, TAKEOVER_FAILED, ClientHandle, MeshPort
from .retained import SYS_PREFIX, RetainedStore
from .session import Session, SessionLimits
from .session_life import SessionLife
from .shared import NONE, SharedGroup, SharedRoute, is_shared
from .shared_routing import SharedRouting
from .stats import RouterStats
from .topics import TopicIndex

if TYPE_CHECKING:
    from .log import CommitLog
    from .persistence import StateStore

__all__ = ["TAKEOVER_FAILED", "MeshPort", "Router", "RouterConfig"]

log = logging.getLogger(__name__)


class Identified:
    """A session in a route whose matching subscriptions carry Subscription Identifiers: it gets
    each message as a copy with them (``Message.with_ids``), which only MQTT 5 needs."""

    __slots__ = ("session", "ids", "client_id")

    def __init__(self, session: Session, ids: tuple[int, ...]) -> None:
        self.session = session
        self.ids = ids
        self.client_id = session.client_id

    def deliver(self, msg: Message, qos: int, retain: bool) -> None:
        self.session.deliver(msg.with_ids(self.ids), qos, retain)

    def deliver_packet(self, packet: bytes) -> bool:
        return self.session.deliver_packet(packet)  # False for MQTT 5: then ``deliver``

    @property
    def persistent(self) -> bool:
        return self.session.persistent


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


class Router(SharedRouting, SessionLife):
    def __init__(self, config: RouterConfig, mesh: MeshPort | None = None) -> None:
        self.config = config
        self.router_id = config.router_id
        self.mesh: MeshPort = mesh if mesh is not None else NULL_MESH
        self.stats = RouterStats()
        self.sessions: dict[str, Session] = {}
        self.qos2_sweeper = Qos2Sweeper(self.sessions, self.stats, config.limits.qos2_timeout)
        self.moving: dict[str, Session] = {}  # exported to another router, not yet confirmed there
        self.moving_from: dict[str, int] = {}  # of those, this router's log end when they were exported
        self.stale_moving: set[str] = set()  # of those, the ones found stale meanwhile (a fence)
        # Exported, then kept: the new owner fell silent before confirming. Client id → (session,
        # that router, this log's end at the export), until it confirms or a client resumes here.
        self.in_doubt: dict[str, tuple[Session, str, int]] = {}
        self.moved_in: dict[str, float] = {}  # sessions taken over from another router: when (Unix time)
        self.clients: dict[str, ClientHandle] = {}  # client id → the live connection's handler
        self.listener_sockets: dict[Any, int] = {}  # listener with a max_connections → its open sockets here
        self.subs: TopicIndex[Session, Subscription] = TopicIndex()
        self.local_filters: dict[str, int] = {}  # filter → number of local sessions subscribed
        self.interest_pending: dict[str, Awaitable[None]] = {}  # announced, not yet acknowledged
        self.interest: TopicIndex[str, None] = TopicIndex()  # peers' filters → router ids
        self.retained = RetainedStore(self.stats)
        # Folded routes per topic: [(session, qos cap, no_local, retain_as_published)] and the peer
        # routers to forward to. Cleared on any subscription / interest change.
        self._routes: dict[str, list[tuple[Session, int, bool, bool]]] = {}
        self._peer_routes: dict[str, tuple[str, ...]] = {}
        self._expiry: dict[str, asyncio.TimerHandle] = {}
        self._wills: dict[str, asyncio.TimerHandle] = {}  # delayed wills of offline sessions
        # Shared subscriptions: this router's members per key, every router's presence per key
        # (this one's included), and the routes matching each topic. ``has_shared`` keeps the
        # publish path of a cluster without any shared subscription to one attribute test.
        self.shared_local: dict[str, SharedGroup] = {}
        self.shared_routes: dict[str, SharedRoute] = {}
        self.shared_index: TopicIndex[str, SharedRoute] = TopicIndex()
        self._shared_cache: dict[str, tuple[SharedRoute, ...]] = {}
        self.has_shared = False
        self.commit_log: CommitLog | None = None  # when the log is on (attach_log)
        self.ack_when_durable = False
        self.state: StateStore | None = None  # when the log is on (attach_state)
        # router.auth (set by install_auth): CONNECT's checks, None when nothing is configured;
        # ``acl``: the same object when topics are restricted, else None (one test per fold).
        self.auth: Any = None
        self.acl: Any = None
        self._deferred_acks: deque[tuple[int, Any, bytes]] = deque()
        self._write_soon: _WriteSoon | None = None  # attach_log
        # (offset, client, ack) whose connection is gated until the log has written ``offset``
        self._gates: deque[tuple[int, Any, bytes]] = deque()
        # Replication (cluster.replication.Replication, when --replication-factor > 1): it holds
        # QoS 1/2 acknowledgements until enough nodes have the record, and gives them back
        # through ``release_acks`` / ``refuse_acks``.
        self.replication: Any = None
        # The agreed owners of its persistent sessions (cluster.agreement.owners.SessionOwners,
        # with --agreement): a CONNECT resumes a session only once this router is its owner.
        self.owners: Any = None
        # Sessions taken here from the replica of a router taken for dead ({router: client ids}):
        # that router drops its stale copies when it is heard again. In the snapshot: a restart
        # of this router in between must not forget them.
        self.fenced: dict[str, set[str]] = {}
        # Delayed wills of a silent router's sessions published here from its replica: that router
        # is told (with the fence) not to publish them again when it returns.
        self.fenced_wills: dict[str, set[str]] = {}

    # -- publishing ---------------------------------------------------------------------------------

    def publish(self, msg: Message, source: Any = None) -> None:
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
        if self.has_shared:
            shared = self._shared_cache.get(topic)
            if shared is None:
                shared = self._fold_shared(topic)
            if shared:
                self._publish_shared(msg, shared, source)
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
                for session, _cap, no_local, _rap in routes:
                    if no_local and session.client_id == publisher:
                        continue
                    if not session.deliver_packet(packet):
                        if msg is None:
                            msg = from_mesh(values, sender)
                        session.deliver(msg, 0, False)
                continue
            if groups is not None:
                self.deliver_remote_shared(msg, groups, only)
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

    def deliver_remote_shared(self, msg: Message, groups: list[str], only: bool = False) -> None:
        """``deliver_remote`` for a message this router was also chosen for by the shared
        subscriptions ``groups``: one local member of each gets it (``only``: nobody else)."""
        if not only:
            self.deliver_remote(msg)
        for key in groups:
            self._deliver_remote_shared(msg, key, only)

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

    def attach_mesh(self, mesh: MeshPort) -> None:
        """Join a cluster: the mesh is made after the router (it needs the router to call back)."""
        self.mesh = mesh

    @property
    def clustered(self) -> bool:
        """Whether other routers exist that may hold sessions or subscribers."""
        return self.mesh is not NULL_MESH

    def attach_state(self, state: StateStore) -> None:
        """Persistent sessions and retained messages survive restarts through ``state``."""
        self.state = state

    def attach_log(self, log_: CommitLog, ack_when_durable: bool, end_of_tick: Any = None) -> None:
        """Log what is published here. A QoS 1/2 acknowledgement waits for its record
        (``defer_ack``): until it is fsynced with ``ack_when_durable`` (``--fsync always``), else
        until it is written into the kernel, so that a crash of this process (SIGKILL, OOM) loses
        nothing acknowledged. ``end_of_tick`` (the worker's ``connection.batching.EndOfTick``):
        where the log is marked to be written at the end of the loop iteration in which an
        acknowledgement began to wait, ahead of the log's linger (without it: at the linger)."""
        self.commit_log = log_
        self.ack_when_durable = ack_when_durable
        self._write_soon = _WriteSoon(log_, end_of_tick) if end_of_tick is not None and not ack_when_durable \
            else None
        if ack_when_durable:
            log_.on_durable(self._durable)
        else:
            log_.on_written(self._written)
        log_.on_error(self._log_failed)

    def defer_ack(self, offset: int, client: Any, ack: bytes) -> None:
        """Send ``ack`` to ``client`` (a ``router.client.Client``) once the record at ``offset`` is
        safe (``attach_log``). Written: the ack is queued at once, in its place among the
        connection's packets, and the connection's output gated until the log has written
        ``offset`` (``Connection.gate``; a graceful close waits for it too). Durable, or on
        enough nodes with replication: held here. Either way ``client.held_acks`` counts the
        PUBACKs not sent yet (MQTT 5 Receive Maximum; a QoS 2 message held is counted among the
        client's ids awaiting PUBREL already). Replicated, the batch is marked to be written at
        the end of this iteration too: its REPLICATE frames leave at its flush, not a linger later."""
        if self.replication is not None:
            if self.replication.hold(offset, client, ack):
                if ack[0] == PUBACK:
                    client.held_acks += 1
                soon = self._write_soon
                if soon is not None and not soon.marked:
                    soon.mark()
            else:
                client.conn.send(ack)
            return
        log_ = self.commit_log
        if not self.ack_when_durable:
            conn = client.conn
            if offset > log_.written_offset:
                conn.gate(offset)
                if ack[0] == PUBACK:  # not sent yet: it counts towards the Receive Maximum
                    client.held_acks += 1
                self._gates.append((offset, client, ack))
                soon = self._write_soon
                if soon is not None and not soon.marked:
                    soon.mark()
            conn.send(ack)
            return
        if offset <= log_.durable_offset:
            client.conn.send(ack)
            return
        if ack[0] == PUBACK:
            client.held_acks += 1
        self._deferred_acks.append((offset, client, ack))

    def release_acks(self, held: list[tuple[Any, bytes]]) -> None:
        """Held acknowledgements now safe to send (durable, or on enough nodes): (client, ack) in
        offset order."""
        for client, ack in held:
            if ack[0] == PUBACK:
                client.held_acks -= 1
            if not client.conn.closing:
                client.conn.send(ack)

    def refuse_acks(self, held: list[tuple[Any, bytes]], why: str, gated: bool = False) -> None:
        """Held acknowledgements that cannot be given (the log failed, or the record is not on
        enough nodes in time): never sent; their connections close, and the clients resend after
        reconnecting. ``gated``: the acknowledgements wait behind their connections' gates
        (``defer_ack``), which drop what they hold, unwritten, and close, whether or not a close
        already waits for them."""
        counts: dict[int, list] = {}
        for client, ack in held:
            if ack[0] == PUBACK:
                client.held_acks -= 1
            counts.setdefault(id(client), [client, 0])[1] += 1
        for client, n in counts.values():
            conn = client.conn
            if gated or not conn.closing:
                log.warning("client %s (%s): closing, %d publish(es) %s", conn.client_id, conn.peer, n, why)
                (conn.refuse_output if gated else conn.close)(Reason.IMPLEMENTATION_SPECIFIC_ERROR)

    def _log_failed(self, error: OSError | None) -> None:
        """Records waiting to be written or to become durable never will: refuse their
        acknowledgements by closing their connections, the gated ones with what the gate held
        unwritten (the clients resend after reconnecting); never acknowledge them."""
        if error is None:
            return
        acks, self._deferred_acks = self._deferred_acks, deque()
        self.refuse_acks([(client, ack) for _, client, ack in acks], f"could not be made durable: {error}")
        gates, self._gates = self._gates, deque()
        self.refuse_acks([(client, ack) for _, client, ack in gates], f"could not be written: {error}", gated=True)

    def _durable(self, durable: int) -> None:
        acks = self._deferred_acks
        due = []
        while acks and acks[0][0] <= durable:
            _, client, ack = acks.popleft()
            due.append((client, ack))
        self.release_acks(due)

    def _written(self, written: int) -> None:
        """The log is written up to ``written``: the connections gated on records up to it write
        what they hold."""
        gates = self._gates
        while gates and gates[0][0] <= written:
            _, client, ack = gates.popleft()
            if ack[0] == PUBACK:
                client.held_acks -= 1
            client.conn.open_gate(written)

    def _deliver(self, msg: Message, routes: list[tuple[Session, int, bool, bool]]) -> None:
        """Hand ``msg`` to this router's subscribers of its topic (``routes``, folded). The callers
        look the routes up themselves: a forwarding router mostly finds none, and the call is
        skipped."""
        if msg.expires_ms and msg.expired():  # it waited (in a mesh backlog, say) too long
            self.stats.drop_expired += len(routes)
            return
        qos = msg.qos
        retain = msg.retain
        publisher = msg.client_id
        for session, cap, no_local, rap in routes:
            if no_local and session.client_id == publisher:
                continue
            session.deliver(msg, qos if qos < cap else cap, retain and rap)

    def _fold_routes(self, topic: str) -> list[tuple[Session, int, bool, bool]]:
        """Overlapping subscriptions of one client: deliver once, at the highest granted QoS, with
        the Subscription Identifiers of all of them (MQTT-3.3.4-3/-5): such a session's route holds
        an ``Identified`` in its place, so routes without identifiers cost nothing more."""
        folded: dict[Session, tuple[Session, int, bool, bool]] = {}
        ids: dict[Session, tuple[int, ...]] = {}
        acl = self.acl
        for session, sub in self.subs.match(topic):
            if acl is not None and not acl.may_read(session.username, session.client_id, topic):
                continue  # checked once per topic and session: routes are cached until a change
            if sub.sub_id:
                ids[session] = ids.get(session, ()) + (sub.sub_id,)
            prev = folded.get(session)
            if prev is None:
                folded[session] = (session, sub.qos, sub.no_local, sub.retain_as_published)
            else:
                folded[session] = (session, max(prev[1], sub.qos), prev[2] and sub.no_local,
                                   prev[3] or sub.retain_as_published)
        for session, sub_ids in ids.items():
            folded[session] = (Identified(session, sub_ids), *folded[session][1:])  # type: ignore[assignment]
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

    def interest_announcements(self) -> list[tuple[str, bool | int]]:
        """Everything this router announces, for a peer that (re)joins: filters and presence."""
        me = self.router_id
        out: list[tuple[str, bool | int]] = [(f, True) for f in self.local_filters]
        out += [(key, route.routers[me]) for key, route in self.shared_routes.items() if me in route.routers]
        return out

    # -- subscriptions --------------------------------------------------------------------------------

    def subscribe(self, session: Session, sub: Subscription) -> bool:
        """Index one subscription; True if it is new for this session (not a replacement)."""
        new = sub.topic_filter not in session.subscriptions
        session.subscriptions[sub.topic_filter] = sub
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

        ack.add_done_callback(done)  # type: ignore[attr-defined]

    # -- the other routers ----------------------------------------------------------------------------

    def peer_interest(self, router_id: str, topic_filter: str, add: bool | int) -> None:
        if is_shared(topic_filter):
            self._route_presence(topic_filter, router_id, int(add))
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
        for key in [k for k, route in self.shared_routes.items() if router_id in route.routers]:
            self._route_presence(key, router_id, NONE)

    def peer_silent(self, router_id: str) -> None:
        """A peer router fell silent (stopped, partitioned, restarting): its filter interest stays,
        so what its subscribers would get keeps being forwarded (the mesh holds it, bounded, until
        the peer is heard again), and its shared-group members become the last resort: a group's
        messages go to members that can take them now, and to those behind the silent router only
        when there are none (they wait in the mesh's backlog for it). Its next full announcement
        (``peer_left``, then its presence again) makes it an ordinary member router again."""
        for route in self.shared_routes.values():
            if router_id in route.routers:
                route.set_parked(router_id, True)
        self._shared_cache.clear()

    def peer_retained(self, msg: Message) -> None:
        """A retained update from another router: kept if it is a newer version of its topic than
        this router's (``retained.version``: all routers keep the same one)."""
        if not self.retained.newer(msg):
            return
        if not may_retain(self.retained, msg, self.config.limits, self.stats):
            return
        self.retained.set(msg)
        self.stats.retained_count = len(self.retained)

    def retained_snapshot(self) -> list[Message]:
        return list(self.retained)


class _WriteSoon:
    """The log as an end-of-iteration flush (``connection.batching.EndOfTick``): marked when an
    acknowledgement begins to wait for its record to be written, so the batch is written (and
    the connections gated on it write) in the iteration's own end-of-iteration pass, not a
    linger later. Batches of QoS 0 messages alone keep the linger: nothing waits for them."""

    __slots__ = ("log", "tick", "marked")

    def __init__(self, log_: CommitLog, tick: Any) -> None:
        self.log = log_
        self.tick = tick
        self.marked = False

    def mark(self) -> None:
        self.marked = True
        self.tick.mark(self)

    def flush(self) -> None:
        self.marked = False
        self.log.flush()
