"""A router's read-only face: what stats snapshots, ``$SYS`` and ``/metrics`` read of it.

The stats publisher (``cluster/stats.py``) used to reach into the router's dictionaries and
indexes; it reads this instead, so the router's internals can change without the stats code
changing with them, and nothing outside ``router/`` mutates them by accident.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from operator import attrgetter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .ports import ClientHandle
    from .router import Router
    from .session import Session
    from .stats import RouterStats

_QUEUE = attrgetter("queue")
_INFLIGHT = attrgetter("inflight")
DROPPED = attrgetter("dropped")  # a session's count of messages dropped for it


class RouterView:
    __slots__ = ("_router",)

    def __init__(self, router: Router) -> None:
        self._router = router

    @property
    def router_id(self) -> str:
        return self._router.router_id

    @property
    def stats(self) -> RouterStats:
        """The router's counters (read them; only the router bumps them)."""
        return self._router.stats

    def counts(self) -> dict[str, int]:
        """Sizes of the router's state: sessions, subscriptions, filters announced, (filter, peer)
        interest pairs, shared groups and their members and routes, retained messages."""
        r = self._router
        return {
            "sessions": len(r.sessions),
            "subscriptions": len(r.subs),
            "filters": len(r.local_filters),
            "interest": len(r.interest),
            "shared_groups": len(r.shared_local),
            "shared_members": sum(len(g.members) for g in r.shared_local.values()),
            "shared_routes": len(r.shared_routes),
            "retained": len(r.retained),
        }

    def pending_moves(self) -> tuple[int, ...]:
        """Equal twice: no session's queue or in-flight window can have changed in between by
        what the router does alone (``Router.session_moves``, and messages from other routers);
        the PUBLISHes of clients in between are the caller's to compare (``StatsPublisher``):
        acknowledgements count as state moves, and a SUBSCRIBE that sends retained messages
        too; a PINGREQ changes nothing, so a quiet fleet's keepalives do not bring the count back."""
        r = self._router
        return (*r.session_moves(), r.stats.mesh_msgs_in)

    def session_list(self) -> list[Any]:
        """The sessions as they are now, to walk later (``queued_inflight``) while they change."""
        return list(self._router.sessions.values())

    def queued_inflight(self, sessions: Iterable[Any]) -> tuple[int, int]:
        """QoS 1/2 messages queued behind ``sessions``' windows (a slice of ``session_list``),
        and unacknowledged on the wire. Walked in C (``map``)."""
        return sum(map(len, map(_QUEUE, sessions))), sum(map(len, map(_INFLIGHT, sessions)))

    def dropping(self, sessions: Iterable[Any]) -> list[Session]:
        """Those of ``sessions`` (a slice of ``session_list``) that dropped a message for their
        client (``Session.dropped``). Walked in C (``filter``)."""
        return list(filter(DROPPED, sessions))

    def counts_sessions(self) -> int:
        """How many sessions are held (``counts``'s first, alone)."""
        return len(self._router.sessions)

    def session(self, client_id: str) -> Session | None:
        """The session of that client id held here, if any."""
        return self._router.sessions.get(client_id)

    def client(self, client_id: str) -> ClientHandle | None:
        """The connected client of that id, if any."""
        return self._router.clients.get(client_id)

    def clients(self) -> Iterable[ClientHandle]:
        """The live connections' handlers (for the top-clients listing)."""
        return list(self._router.clients.values())

    @property
    def max_connections(self) -> int:
        """The most client connections this router accepts (its share of --max-connections)."""
        return self._router.config.max_connections

    def peer_stats(self) -> dict[str, list[int]]:
        return self._router.mesh.peer_stats()

    def peer_stats_endpoints(self) -> dict[str, str]:
        return self._router.mesh.peer_stats_endpoints()

    def mesh_refused(self) -> dict[str, str]:
        """Peer endpoints this router cannot join (CURVE handshake failed): a mesh alone has none."""
        refused = getattr(self._router.mesh, "refused_links", None)
        return refused() if refused is not None else {}

    @property
    def log_stats(self) -> Callable[[], dict[str, Any]] | None:
        """The commit log's ``stats()`` (offsets, bytes on disk, reads), None with the log off."""
        log_ = self._router.commit_log
        return None if log_ is None else log_.stats
