"""The agreement engine: PySyncObj's Raft carrying cluster.agreement.state, usable from asyncio.

Raft gives one order of commands that a majority of the members has written before any is
applied; every member applies the same order to its own ``State``. The broker proposes a list
of commands (one log entry) and gets their results once the entry is committed and applied.

Authentication: PySyncObj unpickles what its peers send, so an unauthenticated Raft port would run
anything a connecting process asked. A password is therefore required, on loopback too (like
the mesh): PySyncObj then derives a Fernet key from it (PBKDF2-SHA256) and every frame is
encrypted and authenticated (AES-CBC + HMAC, needs ``cryptography``) before it is unpickled,
and a connection's frames carry a random per-connection key and timestamps that may not go
back: a frame from another connection or an older second is refused, one repeated within the
same second on its connection is not (Raft must tolerate a duplicate). Use a long random
password (a fixed salt makes a weak one guessable offline).

Waiting: PySyncObj runs its own thread (``autoTick``); a commit calls back there, and the result
crosses to the caller's loop with ``call_soon_threadsafe``. A proposal not committed within its
timeout raises ``NoAgreement``: the caller refuses what needed it (a CONNECT: server unavailable).
Its outcome is then unknown (the entry may still commit later), which a conditional command
makes harmless: the next attempt reads the record again and moves from whatever holds.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence

# PySyncObj 0.3.17, when imported, replaces ``socket.inet_ntop`` with a Windows-only function on
# every platform (its win_inet_pton module guards only ``inet_pton``): every other user of
# ``inet_ntop`` in the process (paho, ipaddress-free address formatting) then raises TypeError.
# Import it through here, and the process keeps its own.
_inet_ntop = socket.inet_ntop
from pysyncobj import FAIL_REASON, SyncObjConf, replicated  # noqa: E402
from pysyncobj.transport import TCPTransport  # noqa: E402

socket.inet_ntop = _inet_ntop

# Its followers truncate only from a conflict, and its journal is synced before a member answers.
from .pysyncobj_fixes import PatchedSyncObj  # noqa: E402
from .state import INSYNC, Command, NoAgreement, Result, State  # noqa: E402

__all__ = ["Agreement", "NoAgreement"]


class _Replica(PatchedSyncObj):
    """One member's replica: the only replicated method applies a batch to the local State.

    ``on_changed``: called in PySyncObj's thread, in log order, with the records an applied entry
    changed (``[kind, key, owner, epoch]``, owner None once released; ``[INSYNC, router,
    followers, leader epoch]`` for an in-sync set), so that the node's service
    tells its routers of moves without their asking."""

    def __init__(self, address: str, peers: Sequence[str], conf: SyncObjConf, transport: type,
                 on_changed: Callable[[list[list]], None] | None = None) -> None:
        self.state = State()
        self.on_changed = on_changed  # set before the engine's thread starts: it may replay a journal
        super().__init__(address, list(peers), conf, transportClass=transport)
        # PySyncObj snapshots the attributes set after its __init__ only (it lists those set before
        # as its own): without this, a snapshot (log compaction) would hold no state, and a member
        # restored from it, or a follower sent it, would start from an empty one.
        self._SyncObj__properies.discard("state")

    @replicated
    def apply_batch(self, commands: list[Command]) -> list[Result]:
        hook = self.on_changed
        if hook is None:
            return self.state.apply_batch(commands)
        keys = _touched(commands)
        before = [_record(self.state, kind, key) for kind, key in keys]
        results = self.state.apply_batch(commands)
        changed = [[kind, key, *now] for (kind, key), was in zip(keys, before, strict=True)
                   if (now := _record(self.state, kind, key)) != was]
        if changed:
            hook(changed)
        return results


def _touched(commands: Sequence[Command], into: dict | None = None) -> list[tuple[str, str]]:
    """The (kind, key) of every move and release in ``commands``, those of ``all_of`` too, once each
    and in order, and (INSYNC, router) of every in-sync set; malformed ones left out (they change
    nothing)."""
    seen: dict[tuple[str, str], None] = {} if into is None else into
    for c in commands:
        if not isinstance(c, (tuple, list)) or not c:
            continue
        if c[0] in ("move", "release") and len(c) > 2 and isinstance(c[1], str) and isinstance(c[2], str):
            seen[(c[1], c[2])] = None
        elif c[0] == "insync" and len(c) > 1 and isinstance(c[1], str):
            seen[(INSYNC, c[1])] = None
        elif c[0] == "all" and len(c) == 2 and isinstance(c[1], (tuple, list)):
            _touched(c[1], seen)
    return list(seen)


def _record(state: State, kind: str, key: str) -> tuple:
    """What is published of a touched record: (owner, epoch), or for an in-sync set (the sorted
    followers, the leader epoch)."""
    if kind == INSYNC:
        epoch, followers = state.insync.get(key, (0, frozenset()))
        return sorted(followers), epoch
    return state.owner(kind, key)


class Agreement:
    """A member of the agreement cluster, bound to ``address`` ("host:port") with ``peers``.

    ``data_dir``: where the Raft journal (term, vote and log) and snapshots are kept. A member
    without one forgets its vote when it restarts, so it must then rejoin as a new, empty
    member; with one it may restart in place. ``transport``: PySyncObj's TCP transport, or a
    subclass of it (a test's, that drops what a partition would). ``on_changed``: see ``_Replica``.
    """

    def __init__(self, address: str, peers: Sequence[str], password: str, *, data_dir: str | None = None,
                 election_timeout: tuple[float, float] = (0.4, 1.4), heartbeat: float = 0.1,
                 connect_timeout: float = 3.5, transport: type = TCPTransport,
                 on_changed: Callable[[list[list]], None] | None = None) -> None:
        if not password:
            raise ValueError("the agreement engine needs a password, on loopback too: its peers unpickle frames")
        journal = dump = None
        if data_dir is not None:
            os.makedirs(data_dir, exist_ok=True)
            journal = os.path.join(data_dir, "raft.journal")
            dump = os.path.join(data_dir, "raft.snapshot")
        conf = SyncObjConf(
            password=password,
            bindAddress=bind_address(address),
            autoTick=True,
            raftMinTimeout=election_timeout[0],
            raftMaxTimeout=election_timeout[1],
            appendEntriesPeriod=heartbeat,
            connectionTimeout=connect_timeout,
            connectionRetryTime=min(1.0, connect_timeout),
            journalFile=journal,
            fullDumpFile=dump,
            useFork=False,  # a snapshot written in this thread: no fork of a process that runs other threads
            appendEntriesUseBatch=False,  # an entry leaves at once (not at the next period): the caller batches
            appendEntriesBatchSizeBytes=2**20,  # a mass failover's entries are large: fewer, fuller frames
            dynamicMembershipChange=False,
        )
        self.address = address
        self._retry = heartbeat
        self._closed = False
        self._replica = _Replica(address, peers, conf, transport, on_changed)

    @property
    def state(self) -> State:
        """This member's replica, as fresh as what it has applied: read through ``get`` for the agreed value.
        Raft's thread writes it: read single records (``owner``), never iterate its tables."""
        return self._replica.state

    @property
    def leader(self) -> str | None:
        leader = self._replica._getLeader()
        return None if leader is None else leader.address

    @property
    def listening(self) -> bool:
        """Whether the member's port is bound: until then PySyncObj ticks nothing else (no peer is
        connected to), and retries the bind every second without a word."""
        return bool(self._replica._SyncObj__transport.ready)

    def propose_later(self, commands: Sequence[Command], timeout: float) -> concurrent.futures.Future:
        """Propose from any thread: a Future set (in PySyncObj's thread) with the results. A
        proposal the engine drops (a leader lost, none elected yet) is proposed again until
        ``timeout``: every command is conditional or idempotent, so one that did commit the first
        time answers the second time with what it made. The caller bounds its wait, then cancels."""
        done: concurrent.futures.Future = concurrent.futures.Future()
        deadline = time.monotonic() + timeout
        batch = list(commands)

        def committed(results: list[Result] | None, err: int) -> None:
            if done.done():
                return
            if err != FAIL_REASON.SUCCESS and time.monotonic() + self._retry < deadline:
                _later(self._retry, submit)
                return
            with contextlib.suppress(concurrent.futures.InvalidStateError):  # its caller gave up meanwhile
                if err == FAIL_REASON.SUCCESS:
                    done.set_result(results)
                else:
                    done.set_exception(NoAgreement(f"not committed: {_reason(err)}"))

        def submit() -> None:
            if not done.done():
                self._replica.apply_batch(batch, callback=committed)

        submit()
        return done

    async def propose(self, commands: Sequence[Command], timeout: float) -> list[Result]:
        """Propose a batch (one log entry) and wait for its results without blocking the loop."""
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()

        def relay(f: concurrent.futures.Future) -> None:
            loop.call_soon_threadsafe(_settle, waiter, f)

        proposal = self.propose_later(commands, timeout)
        proposal.add_done_callback(relay)
        try:
            return await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            proposal.cancel()
            raise NoAgreement(f"no majority committed it within {timeout:g}s") from None

    def propose_wait(self, commands: Sequence[Command], timeout: float) -> list[Result]:
        """The same for a plain thread (tests, the benchmark)."""
        proposal = self.propose_later(commands, timeout)
        try:
            results: list[Result] = proposal.result(timeout)
            return results
        except TimeoutError:
            proposal.cancel()
            raise NoAgreement(f"no majority committed it within {timeout:g}s") from None

    def close(self) -> None:
        """Stop the Raft thread and close its port; this member is then silent to the others."""
        if not self._closed:
            self._closed = True
            self._replica.destroy_synchronous()


def bind_address(address: str) -> str:
    """Where the member listens: its own address, resolved as the supervisor's start check binds it.
    PySyncObj binds 0.0.0.0 (or ::) at the member's port otherwise, and a wildcard bind fails while
    any socket of the host holds that port on any address, such as a client's ephemeral port: it
    retries every second without a word, and the member, never bound, connects to nobody either
    (chaos seed 1151369154: node c's member alone for 30 s while a client of another test held
    its port on another address)."""
    host, port = address.rsplit(":", 1)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    ip = socket.getaddrinfo(host, int(port), family, socket.SOCK_STREAM)[0][4][0]
    return f"{ip}:{port}"


def _settle(waiter: asyncio.Future, f: concurrent.futures.Future) -> None:
    if waiter.done() or f.cancelled():
        return  # the caller timed out first
    exc = f.exception()
    if exc is not None:
        waiter.set_exception(exc)
    else:
        waiter.set_result(f.result())


def _reason(err: int) -> str:
    names: dict[int, str] = {v: k for k, v in vars(FAIL_REASON).items() if k.isupper()}
    return names.get(err, str(err)).lower()


def _later(delay: float, call: Callable[[], None]) -> None:
    timer = threading.Timer(delay, call)
    timer.daemon = True
    timer.start()
