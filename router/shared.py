"""MQTT shared subscriptions (``$share/{ShareName}/{filter}``, MQTT 5.0 section 4.8.2).

A message matching a shared subscription goes to exactly one member of its group, cluster-wide.
The choice is made in two steps, so that a message still crosses the mesh once per router:

- the publisher's router picks one *router* per group (``SharedRoute.choose``): a weighted round
  robin over the routers that hold connected members of the group, weighted by how many each
  holds, so every connected member gets about the same share wherever it is connected (a plain
  round robin over routers would give a router's lone member as much as ten members elsewhere);
  routers whose members are all offline only when no member is connected anywhere; the
  publisher's router may pick itself;
- the chosen router picks one local *member* (``SharedGroup.pick``): round robin, preferring a
  connected session with room in its window or queue, then any connected one, then an offline
  persistent session (whose queue then holds the message as for any offline session).

A router tells its peers, per group, its *presence*: the number of its connected members, or minus
the number of its members when none is connected, 0 when it has none. Presence travels as an
interest announcement keyed by the shared subscription string itself: a member joining, leaving,
connecting or going offline costs one entry in the next interest frame, and nothing per message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from brokerd.connection.packets import Subscription

from .topics import valid_topic_filter

if TYPE_CHECKING:
    from .session import Session

SHARE_PREFIX = "$share/"
NONE = 0
SCHEDULE_MAX = 256  # the longest round-robin schedule over routers (weights scale down beyond)


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

    def presence(self) -> int:
        """What this router announces for the group: its connected members, or minus its
        members when none is connected (they are chosen only if nobody is connected anywhere)."""
        online = sum(1 for s, _ in self.members if s.conn is not None)
        return online if online else -len(self.members)

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
        return not conn.write_paused  # type: ignore[attr-defined]  # a Connection, typed object
    return not session.queue and len(session.inflight) < session.receive_max


class SharedRoute:
    """Which routers (this one included) hold members of one shared subscription, with their
    presence, and the weighted round-robin schedule over them. The schedule is rebuilt when a
    presence changes, so choosing costs one index per message."""

    __slots__ = ("key", "group", "topic_filter", "routers", "parked", "schedule", "_turn")

    def __init__(self, key: str, group: str, topic_filter: str) -> None:
        self.key = key
        self.group = group
        self.topic_filter = topic_filter
        self.routers: dict[str, int] = {}
        self.parked: set[str] = set()  # routers fallen silent: chosen only when nobody else can be
        self.schedule: tuple[str, ...] = ()
        self._turn = 0

    def set_presence(self, router_id: str, presence: int) -> None:
        if presence == NONE:
            self.routers.pop(router_id, None)
            self.parked.discard(router_id)
        else:
            self.routers[router_id] = presence
        self._schedule()

    def set_parked(self, router_id: str, parked: bool) -> None:
        """A router fell silent (its connected members cannot take messages now) or is back."""
        if parked:
            self.parked.add(router_id)
        else:
            self.parked.discard(router_id)
        self._schedule()

    def _schedule(self) -> None:
        """Connected members on routers that answer, by number; else connected members behind
        silent routers (the mesh keeps their copies until those return); else offline members."""
        parked = self.parked
        weights = {r: p for r, p in self.routers.items() if p > 0 and r not in parked}
        if not weights:
            weights = {r: p for r, p in self.routers.items() if p > 0}
        if not weights:  # nobody connected anywhere: the offline members, by number
            weights = {r: -p for r, p in self.routers.items()}
        self.schedule = smooth_schedule(weights)

    def choose(self) -> str | None:
        """The router that gets this group's copy of the next message."""
        schedule = self.schedule
        if not schedule:
            return None
        turn = self._turn
        self._turn = turn + 1
        return schedule[turn % len(schedule)]

    def choose_other(self, not_to: str | None) -> str | None:
        """``choose``, passing over router ``not_to`` (for at most one cycle of the schedule);
        None when no other router is in it."""
        for _ in self.schedule:
            rid = self.choose()
            if rid != not_to:
                return rid
        return None


def smooth_schedule(weights: dict[str, int], limit: int = SCHEDULE_MAX) -> tuple[str, ...]:
    """One cycle of smooth weighted round robin (as nginx does it): each key appears ``weight``
    times, spread out rather than in runs (weights 3, 1 give a a b a, not a a a b), so a short
    burst is shared too. Weights scale down (each at least 1) when they sum beyond ``limit``."""
    total = sum(weights.values())
    if total > limit:
        weights = {k: max(1, w * limit // total) for k, w in weights.items()}
        total = sum(weights.values())
    keys = sorted(weights)
    current = dict.fromkeys(keys, 0)
    out = []
    for _ in range(total):
        for k in keys:
            current[k] += weights[k]
        best = max(keys, key=current.__getitem__)
        current[best] -= total
        out.append(best)
    return tuple(out)
