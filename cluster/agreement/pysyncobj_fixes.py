"""PySyncObj 0.3.17 with the gaps the broker cannot live with closed: ``PatchedSyncObj``.

Each fix overrides one of SyncObj's private methods (``_SyncObj__name``, its name-mangled form), calls
the original for everything it leaves alone, and says what upstream does, why it is wrong, and which
rule of the Raft paper (Ongaro and Ousterhout) it restores. Import PySyncObj through
``cluster/agreement/raft.py`` only: importing it replaces ``socket.inet_ntop`` (see there).

1. A follower keeps the entries that agree with the leader's (AppendEntries rules 3 to 5).
2. A member's log, term and vote are on disk before it answers for them ("persistent state on all
   servers, updated on stable storage before responding to RPCs").
3. A candidate asks again for the votes it has not had (section 5.1: "servers retry RPCs if they
   do not receive a response in a timely manner").
4. A connect attempt is bounded (``CONNECT_ATTEMPT_S``): a peer back from a cut is reached at the
   next retry, not after TCP's growing SYN retries (the same rule as section 5.1's).
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from typing import TYPE_CHECKING, Any

from pysyncobj import SyncObj
from pysyncobj import pickle as sync_pickle
from pysyncobj.journal import MetaStorer
from pysyncobj.syncobj import _RAFT_STATE
from pysyncobj.tcp_connection import CONNECTION_STATE

if TYPE_CHECKING:
    from pysyncobj import SyncObjConf
    from pysyncobj.node import Node

__all__ = ["CONNECT_ATTEMPT_S", "PatchedSyncObj"]

# Fix 4: a connect attempt not established within this is given up and made again. A SYN on a
# healthy link is answered in well under it (1 s is also TCP's own first SYN retry), so only an
# attempt whose SYN was lost waits this long.
CONNECT_ATTEMPT_S = 1.0

_keeping = threading.local()  # set while upstream handles an append that fix 1 keeps whole


class _NoFalseTruncation(logging.Filter):
    """Upstream logs "truncating already-applied log entries" (CRITICAL: "may have diverged") before
    it deletes; on an append that fix 1 keeps whole it deletes nothing, so that line would be false."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (getattr(_keeping, "tail", False) and str(record.msg).startswith("truncating"))


logging.getLogger("pysyncobj.syncobj").addFilter(_NoFalseTruncation())


class PatchedSyncObj(SyncObj):
    """SyncObj whose followers truncate only from a conflict, whose journal is synced, and whose
    candidates ask again for votes.

    Membership changes (``dynamicMembershipChange``) are refused: upstream undoes the changes of the
    entries it is about to delete before deleting them, which fix 1 would leave half done."""

    # Upstream's private state that the fixes read and write (set by SyncObj's __init__).
    _SyncObj__raftCommitIndex: int
    _SyncObj__recvTransmission: str | bytes  # a large entry's parts received so far ('' for none)

    def __init__(self, selfNode: str | Node, otherNodes: list[str | Node], conf: SyncObjConf | None = None,
                 **kwargs: Any) -> None:
        if conf is not None and conf.dynamicMembershipChange:
            raise ValueError("PatchedSyncObj does not support dynamicMembershipChange")
        # Set before SyncObj's __init__: it lists the attributes that exist then as its own and
        # snapshots (and restores from a snapshot) only the others.
        self._keep_tail = False  # fix 1: an append that is all repeats deletes nothing
        self._synced_log: tuple | None = None  # fix 2: the log as last synced (first, last index, last term)
        self._synced_dump: tuple | None = None  # fix 2: the snapshot file as last synced (inode, size, mtime)
        self._votes_asked = (0, 0.0)  # fix 3: the term a candidate last asked for votes in, and when
        super().__init__(selfNode, otherNodes, conf, **kwargs)

    # -- 1. entries that agree with the leader's are kept ------------------------------------------

    def _SyncObj__onMessageReceived(self, node: Node, message: dict) -> None:
        """Upstream, on an append whose previous entry matches, deletes every entry after it and then
        appends the leader's. A repeated or late append (the leader resends from an older next index
        after a late answer, or the network repeats) thus deletes entries this member acknowledged
        after it; sent in part, they are not all sent again, and a committed entry may then live on
        the leader alone. Raft (AppendEntries rule 3) deletes only from the first entry whose term
        conflicts, appends only entries not in the log (rule 4), and commits no further than the
        last entry the append vouched for (rule 5). The message is rewritten to start after the
        entries this member already holds, so upstream's deletion falls on the first conflict, or
        (all held) on nothing."""
        append = self._held_entries_skipped(message)
        if append is None:
            super()._SyncObj__onMessageReceived(node, message)
            return
        message, last_new, keep_tail = append
        committed = self._SyncObj__raftCommitIndex
        self._keep_tail = _keeping.tail = keep_tail
        try:
            super()._SyncObj__onMessageReceived(node, message)
        finally:
            self._keep_tail = _keeping.tail = False
        # Upstream commits up to its log's end, which a kept tail may run past into entries of an
        # older term that the leader's log does not hold: rule 5 stops at the last new entry.
        bound = max(committed, last_new)
        if self._SyncObj__raftCommitIndex > bound:
            self._SyncObj__raftCommitIndex = bound
            self._SyncObj__raftLog.setRaftCommitIndex(bound)

    def _SyncObj__deleteEntriesFrom(self, fromIDx: int) -> None:
        """Called by upstream only on an append whose previous entry matches; skipped when every
        entry of the append is already held (rule 3: nothing conflicts, nothing is deleted)."""
        if not self._keep_tail:
            super()._SyncObj__deleteEntriesFrom(fromIDx)

    def _held_entries_skipped(self, message: dict) -> tuple[dict, int, bool] | None:
        """``(message, last new index, keep the tail)`` for an append of entries this member will
        accept (its term current, its previous entry held with the same term), rewritten to start
        after the entries already held; None for every other message, which upstream handles."""
        if message.get("type") != "append_entries" or "prevLogIdx" not in message:
            return None
        if message["term"] < self._SyncObj__raftCurrentTerm:
            return None
        if message.get("transmission") not in (None, "finish"):
            return None  # a part of a large entry: upstream buffers it and answers without appending
        log = self._SyncObj__raftLog
        first, last = log[0][1], log[-1][1]
        prev_idx, prev_term = message["prevLogIdx"], message["prevLogTerm"]
        if prev_idx is None or not first <= prev_idx <= last or log[prev_idx - first][2] != prev_term:
            return None  # refused by upstream, nothing deleted
        if message.get("transmission") == "finish":
            received = self._SyncObj__recvTransmission
            if not isinstance(received, bytes):
                return None
            entries = [sync_pickle.loads(received + message["data"])]
            self._SyncObj__recvTransmission = ""
            message = {k: v for k, v in message.items() if k not in ("transmission", "data")}
        else:
            entries = list(message.get("entries", []))
        held = 0
        for _command, idx, term in entries:
            if idx > last or log[idx - first][2] != term:
                break
            held += 1
        last_new = entries[-1][1] if entries else prev_idx
        if held:
            _command, prev_idx, prev_term = entries[held - 1]
        message = dict(message, prevLogIdx=prev_idx, prevLogTerm=prev_term, entries=entries[held:])
        return message, last_new, held == len(entries) and prev_idx < last

    # -- 2. on disk before answering ---------------------------------------------------------------

    def _SyncObj__sendNextNodeIdx(self, node: Node, reset: bool = False, nextNodeIdx: int | None = None,
                                  success: bool = False) -> None:
        """Upstream writes the journal (a file through mmap) and answers, never syncing it: a machine
        crash then loses entries this member acknowledged, and the leader counted. Raft: persistent
        state is on stable storage before responding. A success answer is the acknowledgement."""
        if success:
            self._sync_log()
        super()._SyncObj__sendNextNodeIdx(node, reset=reset, nextNodeIdx=nextNodeIdx, success=success)

    def _SyncObj__setCurrentTerm(self, term: int, votedForNodeId: str | None) -> None:
        """Upstream stores term and vote (``raft.journal.meta``) through a file it renames into place,
        unsynced, just before it asks for or grants a vote: a member that restarts after a machine
        crash may vote twice in one term. Raft: currentTerm and votedFor are on stable storage
        before responding. The journal's meta writer is swapped for one that syncs a new term or
        vote (this runs in the engine's thread, before the first vote)."""
        journal = self._SyncObj__raftLog
        storer = getattr(journal, "_FileJournal__metaStorer", None)
        if storer is not None and not isinstance(storer, _SyncedMeta):
            journal._FileJournal__metaStorer = _SyncedMeta(storer.getPath())
        super()._SyncObj__setCurrentTerm(term, votedForNodeId)

    def _SyncObj__deleteEntriesTo(self, toIDx: int) -> None:
        """Log compaction: upstream drops the entries a snapshot now holds and rewrites the journal,
        neither synced. The snapshot is synced first, so that no entry is only in unsynced files."""
        self._sync_dump()
        super()._SyncObj__deleteEntriesTo(toIDx)
        self._sync_log()

    def _onTick(self, timeToWait: float = 0.0) -> None:
        """A leader counts its own log towards a majority in the tick's commit step: its new entries
        are synced first (they left for the followers already: Raft lets the two overlap). A
        candidate asks again for votes (fix 3). Connect attempts are bounded (fix 4)."""
        if self._isLeader():
            self._sync_log()
        elif self._SyncObj__raftState == _RAFT_STATE.CANDIDATE:
            self._ask_votes_again()
        self._bound_connects()
        super()._onTick(timeToWait)

    # -- 3. vote requests are sent again ----------------------------------------------------------

    def _ask_votes_again(self) -> None:
        """Upstream sends a vote request once per term. A connection on which nothing was read for
        ``connectionTimeout`` is closed at its next send and the message dropped, and followers
        send each other nothing while a leader lives: when it dies, the first request to the
        other follower is always lost, and the election waits for another timeout, often split.
        Raft retries an unanswered RPC: every heartbeat period, a candidate sends its request
        again to every peer. A member answers one candidate per term once, so no vote counts
        twice; one that voted for another, or is in a later term, ignores it."""
        term, now = self._SyncObj__raftCurrentTerm, time.monotonic()
        asked_term, asked_at = self._votes_asked
        if asked_term != term:
            self._votes_asked = (term, now)  # upstream has just asked
            return
        if now - asked_at < self.conf.appendEntriesPeriod:
            return
        self._votes_asked = (term, now)
        log = self._SyncObj__raftLog
        request = {"type": "request_vote", "term": term, "last_log_index": log[-1][1], "last_log_term": log[-1][2]}
        for node in self._SyncObj__otherNodes:
            self._SyncObj__transport.send(node, request)

    # -- 4. connect attempts are bounded ------------------------------------------------------------

    def _bound_connects(self) -> None:
        """Upstream connects without a bound: a connection stays *connecting* until the kernel gives
        up its SYN retries (1, 3, 7, 15, 31 s after the attempt; 1, 2, 3, 4, 6, 10 ... on Linux 6.5
        and later, ``tcp_syn_linear_timeouts``), and its time-out is checked only
        when the socket has an event or a message is sent on it, neither of which happens while it
        connects. A peer cut off (link down, packets dropped) past ``connectionTimeout`` is tried
        again every ``connectionRetryTime``, each attempt's SYN lost; back, it is reached at the
        attempt's next SYN retry, up to 15 s later (a node whose link was down 12 s took
        persistent sessions in again 3 to 29 s after its link was up, 4 runs). An attempt older
        than ``CONNECT_ATTEMPT_S`` whose socket is not writable yet (no answer to its SYN: a socket
        connected or refused is, and this tick's poll takes it) is given up here, in the engine's
        thread; the transport's disconnect handler makes the next one at once (its retry time has
        passed too), with a new SYN."""
        transport = self._SyncObj__transport
        attempts = getattr(transport, "_lastConnectAttempt", None)
        connections = getattr(transport, "_connections", None)
        if not attempts or not connections:
            return
        now = time.monotonic()  # PySyncObj's monotonicTime, the clock of its attempts
        for node, conn in list(connections.items()):
            began = attempts.get(node)
            if began is None or conn.state != CONNECTION_STATE.CONNECTING or now - began <= CONNECT_ATTEMPT_S:
                continue
            sock = getattr(conn, "_TcpConnection__socket", None)
            if sock is not None and select.select([], [sock], [], 0)[1]:
                continue  # answered meanwhile (this thread was late): upstream's poll handles it
            conn.disconnect()

    def _sync_log(self) -> None:
        """msync the journal (``mmap.flush``: on Linux, a data sync of the file) if it changed since.
        By Raft's log matching, the last entry's index and term name the whole log; the first index
        changes when compaction rewrites it. A snapshot installed from the leader is synced too."""
        journal = self._SyncObj__raftLog
        if not hasattr(journal, "flush"):
            return  # the log in memory: nothing to sync
        key = (journal[0][1], journal[-1][1], journal[-1][2])
        if key != self._synced_log:
            self._sync_dump()
            journal.flush()
            self._synced_log = key

    def _sync_dump(self) -> None:
        path = self.conf.fullDumpFile
        if path is None:
            return
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        if key != self._synced_dump:
            _fsync(path)
            _fsync(os.path.dirname(os.path.abspath(path)))
            self._synced_dump = key


class _SyncedMeta(MetaStorer):
    """Upstream's meta writer (term, vote, commit index: a file renamed into place) with the file and
    its directory synced when the term or vote changed. The commit index alone, stored once a
    second, is not synced: Raft keeps it in memory, and a member relearns it from the leader."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self._synced: tuple | None = None

    def storeMeta(self, meta: dict) -> None:
        vote = (meta.get("currentTerm"), meta.get("votedForNodeId"))
        if vote == self._synced:
            super().storeMeta(meta)
            return
        path = self.getPath()
        with open(path + ".tmp", "wb") as f:
            f.write(sync_pickle.dumps(meta))
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)
        _fsync(os.path.dirname(os.path.abspath(path)))
        self._synced = vote


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
