"""Test helpers: real brokerd processes (pytest-xprocess), real paho clients, raw sockets.

Every wait here is bounded and waits for an event (a message, a CONNACK, a log line), not a time.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import paho.mqtt.client as mqtt
import psutil
from paho.mqtt.enums import CallbackAPIVersion

ROOT = Path(__file__).resolve().parent.parent
BROKERD = str(Path(sys.executable).with_name("brokerd"))
WAIT = 10.0  # the bound of every wait for an event
START_POLL_S = 0.01  # how often a broker's log is read for its ready line while it starts


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_EPHEMERAL_LOW = _ephemeral_low()
PORTS_LOW = 10_000


def worker_ports(low: int = PORTS_LOW, high: int = _EPHEMERAL_LOW - 1) -> range:
    """The ports this test process picks from: the whole range, or under pytest-xdist the worker's
    own slice of it. A port is free when picked and bound by the broker later; two workers picking
    from one range could both find the same port free in between."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not worker.startswith("gw") or count < 2:
        return range(low, high)
    size = (high - low) // count
    start = low + int(worker[2:]) % count * size
    return range(start, start + size)


_PORTS = worker_ports()
_recent: list[int] = []  # the latest ports handed out: a test asking twice gets two different ones
_RECENT = 64
_ports_lock = threading.Lock()  # nodes start in threads (``in_parallel``), each picking its port


def free_port(host: str = "127.0.0.1", count: int = 1) -> int:
    """A free port below the kernel's ephemeral range: a port bound to 0 comes from that range,
    where every client connection also takes its local port, and one could take it between now
    and the broker's bind (a broker of two workers binds after its mesh has joined). Not one of
    the latest handed out (not bound yet, perhaps) nor another xdist worker's (``worker_ports``).
    ``count``: the first of that many free ports in a row (a node's routers bind P, P+1 ...)."""
    if len(_PORTS) > 1000:
        with _ports_lock:
            for _ in range(100):
                port = random.choice(_PORTS)
                run = range(port, port + count)
                if run[-1] not in _PORTS or any(p in _recent for p in run) or not all(_bindable(host, p) for p in run):
                    continue
                _recent.extend(run)
                del _recent[:-_RECENT]
                return port
    for _ in range(50):  # no range of our own: the kernel's pick, and the ports after it
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if all(_bindable(host, p) for p in range(port + 1, port + count)):
            return port
    raise AssertionError(f"no {count} free ports in a row on {host}")


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def in_parallel(*calls: Callable[[], object]) -> list:
    """Run ``calls`` at once, each in a thread; their results in order, or the first exception.

    Nodes of a cluster start together, as operators' nodes do: started one after another, the
    first waits out its bounded wait for peers that are not up yet (``Replication.ready``), and
    waits for each node's next stats snapshot add up (seconds per three-node test)."""
    results: list = [None] * len(calls)
    errors: list[BaseException] = []

    def run(i: int, call: Callable[[], object]) -> None:
        try:
            results[i] = call()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, c), daemon=True) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


_mesh_key_made: list[str] = []
_mesh_key_lock = threading.Lock()  # nodes start in threads (``in_parallel``): one key for all


def mesh_key_file() -> str:
    """The cluster's CURVE secret key file of this test process (``mesh_key``)."""
    import zmq.auth

    with _mesh_key_lock:
        if not _mesh_key_made:
            directory = tempfile.mkdtemp(prefix="brokerd-test-key-")
            atexit.register(shutil.rmtree, directory, True)
            _, secret = zmq.auth.create_certificates(directory, "cluster")  # what `brokerd keygen` writes
            os.chmod(secret, 0o600)
            _mesh_key_made.append(secret)
        return _mesh_key_made[0]


def mesh_key() -> list[str]:
    """``--mesh-key FILE`` for every node a test starts with ``--mesh``: brokerd refuses a mesh
    without a key (loopback too), and nodes join only with the same one, so one key pair serves
    the whole test process. A test about the unkeyed mesh passes ``--mesh-insecure on`` instead."""
    return ["--mesh-key", mesh_key_file()]


# ``--agreement off``: a cluster on heartbeat leases, said in so many words as brokerd requires with
# --mesh. The tests of the mesh, replication and faults without agreement start their nodes so; the
# agreed cluster's tests give --agreement and its peers (tests/chaos/harness.py ``start_nodes``).
LEASES = ("--agreement", "off")


def add_user(path: str | Path, user: str, password: str) -> None:
    """Add ``user`` to the password file at ``path`` as an operator does: ``brokerd passwd``, the
    password on stdin."""
    out = subprocess.run([BROKERD, "passwd", str(path), user], input=password + "\n", text=True,
                         capture_output=True, timeout=30)
    assert out.returncode == 0, out.stderr


def wait_for(predicate: Callable[[], object], timeout: float = WAIT, what: str = "condition") -> object:
    """Poll a condition owned by another process (a counter, a file) until true, bounded."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


@dataclass
class Broker:
    """A running brokerd started through pytest-xprocess."""

    xprocess: object
    name: str
    args: list[str]
    host: str
    port: int
    logfile: Path | None = None
    pid: int = 0
    _starts: int = 0
    env: dict = field(default_factory=dict)
    prefix: list[str] = field(default_factory=list)  # a command that execs brokerd (e.g. prlimit)

    def start(self) -> Broker:
        from xprocess import ProcessStarter

        broker = self

        class Starter(ProcessStarter):
            pattern = "brokerd ready"
            args = [*broker.prefix, BROKERD, *broker.args]
            timeout = 30
            terminate_on_interrupt = True
            env = {**os.environ, "PYTHONUNBUFFERED": "1", **broker.env}
            max_read_lines = 10_000

            def get_lines(self, log_file):  # type: ignore[no-untyped-def]
                """xprocess's, with a shorter pause at the log's end (``START_POLL_S``, not 0.1 s):
                a run starts hundreds of brokers, each awaited here."""
                while True:
                    line = log_file.readline()
                    if not line:
                        time.sleep(START_POLL_S)
                    if datetime.now() > self._max_time:
                        raise TimeoutError(f"the start pattern {self.pattern!r} did not come within "
                                           f"{self.timeout} s")
                    yield line

        self._starts += 1
        pid, logfile = self.xprocess.ensure(self.name, Starter, restart=True)  # type: ignore[attr-defined]
        self.pid = pid
        self.logfile = Path(logfile)
        return self

    def log_text(self, this_run: bool = False) -> str:
        """The broker's output; ``this_run``: only since the latest (re)start."""
        text = self.logfile.read_text(errors="replace") if self.logfile else ""
        return text.rsplit("@@__xproc_block_delimiter__@@", 1)[-1] if this_run else text

    def wait_log(self, text: str, timeout: float = WAIT) -> None:
        wait_for(lambda: text in self.log_text(), timeout, f"log line {text!r}")

    def wait_line(self, *parts: str, timeout: float = WAIT) -> str:
        """A line of the log that holds every one of ``parts``, awaited. On a broker a file's tests
        share (``file_broker``), a test's own line: its client id or its socket's address among
        the parts, so that another test's line alike is not taken for it."""
        def found() -> str | None:
            return next((line for line in self.log_text().splitlines() if all(p in line for p in parts)), None)

        return str(wait_for(found, timeout, f"a log line with {parts!r}"))

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM (graceful stop) and wait; returns the exit status."""
        os.kill(self.pid, signal.SIGTERM)
        return self._wait_exit(timeout)

    def kill(self) -> None:
        """SIGKILL the supervisor and every child: workers, brokerd-stats, brokerd-agree (a crash of
        the whole broker: its Raft member too, not a graceful stop of it)."""
        pids = [self.pid, *child_pids(self.pid)]
        # All stopped first: a worker told of its supervisor's death (its parent-death signal)
        # before its own SIGKILL came could stop gracefully in between, and say goodbye on the
        # mesh, where a test waits for its silence (CI, once).
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        self._wait_exit(10.0)
        for pid in pids[1:]:
            wait_for(lambda p=pid: not _alive(p), 10.0, f"worker {pid} gone")

    def _wait_exit(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                # Not our child (xprocess may detach): poll for existence instead.
                if not _alive(self.pid):
                    return 0
                time.sleep(0.02)
                continue
            if pid:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.02)
        raise AssertionError(f"brokerd pid {self.pid} did not exit within {timeout} s")

    def workers(self) -> list[int]:
        return worker_pids(self.pid)

    def wait_worker_replaced(self, old: int, timeout: float = WAIT) -> None:
        """Wait until the node's one worker is a new process, not ``old`` (killed). The list is
        read once per check: read twice, the dead worker could be reaped in between (an empty
        list the second time: a CI run failed on it)."""
        wait_for(lambda: (pids := self.workers()) and pids[0] != old, timeout, f"{self.name}'s worker restarted")


def stop_together(xprocess, names: list[str], timeout: float = 15.0) -> None:
    """Stop the brokers named, all at once: SIGTERM to every process of each (its workers and
    helpers before the supervisor, as xprocess's ``terminate`` orders them), then one wait for all,
    SIGKILL for any left after ``timeout``. Stopped one after another, a three-node test's teardown
    waited out each node's graceful stop in turn."""
    procs: list[psutil.Process] = []
    for name in names:
        info = xprocess.getinfo(name)
        if not info.isrunning():
            continue
        try:
            parent = psutil.Process(info.pid)
            procs += reversed([parent, *parent.children(recursive=True)])
        except psutil.NoSuchProcess:
            continue
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(sig)
        _, alive = psutil.wait_procs(procs, timeout=timeout)
        procs = [p for p in alive if _not_zombie(p)]
        if not procs:
            return
    print(f"could not stop processes {[p.pid for p in procs]}")  # as xprocess's terminate says it


def _not_zombie(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def freeze(pid: int) -> None:
    """SIGSTOP ``pid`` and wait until every one of its threads is stopped.

    ``kill`` returns before the group stop completes: a thread not yet scheduled when the signal
    came (a loaded two-core CI box) stops only when it next runs, and a test that goes on at once
    can race the very work it meant to freeze out."""
    os.kill(pid, signal.SIGSTOP)

    def all_stopped() -> bool:
        try:
            states = []
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
        except FileNotFoundError:
            return True  # gone: nothing of it runs
        return all(s in "Tt" for s in states)

    wait_for(all_stopped, 10.0, f"process {pid} stopped")


def child_pids(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def worker_pids(pid: int) -> list[int]:
    """The supervisor's worker processes (its children except brokerd-stats and brokerd-agree)."""
    return [p for p in child_pids(pid) if _comm(p) not in ("brokerd-stats", "brokerd-agree")]


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def stop_loops(pahos: list[mqtt.Client]) -> None:
    """paho's ``loop_stop`` for each client, without its wait: ``loop_stop`` leaves the network
    thread to notice when its select() times out (a second, on a connection that is up); here
    every thread is told first and woken through its socket pair, so stopping many takes no
    longer than one, and one takes milliseconds."""
    threads = []
    for c in pahos:
        c._thread_terminate = True  # what loop_stop sets
        if c._sockpairW is not None:
            try:
                c._sockpairW.send(b"0")
            except OSError:
                pass
        if c._thread is not None and c._thread is not threading.current_thread():
            threads.append(c._thread)
    for t in threads:
        t.join(WAIT)


class Client:
    """A paho client with blocking, bounded helpers and a record of what it received."""

    # Every client made during the current test: tests/conftest.py closes them after it. paho
    # waits in select(), which fails for descriptors above 1023, so clients left open by earlier
    # tests would otherwise make a later test's connections hang without a CONNACK.
    made: list[Client] = []

    def __init__(self, port: int, client_id: str = "", *, clean: bool = True, host: str = "127.0.0.1",
                 protocol: int = mqtt.MQTTv311, keepalive: int = 60,
                 will: tuple[str, bytes, int, bool] | None = None, properties: object = None) -> None:
        kwargs = {"clean_session": clean} if protocol != mqtt.MQTTv5 else {}
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol, **kwargs)
        self.host, self.port, self.keepalive = host, port, keepalive
        self.protocol = protocol
        self.clean = clean
        self.connect_properties = properties
        if will:
            self.c.will_set(*will)
        self.messages: list[mqtt.MQTTMessage] = []
        self.cond = threading.Condition()
        self.connack: tuple[int, bool] | None = None
        self.subacks: dict[int, list[int]] = {}
        self.disconnected = threading.Event()
        self.connack_properties: object = None
        self.disconnect_reason: int | None = None
        self.c.on_message = self._on_message
        self.c.on_connect = self._on_connect
        self.c.on_subscribe = self._on_subscribe
        self.c.on_disconnect = self._on_disconnect
        self.c.on_unsubscribe = lambda *a: None
        Client.made.append(self)

    def _on_message(self, c, u, msg) -> None:
        with self.cond:
            self.messages.append(msg)
            self.cond.notify_all()

    def _on_connect(self, c, u, flags, rc, props) -> None:
        with self.cond:
            self.connack = (rc.value, bool(flags.session_present))
            self.connack_properties = props
            self.cond.notify_all()

    def _on_subscribe(self, c, u, mid, rcs, props) -> None:
        with self.cond:
            self.subacks[mid] = [r.value for r in rcs]
            self.cond.notify_all()

    def _on_disconnect(self, c, u, flags, rc, props) -> None:
        self.disconnect_reason = rc.value
        self.disconnected.set()

    def _wait(self, pred: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
        with self.cond:
            if not self.cond.wait_for(pred, timeout):
                raise AssertionError(f"timed out after {timeout} s waiting for {what}")

    def connect(self, expect_rc: int = 0) -> Client:
        kwargs = {}
        if self.protocol == mqtt.MQTTv5:
            kwargs["clean_start"] = self.clean
            if self.connect_properties is not None:
                kwargs["properties"] = self.connect_properties
        self.c.connect(self.host, self.port, self.keepalive, **kwargs)
        self.c.loop_start()
        self._wait(lambda: self.connack is not None, "CONNACK")
        assert self.connack is not None and self.connack[0] == expect_rc, self.connack
        if expect_rc:
            # Refused as expected: paho would try again every few seconds (each try one more
            # refusal in the broker's counters, on any of its workers); it is done.
            self.c.disconnect()
        return self

    @property
    def session_present(self) -> bool:
        assert self.connack is not None
        return self.connack[1]

    def subscribe(self, topic: str | list[tuple[str, int]], qos: int = 0, options: object = None) -> list[int]:
        """SUBSCRIBE and wait for the SUBACK; ``options``: MQTT 5 subscription options (paho's
        ``SubscribeOptions``, No Local ...) in place of ``qos``."""
        return self.wait_suback(self.send_subscribe(topic, qos, options))

    def send_subscribe(self, topic: str | list[tuple[str, int]], qos: int = 0, options: object = None) -> int:
        """SUBSCRIBE without waiting; returns its packet id for ``wait_suback``."""
        result, mid = self.c.subscribe(topic, qos) if options is None else self.c.subscribe(topic, options=options)
        assert result == mqtt.MQTT_ERR_SUCCESS
        return mid

    def wait_suback(self, mid: int) -> list[int]:
        self._wait(lambda: mid in self.subacks, "SUBACK")
        return self.subacks[mid]

    def unsubscribe(self, topic: str) -> None:
        done = threading.Event()
        self.c.on_unsubscribe = lambda *a: done.set()
        self.c.unsubscribe(topic)
        assert done.wait(WAIT), "UNSUBACK"

    def publish(self, topic: str, payload: bytes | str, qos: int = 0, retain: bool = False) -> None:
        info = self.c.publish(topic, payload, qos, retain)
        info.wait_for_publish(WAIT)
        assert info.is_published(), f"publish to {topic} not acknowledged"

    def wait_messages(self, n: int, timeout: float = WAIT) -> list[mqtt.MQTTMessage]:
        self._wait(lambda: len(self.messages) >= n, f"{n} messages (have {len(self.messages)})", timeout)
        return list(self.messages)

    def wait_topic(self, topic: str, timeout: float = WAIT) -> mqtt.MQTTMessage:
        self._wait(lambda: any(m.topic == topic for m in self.messages), f"a message on {topic}", timeout)
        return next(m for m in self.messages if m.topic == topic)

    def wait_payload(self, payload: bytes, timeout: float = WAIT) -> mqtt.MQTTMessage:
        self._wait(lambda: any(m.payload == payload for m in self.messages), f"a message {payload!r}", timeout)
        return next(m for m in self.messages if m.payload == payload)

    def disconnect(self) -> None:
        self.c.disconnect()
        self.disconnected.wait(WAIT)
        self.c.loop_stop()

    def stop_loop(self) -> None:
        """Stop this client's network thread (``stop_loops``): nothing more is read or sent, nor is
        it connected again; the connection stays open."""
        stop_loops([self.c])

    @staticmethod
    def close_all(clients: list[Client]) -> None:
        """Stop the clients' network threads (``stop_loops``) and close their sockets and paho's
        wake-up socket pairs (no DISCONNECT: a test that wants one calls ``disconnect``)."""
        stop_loops([client.c for client in clients])
        for client in clients:
            client.c._reset_sockets()  # paho has no public call that closes its socket pair

    def drop(self) -> None:
        """Close the socket without DISCONNECT (an abnormal close: the will fires)."""
        self.stop_loop()
        sock = self.c.socket()
        if sock is not None:
            sock.close()


class RawClient:
    """A plain TCP socket for the tests that must send exact bytes (malformed packets ...)."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.sock = socket.create_connection((host, port), timeout=WAIT)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_until_closed(self, timeout: float = WAIT) -> bytes:
        """Read until the broker closes the connection (bounded); returns what it sent."""
        self.sock.settimeout(timeout)
        chunks = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                break
            if not data:
                break
            chunks.append(data)
        else:
            raise AssertionError("the broker did not close the connection")
        return b"".join(chunks)

    def recv_exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            data = self.sock.recv(n - len(buf))
            if not data:
                raise AssertionError(f"connection closed after {len(buf)} of {n} bytes")
            buf += data
        return buf

    def close(self) -> None:
        self.sock.close()


def cid(prefix: str) -> str:
    """A client id unique to this test run (tests share brokers' session tables otherwise)."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def subscribe_packet(pid: int, filters: list[tuple[str, int]]) -> bytes:
    """SUBSCRIBE with exact bytes (paho refuses invalid filters); remaining length < 128."""
    body = pid.to_bytes(2, "big")
    for f, q in filters:
        fb = f.encode()
        body += len(fb).to_bytes(2, "big") + fb + bytes([q])
    return bytes([0x82, len(body)]) + body


def read_packet(raw: RawClient) -> bytes:
    """One whole packet of remaining length < 128 from a raw client."""
    head = raw.recv_exact(2)
    assert head[1] < 128
    return head + raw.recv_exact(head[1])


def connect_packet(client_id: str = "raw", keepalive: int = 60, clean: bool = True, level: int = 4,
                   name: bytes = b"MQTT", flags: int | None = None) -> bytes:
    cid = client_id.encode()
    if flags is None:
        flags = 0x02 if clean else 0
    var = len(name).to_bytes(2, "big") + name + bytes([level, flags]) + keepalive.to_bytes(2, "big")
    body = var + len(cid).to_bytes(2, "big") + cid
    return bytes([0x10, len(body)]) + body
