"""The supervisor: forks the workers, restarts one that dies, stops them all gracefully.

It creates no event loop and no ZeroMQ context before forking (a forked copy of either is broken),
so it stays a plain blocking loop around ``sigtimedwait``: SIGCHLD means a worker died (restart it,
unless it keeps crashing), SIGTERM/SIGINT mean stop (forward to the workers, wait, exit 0), SIGHUP
means reload (never the end: a supervisor gone leaves its workers serving with nobody to restart them).

Before it forks anything it checks what an operator can get wrong: every address it will bind is free
(a running broker's included), and no live broker holds its data directory or run directory (it locks
both for its life, see cluster/process.py). Its workers and stats process die with it (PDEATHSIG).
"""

from __future__ import annotations

import errno
import logging
import logging.handlers
import math
import os
import select
import signal
import socket
import sys
import time
from collections import deque
from typing import Any

from .config import WILDCARDS, Config
from .limits import FD_RESERVE, connections_per_worker, raise_open_files
from .listeners import describe, tls_problem
from .notify import notify
from .paths import LOCK_FILE, claim_run_dir, release_run_dir, run_dir
from .process import LockBusy, PidLock, child_signals, die_with_parent

log = logging.getLogger(__name__)

STOP_GRACE_S = 10.0
CRASH_WINDOW_S = 30.0
CRASH_LIMIT = 5
START_TIMEOUT_S = 30.0
MIN_QUIET_CONNECTIONS = 4096  # below this many clients per worker, an open-files cap is a warning
SIGNALS = [signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP]  # handled by sigtimedwait


class Supervisor:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.pids: dict[int, int] = {}  # pid → worker index
        self.crashes: dict[int, deque[float]] = {}
        self.stopping = False
        self.data_lock: PidLock | None = None
        self.run_lock: PidLock | None = None
        self.agreement: Any = None  # the agreement service's handle (cluster/agreement/service.py), if on

    def _fork(self, index: int) -> tuple[int, int]:
        """Fork worker ``index``; returns (pid, read end of its ready pipe)."""
        supervisor = os.getpid()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child
            code = 1
            try:
                os.close(r)
                child_signals()
                if die_with_parent(supervisor):  # False: the supervisor is gone already
                    _name_process(self.config, index)
                    from .worker import worker_main

                    code = worker_main(self.config, index, w)
            except BaseException:  # noqa: BLE001 - a child must never return into the parent's code
                logging.getLogger("brokerd.cluster.worker").exception("worker %d crashed", index)
            finally:
                logging.shutdown()
                os._exit(code)
        os.close(w)
        self.pids[pid] = index
        return pid, r

    def _check_ports(self) -> None:
        """Fail fast, naming the option, when an address this node will bind is taken or unusable.

        The probe sets SO_REUSEADDR (a port left in TIME_WAIT is free) but not SO_REUSEPORT: every
        worker of a running broker sets it, so a probe with it would join that broker's port, and the
        kernel would split the clients between two brokers."""
        cfg = self.config
        host = cfg.listen[0]
        probes = [("--listen", x.host, x.port) for x in cfg.listeners] or [("--listen", host, cfg.listen[1])]
        if cfg.mesh is not None:
            probes += [("--mesh", cfg.mesh[0], cfg.mesh[1] + i) for i in range(cfg.workers)]
        if cfg.stats_port:
            probes += [("--stats-port", cfg.stats_host, cfg.stats_port + i) for i in range(cfg.workers)]
        if cfg.metrics_port:
            probes.append(("--metrics-port", cfg.metrics_host, cfg.metrics_port))
        if cfg.agreement is not None:
            probes.append(("--agreement", *cfg.agreement))
        for option, addr, port in probes:
            problem = _bind_problem(addr, port)
            if problem:
                raise SystemExit(f"brokerd: error: {option}: {problem}")
        problem = tls_problem(cfg.listeners)  # a certificate, key or CA that cannot be loaded
        if problem:
            raise SystemExit(f"brokerd: error: {problem}")

    def _lock_dirs(self) -> None:
        """Lock the data directory (with the log on, or the agreement's journal kept there) and the run
        directory for the supervisor's life.

        The workers inherit the locks and never release them, so they last until the broker's last
        process is gone; a second broker on either directory stops here, before forking. With
        ``--log off`` the agreement journal (``DATA/<node>/agreement``) still needs the lock: two
        members sharing one journal would each vote on the other's behalf."""
        cfg = self.config
        if cfg.log or cfg.agreement:
            path = os.path.join(cfg.data_dir, cfg.node_id)
            try:
                os.makedirs(path, mode=0o700, exist_ok=True)
                self.data_lock = PidLock.acquire(os.path.join(path, LOCK_FILE))
            except LockBusy as busy:
                raise SystemExit(f"brokerd: error: --data-dir: {path} is {busy.in_use()}") from None
            except OSError as exc:
                if not cfg.log:  # only the agreement journal is kept there: name it, as its own check does
                    from .agreement.service import data_dir

                    raise SystemExit(f"brokerd: error: --data-dir: cannot write {data_dir(cfg)} (the agreement "
                                     f"journal): {exc.strerror}") from None
                raise SystemExit(f"brokerd: error: --data-dir: cannot write {path}: {exc.strerror} "
                                 "(or run with --log off)") from None
        try:
            self.run_lock = claim_run_dir(cfg)
        except LockBusy as busy:
            raise SystemExit(f"brokerd: error: --node-id: node {cfg.node_id} with MQTT port {cfg.listen[1]} "
                             f"is {busy.in_use()}") from None
        except OSError as exc:
            raise SystemExit(f"brokerd: error: cannot use the run directory {run_dir(cfg)}: "
                             f"{exc.strerror or exc} (set BROKERD_RUN_DIR or TMPDIR)") from None

    def _unlock_dirs(self) -> None:
        if self.run_lock is not None:
            if self.pids or getattr(self, "aux", None) is not None or self.agreement is not None:
                self.run_lock.release()  # children left (an error path): their sockets stay theirs
            else:
                release_run_dir(self.config, self.run_lock)
            self.run_lock = None
        if self.data_lock is not None:
            self.data_lock.release()
            self.data_lock = None

    def _check_data_dir(self) -> None:
        """Fail fast, naming the option, when the commit log directory cannot be written."""
        path = os.path.join(self.config.data_dir, self.config.node_id)
        try:
            os.makedirs(path, exist_ok=True)
            probe = os.path.join(path, ".write-test")
            with open(probe, "wb") as f:
                f.write(b"ok")
            os.unlink(probe)
        except OSError as exc:
            raise SystemExit(f"brokerd: error: --data-dir: cannot write {path}: {exc.strerror} "
                             "(or run with --log off)") from None

    def _check_agreement_dir(self) -> None:
        """The Raft journal's directory, checked here: a member that cannot write it would die at
        each restart until the node stops, with the reason far back in the log."""
        from .agreement.service import data_dir

        path = data_dir(self.config)
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
            if not os.access(path, os.W_OK | os.X_OK):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        except OSError as exc:
            raise SystemExit(f"brokerd: error: --data-dir: cannot write {path} (the agreement journal): "
                             f"{exc.strerror}") from None

    def run(self) -> int:
        cfg = self.config
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGHUP])  # from here on SIGHUP waits for the loop
        self._check_ports()
        self._lock_dirs()
        try:
            if cfg.log:
                self._check_data_dir()
            if cfg.agreement is not None:
                self._check_agreement_dir()
            return self._serve()
        finally:
            self._unlock_dirs()

    def _serve(self) -> int:
        cfg = self.config
        self._check_open_files()
        signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
        if cfg.agreement is not None:  # before the workers: they find it at start
            from .agreement.service import AgreementProcess

            self.agreement = AgreementProcess(cfg)
            self.agreement.start(wait=True)
        preload_worker()
        pipes = {}
        for i in range(cfg.workers):
            pid, r = self._fork(i)
            pipes[r] = (pid, i)
        if not self._await_ready(pipes):
            self._stop_all()
            return 1
        self._start_aux()
        host, port = cfg.listen
        from .auth_setup import anonymous_allowed

        checked = bool(cfg.password_file or cfg.auth_plugin)  # and whether anonymous clients get in:
        for line in describe(cfg.listeners, cfg.listeners_implicit, checked, anonymous_allowed(cfg)):
            log.info("%s", line)
        log.info("%s", ready_line(cfg))
        unagreed = unagreed_warning(cfg)
        if unagreed:
            log.warning("%s", unagreed)
        notify(f"READY=1\nSTATUS=node {cfg.node_id}: MQTT on {host}:{port}, {cfg.workers} workers")  # systemd
        while True:
            info = signal.sigtimedwait(SIGNALS, 1.0)
            if info is None:
                continue
            if info.si_signo == signal.SIGHUP:
                self._reload()
                continue
            if info.si_signo in (signal.SIGTERM, signal.SIGINT):
                log.info("brokerd stopping (%s)", signal.Signals(info.si_signo).name)
                notify("STOPPING=1")
                self._stop_all()
                return 0
            if not self._reap_and_restart():
                self._stop_all()
                return 1

    def _reload(self) -> None:
        """SIGHUP: reopen ``--log-file`` (logrotate renamed it), and have every worker reload the
        password and ACL files and the TLS listeners' certificates (SIGUSR1: the workers ignore
        SIGHUP, which a terminal's hangup sends to the whole process group).

        The workers' and the stats process's log handlers (``WatchedFileHandler``, see
        ``cluster.cli``) reopen the file at their next line, once its path names another file."""
        from .auth_setup import forward_reload

        reloaded = forward_reload(self.config, self.pids)  # password and ACL files, in the workers
        files = [h for h in logging.getLogger().handlers if isinstance(h, logging.handlers.WatchedFileHandler)]
        if not files:
            if not reloaded:
                log.info("SIGHUP: nothing to reload yet")
            return
        for handler in files:
            handler.reopenIfNeeded()
        log.info("SIGHUP: log file %s reopened", ", ".join(h.baseFilename for h in files))

    def _check_open_files(self) -> None:
        """Raise the open-files limit for the workers to inherit, and say what it allows when it,
        not ``--max-connections``, is what bounds the clients of a worker."""
        cfg = self.config
        before, now = raise_open_files()
        if now > before:
            log.info("open-files limit raised from %d to %d", before, now)
        asked = math.ceil(cfg.max_connections / cfg.workers)
        per_worker = connections_per_worker(cfg.max_connections, cfg.workers, now)
        if per_worker < asked:
            log.log(logging.WARNING if per_worker < MIN_QUIET_CONNECTIONS else logging.INFO,
                    "each worker accepts at most %d client connections (open-files limit %d, less %d "
                    "for the worker itself), not the %d of --max-connections %d over %d worker(s); "
                    "beyond that CONNECT is refused (server unavailable). Raise the hard limit "
                    "(ulimit -Hn; LimitNOFILE= under systemd) to allow more", per_worker, now,
                    FD_RESERVE, asked, cfg.max_connections, cfg.workers)

    # -- auxiliary processes (cluster/metrics.py owns what happens here) -----------------------------

    def _start_aux(self) -> None:
        """Start the node's auxiliary processes (stats aggregation, /metrics, $SYS) after the workers."""
        from .metrics import AuxProcess

        self.aux: AuxProcess | None = AuxProcess(self.config)
        problem = self.aux.check()
        if problem is not None:
            self._stop_all()
            raise SystemExit(f"brokerd: error: {problem}")
        self.aux.start(wait=True)

    def _stop_aux(self) -> None:
        """Stop the auxiliary processes."""
        aux = getattr(self, "aux", None)
        if aux is not None:
            self.aux = None
            aux.stop()

    def _await_ready(self, pipes: dict[int, tuple[int, int]]) -> bool:
        deadline = time.monotonic() + START_TIMEOUT_S
        while pipes:
            left = deadline - time.monotonic()
            if left <= 0:
                log.error("workers did not start within %.0f s", START_TIMEOUT_S)
                return False
            ready, _, _ = select.select(list(pipes), [], [], min(left, 0.5))
            for r in ready:
                data = os.read(r, 1)
                pid, i = pipes.pop(r)
                os.close(r)
                if not data:
                    log.error("worker %d failed to start (see the error above)", i)
                    return False
            # A worker that died before writing closes its pipe (handled above); reap it here too.
            if signal.sigtimedwait([signal.SIGTERM, signal.SIGINT], 0) is not None:
                return False
        return True

    def _reap_and_restart(self) -> bool:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return True
            if pid == 0:
                return True
            index = self.pids.pop(pid, None)
            if index is None:
                # Not a worker: the stats process (cluster/metrics.py) restarts itself, within limits.
                aux = getattr(self, "aux", None)
                if aux is not None and aux.pid == pid:
                    aux.exited(status)
                if self.agreement is not None and self.agreement.pid == pid and not self.agreement.exited(status):
                    log.error("the agreement service keeps dying; stopping brokerd (without it no "
                              "session can move to this node)")
                    return False
                continue
            how = (f"signal {signal.Signals(-os.waitstatus_to_exitcode(status)).name}"
                   if os.WIFSIGNALED(status) else f"exit code {os.waitstatus_to_exitcode(status)}")
            now = time.monotonic()
            history = self.crashes.setdefault(index, deque())
            history.append(now)
            while history and now - history[0] > CRASH_WINDOW_S:
                history.popleft()
            if len(history) > CRASH_LIMIT:
                log.error("worker %d keeps crashing (%d times in %.0f s, last: %s); stopping brokerd",
                          index, len(history), CRASH_WINDOW_S, how)
                return False
            log.warning("worker %d (pid %d) died (%s); restarting it", index, pid, how)
            _, r = self._fork(index)
            os.close(r)

    def _stop_all(self) -> None:
        self._stop_aux()
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + STOP_GRACE_S
        while self.pids and time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid:
                self.pids.pop(pid, None)
            else:
                time.sleep(0.02)
        for pid in list(self.pids):
            log.warning("worker pid %d did not stop in %.0f s; killing it", pid, STOP_GRACE_S)
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        self.pids.clear()
        if self.agreement is not None:  # after the workers: their last proposals still commit
            agreement, self.agreement = self.agreement, None
            agreement.stop()


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def unagreed_warning(cfg: Config) -> str | None:
    """What a node of several run with ``--agreement off`` risks, said once at start: the lease
    rules that then decide who serves a session cannot tell every partition apart (issue 41's
    losses), and an operator who reads only the ready line would not know it."""
    if cfg.mesh is None or not cfg.peer or not cfg.agreement_off:
        return None
    return ("--agreement off: which node serves a persistent session and which followers are in sync "
            "is decided by heartbeat leases, and a network partition can lose acknowledged QoS 1/2 "
            "messages; run --agreement on three nodes or more (README, Several hosts)")


def preload_worker() -> None:
    """Import what a worker imports, once, before the first fork. A forked worker then shares those
    modules' pages with the supervisor (copy-on-write) instead of building a private copy of each
    after the fork: about 1.8 MB less per worker (docs/benchmarks.md, "Memory: where an idle node's PSS goes").
    Importing creates no event loop and no ZeroMQ context (those stay in the worker, after the fork).
    """
    try:
        from . import worker  # noqa: F401 - for its modules: the router, the log, the stats, ZeroMQ
    except ImportError:  # pragma: no cover - a dependency missing: each worker meets it, as before
        return
    # And what a worker imports where it uses it, at start: its state store (``Worker.start``), and
    # the codec the loop encodes the listener's host with. Any import after the fork unshares far
    # more than the module: these two made 1.7 MB of each process's memory private.
    import encodings.idna  # noqa: F401

    from brokerd.router import persistence  # noqa: F401
    try:
        import uvloop  # noqa: F401 - worker_main's loop
    except ImportError:  # pragma: no cover - uvloop is a dependency; the worker falls back to asyncio
        pass


def ready_line(cfg: Config) -> str:
    """What an operator wants to know once the node serves: what runs, where, with which policy."""
    from brokerd.connection._compiled import implementation

    from . import __version__
    from .paths import router_endpoint

    parts = [f"brokerd ready: brokerd {__version__} ({implementation()})", f"node {cfg.node_id}",
             "MQTT on " + (", ".join(x.url.removeprefix("mqtt://") for x in cfg.listeners) or _address(*cfg.listen)), f"{cfg.workers} worker{'s' if cfg.workers != 1 else ''}",
             f"data {os.path.abspath(os.path.join(cfg.data_dir, cfg.node_id))} (fsync {cfg.fsync})" if cfg.log
             else "commit log off"]
    if cfg.mesh is not None:
        peers = ", ".join(_address(*p) for p in cfg.peer)
        parts.append(f"mesh on {_address(*cfg.mesh)}" + (f" (peers {peers})" if peers else ""))
    else:
        parts.append("single node (no --mesh)")
    if cfg.agreement is not None:
        parts.append(f"agreement on {_address(*cfg.agreement)} ({len(cfg.agreement_peer) + 1} members)")
    if cfg.metrics_port:
        mhost = cfg.metrics_host
        shown = socket.gethostname() if mhost in WILDCARDS else mhost
        scheme = "https" if cfg.metrics_certfile else "http"
        parts.append(f"metrics {scheme}://{_address(shown, cfg.metrics_port)}/metrics"
                     + (" (basic auth)" if cfg.metrics_password_file else ""))
    else:
        parts.append("metrics off")
    parts.append(f"stats {router_endpoint(cfg, 0)}" + (" (router 0)" if cfg.workers > 1 else ""))
    return ", ".join(parts)


def _name_process(config: Config, index: int) -> None:
    """Let `ps` show which worker is which (best effort: /proc comm, 15 characters)."""
    try:
        with open(f"/proc/{os.getpid()}/comm", "w") as f:
            f.write(f"brokerd-w{index}")
    except OSError:
        pass
    sys.argv[0] = f"brokerd worker {index}"


def _bind_problem(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be bound now (an operator's words), or None."""
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return f"{shown} is already in use (another broker running?)"
        return f"cannot bind {shown}: {exc.strerror}"
    finally:
        s.close()
    return None
