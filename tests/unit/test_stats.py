"""Stats without processes: snapshots of a real Router with fake connections, rates, aggregation,
the Prometheus text (parsed back with prometheus_client's parser), $SYS values, the CLI's tables."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from brokerd.cluster import stats as stats_module
from brokerd.cluster.config import Config
from brokerd.cluster.metrics import NodeStats, metrics_text, sum_trees
from brokerd.cluster.stats import (
    SCHEMA_VERSION,
    ConnectionSet,
    RateRing,
    StatsPublisher,
    broker_sys_values,
    router_endpoint,
    router_sys_values,
)
from brokerd.cluster.stats_cli import (
    human_bytes,
    human_count,
    human_duration,
    render_connections,
    render_routers,
)
from brokerd.connection.protocol import ConnectionCounters, Traffic
from brokerd.router.message import Message
from brokerd.router.router import Router, RouterConfig
from tests.unit.conftest import FakeConn, PeerStatsMesh


def fake_conn(bytes_in: int = 0, bytes_out: int = 0, msgs_in: int = 0, msgs_out: int = 0,
              peer: str = "127.0.0.1:1") -> FakeConn:
    c = ConnectionCounters()
    c.bytes_in, c.bytes_out, c.msgs_in, c.msgs_out = bytes_in, bytes_out, msgs_in, msgs_out
    return FakeConn(counters=c, peer=peer)


def publisher(node: str = "n", index: int = 0, workers: int = 2,
              loop: asyncio.AbstractEventLoop | None = None) -> tuple[StatsPublisher, Router, ConnectionSet]:
    config = Config(node_id=node, workers=workers, stats_interval=1.0)
    router = Router(RouterConfig(router_id=f"{node}/w{index}", node_id=node))
    conns = ConnectionSet()
    return StatsPublisher(config, index, router, conns, loop=loop), router, conns  # type: ignore[arg-type]


def carried(conns: ConnectionSet, conn: FakeConn) -> None:
    """What a real connection does as it counts: add to the worker's traffic, say it moved."""
    t, c = conns.traffic, conn.counters
    t.bytes_in += c.bytes_in
    t.bytes_out += c.bytes_out
    t.msgs_in += c.msgs_in
    t.msgs_out += c.msgs_out
    if c.moved != t.epoch:
        t.mark_moved(conn)  # type: ignore[arg-type]


def add_client(router: Router, conns: ConnectionSet, client_id: str, **counters: int) -> FakeConn:
    conn = fake_conn(**counters)
    conn.client_id = client_id
    conns.add(conn)  # type: ignore[arg-type]
    carried(conns, conn)
    session = router.new_session(client_id, False)
    router.clients[client_id] = SimpleNamespace(conn=conn, session=session, client_id=client_id)  # type: ignore[assignment]
    router.stats.connections += 1
    return conn


def test_snapshot_counts_live_and_closed_connections_and_sessions():
    pub, router, conns = publisher()
    add_client(router, conns, "big", bytes_in=5000, bytes_out=100, msgs_in=7)
    add_client(router, conns, "small", bytes_in=10, bytes_out=10, msgs_out=3)
    gone = fake_conn(1000, 2000, 4, 5)
    conns.add(gone)  # type: ignore[arg-type]
    carried(conns, gone)
    conns.discard(gone)  # type: ignore[arg-type]
    router.sessions["big"]._queue().extend([(None, 1, False)] * 3)  # type: ignore[list-item]
    router.sessions["small"].own_inflight()[1] = None  # type: ignore[assignment]
    router.stats.drop_queue_full = 2
    router.attach_mesh(PeerStatsMesh({"n/w1": [4, 400, 1, 100]}))  # type: ignore[arg-type]
    router.stats.mesh_msgs_out, router.stats.mesh_bytes_out = 4, 400
    snap = pub.snapshot(0.003)
    assert snap["v"] == SCHEMA_VERSION and snap["kind"] == "router"
    assert (snap["node"], snap["router"], snap["router_id"], snap["routers"]) == ("n", "w0", "n/w0", 2)
    assert snap["traffic"]["clients"] == {"msgs_in": 7 + 4, "msgs_out": 3 + 5, "bytes_in": 5010 + 1000,
                                          "bytes_out": 110 + 2000}
    assert snap["traffic"]["mesh"]["peers"] == {"n/w1": {"msgs_out": 4, "bytes_out": 400, "msgs_in": 1,
                                                         "bytes_in": 100}}
    assert snap["clients"]["connected"] == 2 and snap["clients"]["sockets"] == 2
    assert snap["clients"]["sessions"] == 2
    assert (snap["queued"], snap["inflight"]) == (3, 1)
    assert snap["drops"]["queue_full"] == 2 and set(snap["drops"]) == {
        "queue_full", "too_large", "slow_consumer", "mesh_backpressure", "mesh_peer_gone", "expired", "revoked"}
    assert [c["client_id"] for c in snap["top"]] == ["big", "small"]
    assert snap["top"][0]["queued"] == 3 and snap["top"][1]["inflight"] == 1
    assert snap["loop_lag"] == 0.003 and snap["process"]["rss_bytes"] > 0
    assert set(snap["rates"]) == {"1s", "1min", "5min", "15min"}
    conns_list = pub.connection_list()
    assert conns_list["total"] == 2 and [c["client_id"] for c in conns_list["connections"]] == ["big", "small"]


def test_top_keeps_the_ten_busiest():
    pub, router, conns = publisher()
    for i in range(25):
        add_client(router, conns, f"c{i}", bytes_in=i * 10)
    top = pub.snapshot()["top"]
    assert [c["client_id"] for c in top] == [f"c{i}" for i in range(24, 14, -1)]



def test_many_connections_are_ranked_a_slice_per_loop_iteration(monkeypatch):
    """A fleet's every device moves bytes each second: more than RANK_SLICE to rank are ranked a
    slice per loop iteration (one go held the loop ~5 ms at 5,000 connections), and until that
    ranking ends the snapshot shows the last one's; what moves meanwhile is ranked next."""
    monkeypatch.setattr(stats_module, "RANK_SLICE", 4)

    async def run() -> None:
        pub, router, conns = publisher(loop=asyncio.get_running_loop())

        async def ranked() -> None:
            for _ in range(20):
                await asyncio.sleep(0)
                if pub._ranking is None:
                    return
            raise AssertionError("the ranking never ended")

        def moves(cid: str, amount: int) -> None:
            conn = live[cid]
            conn.counters.bytes_in += amount
            if conn.counters.moved != conns.traffic.epoch:
                conns.traffic.mark_moved(conn)  # type: ignore[arg-type]

        live = {f"c{i}": add_client(router, conns, f"c{i}", bytes_in=i * 10) for i in range(25)}
        assert pub.snapshot()["top"] == []  # under way: no ranking has ended yet
        assert pub._ranking is not None
        await ranked()
        moves("c3", 10_000)
        top = pub.snapshot()["top"]  # the ended ranking's; c3 is ranked in the next one
        assert [c["client_id"] for c in top] == [f"c{i}" for i in range(24, 14, -1)]
        assert pub._ranking is not None
        moves("c5", 20_000)  # while that one is under way: ranked in the one after
        top = pub.snapshot()["top"]  # taken while it is under way: still the first ranking's
        assert [c["client_id"] for c in top] == [f"c{i}" for i in range(24, 14, -1)]
        assert list(pub._unranked.values()) == [live["c5"]]
        await ranked()
        top = pub.snapshot()["top"]
        assert [c["client_id"] for c in top] == ["c3", *(f"c{i}" for i in range(24, 15, -1))]
        await ranked()
        top = pub.snapshot()["top"]
        assert [c["client_id"] for c in top] == ["c5", "c3", *(f"c{i}" for i in range(24, 16, -1))]
        assert (top[0]["bytes_in"], top[1]["bytes_in"]) == (20_050, 10_030)

    asyncio.run(run())


def test_many_sessions_are_counted_a_slice_per_loop_iteration(monkeypatch):
    """The queued and in-flight count walks every session: more than RANK_SLICE of them are
    counted a slice per loop iteration, and the snapshot shows the last finished count."""
    monkeypatch.setattr(stats_module, "RANK_SLICE", 4)

    async def run() -> None:
        pub, router, conns = publisher(loop=asyncio.get_running_loop())
        for i in range(10):
            add_client(router, conns, f"c{i}")
            router.sessions[f"c{i}"]._queue().extend([(None, 1, False)] * i)  # type: ignore[list-item]
            router.sessions[f"c{i}"].own_inflight()[1] = None  # type: ignore[assignment]
        snap = pub.snapshot()
        assert (snap["queued"], snap["inflight"]) == (0, 0)  # under way: the last count (none yet)
        assert pub._counting is not None
        for _ in range(20):
            await asyncio.sleep(0)
            if pub._counting is None:
                break
        assert pub._counting is None, "the count never ended"
        snap = pub.snapshot()
        assert (snap["queued"], snap["inflight"]) == (45, 10)

    asyncio.run(run())

@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "bytes", "close", "snap"]), st.integers(0, 29),
                          st.integers(1, 5000)), max_size=80))
def test_top_ranked_among_the_moved_is_the_top_of_all(steps):
    """The snapshot ranks only the previous top and the connections that moved: as counters only
    grow, that must be the ranking of every connected client, whatever happened in between."""
    pub, router, conns = publisher()
    live: dict[str, FakeConn] = {}
    for op, n, amount in [*steps, ("snap", 0, 0)]:
        cid = f"c{n}"
        if op == "add" and cid not in live:
            live[cid] = add_client(router, conns, cid, bytes_in=amount)
        elif op == "bytes" and cid in live:
            conn = live[cid]
            conn.counters.bytes_out += amount
            conns.traffic.bytes_out += amount
            if conn.counters.moved != conns.traffic.epoch:
                conns.traffic.mark_moved(conn)  # type: ignore[arg-type]
        elif op == "close" and cid in live:
            conn = live.pop(cid)
            conn.closing = True
            conns.discard(conn)  # type: ignore[arg-type]
            del router.clients[cid]
        elif op == "snap":
            top = [c["bytes_in"] + c["bytes_out"] for c in pub.snapshot()["top"]]
            every = sorted((c.counters.bytes_in + c.counters.bytes_out for c in live.values()), reverse=True)
            assert top == every[:10]
            epoch = conns.traffic.epoch
            assert conns.traffic.moved_conns == [] and not any(c.counters.moved == epoch for c in live.values())


def test_closed_connections_do_not_pile_up_in_the_moved_list():
    """Under connection churn with a long stats interval the list of connections that moved would
    keep every closed one of the interval alive: it drops them whenever it doubles."""
    traffic = Traffic()
    live = []
    for i in range(20_000):
        conn = fake_conn()
        conn.closing = i % 100 != 0  # 1 in 100 stays open
        traffic.mark_moved(conn)  # type: ignore[arg-type]
        if not conn.closing:
            live.append(conn)
    assert len(traffic.moved_conns) < Traffic.PRUNE_MIN + 2 * len(live)
    assert all(c in traffic.moved_conns for c in live)  # the open ones are all still there
    assert traffic.take_moved() and not any(c.counters.moved == traffic.epoch for c in live)


def test_rates_over_windows():
    ring = RateRing(1.0, ("n",))
    for t in range(0, 121):
        ring.push(float(t), (t * 10,))
    rates = ring.rates()
    assert rates["1s"]["n"] == pytest.approx(10.0)
    assert rates["1min"]["n"] == pytest.approx(10.0)
    assert rates["15min"]["n"] == pytest.approx(10.0)  # over the 120 s there are
    ring.push(121.0, (1210 + 50,))
    assert ring.rates()["1s"]["n"] == pytest.approx(60.0)
    assert RateRing(0.5, ("n",)).rates()["1s"]["n"] == 0.0


def test_node_aggregate_sums_routers_and_carries_restarted_counters():
    snaps = []
    for i in range(2):
        pub, router, conns = publisher(index=i)
        add_client(router, conns, f"c{i}", bytes_in=100, msgs_in=10, msgs_out=20)
        snaps.append(pub.snapshot())
    node = NodeStats("n", 2, 1.0)
    for s in snaps:
        node.update(s, now=0.0)
    agg = node.aggregate(now=1.0)
    assert agg["kind"] == "node" and agg["routers_reporting"] == ["w0", "w1"]
    assert agg["traffic"]["clients"]["msgs_in"] == 20 and agg["clients"]["connected"] == 2
    # w1 restarts (new pid) with fresh counters: the node total keeps what the old w1 counted.
    restarted = dict(snaps[1], pid=snaps[1]["pid"] + 1,
                     traffic={**snaps[1]["traffic"], "clients": {"msgs_in": 1, "msgs_out": 0, "bytes_in": 5,
                                                                 "bytes_out": 0}})
    node.update(restarted, now=1.0)
    agg = node.aggregate(now=1.5)
    assert agg["traffic"]["clients"]["msgs_in"] == 10 + 10 + 1
    # A silent router's gauges leave the aggregate; its counters stay.
    agg = node.aggregate(now=1.0 + node.stale_after() + 0.5)
    assert agg["clients"]["connected"] == 0 and agg["traffic"]["clients"]["msgs_in"] == 21


def test_sum_trees():
    assert sum_trees([{"a": 1, "b": {"c": 2}}, {"a": 2, "b": {"c": 3, "d": 1.5}, "s": "x"}]) == {
        "a": 3, "b": {"c": 5, "d": 1.5}}


def test_metrics_text_parses_with_router_labels():
    node = NodeStats("n", 2, 1.0)
    for i in range(2):
        pub, router, conns = publisher(index=i)
        add_client(router, conns, f"c{i}", bytes_in=1000 * (i + 1), msgs_in=3 * (i + 1))
        router.attach_mesh(PeerStatsMesh({f"n/w{1 - i}": [5, 500, 0, 0]}))  # type: ignore[arg-type]
        router.stats.drop_slow_consumer = i
        node.update(pub.snapshot())
    families = {f.name: f for f in text_string_to_metric_families(metrics_text(node).decode())}
    received = {s.labels["router"]: s.value for s in families["brokerd_client_messages_received"].samples
                if s.name == "brokerd_client_messages_received_total"}
    assert received == {"w0": 3, "w1": 6}
    nbytes = {s.labels["router"]: s.value for s in families["brokerd_client_received_bytes"].samples
              if s.name.endswith("_total")}
    assert nbytes == {"w0": 1000, "w1": 2000}
    mesh = {(s.labels["router"], s.labels["peer"]): s.value for s in families["brokerd_mesh_messages_sent"].samples
            if s.name.endswith("_total")}
    assert mesh == {("w0", "n/w1"): 5, ("w1", "n/w0"): 5}
    drops = {(s.labels["router"], s.labels["reason"]): s.value for s in families["brokerd_dropped_messages"].samples
             if s.name.endswith("_total")}
    assert drops[("w1", "slow_consumer")] == 1 and drops[("w0", "slow_consumer")] == 0
    assert families["brokerd_client_received_bytes"].type == "counter"
    assert families["brokerd_process_resident_memory_bytes"].type == "gauge"
    assert {s.labels["router"] for s in families["brokerd_router_up"].samples} == {"w0", "w1"}


def test_sys_values_use_mosquitto_names():
    pub, router, conns = publisher()
    add_client(router, conns, "c", bytes_in=10, bytes_out=20, msgs_in=1, msgs_out=2)
    snap = pub.snapshot()
    per_router = dict(router_sys_values(snap))
    assert per_router["messages/received"] == "1" and per_router["bytes/sent"] == "20"
    assert "load/messages/received/15min" in per_router and "drops/queue_full" in per_router
    node = NodeStats("n", 1, 1.0)
    node.update(snap)
    broker = dict(broker_sys_values(node.aggregate()))
    for name in ("clients/connected", "messages/received", "messages/sent", "bytes/received", "bytes/sent",
                 "load/messages/received/1min", "load/messages/received/5min", "load/messages/received/15min",
                 "load/bytes/sent/1min", "subscriptions/count", "uptime", "version"):
        assert name in broker, name
    assert broker["messages/received"] == "1" and broker["clients/connected"] == "1"
    assert broker["uptime"].endswith(" seconds") and broker["version"].startswith("brokerd ")


def test_publish_sys_sends_router_topics_cluster_wide_and_node_topics_locally():
    pub, router, conns = publisher()
    sent: list = []
    local: list = []

    class Recording:
        """The router as ``SysTopics`` uses it, recording what it would publish (compiled, a
        Router's methods cannot be replaced on the instance)."""
        router_id = router.router_id
        peer_retained = router.peer_retained

        def publish(self, msg: Message, source: object = None) -> None:
            sent.append(msg)

        def deliver_remote(self, msg: Message) -> None:
            local.append(msg)

    pub.sys.router = Recording()  # type: ignore[assignment]
    snap = pub.snapshot()
    pub.sys.publish(snap, pub.node_latest)
    assert sent and all(m.topic.startswith("$SYS/brokerd/n/w0/") and m.retain for m in sent)
    assert not local  # no node aggregate yet
    n = len(sent)
    pub.node_latest = NodeStats("n", 1, 1.0).aggregate()
    pub.sys.publish(snap, pub.node_latest)
    assert len(sent) == n  # unchanged per-router values are not published again
    assert local and all(m.topic.startswith("$SYS/broker/") for m in local)
    assert router.retained.match("$SYS/broker/version")


def test_endpoints():
    ipc = Config(node_id="n", listen=("0.0.0.0", 1883))
    assert router_endpoint(ipc, 1).startswith("ipc://") and router_endpoint(ipc, 1).endswith("/w1.stats")
    # tcp stats sockets bind to --stats-host (loopback by default), whatever the MQTT listener's address
    tcp = Config(node_id="n", listen=("0.0.0.0", 1883), stats_port=9900)
    assert router_endpoint(tcp, 2) == "tcp://127.0.0.1:9902"
    assert router_endpoint(tcp, 0, bind=True) == "tcp://127.0.0.1:9900"
    assert router_endpoint(tcp, 0, host="10.1.2.3") == "tcp://10.1.2.3:9900"
    wide = Config(node_id="n", stats_port=9900, stats_host="0.0.0.0")
    assert router_endpoint(wide, 0, bind=True) == "tcp://0.0.0.0:9900"
    assert router_endpoint(wide, 0) == "tcp://127.0.0.1:9900"  # a reader on this host
    assert router_endpoint(Config(stats_host="::", stats_port=5), 0) == "tcp://[::1]:5"


def test_human_units():
    assert human_count(999) == "999" and human_count(1234) == "1.2k" and human_count(2_500_000) == "2.5M"
    assert human_count(2.25) == "2.2" and human_count(0.0) == "0"
    assert human_bytes(512) == "512B" and human_bytes(1536) == "1.5K" and human_bytes(3 << 30) == "3.0G"
    assert human_duration(59) == "59s" and human_duration(3725) == "1h02m" and human_duration(90000) == "1d01h"


def test_render_tables():
    snaps = []
    lists = []
    for i in range(2):
        pub, router, conns = publisher(index=i)
        add_client(router, conns, f"client-{i}", bytes_in=100 * (i + 1))
        snaps.append(pub.snapshot())
        lists.append(pub.connection_list())
    table = render_routers(snaps)
    lines = table.splitlines()
    assert any(line.startswith("ROUTER") for line in lines)
    assert any(line.startswith("w0 ") for line in lines) and any(line.startswith("w1 ") for line in lines)
    assert any(line.startswith("TOTAL") for line in lines)
    text = render_connections(lists)
    rows = [line for line in text.splitlines() if line.startswith("client-")]
    assert rows[0].split()[:2] == ["client-1", "w1"] and rows[1].split()[:2] == ["client-0", "w0"]
    assert not any(line.startswith("dropped most for:") for line in lines)  # nothing dropped: no line


def test_tables_name_the_sessions_that_dropped_most():
    """`brokerd stats`: a line under the routers names the sessions with the most drops across
    them (five at most); `--connections --sort dropped` puts the connected ones first."""
    snaps, lists = [], []
    for i in range(2):
        pub, router, conns = publisher(index=i)
        for j in range(4):
            conn = add_client(router, conns, f"c{i}{j}", bytes_in=100 - j)
            session = router.sessions[f"c{i}{j}"]
            session.conn, session.dropped = conn, 10 * i + j  # type: ignore[assignment]
        router.stats.drop_queue_full = 1
        snaps.append(pub.snapshot())
        lists.append(pub.connection_list())
    (line,) = [line for line in render_routers(snaps).splitlines() if line.startswith("dropped most for:")]
    assert line == ("dropped most for: c13 13 (w1, connected, queued 0), c12 12 (w1, connected, queued 0), "
                    "c11 11 (w1, connected, queued 0), c10 10 (w1, connected, queued 0), "
                    "c03 3 (w0, connected, queued 0)")
    rows = [line.split() for line in render_connections(lists, sort="dropped").splitlines() if line.startswith("c")]
    assert [r[0] for r in rows[:3]] == ["c13", "c12", "c11"] and rows[0][-1] == "13"


def test_replication_line_says_a_node_is_cut_off_and_counts_the_sessions_held():
    """`brokerd stats`: a router whose node sees no majority says so first; a replica shows how
    many of its router's sessions are held here (served from it if that router dies)."""
    from brokerd.cluster.stats_cli import replication_lines

    rep = {"factor": 2, "min_insync": 2, "required": 2, "end": 9, "high_water": 7, "held": 2,
           "refused_total": 0, "followers": {"b/w0": {"lag_records": 2, "in_sync": True}},
           "replicas": {"b/w0": {"end": 41, "acked": 41}}, "sessions": {"b/w0": 3},
           "majority": False, "members": 3}
    (line,) = replication_lines([{"router_id": "a/w0", "replication": rep}])
    assert line.startswith("replication a/w0: CUT OFF: no majority of the 3 member nodes")
    assert "replicas: b/w0 0..41 (3 session(s))" in line
    rep["lease"] = {"epoch": 4, "backing": 1}  # its lease ended: only its own node backs it
    (line,) = replication_lines([{"router_id": "a/w0", "replication": rep}])
    assert "CUT OFF: no majority of the 3 member nodes (1 answer its heartbeats)" in line, line
    rep["majority"] = True
    (line,) = replication_lines([{"router_id": "a/w0", "replication": rep}])
    assert "CUT OFF" not in line


def test_replication_line_says_what_history_is_being_fetched():
    """`brokerd stats`: a replica placed at the high-water mark, and a router back on an empty
    disk, say that the records below where their log starts are being fetched, and how far."""
    from brokerd.cluster.stats_cli import replication_lines

    rep = {"factor": 2, "min_insync": 2, "required": 2, "end": 120, "high_water": 120, "held": 0,
           "refused_total": 0, "followers": {}, "history": {"next": 40, "below": 100},
           "replicas": {"b/w0": {"start": 500, "end": 900, "acked": 900, "history": {"next": 0, "below": 500}},
                        "c/w0": {"start": 0, "end": 77, "acked": 77}}}
    (line,) = replication_lines([{"router_id": "a/w0", "replication": rep}])
    assert "fetching its records below 100 back (at 40)" in line
    assert "b/w0 500..900 (fetching below 500, at 0)" in line
    assert "c/w0 0..77" in line and "c/w0 0..77 (fetching" not in line


def test_replication_line_gives_a_lagging_followers_lag_in_bytes_too():
    """`brokerd stats`: a follower behind shows its lag in records and (estimated) bytes; one in
    step shows lag 0 alone."""
    from brokerd.cluster.stats_cli import replication_lines

    rep = {"factor": 2, "min_insync": 2, "required": 2, "end": 9, "high_water": 7, "held": 0,
           "refused_total": 0, "followers": {"b/w0": {"lag_records": 2, "lag_bytes": 3072, "in_sync": True}},
           "replicas": {}, "sessions": {}, "majority": True, "members": 3}
    (line,) = replication_lines([{"router_id": "a/w0", "replication": rep}])
    assert "b/w0 lag 2 ~3.0K (in sync)" in line, line
    rep["followers"]["b/w0"].update(lag_records=0, lag_bytes=0)
    (line,) = replication_lines([{"router_id": "a/w0", "replication": rep}])
    assert "b/w0 lag 0 (in sync)" in line, line


def test_queued_and_inflight_follow_every_change_though_not_recounted_at_rest():
    """The count of queued and in-flight messages walks every session (most of an idle worker's
    CPU at 6,000 sessions), so a snapshot counts again only when something that can change a
    queue moved: each step here shows in the very next snapshot (a client's PUBLISH to an
    offline session; copies taken over from another router, which neither log nor count as a
    PUBLISH), and at rest the figures stay."""
    from brokerd.connection.packets import Subscription
    from brokerd.router.message import Message

    pub, router, conns = publisher()
    session = router.new_session("offline", True)
    router.subscribe(session, Subscription("q/#", 1))
    assert (pub.snapshot()["queued"], pub.snapshot()["inflight"]) == (0, 0)
    conns.traffic.msgs_in += 1  # what the publisher's connection counts (client.py)
    router.publish(Message("q/a", b"1", 1, False, "p", "n/w0"))
    assert pub.snapshot()["queued"] == 1
    copy = Message("q/b", b"2", 1, False, "p", "n/w1")
    router.take_copies("offline", [[1, False, copy.to_list()]])
    assert pub.snapshot()["queued"] == 2
    assert [pub.snapshot()["queued"] for _ in range(3)] == [2, 2, 2]


def test_the_sessions_that_drop_most_are_named_and_walked_for_only_when_something_dropped(monkeypatch):
    """Drops are counted per router by reason; an operator needs the client too. Each session
    counts the messages dropped for it (every reason); the snapshot names the ten that dropped
    most, connected or offline, and how many sessions dropped at all. The sessions are walked for
    them only when a drop was counted (and, once some dropped, when sessions come or go): at
    rest, and while nothing drops, never."""
    from brokerd.connection.packets import Subscription

    pub, router, conns = publisher()
    router.config.session.max_queued = 2
    walks = []
    fold = stats_module.fold_in_slices

    def counted(loop, items, acc, step, done, size):  # type: ignore[no-untyped-def]
        if step == pub._most_dropped:
            walks.append(len(items))
        return fold(loop, items, acc, step, done, size)

    monkeypatch.setattr(stats_module, "fold_in_slices", counted)
    add_client(router, conns, "busy", bytes_in=100)
    quiet = router.new_session("quiet", True)
    router.subscribe(quiet, Subscription("q/#", 1))
    for i in range(12):
        s = router.new_session(f"slow{i}", True)
        router.subscribe(s, Subscription(f"s/{i}", 1))
    first = pub.snapshot()
    assert (first["droppers"], first["sessions_dropping"], walks) == ([], 0, [])
    for i in range(12):
        for _ in range(2 + i):  # slow<i> holds 2, drops i
            router.publish(Message(f"s/{i}", b"x", 1, False, "p", "n/w0"))
    router.publish(Message("q/a", b"1", 1, False, "p", "n/w0"))
    snap = pub.snapshot()
    assert snap["drops"]["queue_full"] == sum(range(12)) and len(walks) == 1
    assert [(d["client_id"], d["dropped"]) for d in snap["droppers"]] == [(f"slow{i}", i) for i in range(11, 1, -1)]
    assert snap["droppers"][0] == {"client_id": "slow11", "dropped": 11, "connected": False, "queued": 2}
    assert snap["sessions_dropping"] == 11  # slow0 dropped nothing
    assert [c["dropped"] for c in snap["top"]] == [0]  # the connection list's column too
    assert [pub.snapshot()["droppers"] == snap["droppers"] for _ in range(3)] == [True] * 3
    assert len(walks) == 1, "walked again with nothing dropped since"
    router.end_session(router.sessions["slow11"])
    after = pub.snapshot()
    assert after["droppers"][0]["client_id"] == "slow10" and after["sessions_dropping"] == 10 and len(walks) == 2
    pub.config.stats_clients = False  # no client ids in the stats: the count only
    assert (pub.snapshot()["droppers"], pub.snapshot()["sessions_dropping"]) == ([], 10)


def test_a_message_a_reload_made_unreadable_counts_as_a_drop_of_its_session():
    """A message queued for a session whose read grant a reload then took away is not delivered
    (router.session ``pump``): counted as ``revoked``, on the router and on the session."""
    from brokerd.connection.packets import Subscription
    from brokerd.router.access import install_auth
    from brokerd.router.auth import Acl, Auth

    pub, router, conns = publisher()
    install_auth(router, Auth(acl=Acl.parse("user alice\ntopic read a/#\n")))
    session = router.new_session("alice-dev", True)
    session.username = "alice"
    router.subscribe(session, Subscription("a/#", 1))
    router.publish(Message("a/x", b"1", 1, False, "p", "n/w0"))
    assert len(session.queue) == 1
    install_auth(router, Auth(acl=Acl.parse("user alice\ntopic read b/#\n")))
    conn = fake_conn()
    session.conn = conn  # type: ignore[assignment]
    session.pump()
    snap = pub.snapshot()
    assert snap["drops"]["revoked"] == 1 and session.dropped == 1 and not conn.chunks
    assert [(d["client_id"], d["dropped"]) for d in snap["droppers"]] == [("alice-dev", 1)]
