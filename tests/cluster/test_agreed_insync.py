"""The agreed in-sync set end to end (issue 41, ``cluster.replication.insync``): three real nodes
with ``--agreement``. Each router's log is agreed in sync on its follower, at a leader epoch its
incarnation claimed; when the follower's node dies, the set moves to the follower placed in its
stead (committed, not only seen), and QoS 1 publishes are acknowledged again, on the new set."""

from __future__ import annotations

import re

from brokerd.cluster.replication.rules import follower_nodes
from tests.cluster.test_agreed_ownership import nodes  # noqa: F401 - the three nodes with --agreement
from tests.helpers import Broker, Client, cid, wait_for

IN_SYNC = r"the log of a/w0 is in sync on ([^ ]+) \(agreed, leader epoch (\d+)\)"


def _agreed(broker: Broker) -> list[tuple[str, int]]:
    return [(m.group(1), int(m.group(2))) for m in re.finditer(IN_SYNC, broker.log_text())]


def test_the_in_sync_set_is_agreed_and_follows_the_placement(nodes: list[Broker]) -> None:  # noqa: F811
    a, b, c = nodes
    assert follower_nodes("a/w0", "a", ["b", "c"], 1) == ["c"]  # the test's layout rests on it
    wait_for(lambda: ("c/w0", ) == tuple(s for s, _ in _agreed(a))[-1:], 30, "a/w0's log agreed in sync on c/w0")
    epoch = _agreed(a)[-1][1]
    assert epoch > 0
    pub = Client(a.port, cid("pub")).connect()
    pub.c.publish("insync/x", b"before", qos=1).wait_for_publish(10)  # acknowledged on the agreed set
    c.kill()
    # b is placed in c's stead; the set moves to it once committed (never to "nobody" for good).
    wait_for(lambda: _agreed(a)[-1][0] == "b/w0", 30, "a/w0's log agreed in sync on b/w0")
    assert {e for _, e in _agreed(a)} == {epoch}  # one incarnation: one leader epoch
    sub = Client(b.port, cid("sub")).connect()
    sub.subscribe("insync/#", qos=1)
    info = pub.c.publish("insync/x", b"after", qos=1)
    info.wait_for_publish(20)  # acknowledged: a and b hold it
    assert info.is_published()
    assert sub.wait_payload(b"after")
