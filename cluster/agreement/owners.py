"""A router's side of agreed session ownership (issue 41): who serves a persistent session is the
owner the agreement names, never a router's own guess.

A persistent CONNECT runs the mesh's takeover as before (the session's state comes from its old
router, or a replica of it), then claims the session: a conditional move "from the agreed owner
at its epoch to this router" committed by a majority (``claim``). The takeover's result counts
only if it agrees with the record: a session that the agreed owner neither offered nor said it
lacks (it is silent, stopped, cut off) is refused, never replaced by an empty one. A move that
cannot be committed (no majority reachable within ``--agreement-timeout``) refuses the CONNECT:
server unavailable, the client retries, and the session stays where it was.

Fencing: every member publishes each committed move; a router that holds a copy of a session
now owned elsewhere at a newer epoch (it was cut off, stopped, or restored an old snapshot)
disconnects its client and hands on what that copy had not delivered to the new owner
(``Router.fence_stale``), so that what was published on its side meanwhile is not lost.

A claim whose proposal timed out has an unknown outcome: it may commit later (a leader cut off
with it in its log regains a majority), naming a router that undid its takeover and holds no
session. That router withdraws it (a conditional move back to the owner it was claimed from, as
soon as the move is published to it), and the old owner, which knows the takeover was undone,
waits for that before it fences its copy (``SessionLife.fence_stale``): the session stays where
it is instead of being handed to a router that has none (partition seed 15).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Protocol

from .state import OK, SESSION, get, move, release

log = logging.getLogger(__name__)

CLAIM_ATTEMPTS = 3  # a record that changed between the read and the move is read again
CHECK_CHUNK = 10_000  # restored sessions whose records are read in one entry
CHECK_RETRY_S = 1.0  # while no majority answers, the check of restored sessions waits this long
LIMBO_MAX = 10_000  # claims of unknown outcome remembered (the oldest go first): a bound, not a rule


class AgreementPort(Protocol):
    """What the owners need of the node's agreement: ``client.AgreementClient`` (a test's member)."""

    majority: bool  # whether the node's member sees a majority now

    async def read(self, kind: str, key: str) -> tuple[str | None, int]:
        """The member's own view of a record: (owner, epoch), maybe stale."""

    async def propose(self, commands: list, timeout: float | None = None) -> list:
        """One entry's commands, committed by a majority: their results, or an exception."""


class SessionOwners:
    """The agreed owners of this router's persistent sessions, and the claims and fences on them.

    ``epochs``: client id -> the agreed epoch at which this router owns it (from its own claims
    and from the published moves); a published move at that epoch or below is older news.
    """

    def __init__(self, router_id: str, client: AgreementPort, timeout: float) -> None:
        self.router_id = router_id
        self.client = client
        self.timeout = timeout
        self.epochs: dict[str, int] = {}
        self.fence: Callable[[str, str | None], None] | None = None  # Router.fence_stale, set by the worker
        # Whether this router holds (or a CONNECT here is claiming) a session: set by the worker.
        self.holds: Callable[[str], bool] = lambda client_id: True
        # Claims whose proposal timed out (outcome unknown): client id -> the record they moved from.
        self.limbo: dict[str, tuple[str | None, int]] = {}
        self._tasks: set[asyncio.Task] = set()

    @property
    def majority(self) -> bool:
        """Whether this node's agreement member can commit now (its node sees a majority)."""
        return bool(self.client.majority)

    async def claim(self, client_id: str, source: str | None, answered: Iterable[str]) -> str | None:
        """Make this router the agreed owner of ``client_id``'s session, which the takeover found
        at ``source`` (the router that offered it, the silent router whose replica did, this
        router for a session it holds; None: nobody had it); ``answered``: the routers that
        answered the takeover. None once the move is committed, else why the CONNECT is refused."""
        heard = set(answered)
        for _ in range(CLAIM_ATTEMPTS):
            try:
                owner, epoch = await self.client.read(SESSION, client_id)
            except Exception as exc:  # noqa: BLE001 - NoAgreement, or the service restarting
                return f"no majority of the cluster agreed to move its session here ({exc}); the client may retry"
            if owner not in (None, self.router_id, source) and owner not in heard:
                return (f"its session's agreed owner {owner} did not answer (silent or cut off); "
                        "the client may retry")
            try:
                # Moved even when the read names this router: the read is this member's (a cut-off
                # member's may be stale), the move is the majority's.
                result = (await self.client.propose([move(SESSION, client_id, owner, epoch, self.router_id)],
                                                    self.timeout))[0]
            except Exception as exc:  # noqa: BLE001 - NoAgreement, or the service restarting
                if owner != self.router_id:  # it may commit later: withdrawn then (``on_owned``)
                    limbo = self.limbo
                    limbo.pop(client_id, None)
                    limbo[client_id] = (owner, epoch)
                    while len(limbo) > LIMBO_MAX:
                        del limbo[next(iter(limbo))]
                return f"no majority of the cluster agreed to move its session here ({exc}); the client may retry"
            if result[0] == OK:
                self.limbo.pop(client_id, None)
                self.epochs[client_id] = result[2]
                return None
        return "its session's owner changed while it was being moved here; the client may retry"

    def owns(self, client_id: str) -> bool:
        return client_id in self.epochs

    def ended(self, client_id: str) -> None:
        """A persistent session of this router ended for good (expired, or a clean start ended
        it): its record is released, so that nobody waits for this router to offer it. Best
        effort: a record left behind names a router that answers it has none."""
        epoch = self.epochs.pop(client_id, None)
        if epoch is not None:
            self._spawn(self.client.propose([release(SESSION, client_id, self.router_id, epoch)], self.timeout))

    def forget(self, client_id: str) -> None:
        """A clean start ended ``client_id``'s session wherever it was: its record, whoever it
        names, is released (conditional on the record read, so a claim meanwhile wins). Best
        effort, off the CONNECT's path."""
        self.epochs.pop(client_id, None)
        self._spawn(self._forget(client_id))

    async def _forget(self, client_id: str) -> None:
        owner, epoch = await self.client.read(SESSION, client_id)
        if owner is not None:
            await self.client.propose([release(SESSION, client_id, owner, epoch)], self.timeout)

    def moved(self, client_id: str) -> None:
        """The session went to another router by a takeover that router claimed."""
        self.epochs.pop(client_id, None)

    def on_owned(self, batch: list) -> None:
        """Committed changes ([kind, key, owner, epoch]) published by this node's member, in log
        order: a session held here whose record now names another router (or nobody) at a newer
        epoch than this router's own claim is a stale copy: fenced (``Router.fence_stale``)."""
        for kind, key, owner, epoch in batch:
            if kind != SESSION:
                continue
            mine = self.epochs.get(key)
            if owner == self.router_id:
                was = self.limbo.pop(key, None)
                if was is not None and mine is None and not self.holds(key):
                    self._withdraw(key, epoch, was[0])
                    continue
                if mine is None or epoch > mine:
                    self.epochs[key] = epoch  # (a claim's own answer may come after its publication)
                continue
            if mine is not None and epoch <= mine:
                continue  # older than this router's own claim
            self.epochs.pop(key, None)
            if self.fence is not None:
                self.fence(key, owner)

    def _withdraw(self, client_id: str, epoch: int, to: str | None) -> None:
        """A claim of this router that timed out committed later (the record names it at ``epoch``)
        while it holds no session: the record goes back to ``to``, the owner it was claimed from,
        which kept the session (or is released: nobody had it). Conditional, so a claim meanwhile
        wins; best effort (should it fail, the old owner fences its copy after a while)."""
        log.warning("agreement: a claim of session %s that timed out here committed later; the record goes back "
                    "to %s, which kept the session", client_id, to or "nobody")
        command = (move(SESSION, client_id, self.router_id, epoch, to) if to is not None
                   else release(SESSION, client_id, self.router_id, epoch))
        self._spawn(self.client.propose([command], self.timeout))

    def check_restored(self, client_ids: list[str], busy: Callable[[str], bool]) -> None:
        """The persistent sessions this router restored from its snapshot may have moved while it
        was down (their moves were published before it listened): their records are read through
        the log (linearizable), in the background until a majority answers; a session owned
        elsewhere is fenced, one owned here keeps its epoch. One that a CONNECT is claiming now
        (``busy``) is that claim's business."""
        if client_ids:
            self._spawn(self._check(client_ids, busy))

    async def _check(self, client_ids: list[str], busy: Callable[[str], bool]) -> None:
        for i in range(0, len(client_ids), CHECK_CHUNK):
            chunk = client_ids[i:i + CHECK_CHUNK]
            while True:
                try:
                    results = await self.client.propose([get(SESSION, c) for c in chunk], self.timeout)
                    break
                except Exception:  # noqa: BLE001 - no majority yet: the sessions wait (none is served meanwhile)
                    await asyncio.sleep(CHECK_RETRY_S)
            stale = 0
            for cid, (status, owner, epoch) in zip(chunk, results, strict=True):
                if status != OK or cid in self.epochs or busy(cid):
                    continue
                if owner == self.router_id:
                    self.epochs[cid] = epoch
                elif owner is not None and self.fence is not None and self.holds(cid):
                    # (one a takeover moved away meanwhile is not held: nothing to fence, nor to say)
                    stale += 1
                    self.fence(cid, owner)
            if stale:
                log.warning("agreement: %d session(s) restored here moved to other routers while this one was down: "
                            "their copies here hand on what they hold", stale)

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:  # (a release, or a clean start's forget)
            log.info("agreement: a release was not committed (%s); the record names this router until a move",
                     task.exception())
