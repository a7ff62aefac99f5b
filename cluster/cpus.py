"""How many CPUs this process may really use: the default of ``--workers``.

``os.cpu_count()`` counts the machine's cores, not what the process is given: a container started with
``--cpus 2`` or a pod with ``limits.cpu: 2`` on a 64-core host, or a systemd service with
``CPUQuota=200%`` or ``AllowedCPUs=``, would otherwise fork 64 workers that share two cores' worth
of time. So the default is the CPUs of the process's affinity mask (``taskset``, cpusets), capped by
the CFS quota of its cgroup and every cgroup above it: cgroup v2 ``cpu.max`` ("200000 100000" is
two CPUs, "max 100000" none) or cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``. A fraction
rounds up (1.5 CPUs: two workers), and the answer is at least 1.
"""

from __future__ import annotations

import math
import os

CGROUP_ROOT = "/sys/fs/cgroup"
PROC_CGROUP = "/proc/self/cgroup"


def usable_cpus(cgroup_root: str = CGROUP_ROOT, proc_cgroup: str = PROC_CGROUP,
                affinity: int | None = None) -> int:
    """CPUs in the affinity mask, capped by the cgroup CPU quota; at least 1."""
    if affinity is None:
        try:
            affinity = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):  # not on Linux
            affinity = os.cpu_count() or 1
    limit = cgroup_cpu_limit(cgroup_root, proc_cgroup)
    return max(1, min(affinity, limit) if limit is not None else affinity)


def cgroup_cpu_limit(cgroup_root: str = CGROUP_ROOT, proc_cgroup: str = PROC_CGROUP) -> int | None:
    """The CPUs the CFS quota of this process's cgroups allows (rounded up), or None without a quota.

    The smallest quota on the way from the process's cgroup up to the root counts. A cgroup path
    that is not under ``cgroup_root`` (a container without its own cgroup namespace sees the host's
    path, and its own cgroup mounted at the root) is looked for from its deepest existing part."""
    try:
        with open(proc_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    limits: list[float] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # cgroup v2: "0::/system.slice/brokerd.service"
            for d in _up_from(cgroup_root, path):
                limits += filter(None, [_v2_quota(os.path.join(d, "cpu.max"))])
        elif "cpu" in controllers.split(","):  # cgroup v1: "4:cpu,cpuacct:/docker/abc"
            for mount in (controllers, "cpu", "cpu,cpuacct"):
                base = os.path.join(cgroup_root, mount)
                if os.path.isdir(base):
                    for d in _up_from(base, path):
                        limits += filter(None, [_v1_quota(d)])
                    break
    if not lines:  # no /proc/self/cgroup: the root's own files
        limits += filter(None, [_v2_quota(os.path.join(cgroup_root, "cpu.max")),
                                _v1_quota(os.path.join(cgroup_root, "cpu"))])
    return max(1, math.ceil(min(limits) - 1e-9)) if limits else None


def _up_from(root: str, path: str) -> list[str]:
    """Directories from ``root + path`` up to ``root``, those that exist."""
    parts = [p for p in path.split("/") if p and p not in (".", "..")]
    dirs = [os.path.join(root, *parts[:n]) for n in range(len(parts), -1, -1)]
    return [d for d in dirs if os.path.isdir(d)]


def _v2_quota(path: str) -> float | None:
    """CPUs of a cgroup v2 ``cpu.max`` ("QUOTA PERIOD"; QUOTA "max": no limit)."""
    text = _read(path)
    if text is None:
        return None
    fields = text.split()
    try:
        if len(fields) != 2 or fields[0] == "max" or int(fields[1]) <= 0:
            return None
        return int(fields[0]) / int(fields[1])
    except ValueError:
        return None


def _v1_quota(directory: str) -> float | None:
    """CPUs of a cgroup v1 cpu controller directory (quota -1: no limit)."""
    quota, period = _read(os.path.join(directory, "cpu.cfs_quota_us")), \
        _read(os.path.join(directory, "cpu.cfs_period_us"))
    try:
        q, p = int(quota or ""), int(period or "")
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None
