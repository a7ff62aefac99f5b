"""What a router is linked to after it is made, shared by the parts it owns.

The mesh is made after the router (it calls the router back), the log and the snapshot store
are attached at start, the agreed owners and the ACL when they are configured: the parts
(``SessionLife``, ``SharedRoutes``) follow these through one ``Wiring`` the router updates,
rather than reading the router's attributes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .log import CommitLog
    from .persistence import StateStore
    from .ports import MeshPort


class Wiring:
    __slots__ = ("mesh", "commit_log", "state", "owners", "acl")

    def __init__(self, mesh: MeshPort) -> None:
        self.mesh = mesh
        self.commit_log: CommitLog | None = None  # when the log is on (``Router.attach_log``)
        self.state: StateStore | None = None  # when the log is on (``Router.attach_state``)
        # The agreed owners of persistent sessions (cluster.agreement.owners.SessionOwners,
        # with --agreement): a CONNECT resumes a session only once this router is its owner.
        self.owners: Any = None
        # router.auth's checks when topics are restricted, else None (``router.access``).
        self.acl: Any = None
