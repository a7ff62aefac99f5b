"""MQTT shared subscriptions (``$share/{ShareName}/{filter}``, MQTT 5.0 section 4.8.2).

A message matching a shared subscription goes to exactly one member of its group, cluster-wide.
The choice is made in two steps, so that a message still crosses the mesh once per router:

- the publisher's router picks one *router* per group (``SharedRoute.choose``): round robin over
  the routers that hold members of the group, preferring routers with a connected member over
  routers whose members are all offline; the publisher's router may pick itself;
- the chosen router picks one local *member* (``SharedGroup.pick``): round robin, preferring a
  connected session with room in its window or queue, then any connected one, then an offline
  persistent session (whose queue then holds the message as for any offline session).

A router tells its peers, per group, one of three presence levels: ``ONLINE`` (some member
connected), ``OFFLINE`` (members, none connected) or ``NONE``. The levels travel as interest
announcements keyed by the shared subscription string itself, so a group costs nothing on the
mesh until its presence changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from connection.packets import Subscription

from .topics import valid_topic_filter

if TYPE_CHECKING:
    from .session import Session

SHARE_PREFIX = "$share/"
NONE, OFFLINE, ONLINE = 0, 1, 2


def parse_share(topic_filter: str) -> tuple[str, str] | None:
    """(ShareName, filter) of a valid ``$share/{ShareName}/{filter}``, else None.

    ShareName must be non-empty and hold no ``/``, ``+`` or ``#`` (MQTT-4.8.2-1, -2); the filter
    must be a valid topic filter. The caller has checked the prefix."""
    rest = topic_filter[len(SHARE_PREFIX):]
    group, sep, flt = rest.partition("/")
    if not sep or not group or "+" in group or "#" in group or not valid_topic_filter(flt):
        return None
    return group, flt


def is_shared(topic_filter: str) -> bool:
    return topic_filter.startswith(SHARE_PREFIX)


class SharedGroup:
    """This router's members of one shared subscription, and the turn of the round robin."""

    __slots__ = ("key", "members", "_turn")

    def __init__(self, key: str) -> None:
        self.key = key
        self.members: list[tuple[Session, Subscription]] = []
        self._turn = 0

    def add(self, session: Session, sub: Subscription) -> bool:
        """Add or replace a member's subscription; True if the member is new."""
        for i, (s, _) in enumerate(self.members):
            if s is session:
                self.members[i] = (session, sub)
                return False
        self.members.append((session, sub))
        return True

    def remove(self, session: Session) -> bool:
        for i, (s, _) in enumerate(self.members):
            if s is session:
                del self.members[i]
                return True
        return False

    def level(self) -> int:
        if not self.members:
            return NONE
        return ONLINE if any(s.conn is not None for s, _ in self.members) else OFFLINE

    def pick(self, qos: int) -> tuple[Session, Subscription] | None:
        """The next member in turn that can take a message of ``qos`` now; failing that the next
        connected one; failing that the next offline one (its queue or nothing, as for any
        offline session)."""
        members = self.members
        n = len(members)
        if not n:
            return None
        start = self._turn % n
        connected = offline = -1
        for k in range(n):
            i = (start + k) % n
            session, sub = members[i]
            conn = session.conn
            if conn is None:
                if offline < 0:
                    offline = i
                continue
            if _has_room(session, conn, min(qos, sub.qos)):
                connected = i
                break
            if connected < 0:
                connected = i
        i = connected if connected >= 0 else offline
        self._turn = i + 1
        return members[i]


def _has_room(session: Session, conn: object, qos: int) -> bool:
    """Whether a message sent to this member now goes out (QoS 0: the socket drains; QoS 1/2:
    the inflight window has room) rather than being dropped or queued."""
    if qos == 0:
        return not conn.write_paused  # type: ignore[attr-defined]
    return not session.queue and len(session.inflight) < session.receive_max


class SharedRoute:
    """Which routers (this one included) hold members of one shared subscription, with their
    presence level, and the turn of the round robin over the best of them."""

    __slots__ = ("key", "group", "topic_filter", "routers", "candidates", "_turn")

    def __init__(self, key: str, group: str, topic_filter: str) -> None:
        self.key = key
        self.group = group
        self.topic_filter = topic_filter
        self.routers: dict[str, int] = {}
        self.candidates: tuple[str, ...] = ()
        self._turn = 0

    def set_level(self, router_id: str, level: int) -> None:
        if level == NONE:
            self.routers.pop(router_id, None)
        else:
            self.routers[router_id] = level
        best = max(self.routers.values(), default=NONE)
        self.candidates = tuple(sorted(r for r, lv in self.routers.items() if lv == best))

    def choose(self) -> str | None:
        """The router that gets this group's copy of the next message (round robin)."""
        candidates = self.candidates
        if not candidates:
            return None
        turn = self._turn
        self._turn = turn + 1
        return candidates[turn % len(candidates)]
