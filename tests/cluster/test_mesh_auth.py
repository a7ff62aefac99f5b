"""The mesh between nodes always authenticates, loopback included: brokerd refuses ``--mesh``
without ``--mesh-key`` unless ``--mesh-insecure on``, and a local process that speaks the mesh
protocol to a keyed node's tcp port without the cluster's key reads nothing and joins nothing.

Before, an unkeyed mesh on loopback was accepted, and any local process that said HELLO became a
node: it read every message through an INTEREST in ``#``. The outsider here is that process, made
of the tests' own mesh frames (``FakeRouter``); with ``--mesh-insecure on`` it still gets in, which
shows that what the keyed node refuses it is a working attack, not a malformed one.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid

import pytest
import zmq
import zmq.auth

from brokerd.router.mesh_format import HELLO, INTEREST
from tests.cluster.fake_router import FakeRouter
from tests.cluster.test_multihost import mesh_peers, mesh_port
from tests.helpers import BROKERD, LEASES, Client, free_port, mesh_key

OUTSIDER = "outsider/w0"
QUIET_S = 2.0  # how long the outsider keeps trying after the message it must not get was delivered


@pytest.mark.parametrize("given", ["argv", "env"])
def test_a_mesh_without_a_key_is_refused_at_start_loopback_too(tmp_path, given):
    mp = mesh_port("127.0.0.1")
    argv = [BROKERD, "--listen", f"127.0.0.1:{free_port()}", "--data-dir", str(tmp_path)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROKERD_")}
    if given == "argv":
        argv += ["--mesh", f"127.0.0.1:{mp}", *LEASES]
    else:
        env["BROKERD_MESH"] = f"127.0.0.1:{mp}"
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=env)
    assert r.returncode == 2, r.stderr
    expected = f"brokerd: error: --mesh: 127.0.0.1:{mp} needs --mesh-key FILE, loopback too"
    assert r.stderr.startswith(expected), r.stderr
    assert "brokerd keygen --out cluster" in r.stderr and "--mesh-insecure on" in r.stderr


def _outsider_key(kind: str, tmp_path) -> str | None:
    """None: plain sockets; "own": CURVE with a key pair of its own (it knows the cluster's public
    key, which is no secret, but not its secret one)."""
    if kind == "none":
        return None
    _, secret = zmq.auth.create_certificates(str(tmp_path), "outsider")
    return secret


@pytest.mark.parametrize("kind", ["none", "own"])
def test_a_process_without_the_clusters_key_reads_nothing_and_is_no_peer(start_broker, tmp_path, kind):
    """One worker: the outsider speaks to router 0's port."""
    mp = mesh_port("127.0.0.1")
    broker = start_broker("--mesh", f"127.0.0.1:{mp}", *LEASES, *mesh_key(), workers=1)
    u = uuid.uuid4().hex[:6]
    sub = Client(broker.port, f"s{u}").connect()
    sub.subscribe(f"secret{u}/#", 1)
    ctx = zmq.Context()
    try:
        outsider = FakeRouter(ctx, f"tcp://127.0.0.1:{mp}", name=OUTSIDER, node="outsider",
                              key=_outsider_key(kind, tmp_path))
        push = next(iter(outsider.pushes.values()))
        push.setsockopt(zmq.SNDTIMEO, 100)  # once the handshake is refused, ZeroMQ has no pipe to send on
        outsider.quiet = True  # its step() only reads: attempt() says HELLO

        def attempt() -> None:
            with contextlib.suppress(zmq.Again):
                outsider.hello()
                outsider.send(INTEREST, [None, [["#", True]], True])
            outsider.step(wait_ms=50)

        attempt()
        broker.wait_log("CURVE handshake failed")  # the node says whom it refused
        Client(broker.port, f"p{u}").connect().publish(f"secret{u}/x", b"secret", qos=1)
        sub.wait_payload(b"secret")
        until = time.monotonic() + QUIET_S
        while time.monotonic() < until:
            attempt()
        assert outsider.frames == [], "the outsider got mesh frames"
        peers = mesh_peers(broker)
        assert all(OUTSIDER not in p for p in peers.values()), peers
    finally:
        ctx.destroy(linger=0)


def test_with_mesh_insecure_on_a_local_process_joins_and_reads_the_mesh(start_broker):
    """What the keyed node refuses above, said in so many words by the operator: the node warns at
    start, and the same outsider becomes a peer that reads every message. One worker, as above."""
    mp = mesh_port("127.0.0.1")
    broker = start_broker("--mesh", f"127.0.0.1:{mp}", *LEASES, "--mesh-insecure", "on", workers=1)
    broker.wait_log(f"mesh: 127.0.0.1:{mp} is unauthenticated and unencrypted (--mesh-insecure on)")
    u = uuid.uuid4().hex[:6]
    pub = Client(broker.port, f"p{u}").connect()
    ctx = zmq.Context()
    try:
        outsider = FakeRouter(ctx, f"tcp://127.0.0.1:{mp}", name=OUTSIDER, node="outsider", key=None)
        outsider.read(lambda: any(k == HELLO for k, _, _, _ in outsider.frames), "the node's HELLO")
        outsider.send(INTEREST, [None, [["#", True]], True])
        probes = iter(range(1000))

        def read_one() -> bool:
            if outsider.publishes(f"secret{u}".encode()):
                return True
            pub.publish(f"secret{u}/x", f"secret{u}-{next(probes)}", qos=0)
            return False

        outsider.read(read_one, "a message forwarded to the outsider")
        peers = mesh_peers(broker, until=lambda p: all(OUTSIDER in v for v in p.values()))
        assert all(OUTSIDER in p for p in peers.values()), peers
    finally:
        ctx.destroy(linger=0)
