"""Replication across three nodes (127.0.0.1/.2/.3, one worker each, ``--replication-factor 2``):
acknowledged means on two nodes, and a dead publisher's node loses nothing it acknowledged."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import msgpack
import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

from brokerd.cluster.metrics import NodeStats, metrics_text
from brokerd.cluster.replication.rules import follower_nodes
from brokerd.cluster.stats_cli import replication_lines
from brokerd.router.mesh_format import (
    HELLO,
    INTEREST,
    INTEREST_ACK,
    REPLICA_ACK,
    REPLICATE,
    SESSION_GONE,
    SESSION_STATE,
    TAKEOVER_DONE,
    TAKEOVER_REQ,
    TAKEOVER_RESP,
)
from tests.cluster.fake_router import FakeRouter, mesh_endpoint
from tests.cluster.test_multihost import mesh_peers, mesh_port, stats_reader
from tests.helpers import (
    LEASES,
    Broker,
    Client,
    RawClient,
    connect_packet,
    free_port,
    freeze,
    in_parallel,
    mesh_key,
    read_packet,
    wait_for,
)

HOSTS = {"a": "127.0.0.1", "b": "127.0.0.2", "c": "127.0.0.3"}


def three_nodes(start_broker, *extra: str) -> dict:
    """Nodes a, b, c (one worker each, peering through a), started with ``extra``; returns
    {name: Broker} once every router has met the other two."""
    ports = {n: mesh_port(h) for n, h in HOSTS.items()}

    def start(name: str, host: str) -> Broker:
        args = ["--mesh", f"{host}:{ports[name]}", *LEASES, *mesh_key(), "--mesh-timeout", "1", "--fsync", "always",
                *extra]
        # b and c join through a; a names b.
        seed = "b" if name == "a" else "a"
        args += ["--peer", f"{HOSTS[seed]}:{ports[seed]}"]
        return start_broker(*args, host=host, node_id=name, workers=1)

    return _started_and_met(start)


def _started_and_met(start: Callable[[str, str], Broker]) -> dict:
    """Nodes a, b, c (one router each), each ``start(name, host)``, all at once; returns
    {name: Broker} once every router has met the other two: its node's log says each joined, as
    it happens (the routers' stats snapshots, which ``mesh_peers`` reads, say it within a second)."""
    nodes = dict(zip(HOSTS, in_parallel(*(functools.partial(start, n, h) for n, h in HOSTS.items())), strict=True))
    for name, node in nodes.items():
        for other in nodes.keys() - {name}:
            node.wait_log(f"mesh: node {other} joined", timeout=15.0)
    return nodes


def three_nodes_behind_proxies(start_broker, proxies: dict, *extra: str) -> dict:
    """``three_nodes``, each node's mesh behind its proxy in ``proxies`` (tests/cluster/partition.py:
    a test cuts and heals them); returns {name: Broker} once every router has met the other two."""
    ports = {n: mesh_port(h) for n, h in HOSTS.items()}
    from tests.cluster.partition import MeshProxy

    proxies.update({n: MeshProxy(HOSTS[n], ports[n]) for n in HOSTS})

    def start(name: str, host: str) -> Broker:
        seed = "b" if name == "a" else "a"
        return start_broker(
            "--mesh", f"{host}:{ports[name]}", *LEASES, *mesh_key(),
            "--mesh-advertise", f"{host}:{proxies[name].port}",
            "--peer", f"{HOSTS[seed]}:{proxies[seed].port}", "--mesh-timeout", "1", "--fsync", "always",
            "--replication-factor", "2", *extra, host=host, node_id=name, workers=1)

    return _started_and_met(start)


@contextlib.contextmanager
def proxied_nodes(start_broker, *extra: str) -> Iterator[tuple[dict, dict]]:
    """``three_nodes_behind_proxies``: yields (nodes, proxies); every proxy healed and closed after."""
    proxies: dict = {}
    try:
        yield three_nodes_behind_proxies(start_broker, proxies, *extra), proxies
    finally:
        for proxy in proxies.values():
            proxy.heal()
            proxy.close()


def cut_link(nodes: dict, proxies: dict, x: str, y: str) -> None:
    """Cut the mesh link between nodes ``x`` and ``y`` only (the third reaches both), and wait
    until each has taken the other's router for silent."""
    proxies[x].cut({HOSTS[y]})
    proxies[y].cut({HOSTS[x]})
    nodes[x].wait_log(f"router {y}/w0 silent", timeout=10)
    nodes[y].wait_log(f"router {x}/w0 silent", timeout=10)


def snapshot_of(node, until, timeout: float = 10.0) -> dict:
    """The node's (one) router's stats snapshot, once ``until(its replication part)`` holds."""
    reader, _ = stats_reader(node)
    found: dict = {}

    def check() -> bool:
        for topic, body in reader.receive(0.5):
            if topic == b"snap" and body.get("replication"):
                found.clear()
                found.update(body)
        return bool(found) and until(found["replication"])
    try:
        wait_for(check, timeout, f"replication stats of {node.name}")
    finally:
        reader.close()
    return found


def publish_and_die(nodes: dict, stopped: str, pub: Client, topic: str) -> tuple[int, bytes]:
    """With node ``stopped``'s worker SIGSTOPped, ``pub`` on node a publishes n QoS 1 messages
    (``<i>`` + payload) to ``topic``, each acknowledged, then node a is SIGKILLed (its supervisor
    and worker: the frames for the stopped node die with it); the worker runs again. Returns
    (n, payload)."""
    victim = nodes[stopped].workers()[0]
    n, payload = 120, bytes(64 << 10)
    freeze(victim)
    try:
        for i in range(n):  # ~8 MB for the stopped node: far more than the sockets to it hold
            pub.publish(topic, str(i).encode() + payload, qos=1)
        nodes["a"].kill()
    finally:
        os.kill(victim, signal.SIGCONT)
    return n, payload


def test_acknowledged_means_on_two_nodes_and_a_dead_publishers_node_loses_nothing(start_broker):
    """The publisher's node acknowledges once a follower node holds the record, then dies with
    messages it acknowledged still in its queues for a third node, whose router was stopped: that
    node's subscriber, connected throughout, gets every acknowledged message, read back from the
    follower's replica. (With one copy, those messages lived only in the dead node.)"""
    nodes = three_nodes(start_broker, "--replication-factor", "2")
    follower = follower_nodes("a/w0", "a", ["b", "c"], 1)[0]
    stopped = "c" if follower == "b" else "b"
    rep = snapshot_of(nodes["a"], lambda r: f"{follower}/w0" in r["followers"])["replication"]
    assert rep["factor"] == 2 and rep["min_insync"] == 2 and rep["required"] == 2
    u = uuid.uuid4().hex[:6]
    subs = {}
    for name in (follower, stopped):
        subs[name] = Client(nodes[name].port, f"s{name}{u}", host=HOSTS[name]).connect()
        subs[name].subscribe(f"rp{u}/#", 1)
    pub = Client(nodes["a"].port, f"p{u}", host=HOSTS["a"]).connect()
    pub.publish(f"rp{u}/x", b"first", qos=1)
    for s in subs.values():
        s.wait_messages(1)
    # Acknowledged only once on two nodes: the follower's replica holds what a acknowledged.
    # (Its lease is backed by all three nodes once they echo its heartbeats: a mesh timeout in.)
    snap = snapshot_of(nodes["a"], lambda r: r["high_water"] >= 0 and r["lease"]["backing"] == 3)
    assert snap["replication"]["followers"][f"{follower}/w0"]["in_sync"]
    # What an operator sees: `brokerd stats` and Prometheus.
    (line,) = replication_lines([snap])
    assert f"followers: {follower}/w0 lag 0 (in sync)" in line and "high-water" in line
    stats = NodeStats("a", 1, 1.0)
    stats.update(snap)
    families = {f.name: f for f in text_string_to_metric_families(metrics_text(stats).decode())}
    (sample,) = families["brokerd_replica_in_sync"].samples
    assert sample.labels["replica"] == f"{follower}/w0" and sample.value == 1
    (sample,) = families["brokerd_replica_lag_bytes"].samples  # in sync: nothing behind
    assert sample.labels["replica"] == f"{follower}/w0" and sample.value == 0
    assert families["brokerd_replication_high_water_offset"].samples[0].value >= 0
    assert families["brokerd_cluster_lease_backing"].samples[0].value == 3

    n, payload = publish_and_die(nodes, stopped, pub, f"rp{u}/x")
    for name, s in subs.items():
        wait_for(lambda s=s: {m.payload[:-len(payload)] for m in s.messages if m.payload != b"first"}
                 >= {str(i).encode() for i in range(n)}, 30,
                 f"every acknowledged message at the subscriber on node {name}")
    nodes[stopped].wait_log("reading its replica on")


def test_a_dead_publishers_node_loses_nothing_for_a_shared_group(start_broker):
    """As above, for a shared group whose one member is on the stopped node: the publisher's node
    dies with the group's messages it acknowledged still queued for that member's router. The
    routers' catch-ups read back by plain interest only; the holder of the replica now sends
    those messages to the groups (before, the group never got them)."""
    nodes = three_nodes(start_broker, "--replication-factor", "2")
    follower = follower_nodes("a/w0", "a", ["b", "c"], 1)[0]
    stopped = "c" if follower == "b" else "b"
    snapshot_of(nodes["a"], lambda r: f"{follower}/w0" in r["followers"])
    u = uuid.uuid4().hex[:6]
    member = Client(nodes[stopped].port, f"m{u}", host=HOSTS[stopped]).connect()
    member.subscribe(f"$share/g{u}/gr{u}/#", 1)
    pub = Client(nodes["a"].port, f"p{u}", host=HOSTS["a"]).connect()
    pub.publish(f"gr{u}/x", b"first", qos=1)
    member.wait_messages(1)  # a's route to the group is known

    n, payload = publish_and_die(nodes, stopped, pub, f"gr{u}/x")
    wait_for(lambda: {m.payload[:-len(payload)] for m in member.messages if m.payload != b"first"}
             >= {str(i).encode() for i in range(n)}, 30, "every acknowledged message at the group's member")
    nodes[follower].wait_log("read back from its replica for the shared groups")


def test_replication_needs_a_mesh_and_a_log(tmp_path):
    from brokerd.cluster.config import ConfigError, load

    with pytest.raises(ConfigError, match="needs --mesh"):
        load(["--replication-factor", "2"], environ={})
    with pytest.raises(ConfigError, match="needs --log on"):
        load(["--replication-factor", "2", "--mesh", "127.0.0.1:7000", *LEASES, "--log", "off"], environ={})
    with pytest.raises(ConfigError, match="more than --replication-factor"):
        load(["--min-insync", "3", "--replication-factor", "2", "--mesh", "127.0.0.1:7000", *LEASES], environ={})
    cfg = load(["--mesh", "127.0.0.1:7000", *LEASES, *mesh_key()], environ={})
    assert (cfg.replication_factor, cfg.min_insync) == (2, 2)
    assert (load([], environ={}).replication_factor, load([], environ={}).min_insync) == (1, 1)


def test_a_dead_follower_is_replaced_and_publishes_go_on_being_acknowledged(start_broker):
    """The follower's node dies: acknowledgements wait (at most about the mesh timeout) until the
    leader places its log on the third node, which fetches what it lacks and counts in sync."""
    import time

    nodes = three_nodes(start_broker, "--replication-factor", "2")
    follower = follower_nodes("a/w0", "a", ["b", "c"], 1)[0]
    other = "c" if follower == "b" else "b"
    snapshot_of(nodes["a"], lambda r: f"{follower}/w0" in r["followers"])
    u = uuid.uuid4().hex[:6]
    pub = Client(nodes["a"].port, f"p{u}", host=HOSTS["a"]).connect()
    for i in range(20):
        pub.publish(f"df{u}/x", str(i), qos=1)
    nodes[follower].kill()
    t0 = time.monotonic()
    pub.publish(f"df{u}/x", b"after", qos=1)  # waits for a new follower, bounded by the helper's wait
    waited = time.monotonic() - t0
    assert waited < 5, f"acknowledged after {waited:.1f} s"
    snap = snapshot_of(nodes["a"], lambda r: r["followers"].get(f"{other}/w0", {}).get("in_sync")
                       and r["high_water"] >= 20)
    assert list(snap["replication"]["followers"]) == [f"{other}/w0"]
    # The new follower holds the records from where it was placed on: it fetched what it lacked.
    rep = snapshot_of(nodes[other], lambda r: r["replicas"].get("a/w0", {}).get("end", -1) >= 20)
    assert rep["replication"]["replicas"]["a/w0"]["end"] >= 20


def test_a_router_that_wanted_nothing_reads_nothing_back_from_a_dead_nodes_replica(start_broker):
    """A node with no subscriber gets no PUBLISH frame from the publisher's node, whose HELLOs
    say instead how far it has sent everything the node wanted: when that node dies, the read-back
    from its replica starts there, not at the start of its log (which every router would read)."""
    import re

    nodes = three_nodes(start_broker, "--replication-factor", "2")
    u = uuid.uuid4().hex[:6]
    sub = Client(nodes["b"].port, f"sb{u}", host=HOSTS["b"]).connect()
    sub.subscribe(f"rn{u}/#", 1)
    pub = Client(nodes["a"].port, f"p{u}", host=HOSTS["a"]).connect()
    for i in range(30):
        pub.publish(f"rn{u}/x", str(i), qos=1)
    sub.wait_messages(30)
    snapshot_of(nodes["c"], lambda r: r["origin_marks"].get("a/w0", -1) >= 30)  # from a's HELLOs alone
    nodes["a"].kill()
    nodes["c"].wait_log("router a/w0 is silent;", timeout=15)
    text = nodes["c"].log_text()
    assert "reading its replica" not in text
    assert re.search(r"router a/w0 is silent; this router has what it wanted of its messages up to offset "
                     r"(3\d|[4-9]\d)", text), text


def test_a_node_back_on_an_empty_disk_continues_its_log_and_catches_up_as_a_follower(start_broker, tmp_path):
    """Node a is killed and its data directory deleted (a replaced disk). Back, it learns from
    the other nodes how far they hold its log and continues beyond (before, its offsets restarted
    at 0 and its follower took the new records for ones it held: acknowledged with one copy); its
    offline persistent session comes back from its follower, with all 20 messages that waited
    for it, beyond --max-queued 10 (read back from the replica and spooled; before, the follower
    sent at most --max-queued with the session); and where it follows another node's log it
    catches up to in sync."""
    import shutil

    nodes = three_nodes(start_broker, "--replication-factor", "2", "--max-queued", "10")
    u = uuid.uuid4().hex[:6]
    # A persistent session, offline, with messages waiting for it: its follower holds it.
    offline = Client(nodes["a"].port, f"k{u}", clean=False, host=HOSTS["a"]).connect()
    offline.subscribe(f"ed{u}/#", 1)
    snapshot_of(nodes[follower_nodes("a/w0", "a", ["b", "c"], 1)[0]], lambda r: r["sessions"].get("a/w0", 0) == 1)
    offline.disconnect()
    pub = Client(nodes["a"].port, f"p{u}", host=HOSTS["a"]).connect()
    for i in range(20):
        pub.publish(f"ed{u}/x", str(i), qos=1)
    snapshot_of(nodes["a"], lambda r: r["high_water"] >= 19)
    nodes["a"].kill()
    shutil.rmtree(tmp_path / "data" / "a")
    nodes["a"].start()
    nodes["a"].wait_log("it continues at 20")
    nodes["a"].wait_log("1 persistent session(s) of this router restored from its followers")
    back = Client(nodes["a"].port, f"k{u}", clean=False, host=HOSTS["a"]).connect()
    assert back.session_present, "the session of a node back on an empty disk was lost"
    wait_for(lambda: {m.payload for m in back.messages} >= {str(i).encode() for i in range(20)}, 15,
             "the messages that waited for the session, from the follower's replica")
    pub = Client(nodes["a"].port, f"p2{u}", host=HOSTS["a"]).connect()
    pub.publish(f"ed{u}/x", b"after", qos=1)
    snap = snapshot_of(nodes["a"], lambda r: r["end"] >= 20 and r["high_water"] >= 20)
    assert snap["replication"]["end"] == 20  # offset 20: beyond the 0..19 its replica holds
    # Its records 0..19 come back from its follower's replica and join its log below 20.
    snapshot_of(nodes["a"], lambda r: r["start"] == 0 and not r.get("history"), timeout=15)
    nodes["a"].wait_log("20 record(s) below offset 20 fetched and joined to the log")
    for name in ("b", "c"):
        assert "disk was lost" not in nodes[name].log_text()
    # The logs a follows: it is placed back, fetches from the high-water mark and is in sync.
    for leader in ("b", "c"):
        if follower_nodes(f"{leader}/w0", leader, ["a", "b", "c"], 1) != ["a"]:
            continue
        p = Client(nodes[leader].port, f"q{leader}{u}", host=HOSTS[leader]).connect()
        for i in range(5):
            p.publish(f"ed{u}/{leader}", str(i), qos=1)
        snapshot_of(nodes[leader], lambda r: r["followers"].get("a/w0", {}).get("in_sync")
                    and r["followers"]["a/w0"]["offset"] == r["end"] >= 4)


def test_a_history_fetch_broken_off_by_a_crash_goes_on_from_what_it_had(start_broker, tmp_path):
    """Node a, back on an empty disk, fetches its log's old records from c (its follower) in
    paced steps into its ``_history`` directory. Once part is there, c is SIGSTOPped (the fetch
    stalls) and a SIGKILLed. Restarted, a goes on from what it had fetched (it says so), not from
    the start, and every record joins its log, once and in order."""
    import json
    import re
    import shutil
    import subprocess

    from tests.helpers import BROKERD

    assert follower_nodes("a/w0", "a", ["b", "c"], 1) == ["c"]  # the test's layout rests on it
    nodes = three_nodes(start_broker, "--replication-factor", "2")
    u = uuid.uuid4().hex[:6]
    pub = Client(nodes["a"].port, f"p{u}", host=HOSTS["a"]).connect()
    n, pad = 5000, bytes(1024)  # 10 history answers of 500 records
    infos = [pub.c.publish(f"hi{u}/x", str(i).encode() + pad, qos=1) for i in range(n)]
    for info in infos:
        info.wait_for_publish(60)
    assert all(info.is_published() for info in infos)
    pub.drop()
    nodes["a"].kill()
    data = tmp_path / "data"
    shutil.rmtree(data / "a")
    history = data / "a" / "w0" / "_history"
    c_worker = nodes["c"].workers()[0]

    def partly_fetched() -> bool:
        try:
            return any(f.endswith(".log") and os.path.getsize(history / f) > 0 for f in os.listdir(history))
        except OSError:
            return False

    stopped = threading.Event()

    def stop_the_source() -> None:
        deadline = time.monotonic() + 60
        while not partly_fetched() and time.monotonic() < deadline:
            time.sleep(0.001)
        freeze(c_worker)
        stopped.set()

    watcher = threading.Thread(target=stop_the_source, daemon=True)
    watcher.start()
    try:
        nodes["a"].start()
        assert stopped.wait(60), "no history fetched"
        nodes["a"].kill()
    finally:
        watcher.join(60)
        os.kill(c_worker, signal.SIGCONT)
    nodes["a"].start()
    pattern = rf"fetching the records of a/w0 below offset {n} \(from 0\.\.(\d+) held\)"
    wait_for(lambda: re.search(pattern, nodes["a"].log_text(this_run=True)), 15, "the fetch going on")
    held = int(re.search(pattern, nodes["a"].log_text(this_run=True)).group(1))  # type: ignore[union-attr]
    assert 0 <= held < n - 1, held
    nodes["a"].wait_log(f"a/w0: {n} record(s) below offset {n} fetched and joined to the log", timeout=30)
    out = subprocess.run([BROKERD, "log", "tail", "--data-dir", str(data), "--router", "a/w0", "--from-beginning",
                          "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["offset"] for r in records[:n]] == list(range(n))
    assert all(r["topic"] == f"hi{u}/x" for r in records[:n])


def test_a_follower_placed_at_the_high_water_mark_fetches_what_lies_below(start_broker, tmp_path):
    """Node a's log is followed by c. Messages wait in a's log for an offline persistent session;
    c dies, and b, placed in its stead at the high-water mark, fetches the records below it too
    (before, they were then on a alone). c comes back on an empty disk and, placed again, does the
    same. Then a dies: the client reconnects to c, which serves the session from its replica with
    every message that waited, those from before c was placed included."""
    import shutil

    assert follower_nodes("a/w0", "a", ["b", "c"], 1) == ["c"]  # the test's layout rests on it
    nodes = three_nodes(start_broker, "--replication-factor", "2")
    u = uuid.uuid4().hex[:6]
    offline = Client(nodes["a"].port, f"h{u}", clean=False, host=HOSTS["a"]).connect()
    offline.subscribe(f"hs{u}/#", 1)
    snapshot_of(nodes["c"], lambda r: r["sessions"].get("a/w0", 0) == 1)
    offline.disconnect()
    pub = Client(nodes["a"].port, f"p{u}", host=HOSTS["a"]).connect()
    for i in range(30):
        pub.publish(f"hs{u}/x", str(i), qos=1)
    nodes["c"].kill()
    pub.publish(f"hs{u}/x", b"30", qos=1)  # acknowledged once b holds it: b is placed

    def whole(r: dict) -> bool:
        rep = r["replicas"].get("a/w0", {})
        return r["sessions"].get("a/w0", 0) == 1 and rep.get("end", -1) >= 30 and rep["start"] == 0 \
            and not rep.get("history")
    snapshot_of(nodes["b"], whole, timeout=20)
    nodes["b"].wait_log("a/w0: 30 record(s) below offset 30 fetched and joined to the log")
    shutil.rmtree(tmp_path / "data" / "c")
    nodes["c"].start()
    pub.publish(f"hs{u}/x", b"31", qos=1)
    snapshot_of(nodes["c"], whole, timeout=20)
    nodes["a"].kill()
    back = Client(nodes["c"].port, f"h{u}", clean=False, host=HOSTS["c"]).connect()
    assert back.session_present, "the session was lost with its node"
    want = {str(i).encode() for i in range(32)}
    try:
        wait_for(lambda: {m.payload for m in back.messages} >= want, 20, "every message that waited")
    except AssertionError:
        missing = sorted(int(p) for p in want - {m.payload for m in back.messages})
        raise AssertionError(f"{len(missing)} acknowledged message(s) missing: {missing}") from None


@pytest.mark.parametrize("publishers,reconnect", [("b", "c"), ("c", "b")])
def test_a_persistent_session_survives_its_nodes_death(start_broker, publishers, reconnect):
    """A persistent session lives on node a while QoS 1 publishers stream on another node; a is
    SIGKILLed mid-stream and the client reconnects to a third node: session present, and every
    message the publishers had acknowledged arrives (at least once). a's sessions and log are
    followed by c: reconnected to c, c serves the session from its own replica; reconnected to b,
    b asks c for it. What was on its way to a and not yet in its replica comes from the
    publishers' own logs (SESSION_CATCHUP)."""
    import threading
    import time

    assert follower_nodes("a/w0", "a", ["b", "c"], 1) == ["c"]  # the test's layout rests on it
    nodes = three_nodes(start_broker, "--replication-factor", "2")
    u = uuid.uuid4().hex[:6]
    topic = f"ps{u}/x"
    first = Client(nodes["a"].port, f"s{u}", clean=False, host=HOSTS["a"]).connect()
    first.subscribe(f"ps{u}/#", 1)
    # The session is on c before the stream starts (at once after a SUBSCRIBE).
    snapshot_of(nodes["c"], lambda r: r["sessions"].get("a/w0", 0) == 1)
    pub = Client(nodes[publishers].port, f"p{u}", host=HOSTS[publishers])
    pub.connect()
    n = 300
    infos: list = []
    stop = threading.Event()

    def stream() -> None:
        for i in range(n):
            if stop.is_set():
                return
            infos.append(pub.c.publish(topic, str(i).encode(), 1))
            if i % 20 == 19:
                infos[-1].wait_for_publish(20)  # a device's pace: a window of about 20
    streamer = threading.Thread(target=stream, daemon=True)
    streamer.start()
    first.wait_messages(100, timeout=30)
    nodes["a"].kill()
    first.drop()
    t0 = time.monotonic()
    second = Client(nodes[reconnect].port, f"s{u}", clean=False, host=HOSTS[reconnect])
    second.connect()
    took = time.monotonic() - t0
    assert second.session_present, "the session was not found after its node died"
    streamer.join(60)
    stop.set()
    for info in infos:
        info.wait_for_publish(20)
    acked = {str(i).encode() for i, info in enumerate(infos) if info.is_published()}
    assert len(acked) == n, f"only {len(acked)} of {n} publishes acknowledged"

    def received() -> set[bytes]:
        return {m.payload for m in first.messages} | {m.payload for m in second.messages}
    try:
        wait_for(lambda: received() >= acked, 30, "every acknowledged message")
    except AssertionError:
        missing = sorted(int(p) for p in acked - received())
        raise AssertionError(f"{len(missing)} acknowledged message(s) missing: {missing[:20]}...") from None
    nodes["c"].wait_log("handed over from its replica here")
    assert took < 15, f"reconnecting took {took:.1f} s"


def back_with_all(nodes: dict, node: str, client_id: str, n: int) -> Client:
    """The persistent session ``client_id`` reconnects to ``node`` after its own node died:
    session present, and each of the messages ``0`` .. ``n - 1`` that waited for it arrives."""
    second = Client(nodes[node].port, client_id, clean=False, host=HOSTS[node]).connect()
    assert second.session_present, "the session was not found after its node died"
    want = {str(i).encode() for i in range(n)}
    try:
        wait_for(lambda: {m.payload for m in second.messages} >= want, 30, "every message that waited")
    except AssertionError:
        missing = sorted(int(p) for p in want - {m.payload for m in second.messages})
        raise AssertionError(f"{len(missing)} acknowledged message(s) missing: {missing[:20]}") from None
    return second


@pytest.mark.parametrize("reconnect", ["c", "b"])
def test_a_dead_nodes_session_brings_its_whole_backlog_beyond_max_queued(start_broker, reconnect):
    """A persistent session of node a, offline with 800 messages waiting for it (published on b),
    --max-queued 20 everywhere; a is SIGKILLed and the client reconnects to c, which holds a's
    replica and serves the session itself, or to b, which takes it from c. Every one of the 800
    arrives. Before, the replica gave at most --max-queued copies, and the read-back that follows
    (from after the last of them, a batch of 256 records at a time until --max-queued are given)
    left the rest out."""
    assert follower_nodes("a/w0", "a", ["b", "c"], 1) == ["c"]  # the test's layout rests on it
    nodes = three_nodes(start_broker, "--replication-factor", "2", "--max-queued", "20")
    u = uuid.uuid4().hex[:6]
    first = Client(nodes["a"].port, f"s{u}", clean=False, host=HOSTS["a"]).connect()
    first.subscribe(f"bq{u}/#", 1)
    first.disconnect()
    snapshot_of(nodes["c"], lambda r: r["sessions"].get("a/w0", 0) == 1)
    pub = Client(nodes["b"].port, f"p{u}", host=HOSTS["b"]).connect()
    n = 800
    infos = [pub.c.publish(f"bq{u}/x", str(i), qos=1) for i in range(n)]
    for info in infos:
        info.wait_for_publish(20)
        assert info.is_published()
    # The copies a logged for the offline session are in its replica on c.
    snapshot_of(nodes["c"], lambda r: r["replicas"].get("a/w0", {}).get("end", -1) >= n - 1)
    nodes["a"].kill()
    back_with_all(nodes, reconnect, f"s{u}", n)
    nodes["c"].wait_log("handed over from its replica here")


def test_a_moved_sessions_spool_is_read_back_from_its_origin_when_its_new_node_dies(start_broker):
    """A persistent session of node a has 700 messages waiting (published on a, after 600 while
    it was connected); its client reconnects to node b, which spools the backlog, reads two of it
    and acknowledges nothing; b is SIGKILLed and the client reconnects to c. b's spool was on b
    only: its replicated state names where the copies lie in a's log, and c reads them back
    from there, all of them (it spools the answers). Every one of the 700 arrives. Before, c
    asked a only for what it published from ten seconds before b's silence (the 600 came
    first), and a read-back gave at most --max-queued (100; whole steps of 500 records)."""
    assert follower_nodes("b/w0", "b", ["a", "c"], 1) == ["a"]  # the test's layout rests on it
    nodes = three_nodes(start_broker, "--replication-factor", "2", "--max-queued", "100")
    u = uuid.uuid4().hex[:6]
    first = Client(nodes["a"].port, f"s{u}", clean=False, host=HOSTS["a"]).connect()
    first.subscribe(f"mv{u}/#", 1)
    pub = Client(nodes["a"].port, f"p{u}", host=HOSTS["a"]).connect()
    before, n = 600, 700
    # The 600 are in a's log before the backlog (what matters to the read-back); the session
    # need not receive them all: published this fast, some overflow its queue of 100 (dropped,
    # as --max-queued says), which a first version of this test waited for and so failed.
    pre = [pub.c.publish(f"mv{u}/x", f"before {i}", qos=1) for i in range(before)]
    for info in pre:
        info.wait_for_publish(20)
        assert info.is_published()
    first.disconnect()
    infos = [pub.c.publish(f"mv{u}/x", str(i), qos=1) for i in range(n)]
    for info in infos:
        info.wait_for_publish(20)
        assert info.is_published()
    raw = RawClient(nodes["b"].port, host=HOSTS["b"])  # reads, never acknowledges
    try:
        raw.send(connect_packet(f"s{u}", clean=False))
        assert read_packet(raw)[:4] == b"\x20\x02\x01\x00", "no session present on b"
        for _ in range(2):
            assert read_packet(raw)[0] >> 4 == 3  # PUBLISHes from the spool
        nodes["b"].wait_log("spooled to disk")
        # b's follower (a) holds the session as b's snapshot names it: with its copies' spans.
        snapshot_of(nodes["a"], lambda r: r["sessions"].get("b/w0", 0) == 1)
        nodes["b"].kill()
    finally:
        raw.close()
    back_with_all(nodes, "c", f"s{u}", n)
    nodes["c"].wait_log("and 1 for the copies it held")


def test_a_partitioned_minority_stops_acknowledging_and_nothing_acknowledged_is_lost(start_broker):
    """Node c is cut off from a and b (its mesh traffic dropped both ways, by proxies in front of
    every node's mesh). a and b, a majority, go on acknowledging; c sees no majority and stops:
    its QoS 1 publishes are not acknowledged (refused at --replica-timeout), the client of a
    persistent session there is asked to connect elsewhere and cannot connect there again. On the
    majority side that client gets its session (from c's replica) with session present. After the
    partition heals, c drops its stale copy of the session (one owner), and every message that was
    acknowledged anywhere has reached the subscribers on both sides and the moved session."""
    with proxied_nodes(start_broker, "--replica-timeout", "3") as (nodes, proxies):
        u = uuid.uuid4().hex[:6]
        subs = {}
        for name in ("a", "c"):
            subs[name] = Client(nodes[name].port, f"s{name}{u}", host=HOSTS[name]).connect()
            subs[name].subscribe(f"pt{u}/#", 1)
        moving = Client(nodes["c"].port, f"m{u}", clean=False, host=HOSTS["c"]).connect()
        moving.subscribe(f"pt{u}/#", 1)
        snapshot_of(nodes[follower_nodes("c/w0", "c", ["a", "b"], 1)[0]],
                    lambda r: r["sessions"].get("c/w0", 0) == 1)  # its session is on c's follower
        pubs = {n: Client(nodes[n].port, f"p{n}{u}", host=HOSTS[n]).connect() for n in ("a", "c")}
        acked: set[bytes] = set()
        for i in range(10):
            for n, p in pubs.items():
                p.publish(f"pt{u}/{n}", f"{n}-before-{i}".encode(), qos=1)
                acked.add(f"{n}-before-{i}".encode())

        proxies["c"].cut({HOSTS["a"], HOSTS["b"]})
        for n in ("a", "b"):
            proxies[n].cut({HOSTS["c"]})
        nodes["c"].wait_log("not a majority", timeout=15)
        assert moving.disconnected.wait(5), "the persistent session's client was not asked to go"
        moving.drop()  # (paho would keep trying c)
        # The minority: a QoS 1 publish is held, then refused; no persistent session comes in.
        info = pubs["c"].c.publish(f"pt{u}/c", b"c-during", 1)
        info.wait_for_publish(5)
        assert not info.is_published(), "the cut-off node acknowledged a QoS 1 publish"
        nodes["c"].wait_log("not on")  # "... refused: not on 2 node(s) within 3 s" (the connection closes)
        Client(nodes["c"].port, f"q{u}", clean=False, host=HOSTS["c"]).connect(expect_rc=0x88)
        # The majority goes on (a's follower moves from c to b).
        for i in range(10):
            pubs["a"].publish(f"pt{u}/a", f"a-during-{i}".encode(), qos=1)
            acked.add(f"a-during-{i}".encode())
        assert "not a majority" not in nodes["a"].log_text()
        moved = Client(nodes["a"].port, f"m{u}", clean=False, host=HOSTS["a"]).connect()
        assert moved.session_present, "the majority side did not serve the cut-off node's session"

        for proxy in proxies.values():
            proxy.heal()
        nodes["c"].wait_log("sees a majority of the cluster again", timeout=15)
        nodes["c"].wait_log(f"session m{u} was taken over on another node while this router was taken for "
                            "dead: its stale copy here is dropped")
        got = {name: (lambda s=s: {m.payload for m in s.messages}) for name, s in subs.items()}
        got["the moved session"] = lambda: {m.payload for m in moving.messages + moved.messages}
        for name, received in got.items():
            wait_for(lambda received=received: received() >= acked, 30, f"every acknowledged message at {name}")



def test_a_partition_that_cuts_only_some_links_gives_no_session_two_owners(start_broker):
    """a and c cannot reach each other; b reaches both. a and c each hear a majority (themselves
    and b), so counting alone would let c take a for gone and serve its sessions from the replica
    while a serves them too. It does not: b still hears a, so a is not gone for a majority of the
    nodes. The client of a persistent session on a that reconnects to c is refused (server
    unavailable), neither given a's replica nor a second, empty session; through b it gets its
    session from a itself (session present), with what was queued for it meanwhile."""
    with proxied_nodes(start_broker) as (nodes, proxies):
        u = uuid.uuid4().hex[:6]
        device = Client(nodes["a"].port, f"m{u}", clean=False, host=HOSTS["a"]).connect()
        device.subscribe(f"as{u}/#", 1)
        holder = follower_nodes("a/w0", "a", ["b", "c"], 1)[0]
        snapshot_of(nodes[holder], lambda r: r["sessions"].get("a/w0", 0) == 1)
        cut_link(nodes, proxies, "a", "c")
        device.drop()
        pub = Client(nodes["b"].port, f"p{u}", host=HOSTS["b"]).connect()
        pub.publish(f"as{u}/x", b"queued", qos=1)
        Client(nodes["c"].port, f"m{u}", clean=False, host=HOSTS["c"]).connect(expect_rc=0x88)
        nodes["c"].wait_log("heard by other nodes")
        assert "not a majority" not in nodes["c"].log_text()  # c hears a majority: the refusal is the vote's
        back = Client(nodes["b"].port, f"m{u}", clean=False, host=HOSTS["b"]).connect()
        assert back.session_present, "the session was not taken over from a, which still held it"
        back.wait_payload(b"queued")



def test_a_node_the_others_cannot_hear_serves_no_session_though_it_hears_them(start_broker):
    """Cut one way: a's frames reach neither b nor c, theirs reach a. a hears a majority, but b and
    c take it for gone and serve its persistent sessions from its replica; counting what it hears,
    a went on serving them too. Its lease (its heartbeats answered by a majority) ends before
    they can decide: a sends its persistent session's client away (DISCONNECT, use another
    server) and takes no persistent session in; on b the client gets its session, with what was
    published meanwhile. When the cut heals, a drops its stale copy and sees a majority again."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 300
    with proxied_nodes(start_broker) as (nodes, proxies):
        u = uuid.uuid4().hex[:6]
        device = Client(nodes["a"].port, f"m{u}", clean=False, host=HOSTS["a"], protocol=mqtt.MQTTv5,
                        properties=props).connect()
        device.subscribe(f"ow{u}/#", 1)
        holder = follower_nodes("a/w0", "a", ["b", "c"], 1)[0]
        snapshot_of(nodes[holder], lambda r: r["sessions"].get("a/w0", 0) == 1)
        snapshot_of(nodes["a"], lambda r: r["members"] == 3 and r["majority"])  # past its start
        for n in ("b", "c"):
            proxies[n].cut({HOSTS["a"]})  # what a sends them; what they send a still arrives
        assert device.disconnected.wait(5), "the node its peers cannot hear kept serving a persistent session"
        assert device.disconnect_reason == 0x9C, device.disconnect_reason  # use another server
        device.drop()
        nodes["a"].wait_log("only 1 answer its heartbeats: its lease ended")
        Client(nodes["a"].port, f"q{u}", clean=False, host=HOSTS["a"]).connect(expect_rc=0x88)
        for n in ("b", "c"):
            nodes[n].wait_log("router a/w0 silent", timeout=10)
        pub = Client(nodes["c"].port, f"p{u}", host=HOSTS["c"]).connect()
        pub.publish(f"ow{u}/x", b"while-cut", qos=1)
        moved = Client(nodes["b"].port, f"m{u}", clean=False, host=HOSTS["b"], protocol=mqtt.MQTTv5,
                       properties=props).connect()
        assert moved.session_present, "the majority side did not serve the session of the node it cannot hear"
        moved.wait_payload(b"while-cut")
        for proxy in proxies.values():
            proxy.heal()
        nodes["a"].wait_log("sees a majority of the cluster again", timeout=15)
        nodes["a"].wait_log(f"session m{u} was taken over on another node while this router was taken for "
                            "dead: its stale copy here is dropped")


def test_a_third_node_joining_a_node_whose_only_peer_died_does_not_cut_it_off(start_broker):
    """Two nodes, a and b (the majority rule is off with two members); b dies; c joins a. With
    c the rule comes on (a, b and c are members) while b is dead and c echoes nothing in its
    first mesh timeout: a waits for its first lease under the rule as at a start, counting the
    nodes it hears (itself and c), and does not take itself for cut off. Its persistent
    session's client stays connected, and its lease is then backed by a and c."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    ports = {n: mesh_port(h) for n, h in HOSTS.items()}

    def start(name: str, seed: str) -> Broker:
        return start_broker("--mesh", f"{HOSTS[name]}:{ports[name]}", *LEASES, *mesh_key(),
                            "--peer", f"{HOSTS[seed]}:{ports[seed]}",
                            "--mesh-timeout", "1", "--replication-factor", "2", host=HOSTS[name], node_id=name,
                            workers=1)

    a, b = in_parallel(functools.partial(start, "a", "b"), functools.partial(start, "b", "a"))
    snapshot_of(a, lambda r: r["members"] == 2 and r["lease"]["backing"] == 2)
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 300
    u = uuid.uuid4().hex[:6]
    device = Client(a.port, f"m{u}", clean=False, host=HOSTS["a"], protocol=mqtt.MQTTv5, properties=props).connect()
    b.kill()
    a.wait_log("router b/w0 silent", timeout=10)
    start("c", "a")
    snapshot_of(a, lambda r: r["members"] == 3 and r["lease"]["backing"] == 2 and r["majority"], timeout=15)
    assert "not a majority" not in a.log_text()
    assert not device.disconnected.is_set(), "a sent its persistent session's client away"


def test_a_session_moved_away_from_a_router_another_cannot_reach_gets_what_that_one_published(start_broker):
    """b cannot reach c (a reaches both). A persistent session on c, subscribed to what b's
    publisher sends, moves to a (its client reconnects there; a takes it from c, alive). What b
    published before it moved was routed to c and kept by b for c while c is silent to it; when
    the link heals it reaches c, after the session left, and c no longer has it: its hand-on ended
    when the routers it hears answered. The session's new router asks b (silent to c, as c said
    when it handed the session over) for what it published since: every acknowledged message
    arrives, at least once."""
    with proxied_nodes(start_broker) as (nodes, proxies):
        u = uuid.uuid4().hex[:6]
        device = Client(nodes["c"].port, f"d{u}", clean=False, host=HOSTS["c"]).connect()
        device.subscribe(f"mv{u}/#", 1)
        pub = Client(nodes["b"].port, f"p{u}", host=HOSTS["b"]).connect()
        pub.publish(f"mv{u}/x", b"before", qos=1)
        device.wait_payload(b"before")
        cut_link(nodes, proxies, "b", "c")
        sent = [f"cut-{i}".encode() for i in range(5)]
        for payload in sent:
            pub.publish(f"mv{u}/x", payload, qos=1)  # b hears a majority: acknowledged
        device.drop()
        moved = Client(nodes["a"].port, f"d{u}", clean=False, host=HOSTS["a"]).connect()
        assert moved.session_present
        for proxy in proxies.values():
            proxy.heal()
        nodes["c"].wait_log("router b/w0 is back", timeout=15)
        wait_for(lambda: {m.payload for m in moved.messages} >= set(sent), 15,
                 "what b published while c was silent to it, at the session's new router")



def test_a_node_whose_loop_stopped_beyond_the_mesh_timeout_serves_no_session_when_it_runs_again(start_broker):
    """Node c's worker is stopped (SIGSTOP) for longer than the mesh timeout while the client of a
    persistent session there keeps its connection open. The others take c for gone; the client,
    reconnected to a, gets its session from c's replica, and a message published meanwhile reaches
    it there. When c runs again it still holds the old connection and, for a moment, frames the
    others kept for it: it must not serve the session to that connection. Its heartbeat came a
    mesh timeout late, so at once, before it has heard anyone, it counts itself cut off from the
    majority and sends that client away (MQTT 5 DISCONNECT 0x9C, use another server), having
    delivered it nothing published after the takeover; a majority heard again, it acknowledges
    again. (c had logged nothing when it stopped: its follower serves the session from the state
    it holds, with no replica log to read.)"""
    import paho.mqtt.client as mqtt
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    nodes = three_nodes(start_broker, "--replication-factor", "2")
    u = uuid.uuid4().hex[:6]
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 300
    old = Client(nodes["c"].port, f"s{u}", clean=False, host=HOSTS["c"], protocol=mqtt.MQTTv5,
                 properties=props).connect()
    old.subscribe(f"st{u}/#", 1)
    holder = follower_nodes("c/w0", "c", ["a", "b"], 1)[0]
    snapshot_of(nodes[holder], lambda r: r["sessions"].get("c/w0", 0) == 1)
    snapshot_of(nodes["c"], lambda r: r["members"] == 3)  # c counts the others (past its start)
    pub = Client(nodes["b"].port, f"p{u}", host=HOSTS["b"]).connect()
    victim = nodes["c"].workers()[0]
    freeze(victim)
    try:
        for name in ("a", "b"):
            nodes[name].wait_log("router c/w0 silent", timeout=10)
        new = Client(nodes["a"].port, f"s{u}", clean=False, host=HOSTS["a"], protocol=mqtt.MQTTv5,
                     properties=props).connect()
        assert new.session_present, "the stopped node's session was not served from its replica"
        pub.publish(f"st{u}/x", b"after", qos=1)
        new.wait_payload(b"after")
    finally:
        os.kill(victim, signal.SIGCONT)
    nodes["c"].wait_log("loop was paused")
    assert old.disconnected.wait(10), "the old connection was kept"
    assert old.disconnect_reason == 0x9C, f"disconnected with reason {old.disconnect_reason:#x}"
    assert not [m for m in old.messages if m.payload == b"after"], "the old connection was served after the takeover"
    nodes["c"].wait_log("sees a majority of the cluster again", timeout=15)
    c_pub = Client(nodes["c"].port, f"q{u}", host=HOSTS["c"]).connect()
    c_pub.publish(f"st{u}/y", b"c-again", qos=1)  # acknowledged: a majority heard again
    new.wait_payload(b"c-again")


def device_with_a_will(start_broker, delay: int) -> tuple[dict, str, Client, Client]:
    """Three nodes (R = 2; c follows a's log), a watcher of the wills on b, and a device connected
    to a: MQTT 5, a persistent session (expiry 300 s) subscribed to ``cmd<u>``, a QoS 1 will on
    ``will<u>/gone`` with a Will Delay Interval of ``delay`` s. Returns (nodes, u, watcher, device)."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    assert follower_nodes("a/w0", "a", ["b", "c"], 1) == ["c"]  # the tests' layout rests on it
    nodes = three_nodes(start_broker, "--replication-factor", "2")
    u = uuid.uuid4().hex[:6]
    watcher = Client(nodes["b"].port, f"w{u}", host=HOSTS["b"]).connect()
    watcher.subscribe(f"will{u}/#", 1)
    connect_props = Properties(PacketTypes.CONNECT)
    connect_props.SessionExpiryInterval = 300
    device = Client(nodes["a"].port, f"d{u}", clean=False, host=HOSTS["a"], protocol=mqtt.MQTTv5,
                    properties=connect_props)
    will_props = Properties(PacketTypes.WILLMESSAGE)
    will_props.WillDelayInterval = delay
    device.c.will_set(f"will{u}/gone", b"gone", 1, False, will_props if delay else None)
    device.connect()
    device.subscribe(f"cmd{u}", 1)
    return nodes, u, watcher, device


def test_a_dead_nodes_delayed_will_goes_out_from_the_holder_of_its_sessions(start_broker):
    """An MQTT 5 persistent session on node a whose client went away with a will delayed by 3 s:
    node a is SIGKILLed before the will is due. c holds a's sessions (its log's follower): it
    publishes the will when due, once, to a watcher on b. When a returns with its disk (its
    snapshot still has the will waiting), it does not publish it again."""
    nodes, u, watcher, device = device_with_a_will(start_broker, 3)
    device.drop()  # an abnormal close: the will waits 3 s with the offline session
    snap = snapshot_of(nodes["c"], lambda r: r.get("wills", {}).get("a/w0") == 1)  # c holds it
    stats = NodeStats("c", 1, 1.0)
    stats.update(snap)
    families = {f.name: f for f in text_string_to_metric_families(metrics_text(stats).decode())}
    for family in ("brokerd_replica_sessions", "brokerd_replica_wills"):
        (sample,) = families[family].samples
        assert sample.labels["partition"] == "a/w0" and sample.value == 1, (family, sample)
    nodes["a"].kill()
    watcher.wait_payload(b"gone", timeout=15)
    nodes["c"].wait_log(f"the delayed will of session d{u} of silent router a/w0 published here")
    nodes["a"].start()
    # Told before its own timer (its grace: --mesh-timeout + 1 s) fired: had the timer fired
    # first, the session would have had no will left to cancel, and this line would not come.
    nodes["a"].wait_log(f"session d{u}: its delayed will was published on another node")
    wills = [m for m in watcher.messages if m.payload == b"gone"]
    assert len(wills) == 1, f"the will was published {len(wills)} times"


def test_a_dead_nodes_connected_client_has_its_will_published_by_the_holder_of_its_session(start_broker):
    """An MQTT 5 persistent session on node a with its client connected and a will (no delay):
    node a is SIGKILLed. Its connection is lost without a DISCONNECT, so the will is due: c, the
    holder of a's sessions, publishes it once the majority takes a for gone, to a watcher on b.
    a restarted with its disk (its snapshot has the connected client's will, due after a crash)
    does not publish it again; the client reconnects on b and finds its session."""
    nodes, u, watcher, device = device_with_a_will(start_broker, 0)
    snapshot_of(nodes["c"], lambda r: r.get("sessions", {}).get("a/w0") == 1)  # c holds it, will and all
    nodes["a"].kill()
    watcher.wait_payload(b"gone", timeout=15)
    nodes["c"].wait_log(f"the will of session d{u} of silent router a/w0 published here")
    nodes["a"].start()
    nodes["a"].wait_log(f"session d{u}: its delayed will was published on another node")
    device.drop()
    again = Client(nodes["b"].port, f"d{u}", clean=False, host=HOSTS["b"], protocol=device.protocol,
                   properties=device.connect_properties).connect()
    assert again.session_present, "the session was not found on b"
    pub = Client(nodes["b"].port, f"p{u}", host=HOSTS["b"]).connect()
    pub.publish(f"cmd{u}", b"cmd", qos=1)
    again.wait_payload(b"cmd")
    wills = [m for m in watcher.messages if m.payload == b"gone"]
    assert len(wills) == 1, f"the will was published {len(wills)} times"


def test_a_will_dropped_by_disconnect_is_not_published_when_the_node_dies_right_after(start_broker):
    """The device says DISCONNECT (its will is dropped: MQTT-3.1.2-10) and node a is SIGKILLed at
    once. Its follower c must not publish the will it held for the connected client: the
    DISCONNECT reaches the followers at once, not with the next snapshot within a second."""
    nodes, u, watcher, device = device_with_a_will(start_broker, 0)
    snapshot_of(nodes["c"], lambda r: r.get("sessions", {}).get("a/w0") == 1)
    device.disconnect()
    nodes["a"].wait_log(f"client d{u} (")  # its DISCONNECT is processed
    nodes["a"].kill()
    again = Client(nodes["b"].port, f"d{u}", clean=False, host=HOSTS["b"], protocol=device.protocol,
                   properties=device.connect_properties).connect()  # (waits until a counts as gone)
    assert again.session_present, "the session was not found on b"
    # The holder publishes a will that fell due before it hands the session over: none came.
    nodes["c"].wait_log(f"session d{u} of silent router a/w0 handed over from its replica here")
    assert f"of session d{u} of silent router a/w0 published here" not in nodes["c"].log_text()
    assert not [m for m in watcher.messages if m.payload == b"gone"], "a will dropped by DISCONNECT went out"


def test_a_session_that_moves_during_a_partition_gets_what_the_cut_off_side_published(start_broker):
    """Node a is cut off; its publisher's QoS 1 messages for a persistent session on b wait (kept
    for b's router, their acknowledgements held). Meanwhile the session moves from b to c. When
    the partition heals, a sends what it kept to b, by the interest it knew, but the session has
    left b: before, those acknowledged messages were lost. Now c, hearing a again, asks it for what
    it published for the sessions that moved to c while a was silent (SESSION_CATCHUP)."""
    with proxied_nodes(start_broker, "--replica-timeout", "30") as (nodes, proxies):
        u = uuid.uuid4().hex[:6]
        first = Client(nodes["b"].port, f"mv{u}", clean=False, host=HOSTS["b"]).connect()
        first.subscribe(f"mv{u}/#", 1)
        pub = Client(nodes["a"].port, f"p{u}", host=HOSTS["a"]).connect()
        pub.publish(f"mv{u}/x", b"before", qos=1)
        first.wait_payload(b"before")

        proxies["a"].cut({HOSTS["b"], HOSTS["c"]})
        for n in ("b", "c"):
            proxies[n].cut({HOSTS["a"]})
        nodes["a"].wait_log("not a majority", timeout=15)
        for n in ("b", "c"):
            nodes[n].wait_log("router a/w0 silent", timeout=15)
        infos = [pub.c.publish(f"mv{u}/x", f"during-{i}".encode(), 1) for i in range(5)]
        first.drop()
        second = Client(nodes["c"].port, f"mv{u}", clean=False, host=HOSTS["c"]).connect()
        assert second.session_present, "the session did not move from b to c"

        for proxy in proxies.values():
            proxy.heal()
        nodes["a"].wait_log("sees a majority of the cluster again", timeout=15)
        for info in infos:
            info.wait_for_publish(30)
        assert all(info.is_published() for info in infos), "the cut-off node's publishes were not acknowledged"
        want = {f"during-{i}".encode() for i in range(5)}
        wait_for(lambda: {m.payload for m in first.messages + second.messages} >= want, 30,
                 "every acknowledged message at the moved session")



def test_a_follower_restarted_while_the_sessions_router_is_dead_still_serves_them(start_broker):
    """Two failures in a row: node a (a persistent session with a queued message) is SIGKILLed,
    then c, the follower holding a's sessions, is SIGKILLed and restarted while a stays down.
    Before, c kept a's sessions in memory only: the client, reconnecting to b, got a new session.
    Now c keeps them beside a's replica and serves the takeover after its restart: session
    present, and the message."""
    assert follower_nodes("a/w0", "a", ["b", "c"], 1) == ["c"]  # the test's layout rests on it
    nodes = three_nodes(start_broker, "--replication-factor", "2")
    u = uuid.uuid4().hex[:6]
    first = Client(nodes["a"].port, f"s{u}", clean=False, host=HOSTS["a"]).connect()
    first.subscribe(f"tf{u}/#", 1)
    first.disconnect()
    pub = Client(nodes["b"].port, f"p{u}", host=HOSTS["b"]).connect()
    pub.publish(f"tf{u}/x", b"queued", qos=1)  # acknowledged: in a's log and its replica on c
    snapshot_of(nodes["c"], lambda r: r["sessions"].get("a/w0", 0) == 1)
    nodes["a"].kill()
    nodes["b"].wait_log("router a/w0 silent", timeout=15)
    nodes["c"].kill()
    nodes["c"].start()
    mesh_peers(nodes["c"], 15.0, lambda peers: any(len(p) >= 1 for p in peers.values()))
    # b, alone with a dead node and a restarting one, takes persistent sessions in again once c
    # backs its lease (a restarted router echoes a mesh timeout after it starts): until then it
    # refuses them (server unavailable) and the client tries again, as clients do.
    deadline = time.monotonic() + 15
    while True:
        second = Client(nodes["b"].port, f"s{u}", clean=False, host=HOSTS["b"])
        try:
            second.connect()
            break
        except AssertionError:
            second.drop()  # (paho would try again by itself)
            if second.connack != (0x88, False) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)  # the client's pause before it tries again
    assert second.session_present, "the session was lost with the follower's restart"
    second.wait_payload(b"queued", timeout=15)


def test_a_node_left_alone_by_graceful_stops_warns_rather_than_errs(start_broker):
    """The whole cluster being shut down: b and c stop gracefully (SIGTERM, each says GOODBYE), so
    a sees one of three members. The majority rule applies as ever, but the line is a WARNING
    that says the others stopped (it was an ERROR blaming a partition or dead nodes)."""
    nodes = three_nodes(start_broker, "--replication-factor", "2")
    for name in ("b", "c"):
        assert nodes[name].stop() == 0
    nodes["a"].wait_log("not a majority (the others stopped)", timeout=15)
    line = next(x for x in nodes["a"].log_text().splitlines() if "not a majority" in x)
    assert " WARNING " in line, line


def _replica_offer(cid: str, partition: str, topic: str, payload: bytes, epoch: int, arrived_ms: int) -> dict:
    """A session as the holder of silent router ``partition``'s replica hands it over: one
    subscription (``topic``'s parent, QoS 1) and one queued copy."""
    now = int(time.time() * 1000)
    msg = [topic, payload, 1, False, "p", partition, 7, None, now]
    return {"client_id": cid, "username": None, "persistent": True, "expiry": 0,
            "subs": [[topic.rsplit("/", 1)[0] + "/#", 1, False, False, 0, None]], "inflight": [],
            "queue": [[1, False, msg]], "log": [], "qos2_in": [], "next_pid": 1, "shared": [],
            "will": None, "replica": partition, "since_ms": now, "epoch": epoch, "arrived": arrived_ms,
            "stale_replicas": []}


def _two_fake_nodes(ctx: zmq.Context, broker, replicas: dict | None = None) -> list[FakeRouter]:
    """Routers f1/w0 and f2/w0 of nodes f1 and f2 (claiming ``replicas``), met by ``broker``."""
    fakes = [FakeRouter(ctx, mesh_endpoint(broker.port), name=f"f{i}/w0", node=f"f{i}") for i in (1, 2)]
    for fake in fakes:
        fake.replicas = dict(replicas or {})
        fake.read(lambda f=fake: bool(f.kinds(HELLO)), f"the broker's HELLO to {fake.name}")
    return fakes


@contextlib.contextmanager
def _fakes_answering(broker, cid: str, offers: dict) -> Iterator[list[FakeRouter]]:
    """``_two_fake_nodes``, answering in a thread for the block's length: each a takeover of
    ``cid`` with its offer ({name: (delay in seconds, session state)}; none: not held), every
    other takeover with None, and every interest announcement. Their frames stay readable after."""
    ctx = zmq.Context()
    stop = threading.Event()
    fakes = _two_fake_nodes(ctx, broker)

    def serve() -> None:
        due: dict[str, tuple[int, float]] = {}
        deadline = time.monotonic() + 30
        while not stop.is_set() and time.monotonic() < deadline:
            for fake in fakes:
                for kind, _, _, body in fake.step(20):
                    if kind == TAKEOVER_REQ and body[1] == cid and fake.name in offers:
                        due[fake.name] = (body[0], time.monotonic() + offers[fake.name][0])
                    elif kind == TAKEOVER_REQ:
                        fake.send(TAKEOVER_RESP, [body[0], None, False])  # not held here
                    elif kind == INTEREST and body[0] is not None:
                        fake.send(INTEREST_ACK, [body[0], 0])
                req, at = due.get(fake.name, (0, float("inf")))
                if at <= time.monotonic():
                    fake.send(TAKEOVER_RESP, [req, offers[fake.name][1], False])
                    due[fake.name] = (req, float("inf"))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield fakes
    finally:
        stop.set()
        thread.join(5)
        ctx.destroy(linger=0)


@pytest.mark.parametrize("holders", ["replicas", "live routers"])
def test_of_two_copies_of_a_session_the_most_recent_is_taken(start_broker, holders):
    """A session moved between two routers of one node shortly before the node died: the
    replicas of both routers held a copy, and a takeover on another node took whichever answered
    first. The chaos suite (seed 1643296784) lost 16 acknowledged messages that way: the stale
    copy, with an old position, was taken, the current one dropped. Now the takeover weighs
    every copy offered: the most recent (the highest ownership epoch: one more at every move,
    whatever the routers' clocks say) is taken, both holders drop theirs, and, for replicas, the
    silent router of the stale one is fenced (SESSION_GONE), so it drops its copy when it
    returns. The same holds for two live routers (a partition's two sides for a moment after it
    healed). Two fake routers of other nodes play the holders: the stale copy answers at once,
    the current one 0.3 s later. One worker: the router that takes over."""
    broker = start_broker("--mesh", f"127.0.0.1:{free_port()}", *LEASES, *mesh_key(), "--replication-factor", "2",
                          "--mesh-timeout", "3", workers=1)
    u = uuid.uuid4().hex[:6]
    cid = f"s{u}"
    now = int(time.time() * 1000)
    # The current copy is one move further (epoch 4), though its router's clock ran behind.
    offers = {"f1/w0": (0.0, _replica_offer(cid, "y/w0", f"old{u}/x", b"stale", 3, now - 1000)),
              "f2/w0": (0.3, _replica_offer(cid, "z/w0", f"new{u}/x", b"current", 4, now - 5000))}
    if holders == "live routers":
        for _, offer in offers.values():
            for key in ("replica", "since_ms", "stale_replicas"):
                del offer[key]
    with _fakes_answering(broker, cid, offers) as fakes:
        client = Client(broker.port, cid, clean=False).connect()
        assert client.session_present
        client.wait_payload(b"current")
        # Its subscription is the current copy's too: a message on it arrives.
        # (QoS 0: a QoS 1 one would wait for the fake follower's acknowledgement.)
        Client(broker.port, f"p{u}").connect().publish(f"new{u}/y", b"live", qos=0)
        client.wait_payload(b"live")
    assert not [m for m in client.messages if m.payload == b"stale"], "the stale copy was taken"
    for fake in fakes:
        assert [body[1] for body in fake.kinds(TAKEOVER_DONE)] == [True], f"{fake.name} was not told to drop its copy"
    if holders == "replicas":
        gone = [body[:2] for body in fakes[0].kinds(SESSION_GONE)]
        assert ["y/w0", [cid]] in gone, f"the stale copy's router is not fenced: {gone}"
        assert ["z/w0", [cid]] in gone, f"the taken copy's router is not fenced: {gone}"


def test_a_restarted_router_does_not_wipe_the_sessions_its_follower_holds(start_broker):
    """Node a's worker is SIGKILLed and restarted by its supervisor: it restores its persistent
    sessions from its disk and, as a new incarnation, sends its follower (c) the full set of its
    sessions. That set was what its last snapshot listed, and after a restart none had been
    listed yet: the set was empty and wiped c's copies, until some later change of a session
    listed them again (the chaos suite, seed 697068541: 177 acknowledged messages lost when the
    node died within that window). Now the sessions restored go to the followers at once, and no
    full set before them. Here no session changes after the restart; then node a dies, and the
    client, reconnecting to c, finds its session and the message queued for it."""
    assert follower_nodes("a/w0", "a", ["b", "c"], 1) == ["c"]  # the test's layout rests on it
    nodes = three_nodes(start_broker, "--replication-factor", "2")
    a, c = nodes["a"], nodes["c"]
    u = uuid.uuid4().hex[:6]
    first = Client(a.port, f"s{u}", clean=False, host=HOSTS["a"]).connect()
    first.subscribe(f"rw{u}/#", 1)
    first.disconnect()
    Client(nodes["b"].port, f"p{u}", host=HOSTS["b"]).connect().publish(f"rw{u}/x", b"queued", qos=1)
    snapshot_of(c, lambda r: r["sessions"].get("a/w0", 0) == 1)
    placed = "the log of a/w0 is followed by c/w0"
    before = a.log_text().count(placed)
    (worker,) = a.workers()
    os.kill(worker, signal.SIGKILL)
    a.wait_worker_replaced(worker)
    wait_for(lambda: a.log_text().count(placed) > before, 15, "the restarted router placing its follower")
    snapshot_of(c, lambda r: r["sessions"].get("a/w0", 0) == 1)  # a snapshot taken after the placement
    a.kill()
    second = Client(c.port, f"s{u}", clean=False, host=HOSTS["c"]).connect()
    assert second.session_present, "the session was lost with its node after the restart"
    second.wait_payload(b"queued")


def test_a_copy_here_older_than_the_one_a_takeover_brings_gives_way(start_broker):
    """The broker holds an offline persistent session (epoch 0); another router offers a copy one
    move further (epoch 4: the two sides of a partition that healed before the fence came). The
    client reconnects: the more recent copy is its session (its subscription and queued message),
    as among copies offered by several routers; before, the copy here was kept whatever its age,
    and the holder of the current one was told to drop it. One worker: the router that decides."""
    broker = start_broker("--mesh", f"127.0.0.1:{free_port()}", *LEASES, *mesh_key(), "--replication-factor", "2",
                          "--mesh-timeout", "3", workers=1)
    u = uuid.uuid4().hex[:6]
    cid = f"s{u}"
    here = Client(broker.port, cid, clean=False).connect()
    here.subscribe(f"old{u}/#", 0)
    here.disconnect()
    offer = _replica_offer(cid, "z/w0", f"new{u}/x", b"current", 4, int(time.time() * 1000) - 5000)
    for key in ("replica", "since_ms", "stale_replicas"):
        del offer[key]  # a live router's copy
    with _fakes_answering(broker, cid, {"f2/w0": (0.0, offer)}) as fakes:
        client = Client(broker.port, cid, clean=False).connect()
        assert client.session_present
        client.wait_payload(b"current")
        pub = Client(broker.port, f"p{u}").connect()
        pub.publish(f"old{u}/y", b"stale", qos=0)  # the older copy's subscription: gone with it
        pub.publish(f"new{u}/y", b"live", qos=0)
        client.wait_payload(b"live")
    assert not [m for m in client.messages if m.payload == b"stale"], "the older copy here was kept"
    assert [body[1] for body in fakes[1].kinds(TAKEOVER_DONE)] == [True]
    broker.wait_log(f"session {cid}: the copy here (epoch 0) is older than the one another router gave (epoch 4)")


def test_a_router_tells_a_former_follower_to_drop_the_sessions_it_holds(start_broker):
    """A follower holds its leader's persistent sessions, to serve them if the leader dies. When
    the leader restarts and picks another follower, the old one kept its copies: after the
    leader's death, a client could be handed that stale state (with its old position: the
    messages since were lost; the chaos suite, seed 1643296784). Now a router tells every router
    that holds a replica of its log without following it now to drop its sessions (a full, empty
    SESSION_STATE), once per incarnation. Two fake routers of other nodes both claim a replica of
    the broker's log; the one it follows gets the session, the other an empty set."""
    broker = start_broker("--mesh", f"127.0.0.1:{free_port()}", *LEASES, *mesh_key(), "--replication-factor", "2",
                          "--mesh-timeout", "3", workers=1)
    u = uuid.uuid4().hex[:6]
    client = Client(broker.port, f"s{u}", clean=False).connect()
    client.subscribe(f"ff{u}/#", 1)
    client.disconnect()
    ctx = zmq.Context()
    try:
        fakes = _two_fake_nodes(ctx, broker, {"t/w0": 0})
        follower = follower_nodes("t/w0", "t", ["f1", "f2"], 1)[0]
        chosen, other = sorted(fakes, key=lambda f: f.node != follower)

        def states(fake: FakeRouter) -> list:
            return [body for body in fake.kinds(SESSION_STATE) if body[0] == "t/w0"]

        def told() -> bool:
            for fake in fakes:
                fake.step(20)
            return any(f"s{u}" in body[2] for body in states(chosen)) and any(
                body[1] and not body[2] for body in states(other))
        wait_for(told, 15, "the session sent to the follower and an empty set to the other holder")
        assert not any(body[2] for body in states(other)), "the former follower was sent sessions"
    finally:
        ctx.destroy(linger=0)


def test_a_clean_start_fences_the_silent_router_whose_replica_gave_the_session(start_broker):
    """A client that connects with a clean start ends the session a replica's holder handed
    over; the silent router it came from must drop its own copy when it returns (SESSION_GONE),
    or the old session, subscriptions and backlog, comes back there. Before, only a resumed
    session fenced it. A fake router of another node holds the replica copy."""
    broker = start_broker("--mesh", f"127.0.0.1:{free_port()}", *LEASES, *mesh_key(), "--replication-factor", "2",
                          "--mesh-timeout", "3", workers=1)
    u = uuid.uuid4().hex[:6]
    cid = f"s{u}"
    offers = {"f1/w0": (0.0, _replica_offer(cid, "y/w0", f"old{u}/x", b"old", 2, int(time.time() * 1000)))}
    with _fakes_answering(broker, cid, offers) as fakes:
        client = Client(broker.port, cid, clean=True).connect()
        assert not client.session_present
        wait_for(lambda: any(body[:2] == ["y/w0", [cid]] for body in fakes[1].kinds(SESSION_GONE)), 10,
                 "the silent router fenced")


def test_the_holder_of_a_replica_keeps_a_session_until_its_new_owner_confirms(start_broker):
    """The broker follows fake router f1/w0's log and holds its persistent session; f1 falls
    silent. Fake f2/w0 takes the session over from the replica here: the broker keeps its copy
    until f2 confirms. While f2 has not answered, a second request gets nothing (the session is
    on its way); after a failed transfer (TAKEOVER_DONE false) the next request gets the session
    again, with the same messages; once confirmed (true), the copy here is dropped. (A holder
    that dropped its copy at the answer would lose the session with a transfer that breaks off.)
    One worker: the holder."""
    broker = start_broker("--mesh", f"127.0.0.1:{free_port()}", *LEASES, *mesh_key(), "--replication-factor", "2",
                          "--mesh-timeout", "2", workers=1)
    u = uuid.uuid4().hex[:6]
    cid = f"r{u}"
    now = int(time.time() * 1000)
    ctx = zmq.Context()
    try:
        leader, taker = _two_fake_nodes(ctx, broker)
        records = [[now, "f1/w0", None, "p", f"rk{u}/x", 1, False, b"", f"m{i}".encode()] for i in range(3)]
        leader.send(REPLICATE, ["f1/w0", 0, 2, msgpack.packb(records, use_bin_type=True), 2])
        state = {"expiry": 0, "subs": [[f"rk{u}/#", 1, False, False, 0, None]], "shared": [], "position": 0,
                 "ranges": [], "qos2_in": [], "pubrel": [], "username": None, "will": None, "epoch": 1,
                 "arrived": now}
        leader.send(SESSION_STATE, ["f1/w0", True, {cid: state}])
        leader.read(lambda: any(b == ["f1/w0", 2] for b in leader.kinds(REPLICA_ACK)), "the replica's acknowledgement")

        def held() -> int:
            return snapshot_of(broker, lambda r: True)["replication"]["sessions"].get("f1/w0", 0)

        def ask(req: int) -> list:
            taker.send(TAKEOVER_REQ, [req, cid])
            taker.read(lambda: any(b[0] == req for b in taker.kinds(TAKEOVER_RESP)), f"the answer to {req}")
            return next(b for b in taker.kinds(TAKEOVER_RESP) if b[0] == req)

        assert held() == 1
        # f1 falls silent (no more HELLOs); f2 goes on saying HELLO while it waits.
        taker.read(lambda: "f1/w0 silent" in broker.log_text(), "f1/w0 parked", timeout=20)
        first = ask(1)
        assert first[1] is not None and first[1]["client_id"] == cid, first
        assert sorted(item[2][1] for item in first[1]["queue"]) == [b"m0", b"m1", b"m2"]
        assert ask(2)[1] is None  # on its way to f2: not handed out twice
        assert held() == 1, "the copy was dropped before the new owner confirmed"
        taker.send(TAKEOVER_DONE, [1, False])
        again = ask(3)
        assert again[1] is not None and sorted(item[2][1] for item in again[1]["queue"]) == [b"m0", b"m1", b"m2"]
        assert held() == 1
        taker.send(TAKEOVER_DONE, [3, True])
        taker.read(lambda: held() == 0, "the copy dropped once the new owner confirmed", timeout=10)
    finally:
        ctx.destroy(linger=0)
