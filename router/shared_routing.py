"""Shared subscriptions ($share/group/filter) as the router routes them: one member per group gets
each message, wherever in the cluster the members are.

The router's part, split from ``router.router`` by concern: this router's members per group
(``SharedGroup``), every router's presence per group (``SharedRoute``, announced with the interest
announcements), the choice of one router per group for each publish, and handing a message on when
a member's session ends before acknowledging it. ``Router`` mixes this in; the state lives on the
router (see ``Router.__init__``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from brokerd.connection.packets import Subscription

from .message import Message
from .session import Session
from .shared import NONE, SharedGroup, SharedRoute, parse_share
from .topics import TopicIndex

if TYPE_CHECKING:
    from .ports import MeshPort
    from .stats import RouterStats


class SharedRouting:
    router_id: str
    mesh: MeshPort
    stats: RouterStats
    shared_local: dict[str, SharedGroup]
    shared_routes: dict[str, SharedRoute]
    shared_index: TopicIndex[str, SharedRoute]
    _shared_cache: dict[str, tuple[SharedRoute, ...]]
    has_shared: bool

    if TYPE_CHECKING:  # the parts of Router (and its other mixins) used here
        def _fold_peers(self, topic: str) -> tuple[str, ...]: ...  # Router's
        def _session_changed(self, session: Session) -> None: ...  # Router's
        def _interest_ack(self, key: str, ack: Any) -> None: ...  # Router's
        _peer_routes: dict[str, tuple[str, ...]]

    # -- shared subscriptions: publishing -------------------------------------------------------------

    def _fold_shared(self, topic: str) -> tuple[SharedRoute, ...]:
        routes = tuple(route for _, route in self.shared_index.match(topic))
        if len(self._shared_cache) > 65536:
            self._shared_cache.clear()
        self._shared_cache[topic] = routes
        return routes

    def _publish_shared(self, msg: Message, routes: tuple[SharedRoute, ...], source: Any) -> None:
        """Pick one router per group; each peer still gets one copy, naming its groups if any."""
        picked = self._pick_routers(msg, routes)
        mesh = self.mesh
        peers = self._peer_routes.get(msg.topic)
        if peers is None:
            peers = self._fold_peers(msg.topic)
        for rid in peers:
            mesh.forward(rid, msg, source, picked.pop(rid, None))
        for rid, groups in picked.items():
            mesh.forward(rid, msg, source, groups)

    def _pick_routers(self, msg: Message, routes: tuple[SharedRoute, ...]) -> dict[str, list[str]]:
        """One router per group of ``routes``: a member here gets ``msg`` now; returns the other
        routers picked, with their groups."""
        me = self.router_id
        picked: dict[str, list[str]] = {}
        for route in routes:
            rid = route.choose()
            if rid == me:
                if not self._to_member(msg, route.key):
                    self.stats.shared_no_member += 1
            elif rid is not None:
                picked.setdefault(rid, []).append(route.key)
        return picked

    def to_groups(self, msg: Message) -> int:
        """``msg`` for the shared groups alone (read back from a dead router's replica: the plain
        subscribers get theirs through each router's own catch-up): one member of each matching
        group, wherever the choice falls. Returns how many groups it went to."""
        routes = self._shared_cache.get(msg.topic)
        if routes is None:
            routes = self._fold_shared(msg.topic)
        for rid, groups in self._pick_routers(msg, routes).items():
            self.mesh.forward(rid, msg, None, groups, True)
        return len(routes)

    def _deliver_shared(self, msg: Message, key: str) -> None:
        """One local member of shared subscription ``key`` gets ``msg`` (none left: nobody)."""
        if not self._to_member(msg, key):
            self.stats.shared_no_member += 1

    def _to_member(self, msg: Message, key: str) -> bool:
        """``_deliver_shared``: False when this router has no member of ``key`` that may read
        ``msg`` (left to the caller to count, or to hand on)."""
        group = self.shared_local.get(key)
        picked = group.pick(msg.qos) if group is not None else None
        if picked is None:
            return False
        if picked[0].acl is not None:
            picked = _readable_member(group, picked, msg)  # type: ignore[arg-type]
            if picked is None:
                return False
        session, sub = picked
        if msg.expires_ms and msg.expired():
            self.stats.drop_expired += 1
            return True
        qos = msg.qos
        session.deliver_shared(msg.with_ids((sub.sub_id,)) if sub.sub_id else msg, qos if qos < sub.qos else sub.qos,
                               msg.retain and sub.retain_as_published)
        return True

    def _deliver_remote_shared(self, msg: Message, key: str, only: bool) -> None:
        """A message another router chose this one for, for group ``key``. Its last member here
        may have left while the message was on its way (the publisher's router had not heard
        yet): then it goes on to another router of the group, once (``only``: it was handed on
        already, and is not handed back and forth while the routers' views of the group differ)."""
        if not self._to_member(msg, key):
            if only:
                self.stats.shared_no_member += 1
            else:
                self._hand_on(msg, key)

    def _hand_on(self, msg: Message, key: str) -> None:
        """Deliver ``msg`` to another member of group ``key``, wherever the choice falls, and to
        nobody else (its member's session ended before acknowledging it)."""
        route = self.shared_routes.get(key)
        rid = route.choose() if route is not None else None
        if rid == self.router_id:
            self._deliver_shared(msg, key)
        elif rid is not None:
            self.mesh.forward(rid, msg, None, [key], True)
        else:
            self.stats.shared_no_member += 1

    # -- shared subscriptions: membership and presence ------------------------------------------------

    def subscribe_shared(self, session: Session, sub: Subscription) -> bool:
        """Make ``session`` a member of the shared subscription ``sub.topic_filter`` (the whole
        ``$share/group/filter``); True if it was not one already."""
        key = sub.topic_filter
        new = key not in session.shared
        session.shared[key] = sub
        self._session_changed(session)
        group = self.shared_local.get(key)
        if group is None:
            group = self.shared_local[key] = SharedGroup(key)
        group.add(session, sub)
        self._local_presence(key)
        return new

    def unsubscribe_shared(self, session: Session, key: str) -> bool:
        if session.shared.pop(key, None) is None:
            return False
        self._session_changed(session)
        group = self.shared_local.get(key)
        if group is not None:
            group.remove(session)
            if not group.members:
                del self.shared_local[key]
        self._local_presence(key)
        return True

    def shared_presence(self, session: Session) -> None:
        """``session`` connected or went offline: the presence in its groups changes."""
        for key in session.shared:
            self._local_presence(key)

    def _local_presence(self, key: str) -> None:
        """Recompute this router's presence in group ``key``; announce it if it changed."""
        group = self.shared_local.get(key)
        presence = group.presence() if group is not None else NONE
        route = self.shared_routes.get(key)
        if presence == (route.routers.get(self.router_id, NONE) if route is not None else NONE):
            return
        self._route_presence(key, self.router_id, presence)
        self._interest_ack(key, self.mesh.announce_interest(key, presence))

    def _route_presence(self, key: str, router_id: str, presence: int) -> None:
        """Record one router's presence in group ``key``; drop the route when nobody is left."""
        route = self.shared_routes.get(key)
        if route is None:
            parsed = parse_share(key) if presence != NONE else None
            if parsed is None:
                return
            route = self.shared_routes[key] = SharedRoute(key, *parsed)
            self.shared_index.add(route.topic_filter, route.group, route)
            self._shared_cache.clear()
            self.has_shared = True
        route.set_presence(router_id, presence)
        if not route.routers:
            del self.shared_routes[key]
            self.shared_index.remove(route.topic_filter, route.group)
            self._shared_cache.clear()
            self.has_shared = bool(self.shared_routes)


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
