"""Routing by interest, read from the routers' own stats: one copy per router, and teardown to empty."""

from __future__ import annotations

from tests.helpers import Client
from tests.integration.test_stats import INTERVAL, Snapshots, spread


def peer(snaps: dict, a: str, b: str, key: str) -> int:
    return snaps[a]["traffic"]["mesh"]["peers"].get(f"t/{b}", {}).get(key, 0)


def test_one_copy_per_router_however_many_subscribers_it_has(start_broker):
    broker = start_broker("--stats-interval", INTERVAL, "--sys-interval", "0", workers=2)
    view = Snapshots(broker, 2)
    try:
        clients, placed = spread(broker, view, "c", 8)
        (r_pub, (pub, *_)), (r_sub, _) = sorted(placed.items())
        # 100 subscribers on the other router.
        subs: list[Client] = []
        n = 0
        for _ in range(10):  # bounded: batches of 60 connections until 100 landed on r_sub
            batch = {f"s{n + i}": Client(broker.port, f"s{n + i}").connect() for i in range(60)}
            n += 60
            where = view.router_of(list(batch))
            for cid, c in batch.items():
                if where[cid] == r_sub and len(subs) < 100:
                    subs.append(c)
                else:
                    c.disconnect()
            if len(subs) == 100:
                break
        assert len(subs) == 100
        for c in subs:
            c.subscribe("copies/t", 1)
        pub.publish("copies/t", b"x" * 100, qos=1)
        for s in subs:
            s.wait_messages(1)
        snaps = view.until(lambda s: peer(s, r_sub, r_pub, "msgs_in") >= 1 and peer(s, r_pub, r_sub, "msgs_out") >= 1,
                           "both routers to count the copy")
        assert peer(snaps, r_pub, r_sub, "msgs_out") == 1  # one copy, not 100
        assert peer(snaps, r_sub, r_pub, "msgs_in") == 1
        assert peer(snaps, r_pub, r_sub, "bytes_out") < 1000
    finally:
        view.close()


def test_interest_tables_empty_again_after_everyone_leaves(start_broker):
    broker = start_broker("--stats-interval", INTERVAL, "--sys-interval", "0", workers=3)
    view = Snapshots(broker, 3)
    try:
        clients, placed = spread(broker, view, "i", 9, routers=3)
        for i, c in enumerate(clients):
            c.subscribe([(f"it/{i % 4}/#", 1), ("it/shared", 0), (f"it/+/{i}", 2)])
        # Each router's own filters and the others' interest, in one snapshot of each: a router's
        # latest one may show the others' interest from before its own clients' SUBSCRIBEs.
        view.until(lambda s: all(x["interest"] > 0 and x["filters"] > 0 for x in s.values()),
                   "every router's filters and the others' interest")
        # Half unsubscribe, the rest disconnect: every table in the cluster is empty again.
        for i, c in enumerate(clients):
            if i % 2:
                c.unsubscribe(f"it/{i % 4}/#")
                c.unsubscribe("it/shared")
                c.unsubscribe(f"it/+/{i}")
            else:
                c.disconnect()
        view.until(lambda s: all(x["interest"] == 0 and x["filters"] == 0 and x["subscriptions"] == 0
                                 for x in s.values()), "every interest table empty")
    finally:
        view.close()
