"""A private network for the partition test: a bridge in this (the root) namespace, one network
namespace per node with a veth pair into the bridge, addresses on a /24 of 10.201.X.0 that exists
only between the namespaces made here. Faults are made as an operator's network makes them:
iptables rules inside a node's namespace, or its link set down.

Clients stay in this namespace and reach the nodes through the bridge (10.201.X.1 here,
10.201.X.11, .12 ... for the nodes). Everything made is removed by ``Lab.close``, which is safe to
call after a failure half way through ``Lab.open``.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from dataclasses import dataclass, field

CMD_S = 10.0  # the bound of one ip / iptables command


def missing() -> str | None:
    """Why this host cannot run the partition test (None: it can)."""
    if os.geteuid() != 0:
        return "needs root to make network namespaces, a bridge and iptables rules"
    absent = [cmd for cmd in ("ip", "iptables") if shutil.which(cmd) is None]
    if absent:
        return f"needs {' and '.join(absent)} (iproute2, iptables; scripts/test installs them as root)"
    return None


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=CMD_S)
    if check and out.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: {out.stderr.strip()}")
    return out


@dataclass
class Namespace:
    """One node's namespace: its address, its end of the veth pair (``dev``, inside) and the rules
    a fault put in it."""

    name: str
    address: str
    dev: str
    host_dev: str  # the other end, a port of the bridge

    def exec_prefix(self) -> list[str]:
        """The command that runs a program inside (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.name]

    def iptables(self, *rule: str) -> None:
        run("ip", "netns", "exec", self.name, "iptables", "-w", "5", *rule)

    def drop_from(self, addresses: list[str]) -> None:
        """Drop what arrives from ``addresses`` (INPUT)."""
        for a in addresses:
            self.iptables("-A", "INPUT", "-s", a, "-j", "DROP")

    def drop_to(self, addresses: list[str]) -> None:
        """Drop what leaves for ``addresses`` (OUTPUT)."""
        for a in addresses:
            self.iptables("-A", "OUTPUT", "-d", a, "-j", "DROP")

    def heal(self) -> None:
        """No rule left, link up."""
        self.iptables("-F", "INPUT")
        self.iptables("-F", "OUTPUT")
        self.link(True)

    def link(self, up: bool) -> None:
        run("ip", "-n", self.name, "link", "set", self.dev, "up" if up else "down")


@dataclass
class Lab:
    """The bridge and the namespaces of one test run."""

    tag: str
    prefix: str  # "10.201.X"
    bridge: str
    namespaces: list[Namespace] = field(default_factory=list)
    forward_rule: list[str] | None = None  # the root namespace's FORWARD rule for the bridge, if added

    @property
    def host_address(self) -> str:
        return f"{self.prefix}.1"

    @classmethod
    def open(cls, count: int) -> Lab:
        """A bridge and ``count`` namespaces on a /24 no route of this host uses yet."""
        tag = f"{os.getpid() % 10000}{random.randrange(100)}"
        for _ in range(20):
            prefix = f"10.201.{random.randrange(256)}"
            if not run("ip", "route", "show", f"{prefix}.0/24", check=False).stdout.strip():
                break
        else:
            raise AssertionError("no unused 10.201.X.0/24 on this host")
        lab = cls(tag, prefix, f"bkpbr{tag}")
        try:
            lab._make(count)
        except BaseException:
            lab.close()
            raise
        return lab

    def _make(self, count: int) -> None:
        run("ip", "link", "add", self.bridge, "type", "bridge")
        run("ip", "addr", "add", f"{self.host_address}/24", "dev", self.bridge)
        run("ip", "link", "set", self.bridge, "up")
        # br_netfilter passes bridged frames through this namespace's FORWARD chain: a host whose
        # policy drops (Docker sets one) would cut the nodes apart before any fault.
        if _bridge_netfilter():
            self.forward_rule = ["FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT"]
            run("iptables", "-w", "5", "-I", *self.forward_rule)
        for i in range(count):
            ns = Namespace(f"brokerd-p{self.tag}-{i}", f"{self.prefix}.{11 + i}", "mesh0", f"bkp{self.tag}n{i}")
            run("ip", "netns", "add", ns.name)
            self.namespaces.append(ns)
            run("ip", "link", "add", ns.host_dev, "type", "veth", "peer", "name", ns.dev, "netns", ns.name)
            run("ip", "link", "set", ns.host_dev, "master", self.bridge)
            run("ip", "link", "set", ns.host_dev, "up")
            run("ip", "-n", ns.name, "addr", "add", f"{ns.address}/24", "dev", ns.dev)
            run("ip", "-n", ns.name, "link", "set", ns.dev, "up")
            run("ip", "-n", ns.name, "link", "set", "lo", "up")

    def close(self) -> None:
        """Remove everything ``open`` made (what is not there is skipped)."""
        for ns in self.namespaces:
            run("ip", "link", "del", ns.host_dev, check=False)  # its peer goes with it
            run("ip", "netns", "del", ns.name, check=False)
        run("ip", "link", "del", self.bridge, check=False)
        if self.forward_rule is not None:
            run("iptables", "-w", "5", "-D", *self.forward_rule, check=False)


def _bridge_netfilter() -> bool:
    try:
        with open("/proc/sys/net/bridge/bridge-nf-call-iptables") as f:
            return f.read().strip() == "1"
    except OSError:
        return False


def tcp_sockets(pid: int) -> list[tuple[int, int, str]]:
    """(local port, remote port, state) of every TCP socket of ``pid``, read in its own network
    namespace (``/proc/<pid>/net/tcp``: psutil reads this process's namespace, where a node in
    another one has no sockets). State "0A" is LISTEN."""
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = []
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 9 and parts[9] in inodes:
                out.append((int(parts[1].rsplit(":", 1)[1], 16), int(parts[2].rsplit(":", 1)[1], 16), parts[3]))
    return out
