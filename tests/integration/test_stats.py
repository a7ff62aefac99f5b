"""Stats against real `brokerd --workers 2`: snapshots, `brokerd stats` (table, --json, --watch,
--connections, --node), Prometheus /metrics and $SYS agree with the traffic the test sent."""

from __future__ import annotations

import importlib.util
import json
import os
import pty
import re
import select
import signal
import socket
import subprocess
import time
import urllib.request
from typing import Any

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from brokerd.cluster.config import load
from brokerd.cluster.stats_cli import StatsReader
from tests.helpers import BROKERD, LEASES, WAIT, Broker, Client, free_port, mesh_key, wait_for

WORKERS = 2
INTERVAL = "0.2"
FAST = ("--stats-interval", INTERVAL, "--sys-interval", "0.5")
# What a message may cost on the wire beyond topic + payload (fixed header, lengths, packet id), and
# what a connection costs beyond its messages (CONNECT/CONNACK, SUBSCRIBE/SUBACK, PUBACKs, DISCONNECT).
MSG_OVERHEAD = 8
CONN_OVERHEAD = 128
needs_mesh = pytest.mark.skipif(not importlib.util.find_spec("brokerd.cluster.mesh"),
                                reason="the mesh (cluster/mesh.py) is not there yet")


def locator(broker: Broker, workers: int | None = WORKERS) -> list[str]:
    """The options that find the broker's stats sockets (the same as the broker's own)."""
    args = ["--node-id", "t", "--listen", f"{broker.host}:{broker.port}", "--stats-interval", INTERVAL]
    return [*args, "--workers", str(workers)] if workers else args


def stats_cli(*args: str, timeout: float = 30, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`brokerd stats ARGS`, its output a pipe: as wide as the table (COLUMNS only from ``env``)."""
    base = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "BROKERD_RUN_DIR")}
    return subprocess.run([BROKERD, "stats", *args], capture_output=True, text=True, timeout=timeout,
                          env={**base, **(env or {})})


class Snapshots:
    """A live view of every router's latest snapshot (and connection list), read like `brokerd stats`."""

    def __init__(self, broker: Broker, workers: int = WORKERS) -> None:
        self.reader = StatsReader(load(locator(broker, workers)), connections=True, workers=workers)
        self.snaps: dict[str, dict[str, Any]] = {}
        self.lists: dict[str, dict[str, Any]] = {}

    def close(self) -> None:
        self.reader.close()

    def _read(self, timeout: float) -> None:
        for topic, body in self.reader.receive(timeout):
            (self.snaps if topic == b"snap" else self.lists)[body["router"]] = body

    def until(self, predicate: Any, what: str, timeout: float = WAIT) -> dict[str, dict[str, Any]]:
        """Fresh snapshots until ``predicate(snaps)`` holds (bounded): counters settle at their value."""
        deadline = time.monotonic() + timeout
        while True:
            self._read(min(0.5, max(0.0, deadline - time.monotonic())))
            if len(self.snaps) == self.reader.routers and predicate(self.snaps):
                return self.snaps
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}; last: {self.summary()}")

    def summary(self) -> dict[str, Any]:
        return {r: s["traffic"] for r, s in sorted(self.snaps.items())}

    def router_of(self, client_ids: list[str]) -> dict[str, str]:
        """Which router holds each client (from the routers' connection lists)."""
        wanted = set(client_ids)

        def placed() -> bool:
            return wanted <= {c["client_id"] for cl in self.lists.values() for c in cl["connections"]}

        self.until(lambda _: len(self.lists) == self.reader.routers and placed(), "connection lists")
        return {c["client_id"]: cl["router"] for cl in self.lists.values() for c in cl["connections"]
                if c["client_id"] in wanted}


def total(snaps: dict[str, dict[str, Any]], part: str, key: str) -> int:
    return sum(s["traffic"][part][key] for s in snaps.values())


def spread(broker: Broker, view: Snapshots, prefix: str, n: int, routers: int = WORKERS,
           limit: int = 48) -> tuple[list[Client], dict[str, list[Client]]]:
    """Connect ``n`` clients, and more (at most ``limit``) until every router holds one; the kernel
    (SO_REUSEPORT) decides where each lands, the routers' connection lists say where it did."""
    ids: dict[str, Client] = {}

    def connect(count: int) -> None:
        for _ in range(count):
            client_id = f"{prefix}{len(ids)}"
            ids[client_id] = Client(broker.port, client_id).connect()

    connect(n)
    while True:
        where = view.router_of(list(ids))
        placed: dict[str, list[Client]] = {}
        for client_id, client in ids.items():
            placed.setdefault(where[client_id], []).append(client)
        if len(placed) == routers or len(ids) >= limit:
            assert len(placed) == routers, f"{len(ids)} clients all landed on {sorted(placed)}"
            return list(ids.values()), placed
        connect(4)


def scrape(port: int) -> dict[str, dict[tuple, float]]:
    """/metrics as {sample name: {labels (sorted items): value}}, parsed by prometheus_client."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=WAIT) as r:
        text = r.read().decode()
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def scrape_or_none(port: int) -> dict[str, dict[tuple, float]] | None:
    """/metrics, or None while nothing serves it (the stats process is restarting)."""
    try:
        return scrape(port)
    except OSError:
        return None


def by_router(samples: dict[tuple, float]) -> dict[str, float]:
    return {dict(labels)["router"]: v for labels, v in samples.items()}


def test_counters_match_in_snapshots_metrics_and_sys(start_broker):
    mport = free_port()
    broker = start_broker(*FAST, "--metrics-port", str(mport), workers=WORKERS)
    view = Snapshots(broker)
    try:
        subs, placed = spread(broker, view, "sub", 6)
        for s in subs:
            s.subscribe("count/t", 0)
        pub = Client(broker.port, "pub").connect()
        n, payload = 40, b"x" * 100
        for _ in range(n):
            pub.publish("count/t", payload, qos=1)
        for s in subs:
            s.wait_messages(n)
        clients = len(subs) + 1
        msgs_out = n * len(subs)
        per_msg = len(payload) + len("count/t")

        def mesh_total(snaps: dict, key: str) -> int:
            return sum(p[key] for s in snaps.values() for p in s["traffic"]["mesh"]["peers"].values())

        # (the mesh's counts too: a router's snapshot may fall between a publish, counted in, and
        # the end of its loop iteration, where the frame to the other router leaves and is counted)
        snaps = view.until(lambda s: total(s, "clients", "msgs_in") == n and total(s, "clients", "msgs_out") == msgs_out
                           and mesh_total(s, "msgs_out") >= n and mesh_total(s, "msgs_in") >= n,
                           f"msgs_in == {n} and msgs_out == {msgs_out}, {n} through the mesh")
        bytes_in, bytes_out = total(snaps, "clients", "bytes_in"), total(snaps, "clients", "bytes_out")
        assert n * per_msg <= bytes_in <= n * (per_msg + MSG_OVERHEAD) + clients * CONN_OVERHEAD
        assert msgs_out * per_msg <= bytes_out <= msgs_out * (per_msg + MSG_OVERHEAD) + clients * CONN_OVERHEAD
        assert sum(s["clients"]["connected"] for s in snaps.values()) == clients
        assert sum(s["subscriptions"] for s in snaps.values()) == len(subs)
        # Every router had subscribers: each one's deliveries match its own subscribers exactly.
        for router, members in placed.items():
            assert snaps[router]["traffic"]["clients"]["msgs_out"] == n * len(members), router
        # The publisher's router forwarded each message once to the other router (interest).
        origin = view.router_of(["pub"])["pub"]
        other = next(r for r in snaps if r != origin)
        peers = snaps[origin]["traffic"]["mesh"]["peers"]
        assert peers[f"t/{other}"]["msgs_out"] == n
        assert snaps[other]["traffic"]["mesh"]["peers"][f"t/{origin}"]["msgs_in"] == n
        # ... in frames of one or more messages, each frame counted once on either side.
        sent, got = snaps[origin]["traffic"]["mesh"], snaps[other]["traffic"]["mesh"]
        assert 1 <= sent["frames_out"] <= n and got["frames_in"] == sent["frames_out"]

        def metrics_settled() -> dict[str, dict[tuple, float]] | None:
            m = scrape(mport)
            got = by_router(m.get("brokerd_client_messages_received_total", {}))
            sent = by_router(m.get("brokerd_client_messages_sent_total", {}))
            return m if sum(got.values()) == n and sum(sent.values()) == msgs_out else None

        m = wait_for(metrics_settled, what="/metrics to count the messages")
        assert set(by_router(m["brokerd_client_messages_received_total"])) == {f"w{i}" for i in range(WORKERS)}
        assert n * per_msg <= sum(m["brokerd_client_received_bytes_total"].values()) <= \
            n * (per_msg + MSG_OVERHEAD) + clients * CONN_OVERHEAD
        assert sum(m["brokerd_client_sent_bytes_total"].values()) >= msgs_out * per_msg
        assert sum(m["brokerd_clients_connected"].values()) == clients
        mesh = {(dict(k)["router"], dict(k)["peer"]): v for k, v in m["brokerd_mesh_messages_sent_total"].items()}
        assert mesh[(origin, f"t/{other}")] == n

        # $SYS: the node-wide Mosquitto names and the per-router topics, retained.
        sys_reader = Client(broker.port, "sys-reader").connect()
        sys_reader.subscribe([("$SYS/broker/#", 0), ("$SYS/brokerd/t/+/messages/received", 0)])
        latest: dict[str, str] = {}

        def sys_values() -> dict[str, str]:
            with sys_reader.cond:
                for msg in sys_reader.messages:
                    latest[msg.topic] = msg.payload.decode()
                delivered = len(sys_reader.messages)
            latest["(delivered)"] = str(delivered)
            return latest

        def sys_counts(v: dict[str, str]) -> dict[str, bool]:
            """Each count $SYS must show. A round's topics come one after another, and a value
            read may be an earlier round's (one retained before sys-reader subscribed, where its
            own subscriptions are not counted yet): every one is awaited, not the first two."""
            def num(topic: str) -> int:
                return int(v.get(f"$SYS/broker/{topic}", -1))
            return {
                "messages/received": num("messages/received") == n,
                "clients/connected": num("clients/connected") == clients + 1,
                "per router": sum(int(x) for k, x in v.items() if k.startswith("$SYS/brokerd/t/")) == n,
                "publish/messages/received": num("publish/messages/received") == n,
                "bytes/received": num("bytes/received") >= n * per_msg,
                # messages/sent also counts the $SYS messages delivered to sys-reader itself, nothing else.
                "messages/sent": msgs_out <= num("messages/sent") <= msgs_out + int(v["(delivered)"]),
                "subscriptions/count": num("subscriptions/count") == len(subs) + 2,
            }

        try:
            wait_for(lambda: all(sys_counts(sys_values()).values()), what="$SYS values to count the messages")
        except AssertionError:
            v = sys_values()
            raise AssertionError(f"$SYS counts not shown: {[k for k, ok in sys_counts(v).items() if not ok]}; "
                                 f"{v}") from None
        v = sys_values()
        assert re.fullmatch(r"\d+ seconds", v["$SYS/broker/uptime"])
        assert v["$SYS/broker/version"].startswith("brokerd ")
        for window in ("1min", "5min", "15min"):
            assert float(v[f"$SYS/broker/load/messages/received/{window}"]) > 0
        assert {k.split("/")[3] for k in v if k.startswith("$SYS/brokerd/t/")} == {f"w{i}" for i in range(WORKERS)}
    finally:
        view.close()


@needs_mesh
def test_mesh_counters_only_between_routers_with_interest(start_broker):
    workers = 3
    mport = free_port()
    broker = start_broker("--stats-interval", INTERVAL, "--sys-interval", "0", "--metrics-port", str(mport),
                          workers=workers)
    view = Snapshots(broker, workers)
    try:
        _, placed = spread(broker, view, "m", 24, routers=workers)
        (r0, (pub, *_)), (r1, (sub, *_)), (r2, (quiet, *_)) = sorted(placed.items())
        sub.subscribe("interest/t", 1)
        n, m = 25, 10
        for i in range(n):
            pub.publish("interest/t", f"{i}".encode() * 10, qos=1)
        for _ in range(m):
            quiet.publish("nobody/t", b"y" * 50, qos=1)  # nobody anywhere subscribes: no mesh traffic
        sub.wait_messages(n)

        def peer(snaps: dict, a: str, b: str, key: str) -> int:
            return snaps[a]["traffic"]["mesh"]["peers"].get(f"t/{b}", {}).get(key, 0)

        snaps = view.until(lambda s: total(s, "clients", "msgs_in") == n + m and peer(s, r1, r0, "msgs_in") == n,
                           "the publishes to be counted")
        assert peer(snaps, r0, r1, "msgs_out") == n and peer(snaps, r0, r1, "bytes_out") > n * len("interest/t")
        assert peer(snaps, r1, r0, "msgs_in") == n and peer(snaps, r1, r0, "bytes_in") > 0
        for a in (r0, r1, r2):
            for b in (r0, r1, r2):
                if (a, b) != (r0, r1):
                    assert peer(snaps, a, b, "msgs_out") == 0 and peer(snaps, a, b, "bytes_out") == 0, (a, b)
                if (a, b) != (r1, r0):
                    assert peer(snaps, a, b, "msgs_in") == 0, (a, b)

        def mesh_metrics() -> dict | None:
            sent = scrape(mport).get("brokerd_mesh_messages_sent_total", {})
            pairs = {(dict(k)["router"], dict(k)["peer"]): v for k, v in sent.items()}
            return pairs if pairs.get((r0, f"t/{r1}")) == n else None

        pairs = wait_for(mesh_metrics, what="/metrics mesh counters")
        assert all(v == 0 for k, v in pairs.items() if k != (r0, f"t/{r1}")), pairs
    finally:
        view.close()


def test_stats_json_returns_one_object_per_router(start_broker):
    broker = start_broker(*FAST, workers=WORKERS)
    routers = {f"w{i}" for i in range(WORKERS)}
    for args in (locator(broker), locator(broker, workers=None)):  # told the router count, or finding it
        r = stats_cli("--json", *args)
        assert r.returncode == 0, r.stderr
        objects = [json.loads(line) for line in r.stdout.splitlines()]
        assert len(objects) == WORKERS and {o["router"] for o in objects} == routers
        for o in objects:
            assert o["v"] == 1 and o["kind"] == "router" and o["node"] == "t" and o["routers"] == WORKERS
            for key in ("uptime", "clients", "subscriptions", "traffic", "rates", "inflight", "queued", "drops",
                        "process", "loop_lag", "top"):
                assert key in o, key
            assert set(o["rates"]) == {"1s", "1min", "5min", "15min"}
            assert o["process"]["rss_bytes"] > 0


def test_stats_table_shows_every_router_and_a_total(start_broker):
    broker = start_broker(*FAST, workers=WORKERS)
    r = stats_cli(*locator(broker))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any(line.startswith("ROUTER") and "CLIENTS" in line and "CPU%" in line for line in lines)
    for i in range(WORKERS):
        assert any(line.startswith(f"w{i} ") for line in lines), r.stdout
    assert any(line.startswith("TOTAL") for line in lines)


def test_stats_for_a_node_that_is_not_there_fails_clearly():
    r = stats_cli("--node-id", "t", "--listen", f"127.0.0.1:{free_port()}", "--stats-interval", "0.1")
    assert r.returncode == 1 and "no snapshot" in r.stderr and "w0" in r.stderr
    r = stats_cli("--node", "nonsense")
    assert r.returncode == 2 and "--node" in r.stderr


def test_stats_watch_redraws_every_router_in_a_terminal(start_broker):
    broker = start_broker(*FAST, workers=WORKERS)
    master, slave = pty.openpty()
    # Ctrl-C's default action, as in a terminal: a suite started in the background (`cmd &` in a
    # script) ignores SIGINT, and a child inherits that, so it would never see the signal below.
    proc = subprocess.Popen([BROKERD, "stats", "--watch", *locator(broker)], stdin=slave, stdout=slave,
                            stderr=slave, close_fds=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    os.close(slave)
    out = b""
    try:
        deadline = time.monotonic() + WAIT

        def screens() -> list[bytes]:
            # Drawn in place on the alternate screen: each frame starts at home, nothing is cleared.
            assert b"\x1b[2J" not in out
            return out.split(b"\x1b[H")[1:]

        def complete(screen: bytes) -> bool:
            return all(re.search(rb"^w%d " % i, screen, re.M) for i in range(WORKERS)) and b"TOTAL" in screen

        while sum(1 for s in screens() if complete(s)) < 2:  # drawn, then redrawn
            assert time.monotonic() < deadline, f"--watch did not draw every router twice: {out[-2000:]!r}"
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                out += os.read(master, 65536)
        proc.send_signal(signal.SIGINT)
        # Read on, as a terminal does: with the pty full, the exit's last flush of stdout would block.
        deadline = time.monotonic() + WAIT
        while proc.poll() is None:
            assert time.monotonic() < deadline, "--watch did not exit on SIGINT"
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    os.read(master, 65536)
                except OSError:  # EIO: the last writer of the pty is gone
                    break
        assert proc.wait(WAIT) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(WAIT)
        os.close(master)


def test_stats_watch_into_a_pipe_prints_a_plain_table_each_interval(start_broker):
    """No terminal to redraw on (a pipe, a log file): one plain table after another, not nothing."""
    broker = start_broker(*FAST, workers=WORKERS)
    proc = subprocess.Popen([BROKERD, "stats", "--watch", *locator(broker)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env={k: v for k, v in os.environ.items() if k != "COLUMNS"})
    out = b""
    try:
        deadline = time.monotonic() + WAIT
        while out.count(b"\nTOTAL") < 2:
            assert time.monotonic() < deadline, f"--watch into a pipe printed no two tables: {out[-2000:]!r}"
            ready, _, _ = select.select([proc.stdout], [], [], 0.5)
            if ready:
                chunk = os.read(proc.stdout.fileno(), 65536)
                assert chunk, f"--watch ended: {out[-2000:]!r}"
                out += chunk
    finally:
        proc.kill()
        proc.wait(WAIT)
        proc.stdout.close()
    assert b"\x1b" not in out, out[:200]  # plain text: no cursor moves, no alternate screen
    assert [row[0] for row in _rows(out.decode(), "ROUTER")] == ["w0", "w1", "TOTAL"], out


def test_connections_view_lists_clients_with_router_sorted_by_bytes(start_broker):
    broker = start_broker(*FAST, workers=WORKERS)
    clients = [Client(broker.port, f"conn-{i}").connect() for i in range(8)]
    clients[3].publish("big/t", b"z" * 20_000, qos=1)  # the most bytes in, by far
    r = stats_cli("--connections", *locator(broker))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("CLIENT"))
    assert all(h in lines[header] for h in ("ROUTER", "BYTES IN", "BYTES OUT", "QUEUED", "INFLIGHT"))
    rows = [line.split() for line in lines[header + 1:] if line.startswith("conn-")]
    assert {row[0] for row in rows} == {f"conn-{i}" for i in range(8)}
    assert rows[0][0] == "conn-3"
    assert all(row[1] in {f"w{i}" for i in range(WORKERS)} for row in rows)
    r = stats_cli("--connections", "--json", *locator(broker))
    assert r.returncode == 0, r.stderr
    lists = [json.loads(line) for line in r.stdout.splitlines()]
    assert {cl["router"] for cl in lists} == {f"w{i}" for i in range(WORKERS)}
    where = {c["client_id"]: cl["router"] for cl in lists for c in cl["connections"]}
    assert {row[0]: row[1] for row in rows} == where
    big = next(c for cl in lists for c in cl["connections"] if c["client_id"] == "conn-3")
    assert big["bytes_in"] >= 20_000 and big["msgs_in"] == 1


def _two_free_ports() -> int:
    """A port P with P+1 free too (router i's stats on P+i)."""
    for _ in range(50):
        p = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
        return p
    raise AssertionError("no two consecutive free ports")


def test_stats_of_a_node_over_tcp(start_broker):
    port = _two_free_ports()
    start_broker(*FAST, "--stats-port", str(port), workers=WORKERS)
    r = stats_cli("--json", "--node", f"127.0.0.1:{port}")
    assert r.returncode == 0, r.stderr
    assert sorted(json.loads(line)["router"] for line in r.stdout.splitlines()) == [f"w{i}" for i in range(WORKERS)]


def _stats_process(broker: Broker) -> psutil.Process | None:
    for child in psutil.Process(broker.pid).children():
        try:
            if child.name() == "brokerd-stats":
                return child
        except psutil.NoSuchProcess:
            continue
    return None


def test_stats_process_restarts_and_stops_with_the_broker(start_broker):
    mport = free_port()
    broker = start_broker(*FAST, "--metrics-port", str(mport), workers=WORKERS)
    aux = wait_for(lambda: _stats_process(broker), what="the brokerd-stats process")
    assert "brokerd_info" in scrape(mport)  # served once brokerd is ready; routers with their snapshots
    wait_for(lambda: len(scrape(mport).get("brokerd_router_up", {})) == WORKERS, what="routers on /metrics")
    aux.kill()
    wait_for(lambda: (p := _stats_process(broker)) is not None and p.pid != aux.pid, what="a new brokerd-stats")
    new = _stats_process(broker)
    assert new is not None
    wait_for(lambda: len((scrape_or_none(mport) or {}).get("brokerd_router_up", {})) == WORKERS,
             what="/metrics again")
    assert broker.stop() == 0

    def gone() -> bool:
        try:
            return new.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_for(gone, what="brokerd-stats to exit")


def test_metrics_port_in_use_stops_startup_naming_the_option(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        r = subprocess.run([BROKERD, "--workers", "1", "--listen", f"127.0.0.1:{free_port()}", "--node-id", "t",
                            "--data-dir", str(tmp_path), "--metrics-port", str(busy)],
                           capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "--metrics-port" in r.stderr


def test_sys_counts_the_whole_node_without_a_stats_process(start_broker):
    """Without --metrics-port no stats process runs (the node is the supervisor and its workers):
    router 0 builds the node aggregate for $SYS from every router's snapshot, so $SYS/broker/...
    counts the clients and messages of both workers."""
    broker = start_broker(*FAST, workers=WORKERS)
    assert _stats_process(broker) is None
    assert len(psutil.Process(broker.pid).children()) == WORKERS
    view = Snapshots(broker)
    try:
        subs, placed = spread(broker, view, "nsub", 4)
        for s in subs:
            s.subscribe("nodewide/t", 0)
        pub = Client(broker.port, "nodepub").connect()
        n = 30
        for _ in range(n):
            pub.publish("nodewide/t", b"z", qos=1)
        for s in subs:
            s.wait_messages(n)
        sys_reader = Client(broker.port, "nodesys").connect()
        sys_reader.subscribe("$SYS/broker/#", 0)

        def value(topic: str) -> str | None:
            with sys_reader.cond:
                found = [m.payload.decode() for m in sys_reader.messages if m.topic == topic]
            return found[-1] if found else None

        wait_for(lambda: value("$SYS/broker/messages/received") == str(n)
                 and value("$SYS/broker/clients/connected") == str(len(subs) + 2),
                 what="$SYS to count both workers' clients and messages")
        assert len(placed) == WORKERS  # (spread put subscribers on every router)
    finally:
        view.close()


def test_no_stats_process_without_metrics_or_sys(start_broker):
    broker = start_broker("--sys-interval", "0", workers=WORKERS)
    assert _stats_process(broker) is None
    r = stats_cli("--json", *locator(broker))  # brokerd stats reads the routers themselves
    assert r.returncode == 0 and len(r.stdout.splitlines()) == WORKERS, r.stderr


def test_log_counters_count_appends_and_catch_up_reads(start_broker):
    """traffic.log: records appended since start, and records read back (a session catching up)."""
    # One worker: a message that crosses to another router is logged there too (with its origin),
    # so with two the node's record counts would depend on where the kernel put the clients.
    broker = start_broker(*FAST, workers=1)
    view = Snapshots(broker, workers=1)
    try:
        view.until(lambda s: total(s, "log", "records") == 0, "a first snapshot")
        sub = Client(broker.port, "logreader", clean=False).connect()
        sub.subscribe("lc/#", 1)
        sub.disconnect()
        pub = Client(broker.port, "logwriter").connect()
        n, payload = 50, b"y" * 64
        for _ in range(n):
            pub.publish("lc/t", payload, qos=1)
        snaps = view.until(lambda s: total(s, "log", "records") == n, f"log.records == {n}")
        assert total(snaps, "log", "bytes") >= n * len(payload)
        assert total(snaps, "log", "read_records") == 0  # nothing caught up yet
        back = Client(broker.port, "logreader", clean=False).connect()
        assert len(back.wait_messages(n)) == n
        snaps = view.until(lambda s: total(s, "log", "read_records") >= n, f"log.read_records >= {n}")
        assert total(snaps, "log", "read_bytes") >= n * len(payload)
    finally:
        view.close()


# -- operator experience: finding nodes, the terminal, pipes, the cluster -----------------------------

@pytest.fixture
def start_in(xprocess, tmp_path):
    """Start brokerd with BROKERD_RUN_DIR set (its own run directory base, out of other tests' sight)."""
    started: list[Broker] = []

    def start(run_dir: str, *args: str, workers: int = WORKERS, host: str = "127.0.0.1", node_id: str = "t") -> Broker:
        port = free_port(host)
        argv = ["--workers", str(workers), "--listen", f"{host}:{port}", "--node-id", node_id,
                "--data-dir", str(tmp_path / "data"), *FAST, *args]
        broker = Broker(xprocess, f"brokerd-in-{node_id}-{port}", argv, host, port, env={"BROKERD_RUN_DIR": run_dir})
        started.append(broker)
        return broker.start()

    yield start
    Client.close_all([c for c in Client.made])
    for broker in started:
        info = xprocess.getinfo(broker.name)
        if info.isrunning():
            info.terminate(timeout=15)


def _rows(stdout: str, first: str) -> list[list[str]]:
    """The table's rows (split on blanks) after its header line, which starts with ``first``, to TOTAL."""
    lines = stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(first))
    rows = []
    for line in lines[at + 1:]:
        rows.append(line.split())
        if line.startswith("TOTAL"):
            return rows
    raise AssertionError(f"no TOTAL row: {stdout}")


def test_stats_finds_the_local_nodes_by_itself(start_in, tmp_path):
    run = str(tmp_path / "run")
    start_in(run, workers=WORKERS, node_id="found")
    start_in(run, workers=1, node_id="other")  # a node of one router beside one of two
    # A dead broker's directory (its lock free, a socket file left): skipped, not waited for.
    stale = tmp_path / "run" / "gone-1883"
    stale.mkdir()
    (stale / "brokerd.lock").write_text("999999\n")
    (stale / "w0.stats").write_text("")
    for args, env in ((["--json"], {"BROKERD_RUN_DIR": run}), (["--json", "--run-dir", run], {})):
        r = stats_cli(*args, env=env)
        assert r.returncode == 0, r.stderr
        found = sorted((o["node"], o["router"]) for o in map(json.loads, r.stdout.splitlines()))
        assert found == [("found", "w0"), ("found", "w1"), ("other", "w0")], found
    r = stats_cli("--run-dir", run, "--node-id", "found")  # one node of those found, by its id
    assert r.returncode == 0, r.stderr
    assert [row[0] for row in _rows(r.stdout, "ROUTER")] == ["w0", "w1", "TOTAL"]
    r = stats_cli("--run-dir", str(tmp_path / "empty"))
    assert r.returncode == 1 and "no brokerd running here" in r.stderr


def test_stats_finds_a_node_without_its_listen_address(start_broker):
    """In the default run directory base: --node-id alone, not the --listen the broker was given."""
    node = f"solo{os.getpid()}"
    start_broker(*FAST, workers=WORKERS, node_id=node)
    r = stats_cli("--json", "--node-id", node)
    assert r.returncode == 0, r.stderr
    assert sorted(json.loads(x)["router_id"] for x in r.stdout.splitlines()) == [f"{node}/w0", f"{node}/w1"]


def test_stats_fits_80_columns_and_sorts(start_broker):
    broker = start_broker(*FAST, workers=WORKERS)
    view = Snapshots(broker)
    try:
        spread(broker, view, "wide", 5)
    finally:
        view.close()
    r = stats_cli(*locator(broker), env={"COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, r.stdout
    header = next(line for line in lines if line.startswith("ROUTER"))
    for column in ("CLIENTS", "MSG IN/s", "MSG OUT/s", "IN", "OUT", "CPU%"):
        assert column in re.split(r" {2,}", header.strip()), (column, header)  # columns: 2+ blanks apart
    assert [row[0] for row in _rows(r.stdout, "ROUTER")] == ["w0", "w1", "TOTAL"]
    # Piped, without COLUMNS: every column; byte rates in B/s.
    r = stats_cli(*locator(broker))
    header = next(line for line in r.stdout.splitlines() if line.startswith("ROUTER"))
    assert all(c in header for c in ("PID", "UPTIME", "MESH IN", "INFLIGHT", "LAG")), header
    rows = _rows(r.stdout, "ROUTER")
    assert all(row[-1].endswith("ms") and any(cell.endswith("B/s") for cell in row) for row in rows)
    r = stats_cli(*locator(broker), "--sort", "clients")
    assert r.returncode == 0, r.stderr
    rows = _rows(r.stdout, "ROUTER")
    clients = [int(row[3]) for row in rows[:-1]]
    assert clients == sorted(clients, reverse=True) and sum(clients) == int(rows[-1][1])
    r = stats_cli(*locator(broker), "--sort", "colour")
    assert r.returncode == 2 and "--sort" in r.stderr and "clients" in r.stderr


def test_stats_into_a_closed_pipe_ends_quietly(start_broker, tmp_path):
    broker = start_broker(*FAST, workers=WORKERS)
    args = " ".join(locator(broker))
    for command in (f"{BROKERD} stats --json {args} 2>{tmp_path}/err | head -1",
                    f"{BROKERD} stats --watch --json {args} 2>{tmp_path}/err | head -3"):
        r = subprocess.run(["bash", "-c", f"set -o pipefail; {command}"], capture_output=True, text=True,
                           timeout=60, env={k: v for k, v in os.environ.items() if k != "COLUMNS"})
        assert r.returncode == 0, (command, r.stderr)
        assert 1 <= len(r.stdout.splitlines()) <= 3
        err = (tmp_path / "err").read_text()
        assert err == "", err  # no BrokenPipeError, no "Exception ignored"


@needs_mesh
def test_stats_cluster_view_from_one_node(start_in, tmp_path):
    from tests.cluster.test_multihost import mesh_port, wait_mesh_complete

    here, elsewhere = str(tmp_path / "run"), str(tmp_path / "elsewhere")
    hosts = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    ports = [mesh_port(h) for h in hosts]
    stats_port = _two_free_ports()
    nodes = []
    for i, (host, name) in enumerate(zip(hosts, "abc", strict=True)):
        peer = 1 if i == 0 else i - 1
        extra = ["--stats-port", str(stats_port), "--stats-host", host] if name == "c" else []
        # c runs "on another host": another run directory base, its stats on tcp.
        nodes.append(start_in(here if name != "c" else elsewhere, "--mesh", f"{host}:{ports[i]}", *LEASES, "--peer",
                              f"{hosts[peer]}:{ports[peer]}", *mesh_key(), *extra, workers=WORKERS, host=host,
                              node_id=name))
    wait_mesh_complete(nodes, routers=6)
    # From a and b's host alone: c is found through the mesh, at the stats sockets its routers
    # advertise (it has --stats-port), so the view from one node covers the cluster.
    r = stats_cli("--cluster", "--run-dir", here)
    assert r.returncode == 0, r.stderr
    rows = {row[0]: row for row in _rows(r.stdout, "NODE")}
    assert set(rows) == {"a", "b", "c", "TOTAL"} and rows["a"][1] == "2/2" and rows["TOTAL"][1] == "6/6", r.stdout
    assert "no stats read" not in r.stdout
    r = stats_cli("--cluster", "--run-dir", here, "--node", f"127.0.0.3:{stats_port}")
    assert r.returncode == 0, r.stderr
    rows = {row[0]: row for row in _rows(r.stdout, "NODE")}
    assert set(rows) == {"a", "b", "c", "TOTAL"} and rows["TOTAL"][1] == "6/6", r.stdout
    assert "no stats read" not in r.stdout
    r = stats_cli("--cluster", "--json", "--run-dir", here, "--node", f"127.0.0.3:{stats_port}")
    assert r.returncode == 0, r.stderr
    assert sorted(json.loads(x)["router_id"] for x in r.stdout.splitlines()) == \
        [f"{n}/w{i}" for n in "abc" for i in range(WORKERS)]



@needs_mesh
def test_stats_cluster_leaves_out_a_broker_of_another_cluster_on_the_same_host(start_in, tmp_path):
    """a and b are one cluster; x runs beside them, alone: --cluster counts a and b only and names x,
    and --node-id x picks x's cluster (itself) instead."""
    from tests.cluster.test_multihost import mesh_port, wait_mesh_complete

    run = str(tmp_path / "run")
    hosts = {"a": "127.0.0.1", "b": "127.0.0.2"}
    ports = {n: mesh_port(h) for n, h in hosts.items()}
    nodes = [start_in(run, "--mesh", f"{h}:{ports[n]}", *LEASES, "--peer", f"{hosts['b' if n == 'a' else 'a']}:"
                      f"{ports['b' if n == 'a' else 'a']}", *mesh_key(), workers=1, host=h, node_id=n)
             for n, h in hosts.items()]
    start_in(run, workers=1, node_id="x")
    wait_mesh_complete(nodes, routers=2)
    r = stats_cli("--cluster", "--run-dir", run)
    assert r.returncode == 0, r.stderr
    rows = {row[0]: row for row in _rows(r.stdout, "NODE")}
    assert set(rows) == {"a", "b", "TOTAL"} and rows["TOTAL"][1] == "2/2", r.stdout
    assert "cluster of 2 nodes" in r.stdout, r.stdout
    assert "left out, not in this cluster's mesh: x" in r.stderr, r.stderr
    r = stats_cli("--cluster", "--run-dir", run, "--node-id", "x")
    assert r.returncode == 0, r.stderr
    assert set(row[0] for row in _rows(r.stdout, "NODE")) == {"x", "TOTAL"}, r.stdout


def test_the_session_that_drops_is_named_in_snapshots_tables_and_metrics(start_broker):
    """Drops are counted per router by reason; the operator needs the client. An MQTT 5 client
    with a Maximum Packet Size of 128 bytes subscribes at QoS 1 and gets three messages too
    large for it, and two that fit: the snapshot of its router names it among the sessions that
    dropped (three, connected), the connection list counts them on its row, `brokerd stats`
    says it under the table, and /metrics counts one session dropping (no client id there)."""
    import paho.mqtt.client as mqtt

    from tests.integration.test_mqtt5 import v5_props

    mport = free_port()
    broker = start_broker(*FAST, "--metrics-port", str(mport), workers=WORKERS)
    view = Snapshots(broker)
    try:
        small = Client(broker.port, "small-sub", protocol=mqtt.MQTTv5,
                       properties=v5_props(mqtt.PacketTypes.CONNECT, MaximumPacketSize=128)).connect()
        small.subscribe("drop/t", 1)
        pub = Client(broker.port, "pub").connect()
        pub.publish("drop/t", b"ready", qos=1)
        small.wait_payload(b"ready")  # the route is there (the other router knows the subscription)
        for payload in (b"a" * 200, b"ok1", b"b" * 200, b"c" * 200, b"ok2"):
            pub.publish("drop/t", payload, qos=1)
        small.wait_payload(b"ok2")
        assert [m.payload for m in small.messages] == [b"ready", b"ok1", b"ok2"]
        def droppers(snaps: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
            return [d for s in snaps.values() for d in s.get("droppers") or ()]

        # (a snapshot taken between two of the drops may come first: its count is lower)
        snaps = view.until(lambda s: [d["dropped"] for d in droppers(s)] == [3], "the session's three drops")
        assert droppers(snaps) == [{"client_id": "small-sub", "dropped": 3, "connected": True, "queued": 0}]
        assert sum(s["drops"]["too_large"] for s in snaps.values()) == 3
        assert sum(s["sessions_dropping"] for s in snaps.values()) == 1
        view.until(lambda _: any(c["client_id"] == "small-sub" and c["dropped"] == 3
                                 for cl in view.lists.values() for c in cl["connections"]), "its row's count")
        table = stats_cli(*locator(broker))
        assert table.returncode == 0, table.stderr
        assert "dropped most for: small-sub 3 (w" in table.stdout and ", connected, queued 0)" in table.stdout
        m = wait_for(lambda: (got := scrape_or_none(mport)) and sum(got.get("brokerd_sessions_dropping", {}).values())
                     and got, what="/metrics to count the session")
        assert sum(m["brokerd_sessions_dropping"].values()) == 1
    finally:
        view.close()
