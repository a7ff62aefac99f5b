"""The agreed in-sync set of this router's log (issue 41; Kafka's ISR kept by its controller).

With ``--agreement`` the followers that count towards an acknowledgement are those the agreement
committed, not the leader's own view: a failover then knows which replicas hold everything that
was acknowledged (every member of the set holds every record below the high-water mark,
``LeaderState.agree``), and a leader that is cut off, paused or restarted cannot count a
follower the others no longer agree on.

The leader's epoch: each incarnation of a router claims its own log (the owned kind ``log``,
key the router id) with a conditional move, which raises the agreement's one epoch counter; its
in-sync sets are committed at that epoch (``state.insync``), so a set written by an older
incarnation (a process that was paused past its replacement) is refused.

The loop (on the replication's tick, ``TICK_S``): when the set the leader wants
(``LeaderState.wanted``: the followers in sync by their lag that hold the high-water mark) differs
from the agreed one, one proposal at a time; committed, the leader counts by it. Not committed
(no majority): tried again at the next tick; meanwhile a member that lags still holds the
high-water mark back, as it must (acknowledgements wait, and are refused at
``--replica-timeout``). Paid per change of the set, never per message.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from ..agreement.state import OK, insync, move
from .part import Part

if TYPE_CHECKING:
    from .leader import LeaderPart
    from .majority import MajorityPart
    from .rules import Held

log = logging.getLogger(__package__)

LOG = "log"  # the owned kind whose record's epoch is a router's leader epoch
RETRY_S = 1.0  # after a proposal that was not committed


class InsyncPart(Part):
    """Proposing this log's in-sync set through the agreement, and learning others' sets."""

    # The other parts it calls (set by ``Replication``).
    lead: LeaderPart
    quorum: MajorityPart

    def __init__(self, shared: Part) -> None:
        super().__init__(shared)
        self.leader_epoch: int | None = None  # this incarnation's claim of its own log
        self._isr_busy = False
        self._isr_after = 0.0  # monotonic: no proposal before (after one that failed)
        # The in-sync sets committed for every router's log, as published (router -> (epoch,
        # followers)): a failover prefers the replicas they name (``in_sync_holders``).
        self.agreed_isr: dict[str, tuple[int, frozenset[str]]] = {}

    def check_insync(self) -> None:
        """On the tick: propose the wanted in-sync set when it differs from the agreed one."""
        if self.quorum.agreed is None or self.factor <= 1 or self._isr_busy:
            return
        lead = self.lead.leader
        wanted = lead.wanted()
        if wanted == lead.agreed and self.leader_epoch is not None and not lead.pending:
            return
        now = self.clock()
        if now < self._isr_after or not self.quorum.agreed.majority:
            return
        self._isr_busy = True
        lead.propose(wanted)
        task = self.loop.create_task(self._propose_insync(wanted))
        task.add_done_callback(self._insync_done)

    async def _propose_insync(self, wanted: frozenset[str]) -> None:
        client = self.quorum.agreed.client
        timeout = self.config.agreement_timeout
        if self.leader_epoch is None:
            owner, epoch = await client.read(LOG, self.partition)
            result = (await client.propose([move(LOG, self.partition, owner, epoch, self.partition)], timeout))[0]
            if result[0] != OK:
                raise _NotNow(f"the claim of its log was refused: {result}")
            self.leader_epoch = result[2]
        result = (await client.propose([insync(self.partition, self.leader_epoch, wanted)], timeout))[0]
        if result[0] != OK:
            # A newer epoch holds: another incarnation of this router claimed its log since. This
            # one claims again (it is the one running: the supervisor starts one at a time).
            self.leader_epoch = None
            raise _NotNow(f"the in-sync set was refused: {result}")
        was = self.lead.leader.agreed
        released: list[Held] = self.lead.leader.agree(wanted)  # (clears the proposal)
        if was != wanted:  # (None, before the first commit, differs too)
            log.info("replication: the log of %s is in sync on %s (agreed, leader epoch %d)", self.partition,
                     ", ".join(sorted(wanted)) or "no follower", self.leader_epoch)
        self.lead.release(released)

    def _insync_done(self, task: asyncio.Task) -> None:
        self._isr_busy = False
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            # Not committed, or unknown: a set that may still commit is one the leader already
            # counted while it was proposed, so dropping it from the count is safe only once the
            # next proposal (which replaces it) commits. It stays counted until then.
            self._isr_after = self.clock() + RETRY_S
            log.debug("replication: the in-sync set of %s not agreed yet: %s", self.partition, exc)

    def insync_published(self, router: str, epoch: int, followers: Any) -> None:
        """A committed in-sync set, as this node's member published it."""
        current = self.agreed_isr.get(router)
        if current is None or epoch >= current[0]:
            self.agreed_isr[router] = (epoch, frozenset(followers))

    def in_sync_holders(self, partition: str) -> frozenset[str] | None:
        """The routers the agreement names in sync with ``partition``'s log (None: none known)."""
        held = self.agreed_isr.get(partition)
        return None if held is None else held[1]


class _NotNow(Exception):
    """A proposal of the in-sync set that did not hold: tried again later."""
