"""What a router is linked to after it is made, shared by the parts it owns.

The mesh is made after the router (it calls the router back), the log and the snapshot store
are attached at start, the agreed owners and the ACL when they are configured: the parts
(``SessionLife``, ``SharedRoutes``) follow these through one ``Wiring`` the router updates,
rather than reading the router's attributes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .auth import Auth
    from .log import CommitLog
    from .persistence import StateStore
    from .ports import MeshPort


class OwnersPort(Protocol):
    """What the router calls on the agreed owners of its persistent sessions (implemented by
    ``cluster.agreement.owners.SessionOwners``, with --agreement)."""

    def claim(self, client_id: str, source: str | None, answered: Iterable[str]) -> Awaitable[str | None]:
        """Make this router the session's agreed owner: None once it is, else why not."""

    def owns(self, client_id: str) -> bool:
        """Whether this router is the session's agreed owner now."""

    def ended(self, client_id: str) -> None:
        """A persistent session of this router ended for good: its record goes."""

    def forget(self, client_id: str) -> None:
        """A clean start ended the session wherever it was: its record goes, whoever it names."""


class Wiring:
    __slots__ = ("mesh", "commit_log", "state", "owners", "acl")

    def __init__(self, mesh: MeshPort) -> None:
        self.mesh = mesh
        self.commit_log: CommitLog | None = None  # when the log is on (``Router.attach_log``)
        self.state: StateStore | None = None  # when the log is on (``Router.attach_state``)
        # The agreed owners of persistent sessions (cluster.agreement.owners.SessionOwners,
        # with --agreement): a CONNECT resumes a session only once this router is its owner.
        self.owners: OwnersPort | None = None
        # router.auth's checks when topics are restricted, else None (``router.access``).
        self.acl: Auth | None = None
