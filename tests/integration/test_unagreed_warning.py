"""A node of several runs on agreement, or with ``--agreement off`` said in so many words; then it
says at start what it risks (issue 41): the lease rules decide who serves a session, and a
partition can lose acknowledged messages."""

from __future__ import annotations

import subprocess

from brokerd.cluster.config import load
from brokerd.cluster.supervisor import unagreed_warning
from tests.cluster.test_multihost import mesh_port
from tests.helpers import BROKERD, mesh_key


def test_a_node_with_peers_and_agreement_off_warns_at_start(start_broker):
    mport, peer = mesh_port("127.0.0.1"), mesh_port("127.0.0.1")
    broker = start_broker("--mesh", f"127.0.0.1:{mport}", "--peer", f"127.0.0.1:{peer}", *mesh_key(),
                          "--agreement", "off")
    broker.wait_log("--agreement off:")
    line = next(x for x in broker.log_text().splitlines() if "--agreement off:" in x)
    assert " WARNING " in line and "can lose acknowledged" in line and "--agreement on three nodes" in line, line


def test_a_node_with_peers_and_no_word_on_agreement_is_refused(tmp_path):
    """Refused at start, exit status 2, one line naming both ways (the config's unit tests hold its
    wording): a cluster never falls back to the lease rules by omission."""
    mport, peer = mesh_port("127.0.0.1"), mesh_port("127.0.0.1")
    done = subprocess.run([BROKERD, "--mesh", f"127.0.0.1:{mport}", "--peer", f"127.0.0.1:{peer}", *mesh_key(),
                           "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    said = done.stderr.strip().splitlines()[-1]  # after a stale build's warning, if any
    assert f"error: --mesh: 127.0.0.1:{mport} needs --agreement HOST:PORT" in said, said
    assert "--agreement off" in said, said
    assert not any(tmp_path.iterdir())


def test_only_a_node_of_several_with_agreement_off_is_warned():
    key = mesh_key()
    alone = load(["--node-id", "a"], environ={})
    mesh_alone = load(["--node-id", "a", "--mesh", "127.0.0.1:7000", *key, "--agreement", "off"], environ={})
    several = load(["--node-id", "a", "--mesh", "127.0.0.1:7000", "--peer", "127.0.0.2:7000", *key,
                    "--agreement", "off"], environ={})
    agreed = load(["--node-id", "a", "--mesh", "127.0.0.1:7000", "--peer", "127.0.0.2:7000", *key,
                   "--agreement", "127.0.0.1:7100", "--agreement-peer", "127.0.0.2:7100"], environ={})
    assert unagreed_warning(alone) is None
    assert unagreed_warning(mesh_alone) is None  # a single node's mesh: its workers, nothing to agree with
    assert unagreed_warning(agreed) is None
    assert "partition can lose acknowledged" in (unagreed_warning(several) or "")
