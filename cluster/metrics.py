"""The node's stats process: aggregates its routers for Prometheus (/metrics) and $SYS/broker.

Why a process of its own: the supervisor must not hold a ZeroMQ context or an event loop while it
forks workers (a forked copy of either is broken), and the routers must not serve HTTP. So after the
workers are up, the supervisor forks ``brokerd-stats``. It

* subscribes to every router's stats socket (``cluster.paths.router_endpoint``) and keeps the latest
  snapshot of each;
* serves them on ``http://<--listen host>:<--metrics-port>/metrics`` with ``prometheus_client``
  (one series per router: ``router`` and ``node`` labels; conventional names and units);
* publishes the node aggregate (sums over routers; counters of a router's previous incarnations are
  carried, so node totals do not fall back when a worker restarts) once per interval on
  ``ipc://<run dir>/node.stats``, from which every router serves ``$SYS/broker/...`` to its clients.

It runs only when there is something to serve over HTTP (``--metrics-port``; for $SYS alone router 0
builds the node aggregate: ``StatsPublisher._aggregate_here``, the same ``NodeStats``), and
exits when the supervisor stops it (SIGTERM), or when the supervisor is gone. The supervisor
restarts it when it dies, at most ``AUX_CRASH_LIMIT`` times in ``AUX_CRASH_WINDOW_S``.
"""

from __future__ import annotations

import copy
import logging
import os
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

from brokerd.router.stats import LIMITS

from . import __version__
from .config import Config
from .paths import effective_interval, ensure_run_dir, node_endpoint, router_endpoint
from .process import exit_how, fork_child, name_process, stop_child
from .stats_schema import DROP_REASONS, SCHEMA_VERSION, TOPIC_NODE, TOPIC_SNAPSHOT

log = logging.getLogger(__name__)

AUX_CRASH_LIMIT = 5
AUX_CRASH_WINDOW_S = 60.0
AUX_STOP_GRACE_S = 5.0
AUX_READY_TIMEOUT_S = 10.0
PROCESS_NAME = "brokerd-stats"


# -- aggregation (pure: unit-tested without processes) ----------------------------------------------

def sum_trees(trees: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Add up nested dicts of numbers key by key (missing keys count as 0)."""
    out: dict[str, Any] = {}
    for tree in trees:
        for key, value in tree.items():
            if isinstance(value, dict):
                out[key] = sum_trees([out.get(key, {}), value])
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                out[key] = out.get(key, 0) + value
    return out


def counters_of(snap: dict[str, Any]) -> dict[str, Any]:
    """The monotonic counters of a router snapshot (what a restarted router must not lose)."""
    t = snap["traffic"]
    mesh = {k: v for k, v in t["mesh"].items() if k != "peers"}
    c = snap["clients"]
    return {
        "traffic": {"clients": dict(t["clients"]), "mesh": mesh, "log": dict(t["log"])},
        "drops": dict(snap["drops"]),
        "limits": dict(snap.get("limits", {})),
        "auth": dict(snap.get("auth", {})),
        "clients": {k: c[k] for k in ("connects_total", "refused_total", "protocol_errors_total")},
        "refused_log_unavailable_total": snap.get("refused_log_unavailable_total", 0),
    }


def gauges_of(snap: dict[str, Any]) -> dict[str, Any]:
    """What a live router has now (meaningless once it is gone)."""
    c = snap["clients"]
    return {
        "clients": {k: c.get(k, 0) for k in ("connected", "sockets", "sessions", "max")},
        "subscriptions": snap["subscriptions"],
        "filters": snap["filters"],
        "inflight": snap["inflight"],
        "queued": snap["queued"],
        "rates": snap["rates"],
        "process": {k: snap["process"][k] for k in ("cpu_percent", "rss_bytes")},
    }


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for key, value in b.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


_TRAFFIC = ("msgs_in", "msgs_out", "bytes_in", "bytes_out")
# What a node aggregate holds when no router has reported (yet): every key, at zero.
_ZERO_NODE: dict[str, Any] = {
    "clients": dict.fromkeys(("connected", "sockets", "sessions", "connects_total", "refused_total",
                              "protocol_errors_total", "max"), 0),
    "refused_log_unavailable_total": 0,
    "subscriptions": 0, "filters": 0, "inflight": 0, "queued": 0, "rates": {},
    "process": {"cpu_percent": 0.0, "rss_bytes": 0},
    "drops": dict.fromkeys(DROP_REASONS, 0),
    "limits": dict.fromkeys(LIMITS, 0),
    "auth": {"failures_total": 0, "denied_total": 0},
    "traffic": {"clients": dict.fromkeys(_TRAFFIC, 0), "mesh": dict.fromkeys((*_TRAFFIC, "frames_in", "frames_out", "bad_frames"), 0),
                "log": dict.fromkeys(("records", "bytes", "read_records", "read_bytes", "disk_bytes"), 0)},
}


class NodeStats:
    """The latest snapshot of each router of one node, and their aggregate."""

    def __init__(self, node: str, routers: int, interval: float, started: float | None = None) -> None:
        self.node = node
        self.routers = routers
        self.interval = interval
        self.started = time.time() if started is None else started
        self.latest: dict[str, dict[str, Any]] = {}
        self.seen: dict[str, float] = {}  # router → monotonic time of its last snapshot
        self.carry: dict[str, Any] = {}  # counters of routers' previous incarnations
        self.lock = threading.Lock()  # the HTTP thread reads while the main loop updates

    def update(self, snap: dict[str, Any], now: float | None = None) -> bool:
        if snap.get("v") != SCHEMA_VERSION or snap.get("kind") != "router":
            return False
        name = snap["router"]
        with self.lock:
            prev = self.latest.get(name)
            if prev is not None and prev["pid"] != snap["pid"]:
                self.carry = sum_trees([self.carry, counters_of(prev)])
            self.latest[name] = snap
            self.seen[name] = time.monotonic() if now is None else now
        return True

    def drain(self, sub: Any) -> None:
        """Take in every snapshot waiting on ``sub`` (a ZeroMQ SUB socket of routers' stats
        sockets) without blocking; a malformed one is logged and ignored."""
        import msgpack
        import zmq

        while True:
            try:
                _, data = sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                self.update(msgpack.unpackb(data, raw=False))
            except (ValueError, KeyError, TypeError, msgpack.UnpackException):
                log.warning("stats: a malformed snapshot was ignored")

    def stale_after(self) -> float:
        return 3 * self.interval + 1.0

    def current(self, now: float | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(every router's latest snapshot, the fresh ones), sorted by router index."""
        now = time.monotonic() if now is None else now
        with self.lock:
            snaps = sorted(self.latest.values(), key=lambda s: s["index"])
            fresh = [s for s in snaps if now - self.seen[s["router"]] <= self.stale_after()]
        return snaps, fresh

    def aggregate(self, now: float | None = None) -> dict[str, Any]:
        """The node snapshot (schema: docs/stats.md, "Node aggregate")."""
        snaps, fresh = self.current(now)
        counters = sum_trees([self.carry, *(counters_of(s) for s in snaps)])
        gauges = sum_trees(gauges_of(s) for s in fresh)
        node = _merge(copy.deepcopy(_ZERO_NODE), _merge(counters, gauges))
        node.update({
            "v": SCHEMA_VERSION, "kind": "node", "node": self.node, "version": __version__, "ts": time.time(),
            "uptime": time.time() - self.started, "routers": self.routers,
            "routers_reporting": [s["router"] for s in fresh],
            # Every router holds the whole cluster's retained messages: the node has as many as one.
            "retained": max((s["retained"] for s in fresh), default=0),
        })
        return node


# -- Prometheus ---------------------------------------------------------------------------------------

class SnapshotCollector:
    """A prometheus_client collector over the routers' latest snapshots (read at scrape time)."""

    def __init__(self, stats: NodeStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        snaps, fresh = self.stats.current()
        names = {s["router"] for s in fresh}
        lbl = ["node", "router"]

        def gauge(name: str, doc: str, value: Any) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=lbl)
            for s in fresh:
                g.add_metric([s["node"], s["router"]], value(s))
            return g

        def counter(name: str, doc: str, value: Any) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=lbl)
            for s in fresh:
                c.add_metric([s["node"], s["router"]], value(s))
            return c

        info = GaugeMetricFamily("brokerd_info", "brokerd version of this node", labels=["node", "version"])
        info.add_metric([self.stats.node, __version__], 1)
        yield info
        t = "traffic"
        up = GaugeMetricFamily("brokerd_router_up", "1 while the router's stats snapshots arrive", labels=lbl)
        for s in snaps:
            up.add_metric([s["node"], s["router"]], 1 if s["router"] in names else 0)
        yield up
        yield gauge("brokerd_router_uptime_seconds", "seconds since the router started", lambda s: s["uptime"])
        yield gauge("brokerd_clients_connected", "clients connected (past CONNECT)",
                    lambda s: s["clients"]["connected"])
        yield gauge("brokerd_sockets_open", "open client TCP connections, also before CONNECT",
                    lambda s: s["clients"]["sockets"])
        yield gauge("brokerd_sessions", "sessions held, connected or offline", lambda s: s["clients"]["sessions"])
        yield counter("brokerd_connects", "clients accepted (CONNACK 0)", lambda s: s["clients"]["connects_total"])
        yield counter("brokerd_connections_refused", "connections refused (limits)",
                      lambda s: s["clients"]["refused_total"])
        yield counter("brokerd_protocol_errors", "connections closed for a protocol violation",
                      lambda s: s["clients"]["protocol_errors_total"])
        yield counter("brokerd_auth_failures", "CONNECTs refused by authentication (bad user name or "
                      "password, anonymous not allowed, not authorized)",
                      lambda s: s.get("auth", {}).get("failures_total", 0))
        yield counter("brokerd_acl_denied", "PUBLISH packets and SUBSCRIBE filters refused by the ACL",
                      lambda s: s.get("auth", {}).get("denied_total", 0))
        yield gauge("brokerd_max_connections", "client connections the router accepts at most",
                    lambda s: s["clients"].get("max", 0))
        yield counter("brokerd_publishes_refused_log_unavailable", "QoS 1/2 publishes refused, never "
                      "acknowledged, because the commit log could not take them (full or failing disk)",
                      lambda s: s.get("refused_log_unavailable_total", 0))
        yield counter("brokerd_mesh_bad_frames", "mesh frames dropped as malformed (a buggy or lying peer)",
                      lambda s: s[t]["mesh"].get("bad_frames", 0))
        yield gauge("brokerd_subscriptions", "subscriptions (filter, session) on the router",
                    lambda s: s["subscriptions"])
        yield gauge("brokerd_retained_messages", "retained messages held by the router", lambda s: s["retained"])
        yield counter("brokerd_client_messages_received", "PUBLISH packets received from clients",
                      lambda s: s[t]["clients"]["msgs_in"])
        yield counter("brokerd_client_messages_sent", "PUBLISH packets sent to clients",
                      lambda s: s[t]["clients"]["msgs_out"])
        yield counter("brokerd_client_received_bytes", "bytes read from client sockets",
                      lambda s: s[t]["clients"]["bytes_in"])
        yield counter("brokerd_client_sent_bytes", "bytes written to client sockets",
                      lambda s: s[t]["clients"]["bytes_out"])
        mesh = [("brokerd_mesh_messages_sent", "messages forwarded to a peer router", "msgs_out"),
                ("brokerd_mesh_messages_received", "messages received from a peer router", "msgs_in"),
                ("brokerd_mesh_sent_bytes", "bytes of mesh publish frames sent to a peer router", "bytes_out"),
                ("brokerd_mesh_received_bytes", "bytes of mesh publish frames from a peer router", "bytes_in")]
        for name, doc, key in mesh:
            c = CounterMetricFamily(name, doc, labels=[*lbl, "peer"])
            for s in fresh:
                for peer, values in sorted(s[t]["mesh"]["peers"].items()):
                    c.add_metric([s["node"], s["router"], peer], values[key])
            yield c
        yield counter("brokerd_log_records", "records appended to the commit log", lambda s: s[t]["log"]["records"])
        yield counter("brokerd_log_written_bytes", "bytes appended to the commit log", lambda s: s[t]["log"]["bytes"])
        yield counter("brokerd_log_read_records", "records read from the commit log",
                      lambda s: s[t]["log"]["read_records"])
        yield gauge("brokerd_log_size_bytes", "commit log size on disk", lambda s: s[t]["log"]["disk_bytes"])
        yield gauge("brokerd_inflight_messages", "QoS 1/2 messages sent, not yet acknowledged",
                    lambda s: s["inflight"])
        yield gauge("brokerd_queued_messages", "QoS 1/2 messages queued in sessions", lambda s: s["queued"])
        drops = CounterMetricFamily("brokerd_dropped_messages", "messages dropped, by reason",
                                    labels=[*lbl, "reason"])
        for s in fresh:
            for reason, n in s["drops"].items():
                drops.add_metric([s["node"], s["router"], reason], n)
        yield drops
        # Which sessions drop is for the stats socket (its ``droppers``: client ids), not for a
        # label here: a series per client id would grow without bound with a fleet's churn.
        yield gauge("brokerd_sessions_dropping", "sessions held that had a message dropped for them "
                    "(queue full, too large, slow consumer, expired, read grant revoked)",
                    lambda s: s.get("sessions_dropping", 0))
        hits = CounterMetricFamily("brokerd_limit_hits", "times a client hit a limit, by limit "
                                   "(docs/limits.md)", labels=[*lbl, "limit"])
        for s in fresh:
            for name, n in s.get("limits", {}).items():
                hits.add_metric([s["node"], s["router"], name], n)
        yield hits
        yield counter("brokerd_process_cpu_seconds", "CPU time of the worker process (user + system)",
                      lambda s: s["process"]["cpu_seconds"])
        yield gauge("brokerd_process_resident_memory_bytes", "resident memory of the worker process",
                    lambda s: s["process"]["rss_bytes"])
        yield gauge("brokerd_event_loop_lag_seconds", "how late the router's stats timer fired",
                    lambda s: s["loop_lag"])
        yield from _replication_metrics(fresh, lbl)


def _replication_metrics(fresh: list[dict[str, Any]], lbl: list[str]) -> Iterator[Any]:
    """Each router's log as a replicated partition: its high-water mark, held and refused
    acknowledgements, and per follower the lag and whether it is in sync (docs/cluster.md: Replication)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    reps = [(s, s["replication"]) for s in fresh if s.get("replication")]
    hw = GaugeMetricFamily("brokerd_replication_high_water_offset", "the highest offset of the router's "
                           "log held by --min-insync nodes (acknowledgements up to it were sent)", labels=lbl)
    end = GaugeMetricFamily("brokerd_replication_log_end_offset", "the last offset of the router's own log "
                            "written (durable with --fsync always)", labels=lbl)
    held = GaugeMetricFamily("brokerd_replication_held_acks", "QoS 1/2 acknowledgements waiting for "
                             "followers", labels=lbl)
    refused = CounterMetricFamily("brokerd_replication_refused_acks", "QoS 1/2 publishes never acknowledged "
                                  "because too few nodes held them within --replica-timeout", labels=lbl)
    lag = GaugeMetricFamily("brokerd_replica_lag_records", "records of the router's log a follower does not "
                            "hold yet", labels=[*lbl, "replica"])
    lag_s = GaugeMetricFamily("brokerd_replica_lag_seconds", "age of the oldest batch a follower has not "
                              "acknowledged", labels=[*lbl, "replica"])
    lag_b = GaugeMetricFamily("brokerd_replica_lag_bytes", "bytes of the router's log a follower does not hold "
                              "yet (its lag in records times the log's mean record size)", labels=[*lbl, "replica"])
    in_sync = GaugeMetricFamily("brokerd_replica_in_sync", "1 while the follower is in sync (counts towards "
                                "the high-water mark)", labels=[*lbl, "replica"])
    majority = GaugeMetricFamily("brokerd_cluster_majority", "1 while the router's lease is backed by a majority "
                                 "of the cluster's members (0: cut off; QoS 1/2 not acknowledged)", labels=lbl)
    backing = GaugeMetricFamily("brokerd_cluster_lease_backing", "member nodes (its own counted) that answered one "
                                "of the router's heartbeats within its lease's period", labels=lbl)
    sessions = GaugeMetricFamily("brokerd_replica_sessions", "persistent sessions of another router held here "
                                 "(served from its replica if it dies)", labels=[*lbl, "partition"])
    wills = GaugeMetricFamily("brokerd_replica_wills", "of those, offline ones with a delayed will waiting "
                              "(published from here if that router is dead when it falls due)",
                              labels=[*lbl, "partition"])
    history = GaugeMetricFamily("brokerd_replication_history_missing_records", "records below where a log "
                                "starts still to fetch from another node (a replica placed at the high-water "
                                "mark, a log continued after a lost disk; partition: whose log)",
                                labels=[*lbl, "partition"])
    for s, r in reps:
        key = [s["node"], s["router"]]
        for partition, h in [(s["router_id"], r.get("history")),
                             *((p, v.get("history")) for p, v in sorted(r["replicas"].items()))]:
            if h:
                history.add_metric([*key, partition], max(0, h["below"] - h["next"]))
        majority.add_metric(key, 1 if r.get("majority", True) else 0)
        if "lease" in r:
            backing.add_metric(key, r["lease"]["backing"])
        hw.add_metric(key, r["high_water"])
        end.add_metric(key, r["end"])
        held.add_metric(key, r["held"])
        refused.add_metric(key, r["refused_total"])
        for follower, f in sorted(r["followers"].items()):
            lag.add_metric([*key, follower], f["lag_records"])
            lag_s.add_metric([*key, follower], f["lag_seconds"])
            lag_b.add_metric([*key, follower], f.get("lag_bytes", 0))
            in_sync.add_metric([*key, follower], 1 if f["in_sync"] else 0)
        for partition, n in sorted(r.get("sessions", {}).items()):
            sessions.add_metric([*key, partition], n)
        for partition, n in sorted(r.get("wills", {}).items()):
            wills.add_metric([*key, partition], n)
    yield from (majority, backing, hw, end, held, refused, lag, lag_s, lag_b, in_sync, sessions, wills, history)


def metrics_text(stats: NodeStats) -> bytes:
    """The /metrics body (what the HTTP server returns), for tests and tools."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(stats))
    return generate_latest(registry)


def metrics_address(config: Config) -> tuple[str, int]:
    assert config.metrics_port is not None
    return config.metrics_host, config.metrics_port


def check_metrics_port(config: Config) -> str | None:
    """Whether --metrics-port can be bound: an error text naming the option, or None."""
    if not config.metrics_port:
        return None
    host, port = metrics_address(config)
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
    except OSError as exc:
        return f"--metrics-port: cannot bind {host}:{port}: {exc.strerror}"
    finally:
        s.close()
    return None


# -- the process --------------------------------------------------------------------------------------

def aux_main(config: Config, supervisor_pid: int, ready_fd: int | None = None) -> int:
    """The stats process's loop: read snapshots, publish the node aggregate, serve /metrics.

    Writes to ``ready_fd`` once /metrics is served, so that "brokerd ready" means it is."""
    import msgpack
    import zmq

    stopping = False

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    interval = effective_interval(config)
    try:
        import psutil

        started = psutil.Process(supervisor_pid).create_time()
    except Exception:  # noqa: BLE001 - uptime from our own start then
        started = time.time()
    stats = NodeStats(config.node_id, config.workers, interval, started)
    server = None
    if config.metrics_port:
        from prometheus_client import CollectorRegistry

        from .metrics_http import serve

        registry = CollectorRegistry(auto_describe=False)
        registry.register(SnapshotCollector(stats))
        host, port = metrics_address(config)
        try:
            server = serve(registry, host, port, password_file=config.metrics_password_file,
                           certfile=config.metrics_certfile, keyfile=config.metrics_keyfile)
        except (OSError, ValueError) as exc:
            log.error("--metrics-port: cannot serve on %s:%d: %s", host, port, getattr(exc, "strerror", None) or exc)
            return 2
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.IPV6, 1)
    sub.setsockopt(zmq.SUBSCRIBE, TOPIC_SNAPSHOT)
    for i in range(config.workers):
        sub.connect(router_endpoint(config, i))
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    ensure_run_dir(config)
    pub.bind(node_endpoint(config))
    packer = msgpack.Packer(use_bin_type=True)
    if ready_fd is not None:
        os.write(ready_fd, b"1")
        os.close(ready_fd)
    poller = zmq.Poller()
    poller.register(sub, zmq.POLLIN)
    next_publish = time.monotonic() + interval
    log.debug("stats process: %d routers, /metrics %s", config.workers,
              f"on port {config.metrics_port}" if config.metrics_port else "off")
    try:
        while not stopping and os.getppid() == supervisor_pid:
            timeout = max(0.0, min(next_publish - time.monotonic(), 0.5))
            if poller.poll(int(timeout * 1000)):
                stats.drain(sub)
            now = time.monotonic()
            if now >= next_publish:
                next_publish = max(next_publish + interval, now)
                if stats.latest:
                    pub.send_multipart([TOPIC_NODE, packer.pack(stats.aggregate())])
    finally:
        if server is not None:
            server.shutdown()
        sub.close(0)
        pub.close(0)
        ctx.term()
        try:
            os.unlink(node_endpoint(config)[len("ipc://"):])
        except OSError:
            pass
    return 0


class AuxProcess:
    """The supervisor's handle on the stats process: fork, restart within limits, stop."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.pid: int | None = None
        self.starts: deque[float] = deque()

    def check(self) -> str | None:
        return check_metrics_port(self.config)

    def start(self, wait: bool = False) -> None:
        """Fork the stats process; with ``wait``, until it serves (bounded by AUX_READY_TIMEOUT_S).
        Only with --metrics-port: without it router 0 builds the node aggregate for $SYS
        (``StatsPublisher._aggregate_here``), and `brokerd stats` reads the routers directly."""
        if not self.config.metrics_port:
            return
        now = time.monotonic()
        self.starts.append(now)
        while self.starts and now - self.starts[0] > AUX_CRASH_WINDOW_S:
            self.starts.popleft()
        if len(self.starts) > AUX_CRASH_LIMIT:
            log.error("%s keeps dying (%d starts in %.0f s); /metrics and $SYS/broker are off",
                      PROCESS_NAME, len(self.starts), AUX_CRASH_WINDOW_S)
            self.pid = None
            return
        def main(supervisor: int, ready: int | None) -> int:
            _name_process()
            return aux_main(self.config, supervisor, ready)

        self.pid = fork_child(PROCESS_NAME, main, AUX_READY_TIMEOUT_S if wait else None, log)

    def exited(self, status: int) -> None:
        """The supervisor reaped our pid: log it and start a new one."""
        log.warning("%s (pid %s) died (%s); restarting it", PROCESS_NAME, self.pid, exit_how(status))
        self.pid = None
        self.start()

    def stop(self) -> None:
        pid, self.pid = self.pid, None
        if pid is not None:
            stop_child(pid, PROCESS_NAME, AUX_STOP_GRACE_S, log)


def _name_process() -> None:
    name_process(PROCESS_NAME)
