"""Where a node's local sockets live, derived from its config so every tool can find them.

One run directory per node and listener: ``$TMPDIR/brokerd-<uid>/<node>-<port>/`` (short, because
an ipc:// path must fit 107 bytes). ``brokerd stats`` finds a local broker's routers from the same
options the broker was started with (``--node-id``, ``--listen``), or from ``--node host:port``.

The supervisor holds ``brokerd.lock`` in its run directory for its life (``claim_run_dir``): a second
broker for the same node and port stops at start-up, and a directory whose lock can be taken belongs
to a dead broker, so its leftover sockets (which ``brokerd stats`` would take for routers) go.
"""

from __future__ import annotations

import os
import stat
import tempfile

from .config import Config
from .process import PidLock

LOCK_FILE = "brokerd.lock"
CLAIM_TRIES = 20  # attempts to make and lock the run directory while others remove stale ones


def run_base() -> str:
    """The directory of every run directory of this user."""
    return os.environ.get("BROKERD_RUN_DIR") or os.path.join(tempfile.gettempdir(), f"brokerd-{os.getuid()}")


def run_dir(config: Config) -> str:
    return os.path.join(run_base(), f"{config.node_id}-{config.listen[1]}")


def ensure_run_dir(config: Config) -> str:
    path = run_dir(config)
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def mesh_ipc(config: Config, index: int) -> str:
    """The ipc:// endpoint of router ``index``'s mesh PULL socket."""
    return f"ipc://{run_dir(config)}/w{index}.mesh"


def stats_endpoint(config: Config, index: int, host: str | None = None) -> str:
    """Router ``index``'s stats PUB socket: ipc by default, tcp://HOST:(stats_port+index) if set."""
    if config.stats_port:
        return f"tcp://{host or config.listen[0]}:{config.stats_port + index}"
    return f"ipc://{run_dir(config)}/w{index}.stats"


def claim_run_dir(config: Config) -> PidLock:
    """Make and lock this node's run directory, then remove what dead brokers left: stale sockets in
    it, and the run directories of this user's brokers that are gone.

    Raises ``process.LockBusy`` when a live broker holds it, ``OSError`` when it cannot be made."""
    path = run_dir(config)
    for attempt in range(CLAIM_TRIES):
        os.makedirs(path, mode=0o700, exist_ok=True)
        try:
            lock = PidLock.acquire(os.path.join(path, LOCK_FILE))
        except FileNotFoundError:  # another broker removed it as stale between the two calls
            if attempt == CLAIM_TRIES - 1:
                raise
            continue
        break
    _remove_sockets(path)
    remove_stale_run_dirs(keep=path)
    return lock


def release_run_dir(config: Config, lock: PidLock) -> None:
    """At a clean exit, once every worker is reaped: leave nothing behind."""
    path = run_dir(config)
    _remove_sockets(path)
    lock.release(unlink=True)
    try:
        os.rmdir(path)
    except OSError:
        pass  # not empty (someone else's file) or already gone


def remove_stale_run_dirs(keep: str) -> list[str]:
    """Remove the run directories of dead brokers (their lock can be taken); returns them.

    A directory without a lock file is left alone: it may be a live broker's of an older version.
    Only in a base directory of our own (a ``brokerd-<uid>`` that another user made is not ours to
    clean)."""
    base = os.path.dirname(keep)
    try:
        if os.lstat(base).st_uid != os.getuid():
            return []
        names = os.listdir(base)
    except OSError:
        return []
    removed = []
    for name in names:
        path = os.path.join(base, name)
        if path == keep or os.path.islink(path) or not os.path.isdir(path):
            continue
        lock = PidLock.take_stale(os.path.join(path, LOCK_FILE))
        if lock is None:  # a live broker's, or not a brokerd run directory of this version
            continue
        try:
            _remove_sockets(path)
            lock.release(unlink=True)
            os.rmdir(path)
            removed.append(path)
        except OSError:
            pass  # something else in it: the sockets are gone, the directory stays
        finally:
            lock.release()
    return removed


def _remove_sockets(path: str) -> None:
    """Unlink the unix sockets in ``path`` (only sockets: nothing else a broker leaves there)."""
    try:
        entries = list(os.scandir(path))
    except OSError:
        return
    for entry in entries:
        try:
            if stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode):
                os.unlink(entry.path)
        except OSError:
            pass
