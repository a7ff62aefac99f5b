"""A follower that missed records while cut off catches up after the cut heals, though its leader
writes nothing more (issue 41: it stayed behind until the next write)."""

from __future__ import annotations

import uuid

from brokerd.cluster.replication.rules import follower_nodes
from tests.cluster.test_replication import HOSTS, proxied_nodes, snapshot_of
from tests.helpers import Client


def test_a_follower_back_from_a_cut_fetches_what_it_missed_without_new_writes(start_broker):
    """Node a's follower node is cut off (both ways) until a takes its router for silent; a goes
    on acknowledging QoS 1 publishes (``--min-insync 1``), more than one fetch's worth. Once the cut heals, a places its log on
    that follower again and publishes nothing more: within seconds the follower holds a's whole
    log (its lag is 0, its replica ends where a's log ends)."""
    with proxied_nodes(start_broker, "--min-insync", "1") as (nodes, proxies):
        f = follower_nodes("a/w0", "a", ["b", "c"], 1)[0]
        other = "c" if f == "b" else "b"
        u = uuid.uuid4().hex[:6]
        pub = Client(nodes["a"].port, f"p{u}", host=HOSTS["a"]).connect()
        for i in range(5):
            pub.publish(f"gap{u}/x", f"before-{i}".encode(), qos=1)
        snapshot_of(nodes["a"], lambda r: r["followers"].get(f"{f}/w0", {}).get("lag_records", 1) == 0
                    and r["end"] >= 4)

        proxies[f].cut({HOSTS["a"], HOSTS[other]})
        for n in ("a", other):
            proxies[n].cut({HOSTS[f]})
        nodes["a"].wait_log(f"router {f}/w0 silent", timeout=10)
        # More than one fetch answers (FETCH_RECORDS), sent with 20 in flight.
        infos = [pub.c.publish(f"gap{u}/x", f"during-{i}".encode(), 1) for i in range(2500)]
        for info in infos:
            info.wait_for_publish(10)
        assert all(info.is_published() for info in infos)
        pub.disconnect()
        end = snapshot_of(nodes["a"], lambda r: True)["replication"]["end"]

        for proxy in proxies.values():
            proxy.heal()
        # Nothing more is published: the follower learns of its gap from a alone.
        snap = snapshot_of(nodes["a"], lambda r: r["followers"].get(f"{f}/w0", {}).get("lag_records", 1) == 0,
                           timeout=15)
        assert snap["replication"]["end"] == end, "a wrote after the cut healed: the test proves nothing"
        replica = snapshot_of(nodes[f], lambda r: "a/w0" in r["replicas"])["replication"]["replicas"]["a/w0"]
        assert replica["end"] == end
