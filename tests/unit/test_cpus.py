"""The default of --workers: CPUs of the affinity mask capped by the cgroup CPU quota (fake cgroup trees)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from brokerd.cluster.cpus import cgroup_cpu_limit, usable_cpus


def _tree(tmp_path: Path, proc: str, files: dict[str, str]) -> tuple[str, str]:
    root = tmp_path / "cgroup"
    root.mkdir()
    for rel, text in files.items():
        f = root / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    proc_file = tmp_path / "proc-self-cgroup"
    proc_file.write_text(proc)
    return str(root), str(proc_file)


@pytest.mark.parametrize(("cpu_max", "cpus"), [
    ("max 100000\n", None), ("200000 100000\n", 2), ("150000 100000\n", 2), ("50000 100000\n", 1),
    ("400000 200000\n", 2), ("garbage\n", None)])
def test_cgroup_v2_cpu_max(tmp_path, cpu_max, cpus):
    root, proc = _tree(tmp_path, "0::/\n", {"cpu.max": cpu_max})
    assert cgroup_cpu_limit(root, proc) == cpus


def test_cgroup_v2_smallest_quota_on_the_way_up(tmp_path):
    """A systemd service (CPUQuota=) under a slice with its own quota: the smaller one counts."""
    root, proc = _tree(tmp_path, "0::/system.slice/brokerd.service\n", {
        "system.slice/cpu.max": "300000 100000\n",
        "system.slice/brokerd.service/cpu.max": "max 100000\n"})
    assert cgroup_cpu_limit(root, proc) == 3
    assert usable_cpus(root, proc, affinity=8) == 3
    assert usable_cpus(root, proc, affinity=2) == 2  # the affinity mask is smaller


def test_cgroup_path_outside_the_mount_is_read_from_the_root(tmp_path):
    """A container without a cgroup namespace: /proc shows the host's path, its cgroup is the root."""
    root, proc = _tree(tmp_path, "0::/kubepods/pod123/abc\n", {"cpu.max": "100000 100000\n"})
    assert usable_cpus(root, proc, affinity=16) == 1


def test_cgroup_v1_cfs_quota(tmp_path):
    root, proc = _tree(tmp_path, "5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n", {
        "cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
        "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "250000\n",
        "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n"})
    assert cgroup_cpu_limit(root, proc) == 3
    assert usable_cpus(root, proc, affinity=64) == 3


def test_cgroup_v1_no_quota(tmp_path):
    root, proc = _tree(tmp_path, "2:cpu:/\n", {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"})
    assert cgroup_cpu_limit(root, proc) is None
    assert usable_cpus(root, proc, affinity=4) == 4


def test_no_cgroup_files_at_all(tmp_path):
    missing = str(tmp_path / "nothing")
    assert cgroup_cpu_limit(missing, missing) is None
    assert usable_cpus(missing, missing, affinity=3) == 3
    assert usable_cpus(missing, missing, affinity=0) == 1  # never below one worker


def test_this_process():
    """On this machine: within 1 .. the affinity mask, and the default of --workers."""
    from brokerd.cluster.config import OPTIONS

    n = usable_cpus()
    assert 1 <= n <= len(os.sched_getaffinity(0))
    assert next(o for o in OPTIONS if o.name == "workers").default == n
