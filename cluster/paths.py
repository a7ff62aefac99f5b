"""Where a node's local sockets live, derived from its config so every tool can find them.

One run directory per node and listener: ``$TMPDIR/brokerd-<uid>/<node>-<port>/`` (short, because
an ipc:// path must fit 107 bytes). ``brokerd stats`` finds a local broker's routers from the same
options the broker was started with (``--node-id``, ``--listen``), or from ``--node host:port``.
"""

from __future__ import annotations

import os
import tempfile

from .config import Config


def run_dir(config: Config) -> str:
    base = os.environ.get("BROKERD_RUN_DIR") or os.path.join(tempfile.gettempdir(), f"brokerd-{os.getuid()}")
    return os.path.join(base, f"{config.node_id}-{config.listen[1]}")


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
