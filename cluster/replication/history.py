"""Replication's history: the records of a log below where it starts, fetched from a node that
holds them (docs/replication.md, "History").

A follower placed at its leader's high-water mark holds what lies below only once this is done;
a router back on an empty disk gets its old records back. One task per log, one HISTORY_FETCH
at a time, into a log of its own that joins the main log once it reaches it. The rule for each
answer is ``cluster.replication.rules.HistoryState``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgpack

from brokerd.router.log import CommitLog, Record
from brokerd.router.log.format import record_fields

from .follower import FETCH_AGAIN_S, _remove_aside
from .part import Part
from .read_back import highest_holder
from .rules import HistoryState

if TYPE_CHECKING:
    from ..mesh import Peer
    from .follower import FollowerPart, Replica

log = logging.getLogger(__package__)  # (the package's name: the log lines name it as before)

HISTORY_DIR = "_history"  # inside a log's directory: its records below its start, being fetched
HISTORY_WAIT_S = 5.0  # a history request not answered within this is asked again (of the source then)
# A history answer is read and packed on the source's loop (under 1 ms for 500 records of 1 KiB, 5.6 ms for 2,000):
# small answers, and a pause of HISTORY_PACE times the round trip between them, keep a fetch of
# a large log from taking more than about a quarter of the source's loop.
HISTORY_RECORDS = 500
HISTORY_BYTES = 1 << 20
HISTORY_PACE = 3.0


class HistoryPart(Part):
    """Fetching and serving the records below a log's start."""

    # The other parts it calls (set by ``Replication``).
    follow: FollowerPart

    # Of ``FollowerPart``.
    replicas: dict[str, Replica]
    remove_tree: Callable[[str], None]

    def __init__(self, shared: Part) -> None:
        super().__init__(shared)
        # Logs whose records below their start are being fetched (``fetch_history``): the task,
        # the request waiting for its answer, and how far it is (next offset, the log's start).
        self.fetches: dict[str, tuple[CommitLog, asyncio.Task]] = {}
        self._history_waits: dict[str, tuple[str, asyncio.Future]] = {}
        self.history_at: dict[str, tuple[int, int]] = {}

    @staticmethod
    def history_dir(log_: CommitLog) -> str:
        return os.path.join(log_.directory, HISTORY_DIR)

    def fetch_history(self, partition: str, log_: CommitLog) -> None:
        """Fetch the records of ``partition`` below where ``log_`` starts, from a node that
        holds them, and join them to it (docs/replication.md, "History"): a follower placed at the
        high-water mark holds what lies below only once this is done; a router back on an empty
        disk gets its old records back. One task per log, one request at a time."""
        running = self.fetches.get(partition)
        if running is not None and running[0] is log_ and not running[1].done():
            return
        previous = running[1] if running is not None else None
        # At once, not when the task opens it: a restart finds it and goes on (``replicate``).
        os.makedirs(self.history_dir(log_), mode=0o700, exist_ok=True)
        task = self.loop.create_task(self._history(partition, log_, previous))
        self.fetches[partition] = (log_, task)

    def stop_history(self, partition: str) -> None:
        running = self.fetches.get(partition)
        if running is not None:
            running[1].cancel()

    def _history_source(self, partition: str) -> Any:
        """Whom to fetch ``partition``'s history from: its router while it is alive, else the
        live holder of the replica with the highest end (this router's own log: a follower)."""
        peer = self.net.peer(partition)
        if peer is not None and peer.alive:
            return peer
        return highest_holder(partition, self.net.peers())[0]

    async def _history(self, partition: str, target: CommitLog, previous: asyncio.Task | None) -> None:
        if previous is not None:  # the history of a log this one replaced: wait until it let go
            previous.cancel()
            await asyncio.wait([previous])
        directory = self.history_dir(target)
        self.loop.run_in_executor(None, _remove_aside, target.directory)  # what a crash left
        if previous is not None:
            self.follow.remove_tree(directory)
        c = self.config
        # No fsync per batch (nothing waits on it): the close makes the history durable before it joins.
        hist = await CommitLog.open_async(directory, router_id=partition, fsync="interval",
                                          segment_bytes=c.segment_bytes)
        try:
            await self._fetch_into(partition, target, hist, directory)
        except Exception:  # noqa: BLE001 - a peer that lies, a disk that fails: said, and tried at the next start
            log.exception("replication: fetching the records of %s below offset %d failed", partition,
                          target.start_offset)

    async def _fetch_into(self, partition: str, target: CommitLog, hist: CommitLog, directory: str) -> None:
        c = self.config
        try:
            before = target.start_offset
            held = hist.next_offset > hist.start_offset
            if hist.next_offset > before:  # (a log that began again lower: not this one's history)
                await hist.aclose()
                self.follow.remove_tree(directory)
                hist = await CommitLog.open_async(directory, router_id=partition, fsync="interval",
                                                  segment_bytes=c.segment_bytes)
                held = False
            state = HistoryState(before, hist.next_offset if held else None)
            log.info("replication: fetching the records of %s below offset %d%s", partition, before,
                     f" (from {hist.start_offset}..{hist.next_offset - 1} held)" if held else "")
            while not target.closed:
                self.history_at[partition] = (state.ask(), before)
                source = self._history_source(partition)
                if source is None:
                    await asyncio.sleep(FETCH_AGAIN_S)
                    continue
                answer = self.loop.create_future()
                self._history_waits[partition] = (source.router_id, answer)
                asked = self.loop.time()
                self.net.send(source, "history_fetch", [partition, state.ask(), before])
                try:
                    first, last, body = await asyncio.wait_for(answer, HISTORY_WAIT_S)
                except TimeoutError:
                    continue
                finally:
                    if self._history_waits.get(partition, (None, None))[1] is answer:
                        del self._history_waits[partition]
                pause = HISTORY_PACE * (self.loop.time() - asked)
                action = state.arrived(first, last)
                if action == HistoryState.DONE:
                    break
                if action == HistoryState.REPEAT:
                    continue
                records = msgpack.unpackb(body, raw=False)
                if len(records) != last - first + 1:
                    raise ValueError(f"history: {len(records)} records for offsets {first}..{last}")
                if action == HistoryState.BEGIN:
                    if hist.next_offset > hist.start_offset:  # the source no longer has what lies between
                        await hist.aclose()
                        self.follow.remove_tree(directory)
                        hist = await CommitLog.open_async(directory, router_id=partition, fsync="interval",
                                                          segment_bytes=c.segment_bytes)
                    hist.start_at(first)
                skip = state.ask() - first
                hist.append_batch(state.ask(), records[skip:], body if not skip else None)
                if state.appended(last):
                    break
                await asyncio.sleep(pause)
            held_to = hist.next_offset - 1
            fetched = hist.next_offset - hist.start_offset
            await hist.aclose()
            if target.closed:
                return
            joined = await self._join(target, directory, held_to) if fetched > 0 else 0
            self.follow.remove_tree(directory)
            log.info("replication: %s: %d record(s) below offset %d fetched%s", partition, max(fetched, 0),
                     before, f" and joined to the log ({joined} segment(s))" if joined else
                     "; nobody holds any (none, or retention deleted them)")
        finally:
            self.history_at.pop(partition, None)
            if not hist.closed:
                await hist.aclose()

    async def _join(self, target: CommitLog, directory: str, last: int) -> int:
        """``target.join_history_async``, which a cancel (its replica begun anew) does not cut
        short: the task that follows waits for this one, and must not meet files half moved."""
        join = self.loop.create_task(target.join_history_async(directory, last))
        try:
            return await asyncio.shield(join)
        except asyncio.CancelledError:
            await asyncio.wait([join])
            if not join.cancelled() and join.exception() is not None:  # retrieved: the cancel says why we stop
                log.debug("replication: a join cut short by a cancel failed: %s", join.exception())
            raise

    def history_fetch(self, peer: Peer, partition: str, offset: int, before: int) -> None:
        """``peer`` fetches the records of ``partition`` below ``before`` from ``offset`` on
        (``_history``): from this router's log, or its replica of it; contiguous records up to
        ``HISTORY_RECORDS``/``HISTORY_BYTES``, or an empty answer: no more."""
        rep = self.follow.replicas.get(partition)
        log_ = self.log if partition == self.partition else rep.log if rep is not None else None
        records: list[Record] = []
        if log_ is not None:
            for r in log_.read(offset, max_records=HISTORY_RECORDS, max_bytes=HISTORY_BYTES):
                if r.offset >= before or (records and r.offset != records[-1].offset + 1):
                    break  # (a log continued after a lost disk has a gap: the asker begins again after it)
                records.append(r)
        if not records:
            self.net.send(peer, "history", [partition, -1, -1, b""])
            return
        body = msgpack.packb([record_fields(r) for r in records])
        self.net.send(peer, "history", [partition, records[0].offset, records[-1].offset, body])

    def history(self, sender: str, partition: str, first: int, last: int, body: bytes) -> None:
        """The answer to a history request: to the task that asked, if it asked ``sender``."""
        waiting = self._history_waits.get(partition)
        if waiting is not None and waiting[0] == sender and not waiting[1].done():
            waiting[1].set_result((first, last, body))
