"""What the packets of one client connection mean: CONNECT, PUBLISH, SUBSCRIBE ... in MQTT terms.

``Client`` is the ``connection.protocol.Handler`` the router hands to each connection. It decides
in MQTT 5 reason codes and lets the codec and ``connack_code`` express the decision in the client's
protocol level. Connecting may wait for the cluster (a takeover of the same client id on another
router); packets that arrive meanwhile are held and processed in order once the session is ready.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from brokerd.connection.codec import PUBACK, PUBCOMP, PUBREC, encode, success_ack, topic_levels_ok
from brokerd.connection.packets import (
    MQTT_5,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Prop,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
)
from brokerd.connection.ratelimit import CONNECTIONS, REFUSED_FILTERS
from brokerd.connection.reasons import ProtocolError, Reason, connack_code

from .access import (
    AUTHENTICATING,
    Access,
    anonymous_check,
    authenticate,
    decided,
    may_subscribe,
    plugin_reason,
    publish_refusal,
)
from .auth import may_publish
from .limits import (
    connack_limits,
    connect_refused,
    listener_closed,
    listener_opened,
    listener_refused,
    over_subscription_quota,
    server_keepalive,
    session_expiry,
)
from .log.errors import LogUnavailable
from .message import Message, will_delay
from .outbound import NO_LIMIT, Outbound
from .ownership import REFUSE, REFUSED, Claim, decide, name, state_owner
from .ports import NOT_AGREED, TAKEOVER_FAILED, TAKEOVER_UNAVAILABLE, TAKEOVER_UNDECIDED
from .retained_out import RetainedOut
from .shared import is_shared, parse_share
from .spool import drop_named
from .topics import valid_topic_filter

if TYPE_CHECKING:
    from brokerd.connection.protocol import Connection

    from .router import Router
    from .session import Session

log = logging.getLogger(__name__)

CONNECTING = "connecting"  # the pause_reading cause while a CONNECT waits for the cluster
SUBSCRIBING = "subscribing"  # the hold cause while a SUBSCRIBE's filters are taken a slice per turn
FILTERS_PER_TURN = 1024  # filters of one SUBSCRIBE taken per loop turn (valid ones: about 5 ms)
DURABLE_WAIT_S = 5.0  # a session taken over waits this long at most to be in this router's snapshot
_PROTOCOLS = {3: "MQTT 3.1", 4: "MQTT 3.1.1", 5: "MQTT 5.0"}  # protocol level → what an operator calls it


class Client:
    __slots__ = ("conn", "router", "session", "client_id", "level", "will", "_pending", "_connecting",
                 "_taken_over", "_max_qos", "_unconnected", "_listener", "_aliases", "_problem_info", "held_acks",
                 "username")

    def __init__(self, router: Router, conn: Connection) -> None:
        self.router = router
        self.conn = conn
        self.session: Session | None = None
        self.client_id = ""
        self.level = 4
        self.will: Message | None = None
        self._pending: list[Packet] | None = None
        self._connecting = False
        self._taken_over = False
        self._max_qos = 2
        # A socket not yet CONNECTed holds a place under --max-connections until its CONNECT.
        self._unconnected = True
        router.stats.unconnected += 1
        self._listener = listener_opened(router, conn)
        self._aliases: dict[int, str] | None = None  # topic aliases this client set (MQTT 5)
        self._problem_info = True  # MQTT 5 Request Problem Information: reason strings wanted
        self.held_acks = 0  # QoS 1/2 acknowledgements waiting for the disk or the followers
        self.username: str | None = None  # its identity, once connected (its will is published as it)

    # -- Handler interface ----------------------------------------------------------------------------

    def packet_received(self, packet: Packet) -> None:
        if self.session is None:
            if type(packet) is Connect and not self._connecting:
                self._connecting = True
                self._on_connect(packet)
            elif self._pending is not None:
                self._pending.append(packet)
            return
        # ``cls is X`` does not narrow ``packet`` for mypy (``type(packet) is X`` in each branch
        # would cost a call per packet): hence the ignores below.
        cls = type(packet)
        try:
            if cls is Publish:
                self._on_publish(packet)  # type: ignore[arg-type]
            elif cls is Puback:
                self.session.puback(packet.packet_id)  # type: ignore[union-attr, arg-type]
            elif cls is Pubrec:
                self.session.pubrec(packet.packet_id, packet.reason_code)  # type: ignore[union-attr, arg-type]
            elif cls is Pubrel:
                self.session.pubrel(packet.packet_id)  # type: ignore[union-attr, arg-type]
                self.conn.send(success_ack(PUBCOMP, packet.packet_id))  # type: ignore[union-attr, arg-type]
            elif cls is Pubcomp:
                self.session.pubcomp(packet.packet_id)  # type: ignore[union-attr, arg-type]
            elif cls is Subscribe:
                self._on_subscribe(packet)  # type: ignore[arg-type]
            elif cls is Unsubscribe:
                self._on_unsubscribe(packet)  # type: ignore[arg-type]
            elif cls is Disconnect:
                self._on_disconnect(packet)  # type: ignore[arg-type]
            else:
                raise ProtocolError(f"a client may not send {cls.__name__}", Reason.PROTOCOL_ERROR)
        except ProtocolError as exc:
            self.conn.protocol_violation(exc)

    def _on_disconnect(self, packet: Disconnect) -> None:
        """DISCONNECT: the will is kept only with reason 0x04; MQTT 5 may change the session
        expiry interval, but not from 0 to more (MQTT-3.14.2-2: a protocol error, and then the
        will goes out, as for any protocol error)."""
        session = self.session
        assert session is not None
        if self.level >= MQTT_5 and Prop.SESSION_EXPIRY_INTERVAL in packet.properties:
            asked = packet.properties[Prop.SESSION_EXPIRY_INTERVAL]
            if session.expiry_s == 0 and asked:
                raise ProtocolError("MQTT-3.14.2-2 DISCONNECT sets a session expiry interval after "
                                    "CONNECT set 0", Reason.PROTOCOL_ERROR)
            session.expiry_s = session_expiry(self.level, True, asked, self.router.config.limits)
            session.persistent = session.expiry_s > 0
        if packet.reason_code != Reason.DISCONNECT_WITH_WILL and self.will is not None:
            self.will = None
            state, router = self.router.state, self.router
            if session.persistent and state is not None and router.replication is not None:
                # Its followers hold the will (``live_will``): tell them it is gone at once, not
                # within the second, or a node lost meanwhile has it published after all.
                state.mark(soon=True)

    def violation(self, exc: ProtocolError) -> None:
        """The connection is being closed for breaking a rule: count it (and why)."""
        stats = self.router.stats
        stats.protocol_errors += 1
        if exc.reason == Reason.PACKET_TOO_LARGE:
            stats.drop_too_large += 1

    def _let_go(self) -> Session | None:
        """Detach this connection from its session and the router's client table; returns the
        session if this connection held it (a connection taken over, or lost before its CONNECT
        finished, holds none)."""
        router = self.router
        session = self.session
        if session is not None and session.conn is self.conn:
            router.stats.connections -= 1
            session.detach()
        else:
            session = None
        if router.clients.get(self.client_id) is self:
            del router.clients[self.client_id]
        return session

    def connection_lost(self, graceful: bool) -> None:
        router = self.router
        if self._unconnected:
            self._unconnected = False
            router.stats.unconnected -= 1
        if self._listener is not None:
            listener_closed(router, self._listener)
            self._listener = None
        if self.session is not None:  # it had connected (a connection taken over said so already)
            CONNECTIONS.log(log, "client %s (%s) disconnected (%s)", self.client_id, self.conn.peer,
                            "DISCONNECT" if graceful else "closed without DISCONNECT" +
                            ("; will published" if self.will is not None else ""))
        session = self._let_go()
        will, self.will = self.will, None
        if session is not None:
            if session.persistent or session.expiry_s:
                if will is not None and will_delay(will):  # out at the earlier of the delay and
                    router.delay_will(session, will, will_delay(will))  # the session's end,
                    will = None  # if it is not resumed
                router.schedule_expiry(session)
                if session.shared:
                    router.shared_presence(session)
            else:
                router.end_session(session)
        # Else taken over: a delayed will went with the session (``taken_over``); one still here
        # has no delay, or its session ends with this connection, so it goes out now.
        if will is not None:  # a DISCONNECT other than 0x04 cleared it
            router.publish_will(will, self.username)

    # -- CONNECT --------------------------------------------------------------------------------------

    def _refuse(self, reason: Reason, why: str) -> None:
        self.will = None  # a refused CONNECT made no session: its will is never published (MQTT-3.1.2-8)
        CONNECTIONS.log(log, "client %r (%s) refused: %s", self.client_id, self.conn.peer, why)
        self.conn.send(encode(Connack(False, connack_code(reason, self.level)), self.level))
        self.conn.close()

    def _on_connect(self, connect: Connect) -> None:
        """CONNECT: the listener's rules and ``router.auth`` decide first (``router.access``)."""
        router = self.router
        access = anonymous_check(router.auth, self.conn, connect)
        if access.anonymous:
            connect.username = connect.password = None
        if access.refused is None and router.auth is not None:
            self.level = connect.protocol_level
            self.client_id = connect.client_id
            access = authenticate(router.auth, router.acl, self.conn, connect)
            if access.pending is not None:  # a plugin is asked: hold what the client sends meanwhile
                self._pending = []
                self.conn.pause_reading(AUTHENTICATING)
                asyncio.ensure_future(self._authenticated(connect, access.pending))
                return
        self._admit(connect, access)

    async def _authenticated(self, connect: Connect, pending: Awaitable[Reason | None]) -> None:
        reason = await plugin_reason(connect, pending)
        if self.conn.closing:
            return
        self._admit(connect, decided(self.router.acl, connect, reason))
        self.conn.resume_reading(AUTHENTICATING)

    def _admit(self, connect: Connect, access: Access) -> None:
        if access.refused is None:
            self._start_connect(connect)
            return
        self.level = connect.protocol_level
        self.client_id = connect.client_id
        self.router.stats.auth_failures += 1
        self._pending = None
        self._refuse(access.refused, access.why)  # never the password

    def identity_revoked(self) -> None:
        """Its user left the password file (a reload, ``access.install_auth``): disconnected. Its
        will goes with it (nobody may publish as that user now); its session stays, for the
        user if it is added again."""
        self.will = None
        self.conn.close(Reason.NOT_AUTHORIZED)

    def _start_connect(self, connect: Connect) -> None:
        router = self.router
        self.level = connect.protocol_level
        client_id = connect.client_id
        assigned = False
        if self._unconnected:
            self._unconnected = False
            router.stats.unconnected -= 1
        if connect_refused(self, connect, router.config.limits, router.stats):
            return
        if self.level >= MQTT_5 and Prop.AUTHENTICATION_METHOD in connect.properties:
            # Enhanced authentication (AUTH exchanges): no method is supported, as Mosquitto
            # without an auth plugin that offers one (MQTT 5 4.12).
            self.client_id = client_id
            self._refuse(Reason.BAD_AUTHENTICATION_METHOD, "enhanced authentication method "
                         f"{connect.properties[Prop.AUTHENTICATION_METHOD]!r} not supported")
            return
        if not client_id:
            if not connect.clean_start and self.level < MQTT_5:
                self.client_id = ""
                self._refuse(Reason.CLIENT_IDENTIFIER_NOT_VALID,
                             "MQTT-3.1.3-8 empty client id requires clean session")
                return
            client_id = "auto-" + uuid.uuid4().hex
            assigned = True
        self.client_id = client_id
        self.conn.client_id = client_id
        if router.stats.connections + router.stats.unconnected >= router.config.max_connections:
            router.stats.refused_connections += 1
            self._refuse(Reason.SERVER_BUSY, f"max connections ({router.config.max_connections}) reached")
            return
        if self._listener is not None and listener_refused(self, self._listener):
            return
        if connect.will is not None:
            w = connect.will
            self.will = Message(w.topic, w.payload, w.qos, w.retain, client_id, router.router_id,
                                properties=w.properties or None)
        if self._pending is None:  # else it holds what came while a plugin was asked
            self._pending = []
        if self._not_the_owner(connect, router.sessions.get(client_id)):
            return  # before its owner's connection is closed: the session stays as it is
        local = router.clients.get(client_id)
        if local is not None:
            local.taken_over()
        if not router.clustered:
            self._finish_connect(connect, None, assigned)
            return
        replication = router.replication
        if replication is not None and not connect.clean_start:
            replication.check_paused()
        if replication is not None and not connect.clean_start and replication.in_minority:
            # A partition's minority side takes no session in: the majority may be serving it.
            self._refuse(Reason.SERVER_UNAVAILABLE, "this node is cut off from the majority of the cluster; "
                         "the client may retry (elsewhere)")
            return
        # Another router may hold this client id: ask the cluster first (bounded wait). Until the
        # CONNACK, nothing more is read from the client: what it pipelined behind the CONNECT in
        # this read is held (one read's worth), the rest waits in its socket.
        router.clients[client_id] = self
        self.conn.pause_reading(CONNECTING)
        asyncio.ensure_future(self._connect_via_cluster(connect, assigned))

    def _claim(self, known: bool, owner: str | None, connect: Connect) -> Claim:
        return decide(known, owner, connect.username, self.router.config.session_owner)

    def _not_the_owner(self, connect: Connect, session: Session | None) -> bool:
        """A session of another identity has this client id and --session-owner refuse: refused
        (CONNACK not authorized), True. The log line names both users, never a password."""
        if session is None or self._claim(session.owner_known, session.username, connect) is not Claim.REFUSE:
            return False
        self._refuse_claim(connect, session.username, None)
        return True

    def _refuse_claim(self, connect: Connect, owner: str | None, where: str | None) -> None:
        self.router.stats.auth_failures += 1
        self._refuse(Reason.NOT_AUTHORIZED, f"its session belongs to user {name(owner)}"
                     f"{f' (on router {where})' if where else ''}, not to user {name(connect.username)} "
                     "(--session-owner refuse)")

    def _replaces(self, session: Session, connect: Connect) -> bool:
        """Whether the session here is not this client's to resume: another identity's, with
        --session-owner replace, or one whose owner is unknown (``router.ownership``). It ends,
        logged, and this client gets a clean session."""
        if self._claim(session.owner_known, session.username, connect) is Claim.RESUME:
            return False
        CONNECTIONS.log(log, "session %s of %s dropped: user %s connected with its client id and gets a clean "
                        "session (--session-owner %s)", self.client_id,
                        f"user {name(session.username)}" if session.owner_known else "an unknown user",
                        name(connect.username), self.router.config.session_owner)
        return True

    async def _connect_via_cluster(self, connect: Connect, assigned: bool) -> None:
        router = self.router
        refuse = router.config.session_owner == REFUSE
        answered: set[str] = set()
        state = await router.mesh.takeover(self.client_id, [connect.username, refuse], answered)  # bounded
        if router.owners is not None:  # (a connection closed meanwhile too: its session is kept here)
            state = await self._agree(connect, state, answered)
        try:
            await self._settle_connect(connect, assigned, state)
        finally:  # (done already where the session's interest was waited for)
            router.mesh.confirm_takeover(self.client_id)
            if isinstance(state, dict) and state.get("spool"):
                spooled = state["spool"]
                session = router.sessions.get(self.client_id)
                if session is None or all(r.directory != spooled[0] for r in session.ranges):
                    drop_named(state)  # not taken in (a clean start): its backlog ends here

    async def _agree(self, connect: Connect, state: dict | None, answered: set[str]) -> dict | None:
        """With agreement on (``--agreement``), the session a takeover brought counts only once
        this router is its agreed owner (``cluster.agreement.owners``): a resumed session is
        claimed, a refused claim undoes the takeover (the session stays where it was) and refuses
        the CONNECT; a clean start releases whatever record the session had."""
        router = self.router
        owners = router.owners
        assert owners is not None  # the caller's test
        if state is not None and (REFUSED in state or state is TAKEOVER_FAILED or state is TAKEOVER_UNAVAILABLE):
            return state
        if connect.clean_start:
            if state is not None or owners.owns(self.client_id) or self.client_id in router.sessions:
                owners.forget(self.client_id)
            return state
        if state is None:
            source = router.router_id if self.client_id in router.sessions else None
        else:
            source = state.get("replica") or state.get("offered_by")
        why = await owners.claim(self.client_id, source, answered)
        if why is None:
            return state
        router.mesh.abort_takeover(self.client_id)
        if state is not None:
            drop_named(state)
        return {NOT_AGREED: why}

    async def _settle_connect(self, connect: Connect, assigned: bool, state: dict | None) -> None:
        router = self.router
        if state is not None and REFUSED in state:  # another identity's session (router.ownership)
            if router.clients.get(self.client_id) is self:
                del router.clients[self.client_id]
            if not self.conn.closing:
                self._refuse_claim(connect, *state[REFUSED])
            return
        if state is None and not connect.clean_start and router.replication is not None and router.owners is None \
                and router.replication.undecided():
            state = TAKEOVER_UNDECIDED
        if self.conn.closing or state is TAKEOVER_FAILED or state is TAKEOVER_UNAVAILABLE \
                or state is TAKEOVER_UNDECIDED or (state is not None and NOT_AGREED in state):
            if router.clients.get(self.client_id) is self:
                del router.clients[self.client_id]
            if state is TAKEOVER_UNDECIDED:
                self._refuse(Reason.SERVER_UNAVAILABLE, "a router that may hold its session is silent here but "
                             "heard by other nodes (the cluster does not agree it is gone); the client may "
                             "retry (elsewhere)")
            elif state is TAKEOVER_FAILED:
                self._refuse(Reason.SERVER_UNAVAILABLE, "its session is moving from another router and the "
                             "transfer broke off (the session stays there); the client may retry")
            elif state is TAKEOVER_UNAVAILABLE:
                self._refuse(Reason.SERVER_UNAVAILABLE, "a router of this node that may hold its session "
                             "is down (restarting); the client may retry")
            elif state is not None and NOT_AGREED in state:
                self._refuse(Reason.SERVER_UNAVAILABLE, state[NOT_AGREED])
            elif state is not None and state["persistent"] and self._newer_or_only(state):
                # Its old owner let the session go: keep it here, offline, as if this client left.
                session = router.import_session(self.client_id, state)
                router.schedule_expiry(session)
                router.rearm_will(session)
                if state.get("replica") and router.replication is not None:
                    router.replication.adopted(session, state)
                await self._durable(session)
            return
        if (state is not None and not connect.clean_start and self._claim(*state_owner(state), connect) is Claim.RESUME
                and self._newer_or_only(state)):
            state = await self._import_announced(state)
            if state is TAKEOVER_FAILED:
                return
        elif state is not None and state.get("replica") and router.replication is not None:
            # A clean start ends the copy a replica gave: its silent router must drop its own
            # too when it returns, or the old session would come back there.
            router.replication.fence(self.client_id, [state["replica"]])
        self._finish_connect(connect, state, assigned)
        self.conn.resume_reading(CONNECTING)

    def _newer_or_only(self, state: dict) -> bool:
        """Whether the copy of this client's session a takeover brought is to be taken in: there
        is none here, or the one here is older and is dropped (``yield_to_newer``)."""
        self.router.yield_to_newer(self.client_id, state)
        return self.client_id not in self.router.sessions

    async def _durable(self, session: Session) -> None:
        """Wait (bounded) until a persistent session taken in is in this router's snapshot: its
        old owner drops it from its own once told, and a crash of both in between (one node's
        two workers) would lose it."""
        state = self.router.state
        if state is None or not session.persistent:
            return
        try:
            await asyncio.wait_for(state.durable(), DURABLE_WAIT_S)
        except TimeoutError:
            log.warning("session %s: not in this router's snapshot within %g s; its old router is told it "
                        "is here all the same", self.client_id, DURABLE_WAIT_S)

    async def _import_announced(self, state: dict) -> dict | None:
        """Take in a session moved here from another router and hold the CONNACK, as a SUBACK is
        held, until every other router has acknowledged the interest its subscriptions announce:
        whatever is published anywhere after the CONNACK then reaches it. Returns None (the
        session is here now), or TAKEOVER_FAILED when the connection went away meanwhile (the
        session stays here, offline)."""
        router = self.router
        session = router.import_session(self.client_id, state)
        pending = router.interest_pending
        waits = [pending[f] for f in session.subscriptions if f in pending]
        acked = await asyncio.gather(*waits, return_exceptions=True) if waits else None
        await self._durable(session)
        # Its interest is known everywhere, and it is in this router's snapshot: the old owner
        # may let it go, and hands on what reached it meanwhile (``Router.hand_on``).
        router.mesh.confirm_takeover(self.client_id, acked)
        if state.get("replica") and router.replication is not None:
            # From the replica of a silent router: once its interest is known everywhere, ask the
            # other routers for what was on its way there (docs/replication.md, "Sessions").
            router.replication.adopted(session, state)
        elif state.get("silent") and router.replication is not None:
            # From a live router to which others were silent: ask them what they published.
            router.replication.moved_past_silence(session, state["silent"])
        if not self.conn.closing:
            return None
        if router.clients.get(self.client_id) is self:
            del router.clients[self.client_id]
        if session.persistent or session.expiry_s:
            router.schedule_expiry(session)
            router.rearm_will(session)
        else:
            router.end_session(session)
        return TAKEOVER_FAILED

    def _finish_connect(self, connect: Connect, remote_state: dict | None, assigned: bool) -> None:
        router = self.router
        client_id = self.client_id
        level = self.level
        persistent = not connect.clean_start
        asked = 0
        if level >= MQTT_5:
            asked = connect.properties.get(Prop.SESSION_EXPIRY_INTERVAL, 0)
            persistent = asked > 0
        limits = router.config.limits
        expiry = session_expiry(level, persistent, asked, limits)
        session = router.sessions.get(client_id)
        if session is not None and self._not_the_owner(connect, session):  # (one that came meanwhile)
            if router.clients.get(client_id) is self:
                del router.clients[client_id]
            return
        if remote_state is not None and session is None:
            session = router.import_session(client_id, remote_state)
        if session is not None and (self._replaces(session, connect) or connect.clean_start or not session.persistent):
            # The old session ends here: a will it held back goes out now (MQTT 5 3.1.3.2.2). One
            # that lasts only as long as its connection (3.1.1 clean session, MQTT 5 expiry 0) ends
            # with the connection this CONNECT takes over, and is never resumed (MQTT-3.1.2-6).
            # So does one of another identity (``_replaces``): nothing of it is this client's.
            will, owner = session.will, session.username
            router.end_session(session)
            session = None
            if will is not None:
                router.publish_will(will, owner)
        else:
            router.cancel_will(client_id)  # the session is resumed: its delayed will never goes
            router.in_doubt.pop(client_id, None)  # resumed here: a late confirmation leaves it here
        session_present = session is not None
        if session is None:
            session = router.new_session(client_id, persistent)
        else:
            session.persistent = persistent
            router.cancel_expiry(client_id)
        session.expiry_s = expiry
        self.session = session
        # Its owner (a resumed session is this identity's already): it goes where the session goes.
        session.username = self.username = connect.username
        session.owner_known = True
        router.clients[client_id] = self
        router.stats.connections += 1
        router.stats.connects_total += 1
        props: dict = {}
        receive_max = None
        if level >= MQTT_5:
            cp = connect.properties
            receive_max = cp.get(Prop.RECEIVE_MAXIMUM)
            self._problem_info = cp.get(Prop.REQUEST_PROBLEM_INFORMATION, 1) == 1
            props = {
                Prop.RETAIN_AVAILABLE: 1,
                Prop.WILDCARD_SUBSCRIPTION_AVAILABLE: 1,
                Prop.SHARED_SUBSCRIPTION_AVAILABLE: 1,
                Prop.SUBSCRIPTION_IDENTIFIER_AVAILABLE: 1,
                Prop.MAXIMUM_PACKET_SIZE: router.config.max_packet_size,
                Prop.RECEIVE_MAXIMUM: limits.max_qos2_pending,
            }
            if limits.max_topic_alias:
                props[Prop.TOPIC_ALIAS_MAXIMUM] = limits.max_topic_alias
            connack_limits(props, connect.keepalive, asked, expiry, limits, router.stats)
            if assigned:
                props[Prop.ASSIGNED_CLIENT_IDENTIFIER] = client_id
            # What it accepts of what is sent to it: a Maximum Packet Size, topic aliases.
            alias_max = cp.get(Prop.TOPIC_ALIAS_MAXIMUM, 0) if router.config.topic_alias_out else 0
            if Prop.MAXIMUM_PACKET_SIZE in cp or alias_max:
                self.conn.outbound = Outbound(cp.get(Prop.MAXIMUM_PACKET_SIZE, NO_LIMIT), alias_max)
        self.conn.accept(server_keepalive(connect.keepalive, limits), level)
        self.conn.send(encode(Connack(session_present, 0, props), level))
        # Like Mosquitto, one line per connect and disconnect, nothing per message; never the password.
        # At most CONNECTION_LINES_PER_SECOND of them, then a summary: a reconnect storm's lines
        # would cost as much CPU as its connects.
        CONNECTIONS.log(log, "client %s connected from %s (%s, %s, keepalive %d%s)", client_id, self.conn.peer,
                        _PROTOCOLS.get(level, f"protocol level {level}"),
                        "clean start" if connect.clean_start else
                        "session resumed" if session_present else "new persistent session",
                        connect.keepalive, f", user {connect.username!r}" if connect.username is not None else "")
        session.attach(self.conn, receive_max)
        if session.shared:
            router.shared_presence(session)
        pending, self._pending = self._pending, None
        for packet in pending or ():
            if self.conn.closing:
                break
            self.packet_received(packet)

    def move_away(self) -> None:
        """This node is cut off from the majority of the cluster (cluster.quorum): close with
        Use Another Server (MQTT 5; 3.1.1 clients just see the close) so that the client connects
        to the majority side, which serves its session from a replica. The client is not gone:
        a will without a delay is not published (one with a delay waits with the session, as
        on any close, and is cancelled when the session resumes elsewhere)."""
        if self.will is not None and not will_delay(self.will):
            self.will = None
        self.conn.close(Reason.USE_ANOTHER_SERVER)

    def taken_over(self) -> None:
        """The same client id connected elsewhere: close this connection (its will fires)."""
        if self._taken_over:
            return
        self._taken_over = True
        session = self._let_go()
        will = self.will
        if session is not None and will is not None and will_delay(will) and (session.persistent or session.expiry_s):
            # The delayed will waits with the session, wherever it goes: the new connection
            # publishes it if it starts clean (the session ends), drops it if it resumes
            # (MQTT-3.1.3-9); if the session stays here after all, it goes out when due.
            self.will = None
            self.router.delay_will(session, will, will_delay(will))
        if session is not None and session.shared:
            self.router.shared_presence(session)
        self.session = None
        CONNECTIONS.log(log, "client %s (%s): session taken over by a new connection", self.client_id, self.conn.peer)
        self.conn.close(Reason.SESSION_TAKEN_OVER)

    # -- PUBLISH --------------------------------------------------------------------------------------

    def _on_publish(self, p: Publish) -> None:
        qos = p.qos
        if qos > self._max_qos:
            raise ProtocolError("MQTT-3.2.2-11 QoS above the maximum", Reason.QOS_NOT_SUPPORTED)
        if p.properties and Prop.TOPIC_ALIAS in p.properties:
            self._resolve_alias(p)
        if (self.session.acl is not None or p.topic.startswith("$")) and not may_publish(self.session, p.topic):  # type: ignore[union-attr, arg-type]  # connected
            self.router.stats.acl_denied += 1  # ACL, or $SYS/
            ack = publish_refusal(self.client_id, self.level, p)
            if ack is not None:
                self.conn.send(ack)
            return
        router = self.router
        conn = self.conn
        conn.counters.msgs_in += 1
        conn.traffic.msgs_in += 1
        msg = Message.published(p.topic, p.payload, qos, p.retain, self.client_id, router.router_id,
                                p.properties, p.raw, conn.protocol_level)
        try:
            if qos == 0:
                router.publish(msg, conn)
            elif qos == 1:
                if self.held_acks:  # only --fsync always and replication hold PUBACKs back
                    self._receive_maximum(self.held_acks + len(self.session.inbound_qos2))  # type: ignore[union-attr]
                router.publish(msg, conn)
                self._acknowledge(success_ack(PUBACK, p.packet_id), msg)  # type: ignore[arg-type]
            else:
                session = self.session
                pid = p.packet_id
                if pid in session.inbound_qos2:  # type: ignore[union-attr]  # a DUP we already took
                    conn.send(success_ack(PUBREC, pid))  # type: ignore[arg-type]
                    return
                ids = session.inbound_qos2  # type: ignore[union-attr]
                if not ids:
                    router.qos2_sweeper.track(session)  # type: ignore[arg-type]
                else:
                    self._receive_maximum(len(ids) + self.held_acks)  # the held ones are QoS 1
                router.publish(msg, conn)
                session.qos2_ids().add(pid)  # type: ignore[union-attr, arg-type]
                self._acknowledge(success_ack(PUBREC, pid), msg)  # type: ignore[arg-type]
        except LogUnavailable as exc:
            self._refuse_publish(p, exc)

    def _receive_maximum(self, unacknowledged: int) -> None:
        """MQTT 5 flow control (4.9): a client may have at most Receive Maximum (CONNACK, the
        --max-qos2-pending value) QoS 1/2 PUBLISHes unacknowledged: QoS 2 ones until their
        PUBREL, QoS 1 ones while their PUBACK waits for the disk. One more: DISCONNECT 0x93."""
        if unacknowledged >= self.router.config.limits.max_qos2_pending:
            self.router.stats.limit_qos2_pending += 1
            raise ProtocolError(f"more than {unacknowledged} QoS 1/2 messages unacknowledged (Receive Maximum)",
                                Reason.RECEIVE_MAXIMUM_EXCEEDED)

    def _resolve_alias(self, p: Publish) -> None:
        """MQTT 5 topic alias from the client (3.3.2.3.4): a topic with an alias sets the mapping,
        an empty topic uses it. Out of 1..--max-topic-alias: DISCONNECT 0x94; an alias never set
        on this connection: protocol error 0x82, as Mosquitto answers. The alias is taken out of
        the message's properties: it means nothing beyond this connection."""
        props = dict(p.properties)
        alias = props.pop(Prop.TOPIC_ALIAS)
        limit = self.router.config.limits.max_topic_alias
        if not 0 < alias <= limit:
            raise ProtocolError(f"topic alias {alias} outside 1..{limit} (Topic Alias Maximum)",
                                Reason.TOPIC_ALIAS_INVALID)
        aliases = self._aliases
        if aliases is None:
            aliases = self._aliases = {}
        if p.topic:
            aliases[alias] = p.topic
        else:
            topic = aliases.get(alias)
            if topic is None:
                raise ProtocolError(f"MQTT-3.3.4 topic alias {alias} used before it was set on this connection",
                                    Reason.PROTOCOL_ERROR)
            p.topic = topic
        p.properties = props

    def _acknowledge(self, ack: bytes, msg: Message) -> None:
        """A logged message's acknowledgement waits for its record (``Router.defer_ack``: written,
        durable with --fsync always, on enough nodes with replication); an unlogged one's (the
        log off, a $SYS topic) goes out with this iteration's writes."""
        if msg.log_offset >= 0:
            self.router.defer_ack(msg.log_offset, self, ack)
        else:
            self.conn.send(ack)

    def _refuse_publish(self, p: Publish, exc: Exception) -> None:
        """The log cannot take a QoS 1/2 message: never acknowledge what would be lost.
        MQTT 5 gets a negative acknowledgement; MQTT 3.1.1 has none, so the connection is closed
        and the client resends after reconnecting."""
        if self.level >= MQTT_5:
            ack = Puback if p.qos == 1 else Pubrec
            why = {Prop.REASON_STRING: "commit log unavailable"} if self._problem_info else {}
            self.conn.send(encode(ack(p.packet_id, Reason.IMPLEMENTATION_SPECIFIC_ERROR, why),  # type: ignore[arg-type]
                                  self.level))
            return
        log.warning("client %s (%s): QoS %d publish refused, commit log unavailable (%s); closing",
                    self.client_id, self.conn.peer, p.qos, exc)
        self.conn.close()

    # -- SUBSCRIBE / UNSUBSCRIBE ----------------------------------------------------------------------

    def _on_subscribe(self, p: Subscribe) -> None:
        if any(s.no_local and is_shared(s.topic_filter) for s in p.subscriptions):
            # Checked before any filter of the packet takes effect: the whole packet is refused.
            raise ProtocolError("MQTT-3.8.3-4 No Local set on a shared subscription", Reason.PROTOCOL_ERROR)
        sub_id = p.properties.get(Prop.SUBSCRIPTION_IDENTIFIER, 0) if p.properties else 0
        if sub_id.__class__ is list:  # the codec keeps a property that may repeat as a list
            sub_id = sub_id[0] if sub_id else 0
        self._take_filters(p, sub_id, 0, [], [], [])

    def _take_filters(self, p: Subscribe, sub_id: int, start: int, codes: list[int],
                      retained_out: list[tuple[Subscription, bool, int]], announced: list[str]) -> None:
        """Take FILTERS_PER_TURN of the packet's filters from ``start``, the rest a slice per later
        loop turn, and answer once all are taken. One SUBSCRIBE of 150,000 filters took its
        worker for 80 ms in one turn; the other clients' packets are read and answered in between
        now, while this client's later packets are held (``Connection.hold``), so that their
        effects follow its SUBACK. Each subscription is live from its slice: what is retained
        after it went out live (``made``, the retained store's ``seq`` then)."""
        conn = self.conn
        session = self.session
        if start and (conn.closing or session is None or session.conn is not conn):
            return  # closed or taken over meanwhile: nobody to answer, nothing held to release
        assert session is not None
        router = self.router
        limits = router.config.limits
        made = router.retained.seq
        subs = p.subscriptions
        end = min(len(subs), start + FILTERS_PER_TURN)
        for sub in subs[start:end] if start or end < len(subs) else subs:
            f = sub.topic_filter
            shared = is_shared(f)
            if (not valid_topic_filter(f) or (shared and parse_share(f) is None)
                    or not topic_levels_ok(f, conn.max_topic_levels)):
                REFUSED_FILTERS.log(log, "client %s: invalid topic filter %r refused", self.client_id, f[:200])
                codes.append(0x80 if self.level < MQTT_5 else Reason.TOPIC_FILTER_INVALID)
                continue
            if over_subscription_quota(session, f, shared, limits, router.stats):
                REFUSED_FILTERS.log(log, "client %s: filter %r refused, %d subscriptions already", self.client_id,
                                    f[:200], len(session.subscriptions) + len(session.shared))
                codes.append(0x80 if self.level < MQTT_5 else Reason.QUOTA_EXCEEDED)
                continue
            if session.acl is not None and not may_subscribe(session, f, shared):
                router.stats.acl_denied += 1
                codes.append(0x80 if self.level < MQTT_5 else Reason.NOT_AUTHORIZED)
                continue
            granted = min(sub.qos, self._max_qos)
            if granted != sub.qos or sub_id:  # the identifier is kept with the subscription (MQTT 5 3.8.2.1.2)
                sub = Subscription(f, granted, sub.no_local, sub.retain_as_published, sub.retain_handling,
                                   sub_id)
            codes.append(granted)
            announced.append(f)
            if shared:  # no retained messages on establishing a shared subscription (MQTT 4.8.2)
                router.subscribe_shared(session, sub)
                continue
            new = router.subscribe(session, sub)
            retained_out.append((sub, new, made))
        if end < len(subs):
            if not start:
                conn.hold(SUBSCRIBING)
            asyncio.get_running_loop().call_soon(self._take_filters, p, sub_id, end, codes, retained_out, announced)
            return
        if start:
            conn.resume_reading(SUBSCRIBING)  # the held packets follow, in the next turn
        suback = encode(Suback(p.packet_id, codes), self.level)
        pending = router.interest_pending
        waits = [pending[f] for f in announced if f in pending]
        if not waits and retained_out:
            # No announcement to wait for, but the retained messages here may lag a peer's: wait
            # until every peer has answered, and so has handed over any retained update it
            # acknowledged before this SUBSCRIBE (a cleared one must not come back).
            barrier = router.mesh.barrier()
            if barrier is not None:
                waits.append(barrier)
        if waits:
            # Other routers have not confirmed this interest yet: SUBACK once they have, so that
            # whatever is published anywhere after the SUBACK reaches this subscriber. The
            # subscriptions are live here meanwhile: what a publish here retains until then
            # reaches them live, and is not sent again with the SUBACK (``made``).
            asyncio.ensure_future(self._suback_when_acked(waits, suback, retained_out))
            return
        self._suback(suback, retained_out)

    async def _suback_when_acked(self, waits: list, suback: bytes, retained_out: list) -> None:
        await asyncio.gather(*waits, return_exceptions=True)
        if not self.conn.closing and self.session is not None:
            self._suback(suback, retained_out, True)

    def _suback(self, suback: bytes, retained_out: list[tuple[Subscription, bool, int]],
                waited: bool = False) -> None:
        self.conn.send(suback)
        router = self.router
        session = self.session
        assert session is not None
        if retained_out:
            router.stats.state_moves += 1  # retained messages may queue behind a full window
        store = router.retained
        # A slice per loop turn (router.retained_out). What was set since a subscription was made
        # went out live (``made``); after a wait for the peers, what a peer set meanwhile may not
        # have, and goes out now: only what is set from the SUBACK on is left out.
        walks = [(sub, store.iter_match(sub.topic_filter, made, before=store.seq) if waited
                  else store.iter_match(sub.topic_filter, before=made))
                 for sub, new, made in retained_out
                 if sub.retain_handling == 0 or (sub.retain_handling == 1 and new)]
        if walks:
            RetainedOut(session, walks).start()

    def _on_unsubscribe(self, p: Unsubscribe) -> None:
        session = self.session
        assert session is not None
        codes: list[int] = []
        for f in p.topic_filters:
            if is_shared(f):
                existed = self.router.unsubscribe_shared(session, f)
            else:
                existed = self.router.unsubscribe(session, f)
            codes.append(Reason.SUCCESS if existed else Reason.NO_SUBSCRIPTION_EXISTED)
        self.conn.send(encode(Unsuback(p.packet_id, codes), self.level))


