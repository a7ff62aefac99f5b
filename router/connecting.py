"""How one CONNECT becomes a session: the listener's rules and authentication, the limits, the
owner of a session already here, and, in a cluster, the takeover of the session from wherever it
is (and the agreement on its owner) before the CONNACK.

``Connecting`` is the part a ``Client`` makes when its CONNECT arrives (uvicorn's per-request
cycle): it holds what the flow needs across its awaits, sets up the client (its client id,
level, will, session) and hands it the packets held meanwhile. Once the CONNACK is sent, or the
CONNECT refused, the client goes on alone (``router.client``).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from brokerd.connection.codec import encode
from brokerd.connection.packets import MQTT_5, Connack, Connect, Prop
from brokerd.connection.ratelimit import CONNECTIONS
from brokerd.connection.reasons import Reason

from .access import AUTHENTICATING, Access, anonymous_check, authenticate, decided, plugin_reason
from .limits import connack_limits, connect_refused, listener_refused, server_keepalive, session_expiry
from .message import Message
from .outbound import NO_LIMIT, Outbound
from .ownership import REFUSE, REFUSED, Claim, decide, name, state_owner
from .ports import NOT_AGREED, TAKEOVER_FAILED, TAKEOVER_UNAVAILABLE, TAKEOVER_UNDECIDED
from .spool import drop_named

if TYPE_CHECKING:
    from brokerd.connection.protocol import Connection

    from .client import Client
    from .router import Router
    from .session import Session

log = logging.getLogger("brokerd.router.client")  # (where these lines were always logged)

CONNECTING = "connecting"  # the pause_reading cause while a CONNECT waits for the cluster
DURABLE_WAIT_S = 5.0  # a session taken over waits this long at most to be in this router's snapshot
_PROTOCOLS = {3: "MQTT 3.1", 4: "MQTT 3.1.1", 5: "MQTT 5.0"}  # protocol level → what an operator calls it


class Connecting:
    """One CONNECT of ``client``, from its first check to its CONNACK (or refusal)."""

    __slots__ = ("client", "router", "conn")

    def __init__(self, client: Client) -> None:
        self.client = client
        self.router: Router = client.router
        self.conn: Connection = client.conn

    def start(self, connect: Connect) -> None:
        """CONNECT: the listener's rules and ``router.auth`` decide first (``router.access``)."""
        client = self.client
        router = self.router
        access = anonymous_check(router.auth, self.conn, connect)
        if access.anonymous:
            connect.username = connect.password = None
        if access.refused is None and router.auth is not None:
            client.level = connect.protocol_level
            client.client_id = connect.client_id
            access = authenticate(router.auth, router.acl, self.conn, connect)
            if access.pending is not None:  # a plugin is asked: hold what the client sends meanwhile
                client.pending = []
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
        client = self.client
        if access.refused is None:
            self._start_connect(connect)
            return
        client.level = connect.protocol_level
        client.client_id = connect.client_id
        self.router.stats.auth_failures += 1
        client.pending = None
        client.refuse(access.refused, access.why)  # never the password

    def _start_connect(self, connect: Connect) -> None:
        client = self.client
        router = self.router
        client.level = connect.protocol_level
        client_id = connect.client_id
        assigned = False
        if connect_refused(client, connect, router.config.limits, router.stats):
            return
        if client.level >= MQTT_5 and Prop.AUTHENTICATION_METHOD in connect.properties:
            # Enhanced authentication (AUTH exchanges): no method is supported, as Mosquitto
            # without an auth plugin that offers one (MQTT 5 4.12).
            client.client_id = client_id
            client.refuse(Reason.BAD_AUTHENTICATION_METHOD, "enhanced authentication method "
                          f"{connect.properties[Prop.AUTHENTICATION_METHOD]!r} not supported")
            return
        if not client_id:
            if not connect.clean_start and client.level < MQTT_5:
                client.client_id = ""
                client.refuse(Reason.CLIENT_IDENTIFIER_NOT_VALID,
                              "MQTT-3.1.3-8 empty client id requires clean session")
                return
            client_id = "auto-" + uuid.uuid4().hex
            assigned = True
        client.client_id = client_id
        self.conn.client_id = client_id
        # A CONNECT counts as unconnected until it is answered (``Client.counted_connected``).
        # Its own place is not held against it.
        others = router.stats.unconnected - (1 if client.unconnected else 0)
        if router.stats.connections + others >= router.config.max_connections:
            router.stats.refused_connections += 1
            client.refuse(Reason.SERVER_BUSY, f"max connections ({router.config.max_connections}) reached")
            return
        if client.listener is not None and listener_refused(client, client.listener):
            return
        if client.pending is None:  # else it holds what came while a plugin was asked
            client.pending = []
        if self._not_the_owner(connect, router.sessions.get(client_id)):
            return  # before its owner's connection is closed: the session stays as it is
        local = router.clients.get(client_id)
        if local is not None:
            if local.session is None and self._claim(True, local.username, connect) is Claim.REFUSE:
                # Another identity's CONNECT with this client id still waits for the other
                # routers' answer: whose the session is is not known yet, and closing it would let
                # any user knock its owner off. This one may try again once that one is settled.
                router.stats.refused_connections += 1
                client.refuse(Reason.SERVER_UNAVAILABLE, f"user {name(local.username)} is connecting with "
                              "this client id (--session-owner refuse); the client may retry")
                return
            local.taken_over()
        if not router.clustered:
            self._finish_connect(connect, None, assigned)
            return
        replication = router.replication
        if replication is not None and not connect.clean_start:
            replication.check_paused()
        if replication is not None and not connect.clean_start and replication.in_minority:
            # A partition's minority side takes no session in: the majority may be serving it.
            client.refuse(Reason.SERVER_UNAVAILABLE, "this node is cut off from the majority of the cluster; "
                          "the client may retry (elsewhere)")
            return
        # Another router may hold this client id: ask the cluster first (bounded wait). Until the
        # CONNACK, nothing more is read from the client: what it pipelined behind the CONNECT in
        # this read is held (one read's worth), the rest waits in its socket.
        client.username = connect.username  # the identity it proved (``access.removed_user``, the claim above)
        router.clients[client_id] = client
        self.conn.pause_reading(CONNECTING)
        answered: set[str] = set()
        router.mesh.takeover_then(client_id, [connect.username, router.config.session_owner == REFUSE], answered,
                                  lambda state: self._taken(connect, assigned, answered, state))  # bounded

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
        client = self.client
        self.router.stats.auth_failures += 1
        client.refuse(Reason.NOT_AUTHORIZED, f"its session belongs to user {name(owner)}"
                      f"{f' (on router {where})' if where else ''}, not to user {name(connect.username)} "
                      "(--session-owner refuse)")

    def _replaces(self, session: Session, connect: Connect) -> bool:
        """Whether the session here is not this client's to resume: another identity's, with
        --session-owner replace, or one whose owner is unknown (``router.ownership``). It ends,
        logged, and this client gets a clean session."""
        client = self.client
        if self._claim(session.owner_known, session.username, connect) is Claim.RESUME:
            return False
        CONNECTIONS.log(log, "session %s of %s dropped: user %s connected with its client id and gets a clean "
                        "session (--session-owner %s)", client.client_id,
                        f"user {name(session.username)}" if session.owner_known else "an unknown user",
                        name(connect.username), self.router.config.session_owner)
        return True

    def _taken(self, connect: Connect, assigned: bool, answered: set[str], state: dict | None) -> None:
        """The cluster's answer to this CONNECT's takeover (``MeshPort.takeover_then``): settled
        now, or, with --agreement, once this router's claim is decided (``_agree``). A connect
        storm's CONNECTs make no task here: a task and its coroutines cost more than the rest
        of the settling (docs/benchmarks.md, "A connect with two workers: one ask frame out")."""
        if self.router.owners is not None:  # (a connection closed meanwhile too: its session is kept here)
            asyncio.ensure_future(self._agreed(connect, assigned, answered, state))
            return
        self._settle(connect, assigned, state)

    async def _agreed(self, connect: Connect, assigned: bool, answered: set[str], state: dict | None) -> None:
        self._settle(connect, assigned, await self._agree(connect, state, answered))

    def _settle(self, connect: Connect, assigned: bool, state: dict | None) -> None:
        """``_settle_connect``, then the takeover confirmed (``_settled``): at once, or once what
        it returned to wait for (a session taken in) is over."""
        waits: Awaitable[None] | None = None
        try:
            waits = self._settle_connect(connect, assigned, state)
        finally:
            if waits is None:
                self._settled(state)
        if waits is not None:
            asyncio.ensure_future(self._settle_waits(waits, state))

    async def _settle_waits(self, waits: Awaitable[None], state: dict | None) -> None:
        try:
            await waits
        finally:
            self._settled(state)

    def _settled(self, state: dict | None) -> None:
        """The CONNECT is settled: its takeover confirmed (done already where the session's
        interest was waited for), and a backlog spooled for a session not taken in dropped."""
        client_id = self.client.client_id
        router = self.router
        router.mesh.confirm_takeover(client_id)
        if isinstance(state, dict) and state.get("spool"):
            spooled = state["spool"]
            session = router.sessions.get(client_id)
            if session is None or all(r.directory != spooled[0] for r in session.ranges):
                drop_named(state)  # not taken in (a clean start): its backlog ends here

    async def _agree(self, connect: Connect, state: dict | None, answered: set[str]) -> dict | None:
        """With agreement on (``--agreement``), the session a takeover brought counts only once
        this router is its agreed owner (``cluster.agreement.owners``): a resumed session is
        claimed, a refused claim undoes the takeover (the session stays where it was) and refuses
        the CONNECT; a clean start releases whatever record the session had."""
        client = self.client
        router = self.router
        owners = router.owners
        assert owners is not None  # the caller's test
        if state is not None and (REFUSED in state or state is TAKEOVER_FAILED or state is TAKEOVER_UNAVAILABLE):
            return state
        if connect.clean_start:
            if state is not None or owners.owns(client.client_id) or client.client_id in router.sessions:
                owners.forget(client.client_id)
            return state
        if state is None:
            source = router.router_id if client.client_id in router.sessions else None
        else:
            source = state.get("replica") or state.get("offered_by")
        why = await owners.claim(client.client_id, source, answered)
        if why is None:
            return state
        router.mesh.abort_takeover(client.client_id)
        if state is not None:
            drop_named(state)
        return {NOT_AGREED: why}

    def _settle_connect(self, connect: Connect, assigned: bool, state: dict | None) -> Awaitable[None] | None:
        """The CONNECT with the takeover's ``state``: refused, or accepted (CONNACK); what is
        left to wait for where a session is taken in (``_durable``, ``_resume``), else None."""
        client = self.client
        router = self.router
        if state is not None and REFUSED in state:  # another identity's session (router.ownership)
            if router.clients.get(client.client_id) is client:
                del router.clients[client.client_id]
            if not self.conn.closing:
                self._refuse_claim(connect, *state[REFUSED])
            return None
        if state is None and not connect.clean_start and router.replication is not None and router.owners is None \
                and router.replication.undecided():
            state = TAKEOVER_UNDECIDED
        if self.conn.closing or state is TAKEOVER_FAILED or state is TAKEOVER_UNAVAILABLE \
                or state is TAKEOVER_UNDECIDED or (state is not None and NOT_AGREED in state):
            if router.clients.get(client.client_id) is client:
                del router.clients[client.client_id]
            if state is TAKEOVER_UNDECIDED:
                client.refuse(Reason.SERVER_UNAVAILABLE, "a router that may hold its session is silent here but "
                              "heard by other nodes (the cluster does not agree it is gone); the client may "
                              "retry (elsewhere)")
            elif state is TAKEOVER_FAILED:
                client.refuse(Reason.SERVER_UNAVAILABLE, "its session is moving from another router and the "
                              "transfer broke off (the session stays there); the client may retry")
            elif state is TAKEOVER_UNAVAILABLE:
                client.refuse(Reason.SERVER_UNAVAILABLE, "a router of this node that may hold its session "
                              "is down (restarting); the client may retry")
            elif state is not None and NOT_AGREED in state:
                client.refuse(Reason.SERVER_UNAVAILABLE, state[NOT_AGREED])
            elif state is not None and state["persistent"] and self._newer_or_only(state):
                # Its old owner let the session go: keep it here, offline, as if this client left.
                session = router.import_session(client.client_id, state)
                router.schedule_expiry(session)
                router.rearm_will(session)
                if state.get("replica") and router.replication is not None:
                    router.replication.adopted(session, state)
                return self._durable(session)
            return None
        if (state is not None and not connect.clean_start and self._claim(*state_owner(state), connect) is Claim.RESUME
                and self._newer_or_only(state)):
            return self._resume(connect, assigned, state)
        if state is not None and state.get("replica") and router.replication is not None:
            # A clean start ends the copy a replica gave: its silent router must drop its own
            # too when it returns, or the old session would come back there.
            router.replication.fence(client.client_id, [state["replica"]])
        self._finish_connect(connect, state, assigned)
        self.conn.resume_reading(CONNECTING)
        return None

    async def _resume(self, connect: Connect, assigned: bool, state: dict) -> None:
        """A session moved here, resumed: taken in (``_import_announced``), then the CONNACK."""
        if await self._import_announced(state) is TAKEOVER_FAILED:
            return
        self._finish_connect(connect, None, assigned)
        self.conn.resume_reading(CONNECTING)

    def _newer_or_only(self, state: dict) -> bool:
        """Whether the copy of this client's session a takeover brought is to be taken in: there
        is none here, or the one here is older and is dropped (``yield_to_newer``)."""
        client = self.client
        self.router.yield_to_newer(client.client_id, state)
        return client.client_id not in self.router.sessions

    async def _durable(self, session: Session) -> None:
        """Wait (bounded) until a persistent session taken in is in this router's snapshot: its
        old owner drops it from its own once told, and a crash of both in between (one node's
        two workers) would lose it."""
        client = self.client
        state = self.router.state
        if state is None or not session.persistent:
            return
        try:
            await asyncio.wait_for(state.durable(), DURABLE_WAIT_S)
        except TimeoutError:
            log.warning("session %s: not in this router's snapshot within %g s; its old router is told it "
                        "is here all the same", client.client_id, DURABLE_WAIT_S)

    async def _import_announced(self, state: dict) -> dict | None:
        """Take in a session moved here from another router and hold the CONNACK, as a SUBACK is
        held, until every other router has acknowledged the interest its subscriptions announce:
        whatever is published anywhere after the CONNACK then reaches it. Returns None (the
        session is here now), or TAKEOVER_FAILED when the connection went away meanwhile (the
        session stays here, offline)."""
        client = self.client
        router = self.router
        session = router.import_session(client.client_id, state)
        pending = router.interest_pending
        waits = [pending[f] for f in session.subscriptions if f in pending]
        acked = await asyncio.gather(*waits, return_exceptions=True) if waits else []
        await self._durable(session)
        # Its interest is known everywhere, and it is in this router's snapshot: the old owner
        # may let it go, and hands on what reached it meanwhile (``Router.hand_on``). A filter
        # this router had already (another session's, announced before) has no wait above, and
        # how far a peer's log is seen here may lie before where the peer took it in: the copies
        # it sent the old owner in between would be taken for direct ones (partition seed 363).
        # So each peer's marks are no lower than where it took this router's filters in.
        router.mesh.confirm_takeover(client.client_id, [*acked, dict(router.interest_taken)])
        if state.get("replica") and router.replication is not None:
            # From the replica of a silent router: once its interest is known everywhere, ask the
            # other routers for what was on its way there (docs/replication.md, "Sessions").
            router.replication.adopted(session, state)
        elif state.get("silent") and router.replication is not None:
            # From a live router to which others were silent: ask them what they published.
            router.replication.moved_past_silence(session, state["silent"])
        if not self.conn.closing:
            return None
        if router.clients.get(client.client_id) is client:
            del router.clients[client.client_id]
        if session.persistent or session.expiry_s:
            router.schedule_expiry(session)
            router.rearm_will(session)
        else:
            router.end_session(session)
        return TAKEOVER_FAILED

    def _finish_connect(self, connect: Connect, remote_state: dict | None, assigned: bool) -> None:
        client = self.client
        router = self.router
        client_id = client.client_id
        level = client.level
        persistent = not connect.clean_start
        asked = 0
        if level >= MQTT_5:
            asked = connect.properties.get(Prop.SESSION_EXPIRY_INTERVAL, 0)
            persistent = asked > 0
        limits = router.config.limits
        expiry = session_expiry(level, persistent, asked, limits)
        session = router.sessions.get(client_id)
        if session is not None and self._not_the_owner(connect, session):  # (one that came meanwhile)
            if router.clients.get(client_id) is client:
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
        client.session = session
        # Its owner (a resumed session is this identity's already): it goes where the session goes.
        session.username = client.username = connect.username
        session.owner_known = True
        if connect.will is not None:  # stored once the CONNECT is accepted (MQTT-3.1.2-8), not while it waits
            w = connect.will
            client.will = Message(w.topic, w.payload, w.qos, w.retain, client_id, router.router_id,
                                  properties=w.properties or None)
        router.clients[client_id] = client
        client.counted_connected()
        router.stats.connections += 1
        router.stats.connects_total += 1
        props: dict = {}
        receive_max = None
        if level >= MQTT_5:
            cp = connect.properties
            receive_max = cp.get(Prop.RECEIVE_MAXIMUM)
            client.problem_info = cp.get(Prop.REQUEST_PROBLEM_INFORMATION, 1) == 1
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
            # (the client's Topic Alias Maximum, cut to the broker's own: each alias holds a topic)
            alias_max = min(cp.get(Prop.TOPIC_ALIAS_MAXIMUM, 0), limits.max_topic_alias_out) \
                if router.config.topic_alias_out else 0
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
        pending, client.pending = client.pending, None
        for packet in pending or ():
            if self.conn.closing:
                break
            client.packet_received(packet)
