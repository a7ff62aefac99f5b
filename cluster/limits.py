"""The open-files limit, which bounds how many clients a worker can hold.

Every client connection is a file descriptor. Shells and service managers often start a process
with a soft limit of 1024 although the hard limit allows far more; a broker that kept it would stop
accepting at about a thousand clients per worker, silently (the kernel still completes the TCP
handshakes, nobody answers). So the supervisor raises the soft limit to the hard one before it
forks, and each worker caps its client connections below what is left, so that a client beyond
the cap still gets a CONNACK refusal instead of a hung connection.
"""

from __future__ import annotations

import math
import resource

# Descriptors a worker keeps for itself beyond its clients: the listener, the event loop, the mesh
# and stats sockets (ZeroMQ takes a few per socket), commit log segments and their indexes, and
# connections being refused.
FD_RESERVE = 128


def raise_open_files() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit; returns the soft limit (before, after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or (hard != resource.RLIM_INFINITY and soft >= hard):
        return soft, soft
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):  # some sandboxes refuse; keep what we have
        return soft, soft
    return soft, target


def open_files() -> int:
    """The soft open-files limit of this process."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 1 << 30 if soft == resource.RLIM_INFINITY else soft


def connections_per_worker(max_connections: int, workers: int, open_files_limit: int) -> int:
    """The client connections one worker accepts: its share of ``--max-connections``, and no
    more than its open-files limit leaves after ``FD_RESERVE``."""
    return max(1, min(math.ceil(max_connections / workers), open_files_limit - FD_RESERVE))
