"""Several nodes on distinct loopback addresses (127.0.0.1/.2/.3), each with 2 workers and a mesh port."""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from brokerd.cluster.config import load
from brokerd.cluster.stats_cli import StatsReader
from tests.helpers import BROKERD, LEASES, Broker, Client, free_port, in_parallel, mesh_key, stop_together


def mesh_port(host: str) -> int:
    """A port P with P and P+1 free on ``host`` (router i of a node binds P+i). From ``free_port``'s
    range, below the ephemeral one: a port bound to 0 is odd there, and its even neighbour is what
    the kernel gives outgoing connections first (on a busy machine, 50 of them in a row taken)."""
    for _ in range(50):
        p = free_port(host)
        try:
            with socket.socket() as s2:
                s2.bind((host, p + 1))
            return p
        except OSError:
            continue
    raise AssertionError("no pair of free ports")


def start_nodes(start_broker, *extra_by_node: list[str]):
    hosts = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    mports = [mesh_port(h) for h in hosts]
    # a peers with b, b with a, c with b only: c learns of a through b.
    peers = [[1], [0], [1]]

    def start(i: int, h: str, name: str) -> Broker:
        args = ["--mesh", f"{h}:{mports[i]}", *LEASES, *mesh_key()]  # a --mesh-key in extra_by_node replaces it
        for j in peers[i]:
            args += ["--peer", f"{hosts[j]}:{mports[j]}"]
        args += extra_by_node[i] if i < len(extra_by_node) else []
        return start_broker(*args, workers=2, host=h, node_id=name)

    nodes = in_parallel(*(functools.partial(start, i, h, name) for i, (h, name) in enumerate(zip(hosts, "abc", strict=True))))
    for n in nodes:
        n.wait_log("joined")
    return nodes


def stats_reader(node: Broker) -> tuple[StatsReader, int]:
    """A reader of the node's routers' stats sockets, and how many routers it has."""
    args = node.args
    node_id, workers = args[args.index("--node-id") + 1], int(args[args.index("--workers") + 1])
    given = ["--node-id", node_id, "--listen", f"{node.host}:{node.port}"]
    for flag in ("--stats-port", "--stats-host"):
        if flag in args:
            given += [flag, args[args.index(flag) + 1]]
    base = node.env.get("BROKERD_RUN_DIR")  # the broker's own run directory base, if it was given one
    reader = StatsReader(load(given, environ={}), workers=workers,
                         run_path=os.path.join(base, f"{node_id}-{node.port}") if base else None)
    return reader, workers


def mesh_peers(node: Broker, timeout: float = 15.0, until=None) -> dict[str, set[str]]:
    """Router name → the peer routers it has met in the mesh, from the node's stats snapshots (the
    log says one line per node joined, not one per router pair), read until ``until(peers)`` holds."""
    reader, workers = stats_reader(node)
    peers: dict[str, set[str]] = {}
    deadline = time.monotonic() + timeout
    try:
        while True:
            for topic, body in reader.receive(0.5):
                if topic == b"snap":
                    peers[body["router"]] = set(body["traffic"]["mesh"]["peers"])
            if len(peers) == workers and (until is None or until(peers)):
                return peers
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {node.name}'s mesh: {peers}")
    finally:
        reader.close()


def wait_mesh_complete(nodes, routers: int = 6, timeout: float = 15.0) -> None:
    """Every router of ``nodes`` has met the other routers - 1 (the snapshots of a restarted node's
    routers count only what they met since)."""
    in_parallel(*(functools.partial(mesh_peers, n, timeout, lambda peers: all(len(p) >= routers - 1 for p in peers.values()))
                  for n in nodes))


@contextlib.contextmanager
def two_nodes(xprocess, data_dir: Callable[[str], object], label: str, *extra: str) -> Iterator[tuple[Broker, Broker]]:
    """Nodes a (127.0.0.1) and b (127.0.0.2), 2 workers each, each the other's --peer, with
    ``extra`` options, started as xprocess ``brokerd-<label>-node-<name>-<port>``; ``data_dir(name)``
    gives each its --data-dir. Stopped on the way out."""
    hosts = ["127.0.0.1", "127.0.0.2"]
    mports = [mesh_port(h) for h in hosts]
    started: list[Broker] = []
    try:
        for i, name in enumerate("ab"):
            host, other = hosts[i], 1 - i
            port = free_port(host)
            argv = ["--workers", "2", "--listen", f"{host}:{port}", "--node-id", name,
                    "--data-dir", str(data_dir(name)), *mesh_key(),
                    "--mesh", f"{host}:{mports[i]}", *LEASES, "--peer", f"{hosts[other]}:{mports[other]}", *extra]
            started.append(Broker(xprocess, f"brokerd-{label}-node-{name}-{port}", argv, host, port))
        in_parallel(*(broker.start for broker in started))
        for n in started:
            n.wait_log("joined")
        wait_mesh_complete(started, routers=4)
        yield started[0], started[1]
    finally:
        stop_together(xprocess, [broker.name for broker in started])


def test_pub_on_one_node_reaches_subscribers_on_others_and_survives_a_node_restart(start_broker):
    a, b, c = start_nodes(start_broker)
    wait_mesh_complete([a, b, c])
    u = uuid.uuid4().hex[:6]
    subs_c = [Client(c.port, f"sc{u}{i}", host=c.host).connect() for i in range(4)]
    subs_b = [Client(b.port, f"sb{u}{i}", host=b.host).connect() for i in range(2)]
    for s in subs_c + subs_b:
        s.subscribe(f"mh{u}/#", 1)
    pub_a = Client(a.port, f"pa{u}", host=a.host).connect()
    for i in range(30):
        pub_a.publish(f"mh{u}/x", str(i), qos=1)
    for s in subs_c + subs_b:
        assert [int(m.payload) for m in s.wait_messages(30)] == list(range(30))

    # Stop the middle node: a and c keep serving each other (c learned of a through b).
    assert b.stop() == 0
    pub_a.publish(f"mh{u}/x", b"while-b-down", qos=1)
    for s in subs_c:
        s.wait_messages(31)
        assert s.messages[-1].payload == b"while-b-down"

    # b comes back and is served again from both sides.
    b.start()
    # Each of b's 2 routers meets the other 5 routers again.
    wait_mesh_complete([b])
    back = [Client(b.port, f"sb2{u}{i}", host=b.host).connect() for i in range(3)]
    for s in back:
        s.subscribe(f"mh{u}/#", 1)
    pub_a.publish(f"mh{u}/x", b"after-restart-a", qos=1)
    pub_c = Client(c.port, f"pc{u}", host=c.host).connect()
    pub_c.publish(f"mh{u}/x", b"after-restart-c", qos=1)
    for s in back:
        s.wait_messages(2)
        assert sorted(m.payload for m in s.messages) == [b"after-restart-a", b"after-restart-c"]


def test_node_with_wrong_curve_key_is_refused(start_broker, tmp_path):
    good = tmp_path / "good"
    bad = tmp_path / "bad"
    for path in (good, bad):
        r = subprocess.run([BROKERD, "keygen", "--out", str(path)], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
    key_good = f"{good}.key_secret"
    key_bad = f"{bad}.key_secret"
    a, b, c = start_nodes(start_broker, ["--mesh-key", key_good], ["--mesh-key", key_good],
                          ["--mesh-key", key_bad])
    # a and b form the cluster; c cannot join, and both sides say why.
    wait_mesh_complete([a, b], routers=4)
    c.wait_log("CURVE handshake failed", timeout=15)
    b.wait_log("CURVE handshake failed", timeout=15)
    assert "router c/" not in a.log_text() + b.log_text()
    u = uuid.uuid4().hex[:6]
    sub_b = Client(b.port, f"sb{u}", host=b.host).connect()
    sub_c = Client(c.port, f"sc{u}", host=c.host).connect()
    sub_b.subscribe(f"k{u}", 1)
    sub_c.subscribe(f"k{u}", 1)
    pub = Client(a.port, f"pa{u}", host=a.host).connect()
    pub.publish(f"k{u}", b"secret", qos=1)
    assert sub_b.wait_topic(f"k{u}").payload == b"secret"
    # c is not part of the mesh: prove nothing reached it by a marker published on c itself.
    Client(c.port, f"m{u}", host=c.host).connect().publish(f"k{u}", b"marker", qos=1)
    sub_c.wait_messages(1)
    assert [m.payload for m in sub_c.messages] == [b"marker"]


@pytest.mark.parametrize("flag", ["--peer"])
def test_peer_without_mesh_is_a_config_error(flag):
    r = subprocess.run([BROKERD, flag, "127.0.0.1:7000"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--peer" in r.stderr
