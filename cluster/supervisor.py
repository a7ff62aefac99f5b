"""The supervisor: forks the workers, restarts one that dies, stops them all gracefully.

It creates no event loop and no ZeroMQ context before forking (a forked copy of either is broken),
so it stays a plain blocking loop around ``sigtimedwait``: SIGCHLD means a worker died (restart it,
unless it keeps crashing), SIGTERM/SIGINT mean stop (forward to the workers, wait, exit 0).
"""

from __future__ import annotations

import logging
import math
import os
import select
import signal
import socket
import sys
import time
from collections import deque

from .config import Config
from .limits import FD_RESERVE, connections_per_worker, raise_open_files

log = logging.getLogger(__name__)

STOP_GRACE_S = 10.0
CRASH_WINDOW_S = 30.0
CRASH_LIMIT = 5
START_TIMEOUT_S = 30.0
MIN_QUIET_CONNECTIONS = 4096  # below this many clients per worker, an open-files cap is a warning


class Supervisor:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.pids: dict[int, int] = {}  # pid → worker index
        self.crashes: dict[int, deque[float]] = {}
        self.stopping = False

    def _fork(self, index: int) -> tuple[int, int]:
        """Fork worker ``index``; returns (pid, read end of its ready pipe)."""
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child
            code = 1
            try:
                os.close(r)
                signal.pthread_sigmask(signal.SIG_SETMASK, [])
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
                    signal.signal(sig, signal.SIG_DFL)
                _name_process(self.config, index)
                from .worker import worker_main

                code = worker_main(self.config, index, w)
            except BaseException:  # noqa: BLE001 - a child must never return into the parent's code
                logging.getLogger("cluster.worker").exception("worker %d crashed", index)
            finally:
                logging.shutdown()
                os._exit(code)
        os.close(w)
        self.pids[pid] = index
        return pid, r

    def _check_listen(self) -> None:
        """Fail fast, with the option named, when the MQTT address cannot be bound."""
        host, port = self.config.listen
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        s = socket.socket(family, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            s.bind((host, port))
        except OSError as exc:
            raise SystemExit(f"brokerd: error: --listen: cannot bind {host}:{port}: {exc.strerror}") from None
        finally:
            s.close()

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

    def run(self) -> int:
        cfg = self.config
        self._check_listen()
        if cfg.log:
            self._check_data_dir()
        self._check_open_files()
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD, signal.SIGTERM, signal.SIGINT])
        pipes = {}
        for i in range(cfg.workers):
            pid, r = self._fork(i)
            pipes[r] = (pid, i)
        if not self._await_ready(pipes):
            self._stop_all()
            return 1
        self._start_aux()
        host, port = cfg.listen
        log.info("brokerd ready: node %s listening on %s:%d with %d worker%s", cfg.node_id, host, port,
                 cfg.workers, "s" if cfg.workers != 1 else "")
        while True:
            info = signal.sigtimedwait([signal.SIGCHLD, signal.SIGTERM, signal.SIGINT], 1.0)
            if info is None:
                continue
            if info.si_signo in (signal.SIGTERM, signal.SIGINT):
                log.info("brokerd stopping (%s)", signal.Signals(info.si_signo).name)
                self._stop_all()
                return 0
            if not self._reap_and_restart():
                self._stop_all()
                return 1

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


def _name_process(config: Config, index: int) -> None:
    """Let `ps` show which worker is which (best effort: /proc comm, 15 characters)."""
    try:
        with open(f"/proc/{os.getpid()}/comm", "w") as f:
            f.write(f"brokerd-w{index}")
    except OSError:
        pass
    sys.argv[0] = f"brokerd worker {index}"
