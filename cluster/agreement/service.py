"""The node's agreement service: the one Raft member of a node, serving that node's workers.

Why a process of its own: a member per worker would make a node count as many votes as it has
workers, and the workers' event loops must not carry PySyncObj's thread. So the supervisor forks
``brokerd-agree`` before the workers (they find it at start), restarts it when it dies (its journal
in ``<data dir>/<node>/agreement`` keeps its vote and log), and stops it after them.

Its workers reach it on two local sockets (the run directory is 0700: nothing more to check):

* ``agreement.sock`` (ROUTER): one msgpack list per request, answered with the same request id.
  ``[req, "propose", commands, timeout(, deadline)]`` -> ``[req, "ok", results]`` or ``[req, "no",
  reason]`` (``deadline``: the caller's, on the host's monotonic clock);
  ``[req, "read", kind, key]`` -> ``[req, "ok", owner, epoch]`` (this member's view, maybe stale);
  ``[req, "status"]`` -> ``[req, "ok", {...}]``. Every proposal received in one poll round goes
  into one Raft entry (``ENTRY_COMMANDS`` at most): a mass failover's moves are a few entries,
  not one each.
* ``agreement.pub`` (PUB): ``["owned", [[kind, key, owner, epoch], ...]]``, what the entries
  applied in a round changed (owner None: released; an in-sync set is ``[INSYNC, router,
  followers, leader epoch]``, and every set is said again each second), and ``["majority", bool]``
  at each change and every second.

*Majority* means "this member can commit now": a no-op is proposed every ``PROBE_EVERY_S``, and
the member has one while a probe sent within the last ``PROBE_TIMEOUT_S`` has committed. Raft's
own leader flag is not enough: a leader cut off from the others believes it leads.
"""

from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import hmac
import logging
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..config import Config
from ..paths import agreement_ipc, agreement_pub, ensure_run_dir
from ..process import exit_how, fork_child, name_process, stop_child
from .state import INSYNC, Command, State, get, join

log = logging.getLogger(__name__)

PROCESS_NAME = "brokerd-agree"  # /proc comm: 15 characters at most
CRASH_LIMIT = 5
CRASH_WINDOW_S = 60.0
STOP_GRACE_S = 5.0
READY_TIMEOUT_S = 10.0
PROBE_EVERY_S = 0.5
PROBE_TIMEOUT_S = 1.5
MAJORITY_REPEAT_S = 1.0  # ["majority", bool] again, for subscribers that came late
JOIN_TIMEOUT_S = 5.0
UNBOUND_GRACE_S = 2.0  # a member not listening this long after its start is said to be
ENTRY_COMMANDS = 5000  # most commands in one Raft entry (a bigger request goes alone)
ROUND_REQUESTS = 10_000  # requests read in one poll round before the rest wait for the next
QUEUE_HWM = 1_000_000  # messages queued per socket: a mass failover's requests at once (ZeroMQ's 1,000 refused them)
MAX_TIMEOUT_S = 300.0
PROBE = get("agreement", "probe")
PASSWORD_CONTEXT = b"brokerd agreement"


def member_address(address: tuple[str, int]) -> str:
    """A member's name, as PySyncObj splits it (``rsplit(':', 1)``: no brackets)."""
    return f"{address[0]}:{address[1]}"


def data_dir(config: Config) -> str:
    return os.path.join(config.data_dir, config.node_id, "agreement")


def password(config: Config) -> str:
    """The members' password, derived from the cluster's mesh key: every node holds the same, and
    nobody without it joins (or has its frames unpickled). Never logged."""
    import zmq.auth

    assert config.mesh_key is not None  # (the configuration refuses --agreement without --mesh-key)
    try:
        _, secret = zmq.auth.load_certificate(config.mesh_key)
    except (OSError, ValueError) as exc:
        raise OSError(f"--mesh-key: cannot load {config.mesh_key}: {exc}") from None
    if secret is None:
        raise OSError(f"--mesh-key: {config.mesh_key} holds no secret key (use the .key_secret file)")
    return hmac.new(secret, PASSWORD_CONTEXT, hashlib.sha256).hexdigest()


# -- pure parts: batching and the majority (unit-tested with a fake clock) ---------------------------

@dataclass
class Request:
    """A worker's proposal, waiting for its entry to commit."""

    identity: bytes
    req: Any
    commands: list
    deadline: float
    answered: bool = False


def entries(requests: list[Request], most: int = ENTRY_COMMANDS) -> list[list[Request]]:
    """Group a round's proposals into entries of at most ``most`` commands, in arrival order; a
    request is never split (one bigger than ``most`` is an entry alone)."""
    out: list[list[Request]] = []
    size = 0
    for r in requests:
        if not out or (out[-1] and size + len(r.commands) > most):
            out.append([])
            size = 0
        out[-1].append(r)
        size += len(r.commands)
    return out


def split(results: list, requests: list[Request]) -> list[list]:
    """An entry's results, back per request (each request's commands were concatenated in order)."""
    out, at = [], 0
    for r in requests:
        out.append(results[at:at + len(r.commands)])
        at += len(r.commands)
    return out


class Majority:
    """Whether this member committed recently: a probe sent at most ``window`` ago has committed."""

    def __init__(self, window: float = PROBE_TIMEOUT_S) -> None:
        self.window = window
        self.last_ok: float | None = None  # when the newest committed probe was sent

    def committed(self, sent: float) -> None:
        if self.last_ok is None or sent > self.last_ok:
            self.last_ok = sent

    def holds(self, now: float) -> bool:
        return self.last_ok is not None and now - self.last_ok <= self.window


class Unbound:
    """When to say that the member's port is not bound: PySyncObj retries a failed bind every second
    without a word, and a member not bound ticks nothing else, so it reaches no peer either (chaos
    seed 1151369154, undiagnosed for a day). Said once it lasted ``grace``, and again once bound."""

    def __init__(self, started: float, grace: float = UNBOUND_GRACE_S) -> None:
        self.started = started
        self.grace = grace
        self.said = False

    def news(self, listening: bool, now: float) -> str | None:
        """"unbound" the first time the member is not bound ``grace`` after its start, "bound" once
        it is after that; else None."""
        if listening:
            said, self.said = self.said, False
            return "bound" if said else None
        if self.said or now - self.started < self.grace:
            return None
        self.said = True
        return "unbound"


UNBOUND_LOG = {  # Unbound's news: how the service says it (with the member's address)
    "unbound": (logging.WARNING, "agreement: cannot listen on %s yet (its port taken on this host?): tried again "
                "every second; until then this member reaches no other"),
    "bound": (logging.INFO, "agreement: listening on %s now"),
}


# -- the service --------------------------------------------------------------------------------------

@dataclass
class _Entry:
    """One Raft entry in flight: workers' proposals, a probe, or this node's join."""

    kind: str  # "requests", "probe", "join"
    future: concurrent.futures.Future
    sent: float
    requests: list[Request] = field(default_factory=list)
    due: float = float("inf")  # the earliest deadline of its requests not answered yet


class Engine(Protocol):
    """What the service needs of its Raft member: ``raft.Agreement``."""

    @property
    def state(self) -> State:
        """The member's replica of the agreed state (PySyncObj's thread writes it)."""

    @property
    def leader(self) -> str | None:
        """The leader this member knows of, if any."""

    @property
    def listening(self) -> bool:
        """Whether the member's port is bound."""

    def propose_later(self, commands: Sequence[Command], timeout: float) -> concurrent.futures.Future:
        """One entry proposed: a Future set with its results, or failed (``NoAgreement``)."""

    def close(self) -> None:
        """Stop the member."""


class Service:
    """The service's loop; ``engine`` makes the Raft member (``Agreement``'s signature)."""

    def __init__(self, config: Config, engine: Callable[..., Engine], clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        assert config.agreement is not None  # (the service runs only with --agreement)
        self.address = member_address(config.agreement)
        self.peers = [member_address(p) for p in config.agreement_peer]
        self.incarnation = time.time_ns()
        self.events: deque = deque()  # (what, value) from PySyncObj's thread, read by the loop
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        os.makedirs(data_dir(config), mode=0o700, exist_ok=True)  # the journal: the agreed state
        self.engine = engine(self.address, self.peers, password(config), data_dir=data_dir(config),
                             on_changed=self._changed)
        self.majority = Majority()
        self.unbound = Unbound(self.clock())
        self.had_majority = False
        self.majority_seen = False  # had it once: a later one is "regained"
        self.leader: str | None = None
        self.joined = False
        self.in_flight: list[_Entry] = []
        self.owned: list[list] = []
        self.next_probe = 0.0
        self.next_join = 0.0
        self.next_majority = 0.0

    # PySyncObj's thread: hand over and wake the loop, nothing else
    def _changed(self, records: list[list]) -> None:
        self.events.append(("owned", records))
        self._wake()

    def _done(self, entry: _Entry) -> None:
        self.events.append(("done", entry))
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"!")
        except OSError:
            pass  # full (BlockingIOError): the loop wakes anyway

    def run(self, ready_fd: int | None, keep_going: Callable[[], bool]) -> int:
        import msgpack
        import zmq

        ctx = zmq.Context()
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.RCVHWM, QUEUE_HWM)
        router.setsockopt(zmq.SNDHWM, QUEUE_HWM)  # beyond it a ROUTER drops answers
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.SNDHWM, QUEUE_HWM)
        ensure_run_dir(self.config)
        paths = [agreement_ipc(self.config), agreement_pub(self.config)]
        for endpoint in paths:
            _unlink(endpoint)  # left by a killed incarnation
        router.bind(paths[0])
        pub.bind(paths[1])
        self.router, self.pub = router, pub
        self.packer = msgpack.Packer(use_bin_type=True)
        peers = ", ".join(self.peers) or "none: a cluster of one"
        log.info("agreement: member %s of %d (peers %s)", self.address, len(self.peers) + 1, peers)
        if ready_fd is not None:
            os.write(ready_fd, b"1")
            os.close(ready_fd)
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        try:
            while keep_going():
                wait = max(0.0, min(self.next_probe, self.next_majority, self._next_deadline()) - self.clock())
                ready = dict(poller.poll(int(min(wait, 0.1) * 1000)))
                if self._wake_r in ready:
                    _drain(self._wake_r)
                self._events()
                if router in ready:
                    self._requests(msgpack)
                self._timers()
                self._publish()
        finally:
            self.engine.close()
            router.close(0)
            pub.close(0)
            ctx.term()
            for endpoint in paths:
                _unlink(endpoint)
            os.close(self._wake_r)
            os.close(self._wake_w)
        return 0

    # -- requests ---------------------------------------------------------------------------------------

    def _requests(self, msgpack: Any) -> None:
        import zmq

        proposals: list[Request] = []
        now = self.clock()
        for _ in range(ROUND_REQUESTS):
            try:
                identity, data = self.router.recv_multipart(zmq.NOBLOCK)[:2]
            except zmq.Again:
                break
            except ValueError:
                continue  # a message without a body
            try:
                msg = msgpack.unpackb(data, raw=False, strict_map_key=False)
                req, op = msg[0], msg[1]
            except (ValueError, TypeError, IndexError, KeyError, msgpack.UnpackException):
                continue  # nothing to answer to
            try:
                if op == "propose":
                    commands, timeout = msg[2], msg[3]
                    if not isinstance(commands, list):
                        raise TypeError
                    timeout = self.config.agreement_timeout if timeout is None else float(timeout)
                    if not 0 < timeout <= MAX_TIMEOUT_S:
                        raise ValueError
                    deadline = now + timeout
                    if len(msg) > 4 and isinstance(msg[4], (int, float)):
                        # The caller's own deadline (CLOCK_MONOTONIC is the host's): a request that
                        # waited in its socket for a service not up yet is not proposed after it.
                        deadline = min(deadline, float(msg[4]))
                    if deadline <= now:
                        self._answer(identity, [req, "no", "its caller's time was up before it arrived"])
                        continue
                    proposals.append(Request(identity, req, commands, deadline))
                elif op == "read":
                    kind, key = msg[2], msg[3]
                    if not isinstance(kind, str) or not isinstance(key, str):
                        raise TypeError
                    self._answer(identity, [req, "ok", *self.engine.state.owner(kind, key)])
                elif op == "status":
                    self._answer(identity, [req, "ok", self.status()])
                else:
                    self._answer(identity, [req, "no", f"unknown request {op!r}"])
            except (TypeError, ValueError, IndexError):
                self._answer(identity, [req, "no", f"malformed {op!r} request"])
        for group in entries(proposals):
            commands = [c for r in group for c in r.commands]
            timeout = max(r.deadline for r in group) - now
            self._propose("requests", commands, timeout, group)

    def _answer(self, identity: bytes, reply: list) -> None:
        import zmq

        try:
            self.router.send_multipart([identity, self.packer.pack(reply)], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # that worker is gone (or its queue full): it times out and asks again

    def status(self) -> dict:
        state = self.engine.state
        members = dict(state.members)  # one copy, taken at once (PySyncObj's thread writes it)
        return {"leader": self.leader, "majority": self.had_majority, "self": self.address,
                "node": self.config.node_id, "incarnation": self.incarnation, "joined": self.joined,
                "members": {n: list(v) for n, v in members.items()}, "epoch": state.epoch}

    # -- entries in flight ------------------------------------------------------------------------------

    def _propose(self, kind: str, commands: list, timeout: float, requests: list[Request] | None = None) -> None:
        sent = self.clock()
        entry = _Entry(kind, self.engine.propose_later(commands, timeout), sent, requests or [])
        entry.due = min((r.deadline for r in entry.requests), default=float("inf"))
        self.in_flight.append(entry)
        entry.future.add_done_callback(lambda _f: self._done(entry))

    def _events(self) -> None:
        while self.events:
            what, value = self.events.popleft()
            if what == "owned":
                self.owned.extend(value)
            else:
                self._settle(value)

    def _settle(self, entry: _Entry) -> None:
        if entry in self.in_flight:
            self.in_flight.remove(entry)
        f = entry.future
        results = None if f.cancelled() or f.exception() is not None else f.result()
        if entry.kind == "probe":
            if results is not None:
                self.majority.committed(entry.sent)
            return
        if entry.kind == "join":
            if results is not None:
                self.joined = True
                log.info("agreement: node %s joined as %s (incarnation %d): %s", self.config.node_id,
                         self.address, self.incarnation, results[0][0])
            else:
                self.next_join = self.clock()  # again at once
            return
        why = "not committed" if results is None else ""
        if results is None and not f.cancelled():
            why = str(f.exception())
        for r, mine in zip(entry.requests, split(results or [], entry.requests), strict=True):
            if not r.answered:
                r.answered = True
                self._answer(r.identity, [r.req, "ok", mine] if results is not None else [r.req, "no", why])

    def _next_deadline(self) -> float:
        return min((e.due for e in self.in_flight), default=float("inf"))

    def _expire(self, now: float) -> None:
        """Answer requests whose time is up; an entry whose every request is answered is let go
        (it may still commit: its outcome is unknown, and conditional commands make that harmless)."""
        for entry in list(self.in_flight):
            if entry.kind != "requests":
                if now - entry.sent > (PROBE_TIMEOUT_S if entry.kind == "probe" else JOIN_TIMEOUT_S) + 1.0:
                    entry.future.cancel()  # the engine's retries stop; its callback settles it
                continue
            if now < entry.due:
                continue  # an entry's requests are looked at only once one of them is due
            left = []
            for r in entry.requests:
                if not r.answered and now >= r.deadline:
                    r.answered = True
                    self._answer(r.identity, [r.req, "no", f"no majority committed it within "
                                              f"{r.deadline - entry.sent:g}s"])
                elif not r.answered:
                    left.append(r.deadline)
            entry.due = min(left, default=float("inf"))
            if not left:
                entry.future.cancel()

    # -- timers ------------------------------------------------------------------------------------------

    def _timers(self) -> None:
        now = self.clock()
        self._expire(now)
        if now >= self.next_probe:
            self.next_probe = now + PROBE_EVERY_S
            self._propose("probe", [PROBE], PROBE_TIMEOUT_S)
        if not self.joined and now >= self.next_join and not any(e.kind == "join" for e in self.in_flight):
            self.next_join = now + JOIN_TIMEOUT_S
            self._propose("join", [join(self.config.node_id, self.address, self.incarnation)], JOIN_TIMEOUT_S)
        news = self.unbound.news(self.engine.listening, now)
        if news is not None:
            level, text = UNBOUND_LOG[news]
            log.log(level, text, self.address)
        leader = self.engine.leader
        if leader != self.leader:
            self.leader = leader
            if leader is None:
                log.info("agreement: no leader known")
            else:
                log.info("agreement: the leader is %s%s", leader, " (this member)" if leader == self.address else "")
        holds = self.majority.holds(now)
        if holds != self.had_majority:
            self.had_majority = holds
            self.next_majority = now
            if holds:
                log.info("agreement: majority %s (leader %s): proposals commit",
                         "regained" if self.majority_seen else "reached", self.leader)
            else:
                log.warning("agreement: majority lost (nothing committed in %.1f s): proposals are refused "
                            "until it is back", PROBE_TIMEOUT_S)
            self.majority_seen = self.majority_seen or holds

    def _publish(self) -> None:
        now = self.clock()
        if self.owned:
            self.pub.send(self.packer.pack(["owned", self.owned]))
            self.owned = []
        if now >= self.next_majority:
            self.next_majority = now + MAJORITY_REPEAT_S
            self.pub.send(self.packer.pack(["majority", self.had_majority]))
            # Every in-sync set as this member holds them, as ``owned`` records: a worker that
            # (re)started since they changed learns them within a second.
            sets = list(self.engine.state.insync.items())  # (one C call: PySyncObj's thread may write)
            if sets:
                self.pub.send(self.packer.pack(["owned", [[INSYNC, r, sorted(f), e] for r, (e, f) in sets]]))


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _unlink(endpoint: str) -> None:
    try:
        os.unlink(endpoint.removeprefix("ipc://"))
    except OSError:
        pass


def service_main(config: Config, supervisor_pid: int, ready_fd: int | None = None) -> int:
    """The forked child: run the member until SIGTERM, or until the supervisor is gone."""
    stopping = False

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for handler in logging.getLogger().handlers:  # name the process in every log line
        fmt = (handler.formatter._fmt if handler.formatter else None) or "%(message)s"
        handler.setFormatter(logging.Formatter(fmt.replace(f"[{config.node_id}]", f"[{config.node_id}/agreement]")))
    from .raft import Agreement

    try:
        service = Service(config, Agreement)
    except OSError as exc:
        log.error("agreement: %s", exc)
        return 2
    return service.run(ready_fd, lambda: not stopping and os.getppid() == supervisor_pid)


class AgreementProcess:
    """The supervisor's handle on the agreement service: fork, restart within limits, stop."""

    def __init__(self, config: Config, clock: Callable[[], float] = time.monotonic) -> None:
        """``clock``: monotonic seconds, for the restarts counted in ``CRASH_WINDOW_S``."""
        self.config = config
        self.clock = clock
        self.pid: int | None = None
        self.starts: deque[float] = collections.deque()

    def start(self, wait: bool = False) -> bool:
        """Fork the service; with ``wait``, until it serves its workers (bounded). False once it
        keeps dying (``CRASH_LIMIT`` starts in ``CRASH_WINDOW_S``)."""
        now = self.clock()
        self.starts.append(now)
        while self.starts and now - self.starts[0] > CRASH_WINDOW_S:
            self.starts.popleft()
        if len(self.starts) > CRASH_LIMIT:
            log.error("%s keeps dying (%d starts in %.0f s)", PROCESS_NAME, len(self.starts), CRASH_WINDOW_S)
            self.pid = None
            return False
        def main(supervisor: int, ready: int | None) -> int:
            _name_process()
            return service_main(self.config, supervisor, ready)

        self.pid = fork_child(PROCESS_NAME, main, READY_TIMEOUT_S if wait else None, log)
        return True

    def exited(self, status: int) -> bool:
        """The supervisor reaped our pid: log it and start a new one (False: it keeps dying)."""
        log.warning("%s (pid %s) died (%s); restarting it", PROCESS_NAME, self.pid, exit_how(status))
        self.pid = None
        return self.start()

    def stop(self) -> None:
        pid, self.pid = self.pid, None
        if pid is not None:
            stop_child(pid, PROCESS_NAME, STOP_GRACE_S, log)


def _name_process() -> None:
    name_process(PROCESS_NAME, "brokerd agreement")
