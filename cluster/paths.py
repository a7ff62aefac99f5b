"""Where a node's sockets live, derived from its config so every tool can find them.

One run directory per node and listener: ``$TMPDIR/brokerd-<uid>/<node>-<port>/`` (short, because
an ipc:// path must fit 107 bytes), or ``$BROKERD_RUN_DIR/<node>-<port>/``. ``brokerd stats`` finds
the local brokers by itself (``local_nodes``: every run directory whose lock is held), or one from the
options it was started with (``--node-id``, ``--listen``), or a remote one from ``--node host:port``.

The supervisor holds ``brokerd.lock`` in its run directory for its life (``claim_run_dir``): a second
broker for the same node and port stops at start-up, and a directory whose lock can be taken belongs
to a dead broker, so its leftover sockets (which ``brokerd stats`` would take for routers) go.
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import stat
import tempfile
from dataclasses import dataclass

from .config import Config
from .process import PidLock

LOCK_FILE = "brokerd.lock"
NODE_FILE = "node.json"  # what `brokerd stats` needs to read a node it finds (written at start)
CLAIM_TRIES = 20  # attempts to make and lock the run directory while others remove stale ones
MIN_STATS_INTERVAL = 0.1  # seconds: bounds the rate ring (15 min / interval samples) and the CPU stats take


def run_base() -> str:
    """The directory of every run directory of this user."""
    return os.environ.get("BROKERD_RUN_DIR") or os.path.join(tempfile.gettempdir(), f"brokerd-{os.getuid()}")


@dataclass(frozen=True)
class LocalNode:
    """A broker's run directory found on this host."""

    node_id: str
    port: int  # its MQTT port (--listen)
    path: str
    readable: bool  # False: another user's (0700), this user may not look in


def run_bases() -> list[str]:
    """Where to look for local brokers: ``$BROKERD_RUN_DIR`` if set, else every user's
    ``$TMPDIR/brokerd-<uid>`` (this user's first; the others' are only readable by root)."""
    if os.environ.get("BROKERD_RUN_DIR"):
        return [run_base()]
    own = run_base()
    others = sorted(p for p in glob.glob(os.path.join(tempfile.gettempdir(), "brokerd-*")) if p != own)
    return [own, *others]


def local_nodes(bases: list[str] | None = None) -> list[LocalNode]:
    """The run directories of the brokers running on this host (sorted by node, then port).

    A directory whose lock nobody holds belongs to a dead broker and is skipped; one that cannot be
    looked into (another user's) is returned with ``readable`` False, for the caller to explain."""
    found = []
    for base in bases if bases is not None else run_bases():
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in names:
            node, sep, port = name.rpartition("-")
            path = os.path.join(base, name)
            if not sep or not node or not port.isdigit() or os.path.islink(path) or not os.path.isdir(path):
                continue
            held = lock_held(path)
            if held is False:
                continue  # a dead broker's
            readable = os.access(path, os.R_OK | os.X_OK)
            if held is None and readable and not any(n.endswith(".stats") for n in os.listdir(path)):
                continue  # no lock and no stats socket: not a broker's (or an old, gone one)
            found.append(LocalNode(node, int(port), path, readable))
    found.sort(key=lambda n: (n.node_id, n.port, n.path))
    return found


def lock_held(path: str) -> bool | None:
    """Whether a live broker holds the lock of run directory ``path``: True, False (a dead broker's),
    None (no lock file, or it cannot be read). A shared lock, taken and dropped at once, tells
    without writing anything: the supervisor holds an exclusive one for the broker's life."""
    try:
        fd = os.open(os.path.join(path, LOCK_FILE), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def run_dir(config: Config) -> str:
    return os.path.join(run_base(), f"{config.node_id}-{config.listen[1]}")


def private_dir(path: str) -> str:
    """Make ``path`` (and its parents) and check that it is a directory of this user's, reachable
    by nobody else: not a symbolic link (``lstat``), owned by us, mode 0700 (nothing for group or
    others). Its ipc sockets are the mesh and stats of a broker: whoever can reach them can inject
    frames. Raises ``PermissionError`` with the reason otherwise (another user made it first in a
    shared /tmp, or a link points elsewhere)."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise PermissionError(f"{path} is not a directory (a symbolic link?): refusing to use it")
    if st.st_uid != os.getuid():
        raise PermissionError(f"{path} belongs to uid {st.st_uid}, not to this user ({os.getuid()})")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)  # ours: tighten it (made by an older brokerd, or a loose umask)
    return path


def ensure_run_dir(config: Config) -> str:
    private_dir(run_base())
    return private_dir(run_dir(config))


def mesh_ipc(config: Config, index: int) -> str:
    """The ipc:// endpoint of router ``index``'s mesh PULL socket."""
    return f"ipc://{run_dir(config)}/w{index}.mesh"


def agreement_ipc(config: Config) -> str:
    """The node's agreement service's ROUTER socket: its workers' proposals, reads and status."""
    return f"ipc://{run_dir(config)}/agreement.sock"


def agreement_pub(config: Config) -> str:
    """The node's agreement service's PUB socket: moves committed, and whether it has a majority."""
    return f"ipc://{run_dir(config)}/agreement.pub"


def stats_endpoint(config: Config, index: int, host: str | None = None) -> str:
    """Router ``index``'s stats PUB socket: ipc by default, tcp://HOST:(stats_port+index) if set."""
    if config.stats_port:
        return f"tcp://{host or config.listen[0]}:{config.stats_port + index}"
    return f"ipc://{run_dir(config)}/w{index}.stats"


def zmq_host(host: str, *, bind: bool) -> str:
    """A --listen host as ZeroMQ wants it: wildcards connect to loopback, IPv6 in brackets."""
    if host in ("", "0.0.0.0"):
        return "0.0.0.0" if bind else "127.0.0.1"
    if host == "::":
        return "[::]" if bind else "[::1]"
    return f"[{host}]" if ":" in host else host


def router_endpoint(config: Config, index: int, *, bind: bool = False, host: str | None = None) -> str:
    """Router ``index``'s stats socket; ``host`` overrides the --listen host (remote nodes)."""
    if not config.stats_port:
        return stats_endpoint(config, index)
    return stats_endpoint(config, index, zmq_host(host or config.stats_host, bind=bind))


def node_endpoint(config: Config) -> str:
    """The stats process's node aggregate (always local: only this node's routers read it)."""
    return f"ipc://{run_dir(config)}/node.stats"


def effective_interval(config: Config) -> float:
    """Seconds between a router's stats snapshots (``node.json`` tells readers, who wait for them)."""
    return max(MIN_STATS_INTERVAL, config.stats_interval)


def claim_run_dir(config: Config) -> PidLock:
    """Make and lock this node's run directory, then remove what dead brokers left: stale sockets in
    it, and the run directories of this user's brokers that are gone.

    Raises ``process.LockBusy`` when a live broker holds it, ``OSError`` when it cannot be made."""
    path = run_dir(config)
    for attempt in range(CLAIM_TRIES):
        private_dir(run_base())
        private_dir(path)
        try:
            lock = PidLock.acquire(os.path.join(path, LOCK_FILE))
        except FileNotFoundError:  # another broker removed it as stale between the two calls
            if attempt == CLAIM_TRIES - 1:
                raise
            continue
        break
    _remove_sockets(path)
    remove_stale_run_dirs(keep=path)
    write_node_file(config, path)
    return lock


def write_node_file(config: Config, path: str) -> None:
    """``node.json``: the node's id, MQTT address, router count, stats endpoints and interval, for
    ``brokerd stats`` to read a node it found (best effort: without it, the directory name and the
    ipc sockets in it still tell most)."""
    info = {"node": config.node_id, "listen": list(config.listen), "workers": config.workers,
            "stats_port": config.stats_port, "stats_interval": effective_interval(config),
            "stats": [router_endpoint(config, i) for i in range(config.workers)],
            "mesh": list(config.mesh) if config.mesh else None, "pid": os.getpid()}
    tmp = os.path.join(path, f".{NODE_FILE}.{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            json.dump(info, f)
        os.replace(tmp, os.path.join(path, NODE_FILE))
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def read_node_file(path: str) -> dict | None:
    try:
        with open(os.path.join(path, NODE_FILE)) as f:
            info = json.load(f)
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def release_run_dir(config: Config, lock: PidLock) -> None:
    """At a clean exit, once every worker is reaped: leave nothing behind."""
    path = run_dir(config)
    _remove_sockets(path)
    _unlink(os.path.join(path, NODE_FILE))
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
            _unlink(os.path.join(path, NODE_FILE))
            lock.release(unlink=True)
            os.rmdir(path)
            removed.append(path)
        except OSError:
            pass  # something else in it: the sockets are gone, the directory stays
        finally:
            lock.release()
    return removed


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


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
