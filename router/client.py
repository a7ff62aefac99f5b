"""What the packets of one client connection mean: CONNECT, PUBLISH, SUBSCRIBE ... in MQTT terms.

``Client`` is the ``connection.protocol.Handler`` the router hands to each connection. It decides
in MQTT 5 reason codes and lets the codec and ``connack_code`` express the decision in the client's
protocol level. Its CONNECT is taken by a part of its own (``router.connecting.Connecting``), which
may wait for the cluster (a takeover of the same client id on another router); packets that arrive
meanwhile are held (``pending``) and processed in order once the session is ready.
"""

from __future__ import annotations

import asyncio
import logging
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

from .access import may_subscribe, publish_refusal
from .auth import may_publish
from .connecting import Connecting
from .limits import listener_closed, listener_opened, over_subscription_quota, session_expiry
from .log.errors import LogUnavailable
from .message import Message, will_delay
from .retained_out import RetainedOut
from .shared import is_shared, parse_share
from .topics import valid_topic_filter

if TYPE_CHECKING:
    from brokerd.connection.protocol import Connection

    from .router import Router
    from .session import Session

log = logging.getLogger(__name__)

SUBSCRIBING = "subscribing"  # the hold cause while a SUBSCRIBE's filters are taken a slice per turn
FILTERS_PER_TURN = 1024  # filters of one SUBSCRIBE taken per loop turn (valid ones: about 5 ms)


class Client:
    MAX_QOS = 2  # the highest QoS taken from a client and granted to its subscriptions (every client's)

    __slots__ = ("conn", "router", "session", "client_id", "level", "will", "pending", "_connecting",
                 "_taken_over", "unconnected", "listener", "_aliases", "problem_info", "held_acks",
                 "username")

    def __init__(self, router: Router, conn: Connection) -> None:
        self.router = router
        self.conn = conn
        self.session: Session | None = None
        self.client_id = ""
        self.level = 4
        self.will: Message | None = None
        self.pending: list[Packet] | None = None
        self._connecting = False
        self._taken_over = False
        # A socket not yet CONNECTed holds a place under --max-connections until its CONNECT.
        self.unconnected = True
        router.stats.unconnected += 1
        self.listener = listener_opened(router, conn)
        self._aliases: dict[int, str] | None = None  # topic aliases this client set (MQTT 5)
        self.problem_info = True  # MQTT 5 Request Problem Information: reason strings wanted
        self.held_acks = 0  # QoS 1/2 acknowledgements waiting for the disk or the followers
        self.username: str | None = None  # its identity, once connected (its will is published as it)

    # -- Handler interface ----------------------------------------------------------------------------

    def packet_received(self, packet: Packet) -> None:
        if self.session is None:
            if type(packet) is Connect and not self._connecting:
                self._connecting = True
                Connecting(self).start(packet)
            elif self.pending is not None:
                self.pending.append(packet)
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
        router.live_connections.discard(self.conn)
        self.counted_connected()
        if self.listener is not None:
            listener_closed(router, self.listener)
            self.listener = None
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

    def counted_connected(self) -> None:
        """No longer one of ``stats.unconnected``: connected, refused or gone. A CONNECT counts
        there until its answer, the other routers' answers about its session awaited included,
        so that a burst of CONNECTs cannot pass ``--max-connections`` while none is counted."""
        if self.unconnected:
            self.unconnected = False
            self.router.stats.unconnected -= 1

    def refuse(self, reason: Reason, why: str) -> None:
        self.counted_connected()  # its socket is closing: it holds no place
        self.will = None  # a refused CONNECT made no session: its will is never published (MQTT-3.1.2-8)
        CONNECTIONS.log(log, "client %r (%s) refused: %s", self.client_id, self.conn.peer, why)
        self.conn.send(encode(Connack(False, connack_code(reason, self.level)), self.level))
        self.conn.close()

    def identity_revoked(self) -> None:
        """Its user left the password file (a reload, ``access.install_auth``): disconnected. Its
        will goes with it (nobody may publish as that user now); its session stays, for the
        user if it is added again."""
        self.will = None
        self.conn.close(Reason.NOT_AUTHORIZED)

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
        if qos > self.MAX_QOS:
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
                                p.properties, p.raw, conn.protocol_level, int(router.clock.unix() * 1000))
        try:
            if qos == 0:
                router.publish(msg, conn)
            elif qos == 1:
                if self.held_acks:  # only --fsync always and replication hold PUBACKs back
                    # (mypy: held acks come after CONNECT: a session is attached)
                    self._receive_maximum(self.held_acks + len(self.session.inbound_qos2))  # type: ignore[union-attr]
                router.publish(msg, conn)
                self._acknowledge(success_ack(PUBACK, p.packet_id), msg)  # type: ignore[arg-type]
            else:
                session = self.session
                pid = p.packet_id
                if pid in session.inbound_qos2:  # type: ignore[union-attr]  # a DUP we already took
                    conn.send(success_ack(PUBREC, pid))  # type: ignore[arg-type]
                    return
                # (mypy: below, a session is attached (after CONNECT) and a QoS 2 PUBLISH has a packet id)
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
            why = {Prop.REASON_STRING: "commit log unavailable"} if self.problem_info else {}
            # (mypy: a QoS 1/2 PUBLISH has a packet id)
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
            granted = min(sub.qos, self.MAX_QOS)
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
            router.clock.call_soon(self._take_filters, p, sub_id, end, codes, retained_out, announced)
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


