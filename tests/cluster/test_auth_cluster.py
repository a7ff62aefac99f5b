"""Authentication and ACLs across nodes (issue #17): a client's identity travels with its session
when another node takes it over, and the ACL holds wherever the session lives: for what waited
offline, for what is forwarded live from another node, and for what it publishes.

Two nodes (127.0.0.1 and 127.0.0.2, 2 workers each) with the same password and ACL files, the
files and users of tests/integration/test_auth.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.test_multihost import two_nodes
from tests.helpers import Broker, Client, cid, wait_for
from tests.integration.test_auth import PASSWORD, _client, files  # noqa: F401 - a fixture


@pytest.fixture
def secured(xprocess, tmp_path, files) -> Iterator[tuple[Broker, Broker]]:  # noqa: F811
    pw, acl = files
    with two_nodes(xprocess, lambda name: tmp_path / f"node-{name}", "auth",
                   "--password-file", str(pw), "--acl-file", str(acl)) as ab:
        yield ab


PASSWORDS = {"alice": PASSWORD, "bob": "bobs-pw"}


def on(node: Broker, user: str, **kw) -> Client:
    """``user`` connected to ``node`` with its password."""
    return _client(node.port, user, PASSWORDS[user], host=node.host, **kw).connect()


def test_a_session_taken_over_by_another_node_keeps_its_users_acl(secured):
    a, b = secured
    client_id = cid("alice-moves")
    # alice may read sensors/# except sensors/secret, and write only alice/#; bob may do anything.
    alice = on(a, "alice", client_id=client_id, clean=False)
    assert alice.subscribe("sensors/#", 1) == [1]
    alice.disconnect()
    bob = on(b, "bob")
    watcher = on(a, "bob")
    watcher.subscribe("sensors/#", 1)
    watcher.subscribe("alice/#", 1)
    # Offline on node a: what bob publishes on node b crosses the mesh to alice's session.
    bob.publish("sensors/secret", "s0", 1)
    bob.publish("sensors/open", "o0", 1)
    watcher.wait_payload(b"o0")
    # alice comes back on node b: the session moves across nodes with its identity.
    alice = on(b, "alice", client_id=client_id, clean=False)
    assert alice.session_present
    alice.wait_payload(b"o0")
    # Live, from the node she left: still only what her ACL lets her read.
    back = on(a, "bob")
    back.publish("sensors/secret", "s1", 1)
    back.publish("sensors/open", "o1", 1)
    alice.wait_payload(b"o1")
    # What she may not write is not delivered (MQTT 3.1.1: dropped silently, as Mosquitto does);
    # what she may is, and after it (one publisher, one path): had the forged one gone through,
    # the watcher would have it by then.
    alice.publish("sensors/open", "forged", 1)
    alice.publish("alice/ok", "mine", 1)
    watcher.wait_payload(b"mine")
    back.publish("sensors/open", "marker", 1)
    alice.wait_payload(b"marker")
    wait_for(lambda: any(m.payload == b"s1" for m in watcher.messages), what="the secret reached bob")
    assert [m.payload for m in alice.messages if m.topic == "sensors/secret"] == []
    assert b"forged" not in [m.payload for m in watcher.messages]
