"""A session is its owner's across the routers of a node (``--workers 2``): another user's CONNECT
with its client id, landing on the other worker, is refused by the router holding the session
before that router closes its owner's connection or lets the session go; with
``--session-owner replace`` it gets a clean session there, with nothing of the owner's.

The kernel spreads connections over the workers (SO_REUSEPORT), so each test connects until a
claim has crossed between the routers (bounded), which the log says.
"""

from __future__ import annotations

import pytest

from tests.cluster.conftest import client_worker
from tests.helpers import cid
from tests.integration.test_session_identity import NOT_AUTHORIZED, client, files  # noqa: F401 - a fixture

ACROSS = "(on router "  # a refusal that came from the other router (``Client._refuse_claim``)
TRIES = 20  # connections until one lands on the other worker: 2**-20 that none does


def start(start_broker, files, *args: str):  # noqa: F811
    pw, acl = files
    return start_broker("--password-file", str(pw), "--acl-file", str(acl), *args, workers=2)


def claims_across(broker, alice_id: str) -> None:
    """bob claims alice's session until a claim was refused by the other router."""
    before = broker.log_text().count(ACROSS)
    for _ in range(TRIES):
        client(broker.port, "bob", alice_id, clean=False).connect(expect_rc=NOT_AUTHORIZED)
        if broker.log_text().count(ACROSS) > before:
            return
    raise AssertionError("no claim reached the other worker")


@pytest.mark.parametrize("log", ["on", "off"])
def test_another_users_claim_is_refused_by_the_router_holding_the_session(start_broker, files, log):  # noqa: F811
    b = start(start_broker, files, "--log", log)
    alice_id = cid("alice-dev")
    alice = client(b.port, "alice", alice_id, clean=False).connect()
    assert alice.subscribe([("a/#", 1), ("$share/grp/a/#", 1)]) == [1, 1]
    claims_across(b, alice_id)
    assert not alice.disconnected.is_set(), "a refused claim closed the owner's connection"
    pub = client(b.port, "pub", cid("pub")).connect()
    pub.publish("a/live", "live", 1)
    alice.wait_payload(b"live")
    alice.disconnect()
    pub.publish("a/queued", "queued", 1)
    claims_across(b, alice_id)
    alice = client(b.port, "alice", alice_id, clean=False).connect()
    assert alice.session_present
    alice.wait_payload(b"queued")
    assert "not handed over: user 'bob' connected with its client id on another router" in b.log_text()


def test_replace_across_workers_gives_a_clean_session(start_broker, files):  # noqa: F811
    b = start(start_broker, files, "--session-owner", "replace")
    pub = client(b.port, "pub", cid("pub")).connect()
    alice_id = cid("alice-dev")
    for i in range(TRIES):
        alice = client(b.port, "alice", alice_id, clean=False).connect()
        assert alice.subscribe([("a/#", 1), ("$share/grp/a/#", 1)]) == [1, 1]
        where = client_worker(b, alice)
        alice.disconnect()
        pub.publish("a/queued", f"queued {i}", 1)
        bob = client(b.port, "bob", alice_id, clean=False).connect()
        assert not bob.session_present
        assert bob.subscribe("b/marker", 1) == [1]
        pub.publish("a/live", "not for bob", 1)
        pub.publish("b/marker", f"end {i}", 1)
        bob.wait_payload(f"end {i}".encode())
        assert [m.topic for m in bob.messages] == ["b/marker"], "bob got something of alice's session"
        across = client_worker(b, bob) != where
        bob.disconnect()
        if across:
            break
    else:
        raise AssertionError("bob never landed on the other worker")
    assert f"session {alice_id} of user 'alice' dropped: user 'bob'" in b.log_text()


@pytest.mark.parametrize("claimed_on", ["c", "b"])
def test_a_dead_nodes_session_is_not_handed_from_its_replica_to_another_user(start_broker, files, claimed_on):  # noqa: F811
    """alice's session lives on node a, followed by c; a dies with a message queued for her. bob
    claims her client id on c (which holds the replica) or on b (which asks c): refused, and the
    replica stays held, so alice, back on c, finds her session and her message."""
    from brokerd.cluster.replication.rules import follower_nodes
    from tests.cluster.test_replication import HOSTS, snapshot_of, three_nodes

    assert follower_nodes("a/w0", "a", ["b", "c"], 1) == ["c"]  # the test's layout rests on it
    pw, acl = files
    nodes = three_nodes(start_broker, "--replication-factor", "2", "--password-file", str(pw),
                        "--acl-file", str(acl))
    alice_id = cid("alice-dev")
    alice = client(nodes["a"].port, "alice", alice_id, clean=False, host=HOSTS["a"]).connect()
    assert alice.subscribe([("a/#", 1), ("$share/grp/a/#", 1)]) == [1, 1]
    alice.disconnect()
    snapshot_of(nodes["c"], lambda r: r["sessions"].get("a/w0", 0) == 1)
    client(nodes["a"].port, "pub", cid("pub"), host=HOSTS["a"]).connect().publish("a/q", "queued", 1)
    nodes["a"].kill()
    node = nodes[claimed_on]
    client(node.port, "bob", alice_id, clean=False, host=HOSTS[claimed_on]).connect(expect_rc=NOT_AUTHORIZED)
    assert "belongs to user 'alice'" in node.log_text()
    alice = client(nodes["c"].port, "alice", alice_id, clean=False, host=HOSTS["c"]).connect()
    assert alice.session_present, "the replica did not stay held for its owner"
    alice.wait_payload(b"queued")
