"""The brokers under test: start one on a free loopback port, measure its processes, stop it.

Each run gets a fresh broker in a temporary directory (brokerd's ./data and logs land there, not in
the repository), bound to 127.0.0.1 only. Broker CPU and RSS are read from the broker's process tree
with psutil: brokerd forks workers, Mosquitto is one process; both are measured the same way.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

from . import mqtt_wire as wire

HOST = "127.0.0.1"
TLS_ENV = "MQTTBENCH_TLS_DIR"  # set by --tls: a directory with ca.pem, server.pem, server.key


def tls_dir() -> Path | None:
    """The certificates of a --tls run (both brokers serve MQTT over TLS with them), else None."""
    d = os.environ.get(TLS_ENV)
    return Path(d) if d else None


def make_certificates(directory: Path) -> Path:
    """A CA and a server certificate for 127.0.0.1, made with the openssl command."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=bench CA",
            "-keyout", "ca.key", "-out", "ca.pem")
    (directory / "server.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "server.key",
            "-out", "server.csr")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-out", "server.pem", "-extfile", "server.ext")
    for name in ("ca.pem", "server.pem", "server.key"):
        os.chmod(directory / name, 0o644)  # mosquitto drops root privileges to its own user
    os.chmod(directory, 0o755)
    return directory


def client_tls_context() -> ssl.SSLContext | None:
    d = tls_dir()
    return ssl.create_default_context(cafile=str(d / "ca.pem")) if d is not None else None
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 5.0
REPO = Path(__file__).resolve().parents[2]


LOG_OFF_ROW = "brokerd --log off"  # the tables' name for brokerd run without its commit log


class BrokerUnavailable(RuntimeError):
    """The broker cannot be run here; the message says why and, where it can, how to fix it."""


@dataclass(frozen=True)
class BrokerKind:
    name: str  # "brokerd" or "mosquitto"
    workers: int = 1
    # brokerd only: > 0 runs a cluster of three nodes (127.0.0.1, .2, .3) with this
    # --replication-factor and the commit log on; the clients connect to the first node.
    replication: int = 0
    # brokerd only: "off" runs it with --log off (no commit log); "on" is as shipped.
    log: str = "on"

    @property
    def label(self) -> str:
        if self.name != "brokerd":
            return self.name
        return (f"brokerd/{self.workers}w" + (f" R{self.replication}" if self.replication else "")
                + (" --log off" if self.log == "off" else ""))

    @property
    def row_name(self) -> str:
        """The broker column of the tables: a replicated cluster, or brokerd without its log, is a
        broker of its own."""
        if self.replication:
            return f"brokerd R{self.replication}"
        return LOG_OFF_ROW if self.name == "brokerd" and self.log == "off" else self.name


def port_sockets(pids: Iterable[int], port: int) -> tuple[list[int], dict[int, int]]:
    """Of the processes ``pids``: those listening on ``port`` (sorted), and for each connection
    accepted on it the client-side port -> pid holding it. brokerd's workers share the port
    (SO_REUSEPORT), so only the kernel knows which worker took which connection."""
    listeners: list[int] = []
    owners: dict[int, int] = {}
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="tcp")
        except psutil.Error:
            continue
        for c in conns:
            if c.laddr and c.laddr.port == port:
                if c.raddr:
                    owners[c.raddr.port] = pid
                elif c.status == psutil.CONN_LISTEN and pid not in listeners:
                    listeners.append(pid)
    return sorted(listeners), owners


def free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def brokerd_executable() -> Path:
    venv_bin = Path(sys.executable).parent
    for candidate in (venv_bin / "brokerd", REPO / ".venv" / "bin" / "brokerd"):
        if candidate.exists():
            return candidate
    found = shutil.which("brokerd")
    if found:
        return Path(found)
    raise BrokerUnavailable("brokerd not available: no brokerd executable in .venv/bin (pip install -e .)")


def mosquitto_executable(install: bool = True) -> Path:
    """Mosquitto's binary; installs the Debian package when missing and running as root."""
    for candidate in (shutil.which("mosquitto"), "/usr/sbin/mosquitto"):
        if candidate and Path(candidate).exists():
            return Path(candidate)
    if not install or os.geteuid() != 0 or not shutil.which("apt-get"):
        raise BrokerUnavailable("mosquitto not installed: run `sudo apt-get install -y mosquitto`")
    print("mosquitto missing: apt-get install -y mosquitto", file=sys.stderr, flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", "mosquitto"]):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
            raise BrokerUnavailable(f"mosquitto install failed ({' '.join(cmd)}): {tail[0]}")
    if Path("/usr/sbin/mosquitto").exists():
        return Path("/usr/sbin/mosquitto")
    raise BrokerUnavailable("mosquitto install finished but no mosquitto binary was found")


def mosquitto_version() -> str:
    try:
        exe = mosquitto_executable(install=False)
        out = subprocess.run([str(exe), "-h"], capture_output=True, text=True, timeout=10).stdout
    except (BrokerUnavailable, OSError, subprocess.TimeoutExpired):
        return "not installed"
    first = out.strip().splitlines()[:1]
    return first[0].replace("mosquitto version ", "") if first else "unknown"


def check_brokerd() -> str | None:
    """None when brokerd can be started, else the reason it cannot (so runs skip it cleanly)."""
    try:
        exe = brokerd_executable()
    except BrokerUnavailable as exc:
        return str(exc)
    try:
        proc = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=30, cwd=tempfile.gettempdir())
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"brokerd not available: `brokerd --help` failed: {exc}"
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        return f"brokerd not available: `brokerd --help` exited {proc.returncode}: {lines[-1] if lines else ''}"
    for flag in ("--workers", "--listen", "--log"):
        if flag not in proc.stdout:
            return f"brokerd not available: `brokerd --help` does not list {flag}"
    return None


def mqtt_probe(port: int, timeout: float = 1.0, host: str = HOST) -> bool:
    """One CONNECT/CONNACK round trip: the broker accepts and speaks MQTT."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw:
            ctx = client_tls_context()
            s = ctx.wrap_socket(raw, server_hostname=HOST) if ctx is not None else raw
            s.settimeout(timeout)
            s.sendall(wire.connect(f"bench-probe-{os.getpid()}-{time.monotonic_ns()}"))
            data = b""
            while len(data) < 4:
                chunk = s.recv(4 - len(data))
                if not chunk:
                    return False
                data += chunk
            ok = data[0] >> 4 == wire.CONNACK and data[3] == 0
            s.sendall(wire.DISCONNECT_PACKET)
            return ok
    except OSError:
        return False


class RunningBroker:
    """A broker process tree started for one run; use as a context manager so it always stops."""

    def __init__(self, kind: BrokerKind, host: str = HOST, extra: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self.host = host
        self.extra = extra  # brokerd: options after the others (a cluster node's)
        self.port = free_port(host)
        self.dir = Path(tempfile.mkdtemp(prefix=f"bench-{kind.name}-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.root: psutil.Process | None = None

    def command(self) -> list[str]:
        if self.kind.name == "brokerd":
            return [
                str(brokerd_executable()), "--workers", str(self.kind.workers),
                "--listen", f"{self.host}:{self.port}" if tls_dir() is None else f"mqtts://{self.host}:{self.port}",
                *(["--certfile", str(tls_dir() / "server.pem"), "--keyfile", str(tls_dir() / "server.key")]
                  if tls_dir() is not None else []),
                # As shipped (the commit log on): the configuration users run. BROKERD_BENCH_ARGS adds
                # options, e.g. "--log off" for the figures without the log.
                *shlex.split(os.environ.get("BROKERD_BENCH_ARGS", "")),
                *(["--log", "off"] if self.kind.log == "off" else []),
                *self.extra,
            ]
        conf = self.dir / "mosquitto.conf"
        conf.write_text(
            "\n".join([
                f"listener {self.port} {HOST}",
                "allow_anonymous true",
                "persistence false",
                "max_queued_messages 1000",
                "max_connections -1",
                "set_tcp_nodelay true",  # brokerd (asyncio) sets TCP_NODELAY too: same footing for latency
                "log_dest none",
                *([f"certfile {tls_dir() / 'server.pem'}", f"keyfile {tls_dir() / 'server.key'}"]
                  if tls_dir() is not None else []),
                "",
            ])
        )
        os.chmod(self.dir, 0o755)  # mosquitto drops root privileges to its own user
        os.chmod(conf, 0o644)
        return [str(mosquitto_executable()), "-c", str(conf)]

    def __enter__(self) -> RunningBroker:
        try:
            self.start()
        except BaseException:
            self.stop()  # __exit__ does not run when __enter__ raises
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        cmd = self.command()
        log = open(self.dir / "broker.log", "wb")  # noqa: SIM115 - the child keeps it open
        try:
            self.proc = subprocess.Popen(
                cmd, cwd=self.dir, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            log.close()
        self.root = psutil.Process(self.proc.pid)
        deadline = time.monotonic() + START_TIMEOUT_S
        # brokerd's workers share the port (SO_REUSEPORT): the run starts once every worker
        # listens, or the kernel hands the first connections to the workers that are up already
        # and a scaling run measures fewer workers than it names.
        listeners = self.kind.workers if self.kind.name == "brokerd" else 1
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BrokerUnavailable(
                    f"{self.kind.label} exited with {self.proc.returncode} at start: {self.log_tail()}"
                )
            if self.listening() >= listeners and mqtt_probe(self.port, host=self.host):
                return
            time.sleep(0.05)
        raise BrokerUnavailable(f"{self.kind.label} did not accept MQTT on {self.host}:{self.port} in {START_TIMEOUT_S:.0f} s")

    def listening(self) -> int:
        """How many of the broker's processes listen on its port."""
        return len(port_sockets([p.pid for p in self.processes()], self.port)[0])

    def log_tail(self, lines: int = 3) -> str:
        try:
            text = (self.dir / "broker.log").read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(text[-lines:])

    def processes(self) -> list[psutil.Process]:
        if self.root is None:
            return []
        try:
            return [self.root, *self.root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def cpu_seconds(self) -> float:
        """User+system CPU of the broker tree so far, reaped workers included."""
        total = 0.0
        for p in self.processes():
            try:
                t = p.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += t.user + t.system
            if p is self.root:
                total += t.children_user + t.children_system
        return total

    def rss_bytes(self) -> int:
        total = 0
        for p in self.processes():
            try:
                total += p.memory_info().rss
            except psutil.NoSuchProcess:
                continue
        return total

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM, then SIGKILL to the whole (own) process group after STOP_TIMEOUT_S."""
        if self.proc is not None:
            pgid = self.proc.pid  # start_new_session: the broker leads its own group
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    pass
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)


CLUSTER_HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")


class BrokerdCluster:
    """Three brokerd nodes on 127.0.0.1, .2 and .3 with ``--replication-factor R`` and the commit
    log on (what replication copies); the clients connect to the first node, so the figures are
    what replication costs a node's own traffic: its CPU is the three nodes' together (the
    followers' appends count), its RSS too. Same interface as ``RunningBroker``."""

    def __init__(self, kind: BrokerKind) -> None:
        self.kind = kind
        self.nodes = [RunningBroker(kind, host=host) for host in CLUSTER_HOSTS]
        given = shlex.split(os.environ.get("BROKERD_BENCH_ARGS", ""))
        self.agreed = not any(a == "--agreement" and b == "off" for a, b in zip(given, given[1:], strict=False))
        mesh, agree = [], []
        for node in self.nodes:  # a port released by the OS may come back: never the listener's
            for ports in (mesh, agree):
                port = free_port(node.host)
                while port == node.port or port in mesh:
                    port = free_port(node.host)
                ports.append(port)
        # The mesh as deployed: authenticated and encrypted with the cluster's key (its cost counts).
        key = self.nodes[0].dir / "cluster"
        subprocess.run([str(brokerd_executable()), "keygen", "--out", str(key)], check=True, capture_output=True,
                       timeout=60)
        for i, (node, name) in enumerate(zip(self.nodes, "abc", strict=True)):
            extra = ["--log", "on", "--node-id", name, "--mesh", f"{node.host}:{mesh[i]}",
                     "--mesh-key", f"{key}.key_secret", "--replication-factor", str(kind.replication)]
            # As deployed: who serves each persistent session agreed through Raft (paid per move,
            # never per message: what the bench measures is the message path with it running).
            # BROKERD_BENCH_ARGS="--agreement off" runs the lease rules instead, to compare.
            if self.agreed:
                extra += ["--agreement", f"{node.host}:{agree[i]}",
                          *(a for j, other in enumerate(self.nodes) if j != i
                            for a in ("--agreement-peer", f"{other.host}:{agree[j]}"))]
            if i:
                extra += ["--peer", f"{CLUSTER_HOSTS[0]}:{mesh[0]}"]
            node.extra = tuple(extra)
        self.port = self.nodes[0].port
        self.dir = self.nodes[0].dir

    def __enter__(self) -> BrokerdCluster:
        try:
            for node in self.nodes:
                node.start()
            self._wait_placed()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _wait_placed(self) -> None:
        """Until the first node's routers have met the others and placed their followers, and its
        agreement member hears a majority (persistent sessions are served from then on)."""
        want = self.kind.replication - 1
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            text = (self.dir / "broker.log").read_text(errors="replace")
            joined = "node b joined" in text and "node c joined" in text \
                and (not self.agreed or "agreement: majority" in text)
            # The placement line (cluster.replication): "replication: the log of a/w0 is followed by ..."
            placed = [line.split(" is followed by ", 1)[1] for line in text.splitlines()
                      if "replication: the log of a/" in line and " is followed by " in line]
            if joined and (want == 0 or (placed and len(placed[-1].split(", ")) >= want)):
                return
            time.sleep(0.1)
        raise BrokerUnavailable(f"{self.kind.label}: the three nodes did not join, agree and place replicas in "
                                f"{START_TIMEOUT_S:.0f} s: {self.log_tail()}")

    def processes(self) -> list[psutil.Process]:
        return [p for node in self.nodes for p in node.processes()]

    def cpu_seconds(self) -> float:
        return sum(node.cpu_seconds() for node in self.nodes)

    def rss_bytes(self) -> int:
        return sum(node.rss_bytes() for node in self.nodes)

    def alive(self) -> bool:
        return all(node.alive() for node in self.nodes)

    def log_tail(self, lines: int = 3) -> str:
        return " / ".join(f"{n}: {node.log_tail(lines)}" for n, node in zip("abc", self.nodes, strict=True))

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def start_broker(kind: BrokerKind) -> RunningBroker | BrokerdCluster:
    """The broker (or replicated cluster) a run measures, to use as a context manager."""
    return BrokerdCluster(kind) if kind.replication else RunningBroker(kind)
