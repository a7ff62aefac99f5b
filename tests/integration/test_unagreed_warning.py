"""A node of several run without ``--agreement`` says at start what it risks (issue 41): the lease
rules then decide who serves a session, and a partition can lose acknowledged messages."""

from __future__ import annotations

from brokerd.cluster.config import load
from brokerd.cluster.supervisor import unagreed_warning
from tests.cluster.test_multihost import mesh_port
from tests.helpers import mesh_key


def test_a_node_with_peers_and_no_agreement_warns_at_start(start_broker):
    mport, peer = mesh_port("127.0.0.1"), mesh_port("127.0.0.1")
    broker = start_broker("--mesh", f"127.0.0.1:{mport}", "--peer", f"127.0.0.1:{peer}", *mesh_key())
    broker.wait_log("no --agreement:")
    line = next(x for x in broker.log_text().splitlines() if "no --agreement:" in x)
    assert " WARNING " in line and "can lose acknowledged" in line and "--agreement on three nodes" in line, line


def test_only_a_node_of_several_without_agreement_is_warned():
    key = mesh_key()
    alone = load(["--node-id", "a"], environ={})
    mesh_alone = load(["--node-id", "a", "--mesh", "127.0.0.1:7000", *key], environ={})
    several = load(["--node-id", "a", "--mesh", "127.0.0.1:7000", "--peer", "127.0.0.2:7000", *key], environ={})
    agreed = load(["--node-id", "a", "--mesh", "127.0.0.1:7000", "--peer", "127.0.0.2:7000", *key,
                   "--agreement", "127.0.0.1:7100", "--agreement-peer", "127.0.0.2:7100"], environ={})
    assert unagreed_warning(alone) is None
    assert unagreed_warning(mesh_alone) is None  # a single node's mesh: its workers, nothing to agree with
    assert unagreed_warning(agreed) is None
    assert "partition can lose acknowledged" in (unagreed_warning(several) or "")
