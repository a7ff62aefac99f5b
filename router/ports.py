"""What a router needs from the world around it, declared: the mesh (other routers), the client
connections' handlers, and the replication of its log. ``router/`` implements none of them:
``cluster.mesh.Mesh`` is the mesh, ``router.client.Client`` the handler,
``cluster.replication.Replication`` the replication (None without it). A router without peers
gets ``NULL_MESH``, so that the router's code has no "is there a mesh?" branches.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Protocol

from mypy_extensions import mypyc_attr

from .message import Message

if TYPE_CHECKING:
    from brokerd.connection.ports import Connection

    from .client import Client
    from .session import Session

# What ``MeshPort.takeover`` answers when a session was being moved here and the transfer broke
# off: the session stayed with its old owner, and the CONNECT is refused (the client retries).
TAKEOVER_FAILED: dict = {"failed": True}
# What it answers when a router of this node that may hold the session stayed down (crashed and
# not restarted yet, or stopped) for the whole bounded wait: a new session here would leave two
# of them once it is back, so the CONNECT is refused (server unavailable) and the client retries.
TAKEOVER_UNAVAILABLE: dict = {"unavailable": True}
# Nobody offered the session while a router of another node is silent here but heard by other
# nodes (``Replication.undecided``: a partition that cut only some links): that router may be
# serving it, so a persistent session's CONNECT is refused (server unavailable) rather than
# given a second, empty session; the client retries, elsewhere or later.
TAKEOVER_UNDECIDED: dict = {"undecided": True}
# The key of what a CONNECT's claim on its session answers when the agreement did not make this
# router the session's owner (``cluster.agreement.owners``): why, for the refusal's reason string.
NOT_AGREED = "not_agreed"


class Source(Protocol):
    """The client connection a publish came from, as the mesh sees it: reading from it pauses
    while a peer's link is full (a ``connection.ports.Connection`` is one). A Protocol, not that
    class: the compiled publish path, on which every message goes, checks nothing for it."""

    def pause_reading(self, by: object) -> None: ...

    def resume_reading(self, by: object) -> None: ...


class MeshPort(Protocol):
    """What a router needs from the cluster: implemented by ``cluster.mesh.Mesh``."""

    def forward(self, router_id: str, msg: Message, source: Source | None = None, groups: list[str] | None = None,
                only: bool = False) -> None:
        """Queue ``msg`` for one peer router (batched per loop iteration). ``source`` is the client
        connection it came from: the mesh pauses reading from it while that peer is backed up.
        ``groups``: the shared subscriptions that router was chosen for; ``only``: for them alone
        (a message handed on from a member whose session ended: that router's normal subscribers
        and its log had their copy already)."""

    def forward_to(self, router_ids: tuple[str, ...], msg: Message, source: Source | None = None) -> None:
        """``forward`` to each of ``router_ids`` (no shared subscriptions), the message encoded for
        the mesh once for all of them."""

    def announce_interest(self, topic_filter: str, add: bool | int) -> Awaitable[None] | None:
        """Tell every peer router that this router gained / lost its interest in a filter (for a
        ``$share/`` key: its presence, 0 = none); for a gain, an awaitable that completes
        when every live peer has acknowledged it."""

    def retained_update(self, msg: Message) -> None:
        """Tell every peer router about a retained message (an empty payload clears it)."""

    def hears(self, router_id: str) -> bool:
        """Whether peer router ``router_id`` counts as alive here now."""

    def interest_known(self, router_id: str) -> bool:
        """Whether peer router ``router_id``'s full interest announcement (its filters and its
        shared groups' presence) reached this router since it met that router's incarnation."""

    def barrier(self) -> Awaitable[None] | None:
        """An awaitable that completes when every live peer has answered a request sent now, so
        that everything they sent before it (retained updates above all) has been handled here;
        None without live peers."""

    def takeover(self, client_id: str, claim: list | None = None,
                 answered: set[str] | None = None) -> Awaitable[dict | None]:
        """Ask every peer to give up ``client_id``: its session state, None if nobody had it,
        ``TAKEOVER_FAILED`` or ``TAKEOVER_UNAVAILABLE``; for a CONNECT making ``claim`` (``[user
        name, refuse?]``), ``ownership.refusal`` when the session is another identity's (it stays
        where it is). The port bounds the wait (it goes on while a session arrives, and while a
        router of this node is down). ``answered`` is filled with the routers that answered.
        The session a live router offered names it (``offered_by``)."""

    def takeover_then(self, client_id: str, claim: list | None, answered: set[str] | None,
                      then: Callable[[dict | None], None]) -> None:
        """``takeover``, its result handed to ``then`` rather than awaited: a CONNECT that no
        other router's session concerns is settled from a callback, with no task of its own."""

    def abort_takeover(self, client_id: str) -> None:
        """The session ``takeover`` brought is not taken after all (the agreement did not make this
        router its owner): its old owner, or this router's replica, keeps it."""

    def confirm_takeover(self, client_id: str, acked: list | None = None) -> None:
        """The session ``takeover`` brought from a live router is here, its interest
        acknowledged (``acked``: the results of the interest waits): its old owner may let it go
        and hand on what still reaches it. Called once the CONNECT is settled; a no-op for
        anything else. The port confirms by itself if this never comes (bounded)."""

    def hand_on(self, router_id: str, client_id: str, items: list, answered: dict | None = None,
                stale: bool = False) -> None:
        """Copies ([qos, retain, message values]) for a session that moved to ``router_id``,
        which reached this router after it moved; called once a move, with none too (the new
        owner learns the hand-on ended). ``answered``: the routers that answered the barrier
        before it (the others may still send stragglers here: the new owner asks them);
        ``stale``: from a copy the agreement fenced (the new owner takes every copy)."""

    def peer_stats(self) -> dict[str, list[int]]:
        """Traffic per peer router: {router id: [msgs out, bytes out, msgs in, bytes in]}."""

    def peer_stats_endpoints(self) -> dict[str, str]:
        """The stats sockets of peer routers that other nodes can read: {router id: tcp://...}."""


@mypyc_attr(allow_interpreted_subclasses=True)  # the unit tests' fake meshes start from it
class NullMesh:
    """The mesh of a router alone: nobody to forward to, announce to, or wait for."""

    def forward(self, router_id: str, msg: Message, source: Source | None = None, groups: list[str] | None = None,
                only: bool = False) -> None:
        return None

    def forward_to(self, router_ids: tuple[str, ...], msg: Message, source: Source | None = None) -> None:
        for router_id in router_ids:  # one at a time: what a mesh made for a test records
            self.forward(router_id, msg, source)

    def announce_interest(self, topic_filter: str, add: bool | int) -> None:
        return None

    def retained_update(self, msg: Message) -> None:
        return None

    def hears(self, router_id: str) -> bool:
        return False

    def interest_known(self, router_id: str) -> bool:
        return True  # (nobody to wait for)

    def barrier(self) -> None:
        return None

    def confirm_takeover(self, client_id: str, acked: list | None = None) -> None:
        return None

    def abort_takeover(self, client_id: str) -> None:
        return None

    def hand_on(self, router_id: str, client_id: str, items: list, answered: dict | None = None,
                stale: bool = False) -> None:
        return None

    def peer_stats(self) -> dict[str, list[int]]:
        return {}

    def peer_stats_endpoints(self) -> dict[str, str]:
        return {}

    async def takeover(self, client_id: str, claim: list | None = None,
                       answered: set[str] | None = None) -> dict | None:
        return None  # no other router holds it: answered at once, without a turn of the loop

    def takeover_then(self, client_id: str, claim: list | None, answered: set[str] | None,
                      then: Callable[[dict | None], None]) -> None:
        then(None)  # (as ``takeover``: at once)


NULL_MESH = NullMesh()


class ReplicationPort(Protocol):
    """What a router calls on its log's replication (``cluster.replication.Replication``, with
    ``--replication-factor`` > 1; a router without it has None and checks for it)."""

    @property
    def in_minority(self) -> bool:
        """Whether no majority of the cluster backs this router now: no QoS 1/2 acknowledgement,
        no session taken in."""

    def hold(self, offset: int, client: Client, ack: bytes) -> bool:
        """Whether the acknowledgement ``ack`` of the record at ``offset`` must wait for the
        followers (or the majority); then it comes back through ``Router.release_acks`` or
        ``Router.refuse_acks``."""

    def check_paused(self) -> None:
        """Before a persistent CONNECT looks at ``in_minority``: a pause of this process is
        noticed first (the majority counted again)."""

    def undecided(self) -> list[str]:
        """Routers of other nodes silent here but not gone for a majority: one may be serving a
        session nobody here was offered."""

    def sessions_changed(self, sessions: dict[str, dict]) -> None:
        """The router's persistent sessions as its snapshot holds them: the changes go to the
        followers."""

    def drop_users_wills(self, users: set[str]) -> list[tuple[str, str]]:
        """The wills held with other routers' sessions of ``users`` (a reload removed them):
        dropped. Returns the (partition, client id) of each."""

    def adopted(self, session: Session, state: dict) -> None:
        """A session came here from the replica of a silent router: make it the only one, and ask
        the other routers for what it may have missed."""

    def fence(self, client_id: str, partitions: Iterable[str]) -> None:
        """``client_id``'s session is here now, not with the silent routers ``partitions``."""

    def moved_past_silence(self, session: Session, silent: object) -> None:
        """A session moved here from a router to which others were silent: ask them for what
        they published meanwhile. ``silent`` is what the old router sent ({router id: when its
        silence began, Unix ms}), unchecked: the port checks it."""


class ClientHandle(Protocol):
    """What a router needs from the handler of one client connection (``router.client.Client``)."""

    client_id: str
    conn: Connection
    session: Session | None  # the session it is attached to (None before CONNECT is settled)
    will: Message | None  # its will, until the connection ends or DISCONNECT drops it
    username: str | None  # the identity it proved, from its CONNECT's wait for the other routers on

    def taken_over(self) -> None:
        """The same client id connected elsewhere: close this connection (its will fires)."""

    def identity_revoked(self) -> None:
        """Its user left the password file (a reload): close (its will does not fire)."""

    def move_away(self) -> None:
        """This node is cut off from the cluster's majority: close, asking the client to connect
        elsewhere (its will does not fire)."""
