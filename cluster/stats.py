"""Per-router stats: the router's counters, once per interval, as a msgpack snapshot on a PUB socket.

Why it is shaped this way: the hot path only bumps plain integers (the router's ``RouterStats``,
each connection's ``ConnectionCounters`` and the worker's ``Traffic`` beside them, the mesh's
per-peer lists). Everything else (rates, the top connections, CPU and memory) is computed here,
once per ``--stats-interval``, from a ``loop.call_at`` callback on the worker's own event loop: no
thread, no lock, no allocation per message; and in time proportional to the traffic, not to the
connections (the top is ranked among the connections that moved: ``Traffic``). How late that
callback fires is the event-loop lag we report.

Sockets (``docs/stats.md`` has the operator's view):

* ``ipc://<run dir>/w<i>.stats`` (``cluster.paths.stats_endpoint``), or ``tcp://HOST:(P+i)`` with
  ``--stats-port P`` (HOST is the ``--listen`` host). A ZeroMQ XPUB socket: subscribers see plain
  PUB behaviour, and the router learns whether anybody wants the (larger) connection list.
* Two-frame messages ``[topic, msgpack body]``. Topic ``snap``: the router snapshot, every interval.
  Topic ``conns``: the full connection list, every interval, built only while some subscriber is
  subscribed to ``conns`` (``brokerd stats --connections``).

The snapshot's schema, and the topics: ``cluster.stats_schema``. Rates, the worker's traffic, and
work split across loop turns: ``cluster.stats_figures``.

$SYS: every ``--sys-interval`` the router publishes its own values under
``$SYS/brokerd/<node>/<router>/...`` (retained, through ``router.publish``: they reach subscribers
on every router and node), and the node's aggregate under Mosquitto's ``$SYS/broker/...`` names,
delivered to this router's own subscribers only, so that the routers of a node each serve the same
node-wide values and nodes do not overwrite each other's. The node aggregate comes from the stats
process (``cluster.metrics``) on ``ipc://<run dir>/node.stats``.
"""

from __future__ import annotations

import heapq
import logging
import os
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import msgpack
import psutil
import zmq

from brokerd.router.stats import LIMITS
from brokerd.router.sys_topics import SYS_CLIENT_ID, SysTopics, broker_sys_values, router_sys_values
from brokerd.router.view import DROPPED, RouterView

from . import __version__
from .config import Config
from .metrics import NodeStats
from .paths import effective_interval, ensure_run_dir, node_endpoint, router_endpoint, zmq_host
from .stats_figures import ConnectionSet, RateRing, SlicedFold, client_bytes, client_row, fold_in_slices
from .stats_schema import (
    CONNECTIONS_MAX,
    DROP_REASONS,
    DROPPERS_N,
    SCHEMA_VERSION,
    SESSION_DROPS,
    TOP_N,
    TOPIC_CONNECTIONS,
    TOPIC_NODE,
    TOPIC_SNAPSHOT,
)

if TYPE_CHECKING:
    import asyncio

    from brokerd.router.ports import ClientHandle
    from brokerd.router.router import Router
    from brokerd.router.session import Session

log = logging.getLogger(__name__)

# Connections ranked, or sessions counted, per loop iteration (``SlicedFold``): a fleet's every
# device moves bytes each second, and ranking 5,000 of them in one go held the loop ~5 ms,
# counting their sessions' queues ~1.3 ms, once a second (a slice of 1,000 to rank took ~1.3 ms).
RANK_SLICE = 250
PENDING_RECOUNT = 10  # snapshots: queued and in-flight counted again at least this often, moved or not


class StatsPublisher:
    """One per worker: snapshots on the router's stats socket, and the $SYS topics."""

    def __init__(self, config: Config, index: int, router: Router, connections: ConnectionSet,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.config = config
        self.index = index
        self.router = RouterView(router)  # read-only: counts, clients, counters
        self.connections = connections
        self.loop = loop
        self.name = f"w{index}"
        self.interval = effective_interval(config)
        self.endpoint = router_endpoint(config, index, bind=True)
        self.started = time.monotonic()
        self.seq = 0
        self.rates = RateRing(self.interval)
        self.replication: Any = None  # cluster.replication.Replication, set by the worker
        self.process = psutil.Process()
        self.process.cpu_percent(None)  # the first call only starts the measurement
        self.process_figures: tuple[int, float, float] = (0, 0.0, 0.0)  # the last read: RSS, CPU s, CPU %
        self.ctx: zmq.Context | None = None
        self.pub: zmq.Socket | None = None
        self.node_sub: zmq.Socket | None = None
        self.node_latest: dict[str, Any] | None = None
        # Router 0 builds the node aggregate for $SYS itself when no stats process runs (no
        # --metrics-port): the other routers' snapshots in, the aggregate out on node.stats.
        self.node_stats: Any = None  # cluster.metrics.NodeStats
        self.peers_sub: zmq.Socket | None = None
        self.node_pub: zmq.Socket | None = None
        self.subscribed: set[bytes] = set()
        self._due = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._sys_due = 0.0
        self.sys = SysTopics(router, config.node_id, self.name)
        self._log_base: tuple[int, int] | None = None
        self._errors_logged = 0
        self._packer = msgpack.Packer(use_bin_type=True)
        self._top_clients: list[ClientHandle] = []  # the last ranking's top (``_top``)
        self._top_conns: list[Any] = []  # their connections, ranked again with the next ones to move
        self._ranking: SlicedFold | None = None  # a ranking under way (``_top``)
        self._counting: SlicedFold | None = None  # a count of queued and in-flight under way
        self._unranked: dict[int, Any] = {}  # moved while a ranking was under way: for the next
        self._pending_key: tuple[int, ...] = ()  # what ``queued_inflight`` was counted at
        self._pending = (0, 0)
        self._finding: SlicedFold | None = None  # a walk for the sessions that drop most under way
        self._drops_walked = (0, 0)  # ``SESSION_DROPS`` summed, and the sessions, when the last walk began
        self._dropping: tuple[int, list[Session]] = (0, [])  # its result: (sessions that dropped, the most)

    # -- life cycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Bind the stats socket and start the periodic snapshot (raises OSError naming the option)."""
        self.ctx = zmq.Context()
        if self.endpoint.startswith("ipc://"):
            ensure_run_dir(self.config)
        pub = self.ctx.socket(zmq.XPUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.SNDHWM, 100)
        pub.setsockopt(zmq.IPV6, 1)
        try:
            pub.bind(self.endpoint)
        except zmq.ZMQError as exc:
            pub.close()
            self.ctx.term()
            self.ctx = None
            option = "--stats-port" if self.config.stats_port else "stats socket"
            raise OSError(f"{option}: cannot bind {self.endpoint}: {exc.strerror}") from None
        self.pub = pub
        if self.config.sys_interval > 0 and self.index == 0 and not self.config.metrics_port:
            self._aggregate_here()
        elif self.config.sys_interval > 0:
            sub = self.ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.RCVHWM, 16)
            sub.setsockopt(zmq.SUBSCRIBE, TOPIC_NODE)
            sub.connect(node_endpoint(self.config))
            self.node_sub = sub
        now = self.loop.time()
        self.rates.push(time.monotonic(), self._rate_values(self._totals()))
        self._due = now + self.interval
        self._sys_due = time.monotonic()  # $SYS at the first tick, then every --sys-interval
        self._timer = self.loop.call_at(self._due, self._tick)
        log.debug("stats for %s on %s every %.2f s", self.router.router_id, self.endpoint, self.interval)

    def _aggregate_here(self) -> None:
        """Router 0, with $SYS on and no stats process: subscribe to the other routers'
        snapshots and publish the node aggregate on ``node.stats`` (docs/stats.md). Why here and
        not in a process of its own: that process (a third interpreter) was a quarter of an idle
        node's memory (about 12 MB of 48 MB PSS) and a millisecond of CPU a second, for a sum
        over a few snapshots a second. It runs only where /metrics is served (``--metrics-port``):
        HTTP stays out of the routers."""
        assert self.ctx is not None
        try:
            started = psutil.Process(os.getppid()).create_time()  # the supervisor's: the node's uptime
        except psutil.Error:
            started = time.time()
        self.node_stats = NodeStats(self.config.node_id, self.config.workers, self.interval, started)
        sub = self.ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.IPV6, 1)
        sub.setsockopt(zmq.SUBSCRIBE, TOPIC_SNAPSHOT)
        for i in range(1, self.config.workers):
            sub.connect(router_endpoint(self.config, i))
        self.peers_sub = sub
        node_pub = self.ctx.socket(zmq.PUB)
        node_pub.setsockopt(zmq.LINGER, 0)
        try:
            node_pub.bind(node_endpoint(self.config))
        except zmq.ZMQError as exc:
            node_pub.close()
            raise OSError(f"stats: cannot bind {node_endpoint(self.config)}: {exc.strerror}") from None
        self.node_pub = node_pub

    def _publish_node(self, snap: dict[str, Any]) -> None:
        """Router 0: the other routers' latest snapshots, this one, and the aggregate out."""
        stats = self.node_stats
        assert self.peers_sub is not None and self.node_pub is not None
        stats.drain(self.peers_sub)
        stats.update(snap)
        node = stats.aggregate()
        self.node_latest = node
        self.node_pub.send_multipart([TOPIC_NODE, self._packer.pack(node)], zmq.NOBLOCK)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for sock in (self.pub, self.node_sub, self.peers_sub, self.node_pub):
            if sock is not None:
                sock.close(0)
        if self.node_pub is not None:
            try:
                os.unlink(node_endpoint(self.config)[len("ipc://"):])
            except OSError:
                pass
        self.pub = self.node_sub = self.peers_sub = self.node_pub = None
        if self.ctx is not None:
            self.ctx.term()
            self.ctx = None
        if self.endpoint.startswith("ipc://"):
            try:
                os.unlink(self.endpoint[len("ipc://"):])
            except OSError:
                pass

    # -- the periodic callback --------------------------------------------------------------------

    def _tick(self) -> None:
        now = self.loop.time()
        lag = max(0.0, now - self._due)
        try:
            self._read_control()
            snap = self.snapshot(lag)
            assert self.pub is not None
            self.pub.send_multipart([TOPIC_SNAPSHOT, self._packer.pack(snap)], zmq.NOBLOCK)
            if self.node_stats is not None:
                self._publish_node(snap)
            if self.config.stats_clients and self._wants(TOPIC_CONNECTIONS):
                self.pub.send_multipart([TOPIC_CONNECTIONS, self._packer.pack(self.connection_list())],
                                        zmq.NOBLOCK)
            if self.config.sys_interval > 0 and time.monotonic() >= self._sys_due:
                self._sys_due = time.monotonic() + self.config.sys_interval
                self.sys.publish(snap, self.node_latest)
        except Exception:  # noqa: BLE001 - stats must never take the router down
            self._errors_logged += 1
            if self._errors_logged <= 3:
                log.exception("stats snapshot failed")
        finally:
            self._due += self.interval
            if self._due <= now:  # blocked for longer than an interval: start afresh
                self._due = now + self.interval
            if self.pub is not None:
                self._timer = self.loop.call_at(self._due, self._tick)

    def _read_control(self) -> None:
        """XPUB subscription changes (who wants ``conns``) and the node aggregate for $SYS."""
        pub = self.pub
        assert pub is not None
        while True:
            try:
                event = pub.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            if event[:1] == b"\x01":
                self.subscribed.add(event[1:])
            elif event[:1] == b"\x00":
                self.subscribed.discard(event[1:])
        sub = self.node_sub
        if sub is not None:
            data = None
            while True:
                try:
                    _, data = sub.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
            if data is not None:
                node = msgpack.unpackb(data, raw=False)
                if node.get("v") == SCHEMA_VERSION:
                    self.node_latest = node

    def _wants(self, topic: bytes) -> bool:
        return any(topic.startswith(prefix) for prefix in self.subscribed)

    # -- what a snapshot holds ----------------------------------------------------------------------

    def _totals(self) -> tuple[int, int, int, int]:
        """Client traffic since the router started (msgs in, out, bytes in, out)."""
        t = self.connections.traffic
        return t.msgs_in, t.msgs_out, t.bytes_in, t.bytes_out

    def _top(self) -> list[dict[str, Any]]:
        """The ``TOP_N`` connected clients with the most bytes, ranked among the previous top and
        the connections that moved bytes since: the same as ranking them all, since counters only
        grow, at a cost proportional to the traffic rather than to the connections. More than
        ``RANK_SLICE`` to rank (a fleet, whose every device moves each second) are ranked a slice
        per loop iteration, not in one go that holds the loop; meanwhile, and until the ranking
        ends, the snapshot shows the last one's clients, with their counters of now."""
        moved = self.connections.traffic.take_moved()
        if not self.config.stats_clients:
            self._top_clients, self._top_conns, self._unranked = [], [], {}
            return []
        if self._ranking is not None:
            for conn in moved:
                self._unranked[id(conn)] = conn
        else:
            pool = [*self._top_conns, *self._unranked.values(), *moved]
            self._unranked = {}
            self._ranking = fold_in_slices(self.loop, pool, [], self._best, self._ranked, RANK_SLICE)
        client_of = self.router.client
        live = [c for c in self._top_clients if client_of(c.client_id) is c]
        live.sort(key=client_bytes, reverse=True)
        return [client_row(client) for client in live]

    def _count(self, sessions: list[Any], acc: tuple[int, int]) -> tuple[int, int]:
        queued, inflight = self.router.queued_inflight(sessions)
        return acc[0] + queued, acc[1] + inflight

    def _counted(self, pending: tuple[int, int]) -> None:
        self._counting = None
        self._pending = pending

    def _droppers(self) -> list[dict[str, Any]]:
        """The ``DROPPERS_N`` sessions with the most messages dropped for them (every reason,
        ``Session.dropped``), connected or not: the operator's answer to which client the drops
        counters are about. The sessions are walked (a slice per loop iteration, as the count of
        queued messages) only when a drop of that kind was counted since the last walk began, or
        sessions came or went while some had dropped: nothing when nothing drops, and each
        session counts its drops on a drop only. Meanwhile the last walk's sessions show, those
        still held, with their counts of now."""
        st = self.router.stats
        key = (sum(getattr(st, f"drop_{reason}") for reason in SESSION_DROPS), self.router.counts_sessions())
        walked = self._drops_walked
        if self._finding is None and (key[0] != walked[0] or (self._dropping[0] and key[1] != walked[1])):
            self._drops_walked = key
            self._finding = fold_in_slices(self.loop, self.router.session_list(), (0, []), self._most_dropped,
                                           self._dropped_found, RANK_SLICE)
        if not self.config.stats_clients:  # (--stats-clients off: no client ids in the stats)
            return []
        session_of = self.router.session
        live: list[Session] = [s for s in self._dropping[1] if session_of(s.client_id) is s]
        live.sort(key=DROPPED, reverse=True)
        return [{"client_id": s.client_id, "dropped": s.dropped, "connected": s.conn is not None,
                 "queued": len(s.queue)} for s in live]

    def _most_dropped(self, sessions: list[Any], acc: tuple[int, list[Session]]) -> tuple[int, list[Session]]:
        dropping = self.router.dropping(sessions)
        return acc[0] + len(dropping), heapq.nlargest(DROPPERS_N, [*acc[1], *dropping], key=DROPPED)

    def _dropped_found(self, acc: tuple[int, list[Session]]) -> None:
        self._finding = None
        self._dropping = acc

    def _best(self, conns: Iterable[Any], best: list[ClientHandle]) -> list[ClientHandle]:
        """The ``TOP_N`` of ``best`` and the connected clients of ``conns``."""
        client_of = self.router.client
        chosen: dict[int, ClientHandle] = {id(c.conn): c for c in best}
        for conn in conns:
            client_id = conn.client_id
            if client_id is None:
                if not conn.closing:  # not past CONNECT yet: look again at the next snapshot
                    self.connections.traffic.mark_moved(conn)
                continue
            client = client_of(client_id)
            if client is not None and client.conn is conn:
                chosen[id(conn)] = client
        return heapq.nlargest(TOP_N, chosen.values(), key=client_bytes)

    def _ranked(self, best: list[ClientHandle]) -> None:
        self._ranking = None
        self._top_clients = best
        self._top_conns = [client.conn for client in best]

    def _log(self) -> dict[str, int]:
        """The commit log's counters since this router started. Appends are not counted in the
        hot path: they are the offsets and file bytes the log gained since the first snapshot."""
        records = written = read_records = read_bytes = disk = 0
        info = self.router.log_stats
        if info is not None:
            try:
                s = info()
                disk = int(s.get("bytes", 0))
                if self._log_base is None:
                    self._log_base = (int(s.get("next_offset", 0)), disk)
                records = int(s.get("next_offset", 0)) - self._log_base[0]
                written = max(0, disk - self._log_base[1])
                read_records = int(s.get("read_records", 0))
                read_bytes = int(s.get("read_bytes", 0))
            except Exception:  # noqa: BLE001 - a log in trouble must not stop the stats
                pass
        return {"records": records, "bytes": written, "read_records": read_records,
                "read_bytes": read_bytes, "disk_bytes": disk}

    def _rate_values(self, totals: tuple[int, int, int, int], log_: dict[str, int] | None = None) -> tuple[int, ...]:
        st = self.router.stats
        log_ = log_ or {"records": 0, "bytes": 0}
        return (*totals, st.mesh_msgs_in, st.mesh_msgs_out, st.mesh_bytes_in, st.mesh_bytes_out,
                log_["records"], log_["bytes"], st.connects_total)

    def snapshot(self, lag: float = 0.0) -> dict[str, Any]:
        router = self.router
        st = router.stats
        now = time.monotonic()
        totals = self._totals()
        log_ = self._log()
        self.rates.push(now, self._rate_values(totals, log_))
        # The count walks every session (0.36 ms for 6,000; most of an idle worker's CPU): done
        # again only when something that can change it moved, and every PENDING_RECOUNT snapshots.
        pending_key = (*router.pending_moves(), totals[0], totals[1])  # PUBLISHes in and out
        if (pending_key != self._pending_key or self.seq % PENDING_RECOUNT == 0) and self._counting is None:
            self._pending_key = pending_key
            # Thousands of sessions are counted a slice per loop iteration, shown when done.
            self._counting = fold_in_slices(self.loop, router.session_list(), (0, 0), self._count, self._counted,
                                            RANK_SLICE)
        queued, inflight = self._pending
        counts = router.counts()
        peers = {
            peer: {"msgs_out": s[0], "bytes_out": s[1], "msgs_in": s[2], "bytes_in": s[3]}
            for peer, s in router.peer_stats().items()
        }
        try:
            cpu_times = self.process.cpu_times()
            self.process_figures = (self.process.memory_info().rss, cpu_times.user + cpu_times.system,
                                    self.process.cpu_percent(None))
        except (psutil.Error, OSError):
            # A worker holding as many clients as its open files allow cannot open /proc (EMFILE):
            # the snapshot goes out with the last figures read, not without its counts.
            pass
        mem, cpu_seconds, cpu_percent = self.process_figures
        self.seq += 1
        return {
            "v": SCHEMA_VERSION,
            "kind": "router",
            "node": self.config.node_id,
            "router": self.name,
            "router_id": router.router_id,
            "index": self.index,
            "routers": self.config.workers,
            "version": __version__,
            "pid": os.getpid(),
            "seq": self.seq,
            "ts": time.time(),
            "uptime": now - self.started,
            "interval": self.interval,
            "clients": {
                "connected": st.connections,
                "sockets": len(self.connections),
                "unconnected": st.unconnected,
                "sessions": counts["sessions"],
                "connects_total": st.connects_total,
                "refused_total": st.refused_connections,
                "protocol_errors_total": st.protocol_errors,
                "max": router.max_connections,
            },
            "auth": {"failures_total": st.auth_failures, "denied_total": st.acl_denied},
            "subscriptions": counts["subscriptions"],
            "filters": counts["filters"],
            "interest": counts["interest"],  # (filter, peer router) pairs this router forwards by
            "shared": {"groups": counts["shared_groups"], "members": counts["shared_members"],
                       "routes": counts["shared_routes"], "no_member_total": st.shared_no_member},
            "retained": counts["retained"],
            "traffic": {
                "clients": {"msgs_in": totals[0], "msgs_out": totals[1],
                            "bytes_in": totals[2], "bytes_out": totals[3]},
                "mesh": {"msgs_in": st.mesh_msgs_in, "msgs_out": st.mesh_msgs_out,
                         "bytes_in": st.mesh_bytes_in, "bytes_out": st.mesh_bytes_out,
                         "frames_in": st.mesh_frames_in, "frames_out": st.mesh_frames_out,
                         "bad_frames": st.mesh_bad_frames, "peers": peers},
                "log": log_,
            },
            "rates": self.rates.rates(),
            "inflight": inflight,
            "refused_log_unavailable_total": st.refused_log_unavailable,
            "queued": queued,
            "drops": {reason: getattr(st, f"drop_{reason}") for reason in DROP_REASONS},
            "droppers": self._droppers(),  # (first: it sets the count below)
            "sessions_dropping": self._dropping[0],
            "limits": {name: getattr(st, f"limit_{name}") for name in LIMITS},
            "process": {"cpu_percent": cpu_percent, "cpu_seconds": cpu_seconds, "rss_bytes": mem},
            "loop_lag": lag,
            "top": self._top(),
            # Peer routers' stats sockets that can be read from elsewhere (`brokerd stats --cluster`).
            "peer_stats": router.peer_stats_endpoints(),
            # Peers its links cannot join: their CURVE handshake fails (another --mesh-key).
            "mesh_refused": router.mesh_refused(),
            # This router's log's followers and the replicas it holds (cluster.replication).
            "replication": self.replication.stats() if self.replication is not None else None,
        }

    def connection_list(self) -> dict[str, Any]:
        clients = list(self.router.clients())
        chosen = heapq.nlargest(CONNECTIONS_MAX, clients, key=client_bytes)
        return {"v": SCHEMA_VERSION, "kind": "connections", "node": self.config.node_id, "router": self.name,
                "router_id": self.router.router_id, "index": self.index, "ts": time.time(), "total": len(clients),
                "connections": [client_row(c) for c in chosen]}

    # -- $SYS -------------------------------------------------------------------------------------


# Names callers import from here, each kept where it lives (the schema, the figures, the
# addresses in ``paths``).
__all__ = ["CONNECTIONS_MAX", "DROP_REASONS", "SCHEMA_VERSION", "SYS_CLIENT_ID", "TOPIC_CONNECTIONS", "TOPIC_NODE",
           "TOPIC_SNAPSHOT", "TOP_N", "ConnectionSet", "RateRing", "SlicedFold", "StatsPublisher", "broker_sys_values",
           "effective_interval", "fold_in_slices", "node_endpoint", "router_endpoint", "router_sys_values",
           "zmq_host"]
