"""What every part of ``Replication`` reads: the router it replicates, its log, and the mesh.

The parts (leader, follower, history, read-back, sessions, catch-ups, wills, restore, majority)
are mixins of one ``Replication``: each sets up its own state (``_init_<part>``) and calls the
others through ``self``. This base only declares what they share, set by ``Replication``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from brokerd.router.log import CommitLog
    from brokerd.router.router import Router

    from ..config import Config
    from .link import MeshLink


class Part:
    """The state every part of replication reads (set by ``Replication.__init__``)."""

    config: Config
    router: Router
    net: MeshLink  # the mesh, through the one interface replication uses (``link``)
    loop: asyncio.AbstractEventLoop
    partition: str  # this router's id: its own log's partition
    log: CommitLog  # this router's own log
    factor: int  # --replication-factor (1: this router only follows)
    min_insync: int
    always: bool  # --fsync always: what counts is what is durable, not only written
    _started: float  # when replication started (monotonic): peers are still joining for a while
