"""A router of another node spoken by a test over ZeroMQ: the mesh's frames, exactly, without a
broker behind them, for the cases a real cluster reaches only by chance (a confirmation meant
for an old incarnation, two replicas answering one takeover)."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable

import msgpack
import pytest
import zmq

CLUSTER_KEY = "cluster"  # FakeRouter's ``key``: the one every test node holds


def run_dirs() -> list[str]:
    """The run directories of the brokers started by this user (their mesh's ipc sockets)."""
    base = os.environ.get("BROKERD_RUN_DIR") or os.path.join(tempfile.gettempdir(), f"brokerd-{os.getuid()}")
    try:
        return [os.path.join(base, d) for d in os.listdir(base)]
    except FileNotFoundError:
        pytest.fail("no brokerd run directory")


def mesh_endpoint(port: int, node: str = "t", worker: int = 0) -> str:
    """The ipc endpoint of a broker's router (node ``node``, MQTT port ``port``)."""
    dirs = [d for d in run_dirs() if d.endswith(f"{node}-{port}")]
    assert dirs, f"no run directory for the broker on port {port}"
    return f"ipc://{dirs[0]}/w{worker}.mesh"


class FakeRouter:
    """A router of another node: it says HELLO (as one incarnation or another, with the replicas
    it claims to hold), sends what the test tells it, and keeps every frame sent to it.

    ``key``: the CURVE secret key file it holds. By default the cluster's (``tests.helpers.mesh_key``,
    which every test node started with ``--mesh`` holds): a node links back to this router's tcp
    PULL as a CURVE client, so that socket is a CURVE server. Another file: an outsider that holds
    a key of its own; None: an outsider with plain sockets."""

    def __init__(self, ctx: zmq.Context, target: str, name: str = "fake/w0", node: str = "fake",
                 target_id: str | None = None, key: str | None = CLUSTER_KEY) -> None:
        import zmq.auth

        from brokerd.router.mesh_format import MESH_VERSION
        from tests.helpers import mesh_key_file

        self.version, self.name, self.node, self.inc = MESH_VERSION, name, node, 1
        self.replicas: dict[str, int] = {}  # HELLO's ``replicas``: partition -> end
        self.pull = ctx.socket(zmq.PULL)
        self.pull.setsockopt(zmq.LINGER, 0)
        # (own public key, own secret key, the cluster's public key), for the tcp sockets.
        self.curve: tuple[bytes, bytes, bytes] | None = None
        if key is not None:
            public, secret = zmq.auth.load_certificate(mesh_key_file() if key == CLUSTER_KEY else key)
            self.curve = (public, secret, zmq.auth.load_certificate(mesh_key_file())[0])
            self.pull.curve_server = True
            self.pull.curve_publickey, self.pull.curve_secretkey = public, secret
        port = self.pull.bind_to_random_port("tcp://127.0.0.1")
        self.tcp = f"tcp://127.0.0.1:{port}"
        self.ctx = ctx
        self.pushes: dict[str, zmq.Socket] = {}  # router id (as the test names it) -> its socket
        self.connect(target, target_id)
        self.frames: list[tuple[int, str, int, object]] = []  # (kind, sender, incarnation, body)
        # The numbered ones among them (mesh version 23): (kind, sender, number, for whom, body).
        self.numbered: list[tuple[int, str, int, int, object]] = []
        self._next_hello = 0.0
        self.quiet = False  # says no HELLO (falls silent) while set; still reads

    def connect(self, target: str, router_id: str | None = None) -> zmq.Socket:
        """A socket to one more router (``target``: its mesh endpoint); HELLO goes to all."""
        push = self.ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        if self.curve is not None and target.startswith("tcp://"):  # a node's tcp mesh is CURVE
            push.curve_publickey, push.curve_secretkey, push.curve_serverkey = self.curve
        push.connect(target)
        self.pushes[router_id or target] = push
        return push

    def send(self, kind: int, body: object, to: str | None = None, number: tuple[int, int] | None = None) -> None:
        """A frame to every router connected (``to``: the one of that router id); ``number``:
        (its number, the receiver's incarnation it is for), as a frame of a numbered kind."""
        envelope = [self.version, kind, self.name, self.inc, body, *(number or ())]
        frame = msgpack.packb(envelope, use_bin_type=True)
        for push in self.pushes.values() if to is None else [self.pushes[to]]:
            push.send(frame)

    def hello(self, acks: dict | None = None) -> None:
        from brokerd.router.mesh_format import HELLO

        body = {"node": self.node, "ipc": None, "tcp": self.tcp, "stats": None, "peers": [],
                "acks": acks or {}, "log": -1}
        if self.replicas:
            body["replicas"] = self.replicas
        self.send(HELLO, body)

    def step(self, wait_ms: int = 100) -> list[tuple[int, str, int, object]]:
        """Say HELLO when one is due (every 0.3 s, as a live router does; never while ``quiet``)
        and read what came within ``wait_ms``: the new frames."""
        now = time.monotonic()
        if now >= self._next_hello and not self.quiet:
            self.hello()
            self._next_hello = now + 0.3
        new = []
        while self.pull.poll(wait_ms):
            # (a frame of a numbered kind carries its number and the incarnation it is for after
            # the body: mesh version 23; this router confirms none of them)
            _, kind, sender, inc, body, *numbered = msgpack.unpackb(self.pull.recv(), raw=False)
            new.append((kind, sender, inc, body))
            if numbered:
                self.numbered.append((kind, sender, numbered[0], numbered[1], body))
            wait_ms = 0
        self.frames += new
        return new

    def read(self, until: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
        """Read frames (saying HELLO now and then) until ``until()``."""
        deadline = time.monotonic() + timeout
        while not until():
            assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
            self.step()

    def kinds(self, kind: int) -> list[object]:
        """The bodies of the frames of ``kind`` received."""
        return [body for k, _, _, body in self.frames if k == kind]

    def publishes(self, payload: bytes) -> list[int]:
        """The numbers of the PUBLISH frames received that carry ``payload``."""
        from brokerd.router.mesh_format import PUBLISH

        return [body[0] for body in self.kinds(PUBLISH) if payload in msgpack.packb(body[1], use_bin_type=True)]
