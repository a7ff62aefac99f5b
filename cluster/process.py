"""Process safety: a broker's processes die together, and one broker at a time owns its directories.

Why this exists:

* A worker outlives a supervisor killed with SIGKILL (or crashing): it keeps serving its share of the
  MQTT port with nobody to restart it, and keeps writing the commit log. ``die_with_parent`` asks the
  kernel (Linux ``prctl(PR_SET_PDEATHSIG)``) to send it SIGTERM, its graceful stop, when the
  supervisor goes; without prctl a thread polls ``getppid()``.
* Two brokers on one data directory write the same commit log and ``state.msgpack``; two on one run
  directory bind each other's ipc sockets. ``PidLock`` is an exclusive ``flock`` on a file that holds
  the holder's pid. The kernel drops the lock when the last process holding it is gone (the supervisor,
  and the workers and stats process that inherit its descriptor over fork), so it never goes stale:
  a lock that can be taken marks a directory nobody uses.
"""

from __future__ import annotations

import ctypes
import fcntl
import logging
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
PARENT_POLL_S = 1.0  # the getppid() fallback's period
HOLDERS_EXIT_S = 10.0  # how long a new broker waits for a dead supervisor's workers to finish exiting


def child_signals() -> None:
    """The signal state of a process the supervisor forks (a worker, the stats process).

    The fork inherits the supervisor's blocked signals and dispositions. SIGHUP is ignored: a reload
    request is the supervisor's business, and a hangup sent to the whole process group (a closed
    terminal, ``kill -HUP -PGID``) must not end the workers one by one. The dispositions are set
    before the mask is cleared, so that no signal pending meanwhile meets the old ones."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # a worker's reload request (handled once it runs)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def die_with_parent(parent: int, sig: int = signal.SIGTERM) -> bool:
    """Have this process receive ``sig`` when ``parent`` dies, however it dies; False if it already has.

    SIGTERM rather than SIGKILL: it is the graceful stop of a worker (flush the commit log, close the
    clients) and of the stats process. The parent may die between the fork and this call, and then no
    signal ever comes: ``getppid()`` no longer being ``parent`` says so, and the caller exits."""
    if not _set_pdeathsig(sig):
        threading.Thread(target=_watch_parent, args=(parent, sig), name="parent-watch", daemon=True).start()
    return os.getppid() == parent


def _set_pdeathsig(sig: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        zero = ctypes.c_ulong(0)
        failed: int = libc.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(sig), zero, zero, zero)  # (0: set)
        return failed == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent: int, sig: int) -> None:
    """Without prctl: once the parent is gone (this process re-parented), signal ourselves."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os.kill(os.getpid(), sig)


def fork_child(name: str, main: Callable[[int, int | None], int], wait: float | None, log: Any) -> int:
    """Fork a node-level child process (the stats process, the agreement service) running
    ``main(supervisor pid, ready fd or None)``, which exits with its code: SIGHUP ignored (a reload
    is the supervisor's business), SIGTERM when the supervisor dies, a crash logged. With ``wait``
    (seconds), return once the child wrote to the ready fd, or that long (logged). Its pid."""
    supervisor = os.getpid()
    r, w = os.pipe() if wait is not None else (None, None)
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            if r is not None:
                os.close(r)
            child_signals()
            if die_with_parent(supervisor):  # False: the supervisor is gone already
                code = main(supervisor, w)
        except BaseException:  # noqa: BLE001 - a child must never return into the parent's code
            log.exception("%s crashed", name)
        finally:
            logging.shutdown()
            os._exit(code)
    if r is not None and w is not None:
        os.close(w)
        try:
            if not select.select([r], [], [], wait)[0]:
                log.warning("%s did not start within %.0f s", name, wait)
        finally:
            os.close(r)
    return pid


def exit_how(status: int) -> str:
    """How a reaped child ended, for a log line: the signal that killed it, or its exit code."""
    code = os.waitstatus_to_exitcode(status)
    return f"signal {signal.Signals(-code).name}" if os.WIFSIGNALED(status) else f"exit code {code}"


def stop_child(pid: int, name: str, grace: float, log: Any) -> None:
    """SIGTERM a node-level child process and reap it; SIGKILL it if it is still there after
    ``grace`` seconds (logged: a child that ignores a stop is a bug to see)."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done:
            return
        time.sleep(0.01)
    log.warning("%s (pid %d) did not stop in %.0f s; killing it", name, pid, grace)
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def name_process(name: str, argv0: str | None = None) -> None:
    """Name this process in ``ps`` and ``/proc/PID/comm`` (what tests and operators look for)."""
    try:
        with open(f"/proc/{os.getpid()}/comm", "w") as f:
            f.write(name)
    except OSError:
        pass
    sys.argv[0] = argv0 or name


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, dead but not yet reaped, counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc: kill(0) said it exists


class LockBusy(Exception):
    """Another process holds the lock; ``pid`` is the one its holder wrote (None: unreadable)."""

    def __init__(self, path: str, pid: int | None) -> None:
        super().__init__(path)
        self.path = path
        self.pid = pid

    def in_use(self) -> str:
        """Who holds it and what to do, in an operator's words."""
        if self.pid is None:
            return "in use by another brokerd (stop it first)"
        if pid_alive(self.pid):
            return f"in use by brokerd pid {self.pid} (stop it first)"
        return f"in use by what is left of brokerd pid {self.pid} (its workers; stop them first)"


class PidLock:
    """An exclusive ``flock`` on ``path``, a file holding the holder's pid.

    The descriptor is close-on-exec but inherited over fork: the workers and the stats process hold the
    lock too, and none of them unlocks it, so it lasts until the last of the broker's processes exits.
    Whoever removes a lock file (``release(unlink=True)``, ``take_stale``'s callers) does so while
    holding it; ``acquire`` checks that the file it locked is still the one at ``path``."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self.fd = fd

    @classmethod
    def acquire(cls, path: str, wait_s: float = HOLDERS_EXIT_S) -> PidLock:
        """Lock ``path`` (created if missing) and write this process's pid into it.

        Raises ``LockBusy`` at once when the recorded holder is alive. When it is not (a supervisor
        killed while its workers are still stopping, or another broker cleaning a stale directory
        for a moment), waits up to ``wait_s`` for the lock. Raises ``OSError`` when the file cannot
        be made (``FileNotFoundError``: its directory was removed meanwhile)."""
        deadline = time.monotonic() + wait_s
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = _read_pid(fd)
                os.close(fd)
                if (pid is not None and pid_alive(pid)) or time.monotonic() >= deadline:
                    raise LockBusy(path, pid) from None
                time.sleep(0.05)
                continue
            except BaseException:
                os.close(fd)
                raise
            if _same_file(fd, path):
                break
            os.close(fd)  # removed by a cleaner after we opened it: lock the new one
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(path, fd)

    @classmethod
    def take_stale(cls, path: str) -> PidLock | None:
        """Lock an existing ``path`` if nobody holds it (its broker is gone), else None.
        Writes nothing: the caller removes what the dead broker left, the lock file last."""
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        if not _same_file(fd, path):
            os.close(fd)
            return None
        return cls(path, fd)

    def release(self, unlink: bool = False) -> None:
        """Drop the lock (this process's hold; forked children keep theirs until they exit)."""
        if self.fd < 0:
            return
        if unlink:
            try:
                os.unlink(self.path)
            except OSError:
                pass
        os.close(self.fd)
        self.fd = -1


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _same_file(fd: int, path: str) -> bool:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)
