"""Shared subscriptions ($share/group/filter) as the router routes them: one member per group gets
each message, wherever in the cluster the members are.

A part the router owns (``router.shared``; rumqttd's model: the router composes parts, each a
file): this router's members per group (``SharedGroup``), every router's presence per group
(``SharedRoute``, announced with the interest announcements), the choice of one router per group
for each publish, and handing a message on when a member's session ends before acknowledging it.
It is given what it uses of the router: its links (``Wiring``: the mesh), the peer routers
interested in a topic, and two notices (a persistent session changed; an announcement waits
for its acknowledgements).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from brokerd.connection.packets import Subscription

from .message import Message
from .session import Session
from .shared import NONE, SharedGroup, SharedRoute, parse_share
from .topics import TopicIndex, remember

if TYPE_CHECKING:
    from .clock import Clock
    from .ports import Source
    from .stats import RouterStats
    from .wiring import Wiring

log = logging.getLogger(__name__)

# A group's copy that reaches a router knowing no router of its group waits this long for one to
# be announced (``SharedRoutes.held``); at most this many wait (beyond: dropped, counted).
HELD_S = 10.0
HELD_MAX = 10_000


class SharedRoutes:
    def __init__(self, router_id: str, stats: RouterStats, clock: Clock, wiring: Wiring,
                 peers: Callable[[str], tuple[str, ...]], session_changed: Callable[[Session], None],
                 interest_ack: Callable[[str, Awaitable[None] | None], None]) -> None:
        self.router_id = router_id
        self.stats = stats
        self.clock = clock
        self.wiring = wiring
        self._peers = peers  # the peer routers interested in a topic (the router's folded routes)
        self._session_changed = session_changed
        self._interest_ack = interest_ack
        # This router's members per key, every router's presence per key (this one's included),
        # and the routes matching each topic. ``active`` keeps the publish path of a cluster
        # without any shared subscription to one attribute test.
        self.local: dict[str, SharedGroup] = {}
        self.routes: dict[str, SharedRoute] = {}
        self.index: TopicIndex[str, SharedRoute] = TopicIndex()
        self.cache: dict[str, tuple[SharedRoute, ...]] = {}
        self.active = False
        # Group copies chosen for this router that found no member here and no router of their
        # group known (this router just restarted: the peers' presence comes with their interest,
        # after the frames they send again): key -> (until when, the copies).
        self.held: dict[str, tuple[float, list[Message]]] = {}
        self._held_count = 0
        # Members exported to another router, their move not settled yet (``leave``): key -> the
        # sessions; and the group copies kept for each (client id -> (copy, key)), which found no
        # member here and no other router of their group (``_for_moving``). Empty but during moves.
        self.moving: dict[str, list[Session]] = {}
        self.kept: dict[str, list[tuple[Message, str]]] = {}

    # -- shared subscriptions: publishing -------------------------------------------------------------

    def fold(self, topic: str) -> tuple[SharedRoute, ...]:
        routes = tuple(route for _, route in self.index.match(topic))
        remember(self.cache, topic, routes)
        return routes

    def publish(self, msg: Message, routes: tuple[SharedRoute, ...], source: Source | None) -> None:
        """Pick one router per group; each peer still gets one copy, naming its groups if any."""
        picked = self._pick_routers(msg, routes)
        mesh = self.wiring.mesh
        for rid in self._peers(msg.topic):
            mesh.forward(rid, msg, source, picked.pop(rid, None))
        for rid, groups in picked.items():
            mesh.forward(rid, msg, source, groups)

    def _pick_routers(self, msg: Message, routes: tuple[SharedRoute, ...]) -> dict[str, list[str]]:
        """One router per group of ``routes``: a member here gets ``msg`` now; returns the other
        routers picked, with their groups. Where this router is picked and none of its members
        may read ``msg`` (a reload revoked their grant: ``_to_member``), another router of the
        group is picked instead, whose members' grants may differ (MQTT 4.8.2: the message is
        owed to one member of the group); it hands the copy on once more at most."""
        me = self.router_id
        picked: dict[str, list[str]] = {}
        for route in routes:
            rid = route.choose()
            if rid == me:
                if self._to_member(msg, route.key) or (self.moving and self._for_moving(msg, route.key)):
                    continue
                rid = route.choose_other(me)
                if rid is None:
                    self.stats.shared_no_member += 1
                    continue
            if rid is not None:
                picked.setdefault(rid, []).append(route.key)
        return picked

    def to_groups(self, msg: Message) -> int:
        """``msg`` for the shared groups alone (read back from a dead router's replica: the plain
        subscribers get theirs through each router's own catch-up): one member of each matching
        group, wherever the choice falls. Returns how many groups it went to."""
        routes = self.cache.get(msg.topic)
        if routes is None:
            routes = self.fold(msg.topic)
        for rid, groups in self._pick_routers(msg, routes).items():
            self.wiring.mesh.forward(rid, msg, None, groups, True)
        return len(routes)

    def _deliver_shared(self, msg: Message, key: str) -> None:
        """One local member of shared subscription ``key`` gets ``msg`` (none left: one moving
        away keeps it; else nobody)."""
        if not self._to_member(msg, key) and not (self.moving and self._for_moving(msg, key, True)):
            self.stats.shared_no_member += 1

    def _to_member(self, msg: Message, key: str) -> bool:
        """``_deliver_shared``: False when this router has no member of ``key`` that may read
        ``msg`` (left to the caller to count, or to hand on)."""
        group = self.local.get(key)
        if group is None:
            return False
        picked = group.pick(msg.qos)
        if picked is None:
            return False
        if picked[0].acl is not None:
            picked = _readable_member(group, picked, msg)
            if picked is None:
                return False
        session, sub = picked
        if msg.expires_ms and msg.expired(self.clock.unix() * 1000):
            self.stats.drop_expired += 1
            return True
        qos = msg.qos
        session.deliver_shared(msg.with_ids((sub.sub_id,)) if sub.sub_id else msg, qos if qos < sub.qos else sub.qos,
                               msg.retain and sub.retain_as_published)
        return True

    def deliver_remote(self, msg: Message, key: str, only: bool, sender: str | None = None) -> None:
        """A message another router chose this one for, for group ``key``. Its last member here
        may have left while the message was on its way (the publisher's router had not heard
        yet): then it goes on to another router of the group, once (``only``: it was handed on
        already, and is not handed back and forth while the routers' views of the group differ).
        Where this router knows no router of the group and ``sender``'s full interest has not
        reached it yet (it just met that router: its announcement follows), it waits (``_hold``).
        One whose last member here is moving away meanwhile is kept for it (``_for_moving``)."""
        if not self._to_member(msg, key):
            if self.moving and self._for_moving(msg, key, only):
                return
            if only:
                self.stats.shared_no_member += 1
            elif key not in self.routes and sender is not None and not self.wiring.mesh.interest_known(sender):
                self._hold(msg, key)
            else:
                self.to_another_member(msg, key)

    def _hold(self, msg: Message, key: str) -> None:
        """``msg`` for group ``key``, of which this router knows no member anywhere: it waits
        (``HELD_S``) for a router of the group to be announced, then goes to one member of it.
        A restarted router is sent again the frames its old incarnation never confirmed before
        the senders' interest reaches it: the copies of a group whose member was there (gone with
        the process) found nobody, and were dropped (partition seed 307: five acknowledged)."""
        if self._held_count >= HELD_MAX:
            self.stats.shared_no_member += 1
            return
        entry = self.held.get(key)
        if entry is None:
            until = self.clock.now() + HELD_S
            entry = self.held[key] = (until, [])
            self.clock.call_later(HELD_S, self._held_expired, key, until)
        entry[1].append(msg)
        self._held_count += 1

    def _held_expired(self, key: str, until: float) -> None:
        """No router of group ``key`` was announced in time: its held copies are dropped."""
        entry = self.held.get(key)
        if entry is None or entry[0] != until:
            return  # delivered meanwhile (and maybe held anew since)
        del self.held[key]
        self._held_count -= len(entry[1])
        self.stats.shared_no_member += len(entry[1])
        log.warning("shared subscription %s: %d message(s) chosen for this router found no member of the "
                    "group anywhere within %g s: dropped", key, len(entry[1]), HELD_S)

    def _release_held(self, key: str) -> None:
        """A router of group ``key`` is known now: the copies held for it go to one member each."""
        entry = self.held.pop(key, None)
        if entry is None:
            return
        msgs = entry[1]
        self._held_count -= len(msgs)
        log.info("shared subscription %s: %d message(s) that arrived before any member of the group was "
                 "known here go to its members now", key, len(msgs))
        for msg in msgs:
            self.to_another_member(msg, key)

    def to_another_member(self, msg: Message, key: str, not_to: str | None = None) -> None:
        """Deliver ``msg`` to another member of group ``key``, wherever the choice falls, and to
        nobody else (its member's session ended before acknowledging it). ``not_to``: a router
        never chosen (the one the copy was for, which will not get it: ``Mesh``'s copies for a
        forgotten router, or beyond its backlog)."""
        route = self.routes.get(key)
        rid = route.choose_other(not_to) if route is not None else None
        if rid == self.router_id:
            self._deliver_shared(msg, key)
        elif rid is not None:
            self.wiring.mesh.forward(rid, msg, None, [key], True)
        else:
            self.stats.shared_no_member += 1

    def _for_moving(self, msg: Message, key: str, only: bool = False) -> bool:
        """``msg`` for group ``key`` found no member here, where a member of the group is moving
        away (exported, its move not settled): True when it is taken care of. Another router of
        the group gets it (not ``only``: once), as after the member's export; where there is none
        (the group's only member is the one moving: the new router has not announced it yet), it
        is kept for the moving member (``settled``), up to its ``max_queued``. Dropped instead,
        it reached nobody, though the member's session and subscription exist throughout (MQTT 5
        4.8.2: a message is owed to a member)."""
        sessions = self.moving.get(key)
        if not sessions or not msg.qos:
            return False
        if not only:
            route = self.routes.get(key)
            rid = route.choose_other(self.router_id) if route is not None else None
            if rid is not None:
                self.wiring.mesh.forward(rid, msg, None, [key], True)
                return True
        session = sessions[0]
        kept = self.kept.setdefault(session.client_id, [])
        if len(kept) >= session.limits.max_queued:
            self.stats.drop_queue_full += 1
            return True
        kept.append((msg, key))
        return True

    def settled(self, session: Session) -> list[tuple[Message, str]]:
        """The move of ``session`` is settled (confirmed, failed or in doubt): no longer moving,
        its presence recomputed (a failed move rejoined it first: ``rejoin``); returns the group
        copies kept for it meanwhile (``_for_moving``), for the caller to send on."""
        kept = self.kept.pop(session.client_id, [])
        if kept:
            log.info("session %s: %d group message(s) that found no other member while it moved kept for it",
                     session.client_id, len(kept))
        for key in [k for k, sessions in self.moving.items() if session in sessions]:
            sessions = self.moving[key]
            sessions.remove(session)
            if not sessions:
                del self.moving[key]
            self._local_presence(key)
        return kept

    def send_kept(self, kept: list[tuple[Message, str]], to: str | None) -> None:
        """Group copies kept for a member while it moved go to its new router ``to``, for the group
        there (once); None (the move failed, or the session ended): to a member of each group,
        wherever the choice falls (this router's members first)."""
        for msg, key in kept:
            if to is not None:
                self.wiring.mesh.forward(to, msg, None, [key], True)
            elif not self._to_member(msg, key):
                self.to_another_member(msg, key, self.router_id)

    # -- shared subscriptions: membership and presence ------------------------------------------------

    def subscribe(self, session: Session, sub: Subscription) -> bool:
        """Make ``session`` a member of the shared subscription ``sub.topic_filter`` (the whole
        ``$share/group/filter``); True if it was not one already."""
        key = sub.topic_filter
        new = key not in session.shared
        session.own_shared()[key] = sub
        self._session_changed(session)
        group = self.local.get(key)
        if group is None:
            group = self.local[key] = SharedGroup(key)
        group.add(session, sub)
        self._local_presence(key)
        return new

    def unsubscribe(self, session: Session, key: str) -> bool:
        if session.shared.pop(key, None) is None:
            return False
        self._session_changed(session)
        self._leave_group(session, key)
        return True

    def leave(self, session: Session) -> None:
        """``session`` is leaving this router (another router takes it over): out of its groups
        here now, its memberships kept (they travel with it, and come back here if the move
        fails: ``rejoin``). A group's copy that reaches this router from then on finds no member
        here and goes on to another router of the group (``deliver_remote``). Picked as an
        offline member instead, it waited in the leaving session, which a move drops (a clean
        one) or empties (a persistent one: its log is handed on, and group copies are in no log):
        partition seed 1224 lost two acknowledged messages so, chosen for the old router of a
        member just as its client connected on the publisher's router. Until its move is settled
        (``settled``) it counts here as an offline member (the presence: chosen only where nobody
        is connected anywhere), and a copy that finds no member here and no other router is kept
        for it (``_for_moving``): the group's only member moving, the group had no router at all
        until its new one announced it, and such a copy was dropped."""
        for key in session.shared:
            self.moving.setdefault(key, []).append(session)
            self._leave_group(session, key)

    def rejoin(self, session: Session) -> None:
        """A move of ``session`` failed: it stays here, a member of its groups again."""
        for sub in list(session.shared.values()):
            self.subscribe(session, sub)

    def _leave_group(self, session: Session, key: str) -> None:
        """``session`` out of this router's members of group ``key``; the presence follows."""
        group = self.local.get(key)
        if group is not None:
            group.remove(session)
            if not group.members:
                del self.local[key]
        self._local_presence(key)

    def presence(self, session: Session) -> None:
        """``session`` connected or went offline: the presence in its groups changes."""
        for key in session.shared:
            self._local_presence(key)

    def _local_presence(self, key: str) -> None:
        """Recompute this router's presence in group ``key``; announce it if it changed."""
        group = self.local.get(key)
        presence = group.presence() if group is not None else NONE
        if presence == NONE and self.moving and key in self.moving:
            presence = -len(self.moving[key])  # its members moving away: offline ones (``leave``)
        route = self.routes.get(key)
        if presence == (route.routers.get(self.router_id, NONE) if route is not None else NONE):
            return
        self.route_presence(key, self.router_id, presence)
        self._interest_ack(key, self.wiring.mesh.announce_interest(key, presence))

    def route_presence(self, key: str, router_id: str, presence: int) -> None:
        """Record one router's presence in group ``key``; drop the route when nobody is left."""
        route = self.routes.get(key)
        if route is None:
            parsed = parse_share(key) if presence != NONE else None
            if parsed is None:
                return
            route = self.routes[key] = SharedRoute(key, *parsed)
            self.index.add(route.topic_filter, route.group, route)
            self.cache.clear()
            self.active = True
        route.set_presence(router_id, presence)
        if presence != NONE and self.held:
            self._release_held(key)
        if not route.routers:
            del self.routes[key]
            self.index.remove(route.topic_filter, route.group)
            self.cache.clear()
            self.active = bool(self.routes)

    # -- the other routers ----------------------------------------------------------------------------

    def peer_left(self, router_id: str) -> None:
        """A peer router is gone, or about to announce everything again: its presence goes."""
        for key in [k for k, route in self.routes.items() if router_id in route.routers]:
            self.route_presence(key, router_id, NONE)

    def peer_silent(self, router_id: str) -> None:
        """A peer fell silent: its members become the last resort (``Router.peer_silent``)."""
        for route in self.routes.values():
            if router_id in route.routers:
                route.set_parked(router_id, True)
        self.cache.clear()

    def announcements(self) -> list[tuple[str, int]]:
        """This router's presence per group, for a peer that (re)joins."""
        me = self.router_id
        return [(key, route.routers[me]) for key, route in self.routes.items() if me in route.routers]


def _readable_member(group: SharedGroup, picked: tuple[Session, Subscription],
                     msg: Message) -> tuple[Session, Subscription] | None:
    """The member picked, or the next in turn, that may read ``msg`` by its identity's grants
    now (a reload may have revoked them since it subscribed); None when no member here may."""
    for _ in range(len(group.members)):
        if picked[0].readable(msg):
            return picked
        nxt = group.pick(msg.qos)
        if nxt is None:
            return None
        picked = nxt
    return None
