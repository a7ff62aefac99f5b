"""What a node says of its peers, read as an operator would: the line names what is true.

A node with another --mesh-key than its peer's says whom it cannot join (the refusing side is
not the only one to speak), and `brokerd stats` shows that peer as not joined; a node whose
peers died says they are silent, not that they hear it one way, and does not then contradict
its own refusal to acknowledge with a --min-insync warning."""

from __future__ import annotations

import os
import subprocess
import time

import zmq.auth

from tests.cluster.test_multihost import mesh_port
from tests.cluster.test_replication import three_nodes
from tests.helpers import BROKERD, LEASES, mesh_key

QUIET_S = 3.0  # ZeroMQ retries a refused handshake every 50 ms to 1 s: this is many retries


def _stats(*args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "BROKERD_RUN_DIR")}
    r = subprocess.run([BROKERD, "stats", *args], capture_output=True, text=True, timeout=30, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_a_node_with_another_mesh_key_says_which_peer_it_cannot_join(start_broker, tmp_path):
    _, other_key = zmq.auth.create_certificates(str(tmp_path), "other")
    pa, pb = mesh_port("127.0.0.1"), mesh_port("127.0.0.2")
    start_broker("--mesh", f"127.0.0.1:{pa}", *LEASES, *mesh_key(), workers=1, node_id="a")
    b = start_broker("--mesh", f"127.0.0.2:{pb}", *LEASES, "--mesh-key", other_key, "--peer", f"127.0.0.1:{pa}",
                     workers=1, host="127.0.0.2", node_id="b")
    line = f"mesh: cannot join the peer at tcp://127.0.0.1:{pa}: CURVE handshake failed"
    b.wait_log(line)
    time.sleep(QUIET_S)
    assert b.log_text().count(line) == 1, "the refused link is not logged once (rate-limited)"
    assert "--mesh-key" in next(x for x in b.log_text().splitlines() if line in x)
    out = _stats("--node-id", "b", "--listen", f"127.0.0.2:{b.port}", "--workers", "1")
    assert f"mesh b: not joined: tcp://127.0.0.1:{pa} (CURVE handshake failed" in out, out


def test_a_node_whose_peers_died_says_they_are_silent_and_no_contradicting_warning(start_broker):
    """Killed peers are heard no more: not the one-way cut's "it hears 3, but only 1 answer"."""
    nodes = three_nodes(start_broker, "--mesh-timeout", "3")
    nodes["b"].kill()
    nodes["c"].kill()
    a = nodes["a"]
    a.wait_log("not a majority", timeout=15)
    a.wait_log("router c/w0 silent", timeout=10)
    a.wait_log("router b/w0 silent", timeout=10)
    time.sleep(1.5)  # replication places its followers on every heartbeat (0.5 s)
    text = a.log_text()
    cut = next(x for x in text.splitlines() if "not a majority" in x)
    assert "answer its heartbeats" not in cut, cut
    assert "b, c silent: down, or cut off by a partition" in cut, cut
    since = text[text.index(cut):]
    assert "fewer than --min-insync" not in since, f"QoS 1/2 said acknowledged while it is not: {since[-3000:]}"
