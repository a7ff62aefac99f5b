"""What every part of ``Replication`` reads: the router it replicates, its log, the mesh and its clocks.

The parts (leader, follower, history, read-back, sessions, catch-ups, wills, restore, majority,
in-sync set) are objects ``Replication`` owns, each with its own state; a part calls another
through the reference ``Replication`` gives it (``self.quorum.in_minority``), declared on its
class, so what crosses between parts is named in one place. This base holds what they all read.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from brokerd.router.log import CommitLog
    from brokerd.router.router import Router

    from ..config import Config
    from .link import MeshLink


class Part:
    """The state every part of replication reads, copied from ``shared`` (the ``Replication``)."""

    config: Config
    router: Router
    net: MeshLink  # the mesh, through the one interface replication uses (``link``)
    loop: asyncio.AbstractEventLoop
    partition: str  # this router's id: its own log's partition
    log: CommitLog  # this router's own log
    factor: int  # --replication-factor (1: this router only follows)
    min_insync: int
    always: bool  # --fsync always: what counts is what is durable, not only written
    # The mesh's clocks (``MeshLink.clock``, ``wall``), read by every rule with a time in it: the
    # rules compare the mesh's ``Peer.last_seen`` and ``pause_deadline`` with ``clock``, and a
    # test drives both with one ``FakeClock``.
    clock: Callable[[], float]  # monotonic seconds
    wall: Callable[[], float]  # Unix seconds: a will's due time, a silence's start, as other routers say them
    _started: float  # when replication started (``clock``): peers are still joining for a while

    def __init__(self, shared: Part) -> None:
        self.config = shared.config
        self.router = shared.router
        self.net = shared.net
        self.loop = shared.loop
        self.partition = shared.partition
        self.log = shared.log
        self.factor = shared.factor
        self.min_insync = shared.min_insync
        self.always = shared.always
        self.clock = shared.clock
        self.wall = shared.wall
        self._started = shared._started
