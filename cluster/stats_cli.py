"""`brokerd stats`: the routers of the local nodes as a table (once, or live like `top`), JSON, connections.

It reads the routers' own stats sockets (``cluster.stats``), so it needs nothing from the broker but
where they are. Without options it finds every broker running on this host by itself: each holds a
lock in its run directory (``cluster.paths.local_nodes``), and writes there what a reader needs
(``node.json``: router count, stats endpoints). The broker's own options (``--node-id``,
``--listen``/``--port``, ``--stats-port``, or ``--config FILE``) pick one node as before;
``--node HOST:PORT`` reads a remote node whose ``--stats-port`` is PORT (router i on PORT+i);
``--cluster`` reads every node found here and every ``--node``, then the mesh's other nodes at the
stats sockets they advertise (started with ``--stats-port``), and names those it cannot read.

It waits, bounded, for one snapshot from each router: router 0 (and every endpoint it knows) first;
each snapshot names the node's router count, so the others are found from it. The tables are drawn
with ``rich``: they fit the terminal's width (columns of least use go first), and ``--watch`` redraws
in place, on the terminal's alternate screen like ``top``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

import msgpack
import zmq

from .config import Config, ConfigError, build_parser, load
from .paths import LocalNode, local_nodes, read_node_file, run_base, run_dir
from .stats import SCHEMA_VERSION, TOPIC_CONNECTIONS, TOPIC_SNAPSHOT, effective_interval, router_endpoint

WAIT_SLACK_S = 2.0
WIDE = 1000  # the width when stdout is not a terminal and COLUMNS is not set: every column


# -- human units ------------------------------------------------------------------------------------

def human_count(n: float) -> str:
    """1234 → '1.2k' (SI); below 10, rates keep one decimal."""
    if abs(n) < 1000:
        return f"{n:.1f}" if isinstance(n, float) and 0 < abs(n) < 10 else f"{n:.0f}"
    for unit in ("k", "M", "G", "T"):
        n /= 1000.0
        if abs(n) < 1000:
            return f"{n:.1f}{unit}"
    return f"{n:.1f}P"


def human_bytes(n: float) -> str:
    """1536 → '1.5K' (powers of 1024, like top)."""
    if abs(n) < 1024:
        return f"{n:.0f}B"
    for unit in ("K", "M", "G", "T"):
        n /= 1024.0
        if abs(n) < 1024:
            return f"{n:.1f}{unit}"
    return f"{n:.1f}P"


def human_rate(n: float) -> str:
    """Bytes per second: 1536 → '1.5KB/s' (K = 1024)."""
    text = human_bytes(n)
    return f"{text}/s" if text.endswith("B") else f"{text}B/s"


def human_duration(s: float) -> str:
    s = int(s)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


# -- tables -----------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Column:
    header: str
    cell: Callable[[dict[str, Any]], str]
    keep: int  # what goes first when the terminal is narrow: the highest number
    left: bool = False
    max_width: int | None = None  # longer cells end in an ellipsis


def _rates(s: dict[str, Any]) -> dict[str, float]:
    rates: dict[str, float] = s.get("rates", {}).get("1s", {})  # (a snapshot's msgpack: untyped)
    return rates


def _drops(s: dict[str, Any]) -> int:
    return sum(s.get("drops", {}).values())


# A row is a dict: "name" and "pid"/"uptime" (strings or absent) plus a snapshot or an aggregate.
TRAFFIC_COLUMNS = [
    Column("CLIENTS", lambda s: human_count(s["clients"]["connected"]), 1),
    Column("SUBS", lambda s: human_count(s["subscriptions"]), 6),
    Column("MSG IN/s", lambda s: human_count(_rates(s).get("msgs_in", 0.0)), 1),
    Column("MSG OUT/s", lambda s: human_count(_rates(s).get("msgs_out", 0.0)), 1),
    Column("IN", lambda s: human_rate(_rates(s).get("bytes_in", 0.0)), 2),
    Column("OUT", lambda s: human_rate(_rates(s).get("bytes_out", 0.0)), 2),
    Column("MESH IN", lambda s: human_rate(_rates(s).get("mesh_bytes_in", 0.0)), 7),
    Column("MESH OUT", lambda s: human_rate(_rates(s).get("mesh_bytes_out", 0.0)), 7),
    Column("INFLIGHT", lambda s: human_count(s["inflight"]), 8),
    Column("QUEUED", lambda s: human_count(s["queued"]), 5),
    Column("DROPS", lambda s: human_count(_drops(s)), 3),
    Column("CPU%", lambda s: f"{s['process']['cpu_percent']:.1f}", 3),
    Column("RSS", lambda s: human_bytes(s["process"]["rss_bytes"]), 4),
    Column("LAG", lambda s: f"{s.get('loop_lag', 0.0) * 1000:.1f}ms", 6),
]
ROUTER_COLUMNS = [
    Column("ROUTER", lambda s: s["_name"], 0, left=True),
    Column("PID", lambda s: s.get("_pid", ""), 9),
    Column("UPTIME", lambda s: s.get("_uptime", ""), 9),
    *TRAFFIC_COLUMNS,
]
NODE_COLUMNS = [
    Column("NODE", lambda s: s["_name"], 0, left=True),
    Column("ROUTERS", lambda s: s.get("_routers", ""), 2),
    Column("UPTIME", lambda s: s.get("_uptime", ""), 9),
    *TRAFFIC_COLUMNS,
]
CONNECTION_COLUMNS = [
    Column("CLIENT", lambda r: r["client_id"], 0, left=True, max_width=36),
    Column("ROUTER", lambda r: r["_router"], 0, left=True),
    Column("PEER", lambda r: r["peer"], 4, left=True),
    Column("BYTES IN", lambda r: human_bytes(r["bytes_in"]), 1),
    Column("BYTES OUT", lambda r: human_bytes(r["bytes_out"]), 1),
    Column("MSGS IN", lambda r: human_count(r["msgs_in"]), 2),
    Column("MSGS OUT", lambda r: human_count(r["msgs_out"]), 2),
    Column("QUEUED", lambda r: human_count(r["queued"]), 3),
    Column("INFLIGHT", lambda r: human_count(r["inflight"]), 3),
]

# --sort KEY: what it sorts by (descending; names ascending).
ROUTER_SORTS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "clients": lambda s: s["clients"]["connected"],
    "subs": lambda s: s["subscriptions"],
    "msgs-in": lambda s: _rates(s).get("msgs_in", 0.0),
    "msgs-out": lambda s: _rates(s).get("msgs_out", 0.0),
    "bytes-in": lambda s: _rates(s).get("bytes_in", 0.0),
    "bytes-out": lambda s: _rates(s).get("bytes_out", 0.0),
    "mesh-in": lambda s: _rates(s).get("mesh_bytes_in", 0.0),
    "mesh-out": lambda s: _rates(s).get("mesh_bytes_out", 0.0),
    "queued": lambda s: s["queued"],
    "inflight": lambda s: s["inflight"],
    "drops": _drops,
    "cpu": lambda s: s["process"]["cpu_percent"],
    "rss": lambda s: s["process"]["rss_bytes"],
    "lag": lambda s: s.get("loop_lag", 0.0),
}
CONNECTION_SORTS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "bytes": lambda r: r["bytes_in"] + r["bytes_out"],
    "bytes-in": lambda r: r["bytes_in"],
    "bytes-out": lambda r: r["bytes_out"],
    "msgs-in": lambda r: r["msgs_in"],
    "msgs-out": lambda r: r["msgs_out"],
    "queued": lambda r: r["queued"],
    "inflight": lambda r: r["inflight"],
}
NAME_SORTS = ("router", "node", "client")


def fit_columns(columns: list[Column], rows: list[dict[str, Any]], width: int) -> list[Column]:
    """The columns to show in ``width`` characters: those of least use go first, in ``keep`` order."""
    def need(col: Column) -> int:
        w = max([len(col.header), *(len(col.cell(r)) for r in rows)])
        return min(w, col.max_width) if col.max_width else w

    widths = {col.header: need(col) for col in columns}
    shown = list(columns)
    while len(shown) > 1 and sum(widths[c.header] for c in shown) + 2 * (len(shown) - 1) > width:
        drop = max((c for c in shown if c.keep > 0), key=lambda c: c.keep, default=None)
        if drop is None:
            break
        shown.remove(drop)
    return shown


def make_table(columns: list[Column], rows: list[dict[str, Any]], width: int) -> Any:
    """A rich Table of ``rows``, the columns that fit ``width``: plain, one line per row."""
    from rich.table import Table

    table = Table(box=None, pad_edge=False, show_edge=False, padding=(0, 2, 0, 0), header_style="bold",
                  collapse_padding=True, expand=False)
    shown = fit_columns(columns, rows, width)
    for col in shown:
        table.add_column(col.header, justify="left" if col.left else "right", no_wrap=True,
                         overflow="ellipsis", max_width=col.max_width)
    for row in rows:
        table.add_row(*(col.cell(row) for col in shown), style="bold" if row.get("_total") else None)
    return table


def _sum_snapshots(snaps: list[dict[str, Any]]) -> dict[str, Any]:
    """The aggregate of routers of one or more nodes (each node's through ``NodeStats``)."""
    from .metrics import NodeStats, sum_trees

    by_node: dict[str, list[dict[str, Any]]] = {}
    for s in snaps:
        by_node.setdefault(s["node"], []).append(s)
    aggregates = []
    for node, members in by_node.items():
        agg = NodeStats(node, max(s["routers"] for s in members), 1.0)
        for s in members:
            agg.update(s)
        aggregates.append(agg.aggregate())
    total = sum_trees(aggregates) if aggregates else NodeStats("", 0, 1.0).aggregate()
    total.setdefault("process", {"cpu_percent": 0.0, "rss_bytes": 0})
    total["loop_lag"] = max((s.get("loop_lag", 0.0) for s in snaps), default=0.0)
    return total


def _sorted(items: list[dict[str, Any]], sort: str | None, sorts: dict[str, Callable], name: Callable) -> list:
    if sort and sort in sorts:
        return sorted(items, key=lambda s: (-sorts[sort](s), name(s)))
    return sorted(items, key=name)


def _summary(snaps: list[dict[str, Any]], total: dict[str, Any], routers: int, what: str) -> list[str]:
    t = total["traffic"]
    c, m = t["clients"], t["mesh"]
    load = total.get("rates", {})
    return [
        f"brokerd stats  {what}  routers {len(snaps)}/{routers}  clients {total['clients']['connected']}  "
        f"{time.strftime('%H:%M:%S')}",
        f"since start: msgs in {human_count(c['msgs_in'])} out {human_count(c['msgs_out'])}  "
        f"bytes in {human_bytes(c['bytes_in'])} out {human_bytes(c['bytes_out'])}  "
        f"drops {human_count(sum(total['drops'].values()))}",
        f"mesh since start: msgs in {human_count(m['msgs_in'])} out {human_count(m['msgs_out'])}  "
        "msgs in/s 1/5/15 min: " + " ".join(human_count(load.get(w, {}).get("msgs_in", 0.0))
                                            for w in ("1min", "5min", "15min")),
    ]


def _render(lines: list[str], table: Any, notes: Iterable[str] = ()) -> Any:
    from rich.console import Group
    from rich.text import Text

    return Group(*(Text(line) for line in lines), Text(""), table, *(Text(n) for n in notes))


def to_text(renderable: Any, width: int = WIDE) -> str:
    """What ``renderable`` looks like, plain, in ``width`` columns (lines end without blanks)."""
    console = _console(width, record=True)
    with console.capture() as capture:
        console.print(renderable)
    return "\n".join(line.rstrip() for line in capture.get().rstrip("\n").splitlines())


def render_routers(snaps: list[dict[str, Any]], missing: Iterable[str] = (), *, width: int = WIDE,
                   sort: str | None = None) -> str:
    return to_text(routers_view(snaps, missing, width=width, sort=sort), width)


def render_connections(lists: list[dict[str, Any]], limit: int = 0, *, width: int = WIDE,
                       sort: str | None = None) -> str:
    return to_text(connections_view(lists, limit, width=width, sort=sort), width)


def routers_view(snaps: list[dict[str, Any]], missing: Iterable[str] = (), *, width: int = WIDE,
                 sort: str | None = None) -> Any:
    """One table of routers (of one node or more): rows, a TOTAL line, the counters since start."""
    nodes = sorted({s["node"] for s in snaps})
    multi = len(nodes) > 1
    routers = sum(max((s["routers"] for s in snaps if s["node"] == n), default=0) for n in nodes)
    total = _sum_snapshots(snaps)
    rows = [{**s, "_name": s["router_id"] if multi else s["router"], "_pid": str(s["pid"]),
             "_uptime": human_duration(s["uptime"])} for s in snaps]
    rows = _sorted(rows, sort, ROUTER_SORTS, lambda s: (s["node"], s["index"]))
    rows.append({**total, "_name": "TOTAL", "_total": True})
    what = f"node{'s' if multi else ''} {', '.join(nodes)}"
    missing = list(missing)
    notes = [f"no snapshot from: {', '.join(missing)}"] if missing else []
    notes += refused_lines(snaps)
    notes += replication_lines(sorted(snaps, key=lambda s: (s["node"], s["index"])))
    return _render(_summary(snaps, total, routers, what), make_table(ROUTER_COLUMNS, rows, width), notes)


def refused_lines(snaps: Iterable[dict[str, Any]]) -> list[str]:
    """The peers a node's routers cannot join (the CURVE handshake fails: another --mesh-key), one
    line per node: a node refused by its peers runs alone, and its table alone would not say so."""
    by_node: dict[str, dict[str, str]] = {}
    for s in snaps:
        by_node.setdefault(s["node"], {}).update(s.get("mesh_refused") or {})
    return [f"mesh {node}: not joined: " + ", ".join(f"{peer} (CURVE handshake failed: {why}; another "
                                                     "--mesh-key?)" for peer, why in sorted(refused.items()))
            for node, refused in sorted(by_node.items()) if refused]


def replication_lines(snaps: Iterable[dict[str, Any]]) -> list[str]:
    """Per router with replication: whether its node is cut off from the majority, its log's
    high-water mark, held acknowledgements, and each follower's lag and whether it is in sync;
    then the replicas it holds for other routers (their offsets, how many of their sessions, and
    whether the records below their start are being fetched)."""
    lines = []
    for s in snaps:
        r = s.get("replication")
        if not r:
            continue
        parts = []
        if r["factor"] > 1:
            followers = ", ".join(
                f"{f} lag {human_count(v['lag_records'])}"
                f"{' ~' + human_bytes(v['lag_bytes']) if v['lag_records'] and v.get('lag_bytes') else ''}"
                f" ({'in sync' if v['in_sync'] else 'out of sync'})"
                for f, v in sorted(r["followers"].items())) or "none live"
            parts.append(f"R {r['factor']} min-insync {r['required']}/{r['min_insync']}  end {r['end']}  "
                         f"high-water {r['high_water']}  held {r['held']}  refused {r['refused_total']}  "
                         f"followers: {followers}")
        if r.get("history"):
            parts.append(f"fetching its records below {r['history']['below']} back (at {r['history']['next']})")
        if r["replicas"]:
            sessions = r.get("sessions", {})
            parts.append("replicas: " + ", ".join(
                f"{p} {v.get('start', 0)}..{v['end']}" + (f" ({sessions[p]} session(s))" if sessions.get(p) else "")
                + (f" (fetching below {v['history']['below']}, at {v['history']['next']})" if v.get("history") else "")
                for p, v in sorted(r["replicas"].items())))
        if not r.get("majority", True):
            lease = r.get("lease") or {}
            backing = f" ({lease['backing']} answer its heartbeats)" if "backing" in lease else ""
            parts.insert(0, f"CUT OFF: no majority of the {r.get('members', '?')} member nodes{backing}, QoS 1/2 "
                            "not acknowledged")
        if parts:
            lines.append(f"replication {s['router_id']}: " + "  ".join(parts))
    return lines


def cluster_view(snaps: list[dict[str, Any]], unreachable: Iterable[str] = (), missing: Iterable[str] = (),
                   *, width: int = WIDE, sort: str | None = None) -> Any:
    """One row per node (its routers added up), a TOTAL line, and the mesh's nodes without stats."""
    by_node: dict[str, list[dict[str, Any]]] = {}
    for s in snaps:
        by_node.setdefault(s["node"], []).append(s)
    rows = []
    routers = 0
    for node, members in by_node.items():
        agg = _sum_snapshots(members)
        count = max(s["routers"] for s in members)
        routers += count
        rows.append({**agg, "node": node, "_name": node, "_routers": f"{len(members)}/{count}",
                     "_uptime": human_duration(max(s["uptime"] for s in members))})
    rows = _sorted(rows, sort, ROUTER_SORTS, lambda r: r["node"])
    total = _sum_snapshots(snaps)
    rows.append({**total, "_name": "TOTAL", "_routers": f"{len(snaps)}/{routers}", "_total": True})
    notes = []
    unreachable = sorted(unreachable)
    if unreachable:
        notes.append(f"in the mesh, no stats read: {', '.join(unreachable)} (on another host: add --node "
                     "HOST:STATS_PORT for each)")
    missing = list(missing)
    if missing:
        notes.append(f"no snapshot from: {', '.join(missing)}")
    notes += refused_lines(snaps)
    what = f"cluster of {len(by_node) + len(unreachable)} node{'s' if len(by_node) + len(unreachable) != 1 else ''}"
    return _render(_summary(snaps, total, routers, what), make_table(NODE_COLUMNS, rows, width), notes)


def connection_rows(lists: Iterable[dict[str, Any]], sort: str | None = None) -> list[dict[str, Any]]:
    """Every connection of every router's list, with its router; most bytes (in + out) first."""
    lists = list(lists)
    multi = len({cl["node"] for cl in lists}) > 1
    rows = [{"router": cl["router"], "router_id": cl["router_id"],
             "_router": cl["router_id"] if multi else cl["router"], **c}
            for cl in lists for c in cl["connections"]]
    if sort in ("client", "router"):
        return sorted(rows, key=lambda r: (r["client_id"], r["router_id"]) if sort == "client"
                      else (r["router_id"], r["client_id"]))
    key = CONNECTION_SORTS.get(sort or "bytes", CONNECTION_SORTS["bytes"])
    rows.sort(key=lambda r: (-key(r), r["client_id"]))
    return rows


def connections_view(lists: list[dict[str, Any]], limit: int = 0, *, width: int = WIDE,
                     sort: str | None = None) -> Any:
    rows = connection_rows(lists, sort)
    total = sum(cl["total"] for cl in lists)
    shown = rows[:limit] if limit else rows
    lines = [f"brokerd connections  {total} connected on {len(lists)} routers  {time.strftime('%H:%M:%S')}"]
    notes = [f"({total - len(shown)} more not shown)"] if len(shown) < total else []
    return _render(lines, make_table(CONNECTION_COLUMNS, shown, width), notes)


# -- reading the sockets ----------------------------------------------------------------------------

class StatsReader:
    """SUB sockets on a node's routers; finds the routers it was not told about from snapshots.

    ``run_path``: the node's run directory when it is not this user's own (found by ``local_nodes``)."""

    def __init__(self, config: Any, node: tuple[str, int] | None = None, *, connections: bool = False,
                 workers: int | None = None, run_path: str | None = None) -> None:
        if node is not None:
            config = dataclasses.replace(config, stats_port=node[1])
        self.config = config
        self.host = node[0] if node is not None else None
        self.run_path = run_path or run_dir(config)
        # What tells this node from others of the same id (two brokers "t" on one host, on two ports).
        self.label = f"{node[0]}:{node[1]}" if node is not None else os.path.basename(self.run_path)
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.IPV6, 1)
        self.sub.setsockopt(zmq.SUBSCRIBE, TOPIC_SNAPSHOT)
        if connections:
            self.sub.setsockopt(zmq.SUBSCRIBE, TOPIC_CONNECTIONS)
        self.endpoints: dict[int, str] = {}
        self.routers: int | None = workers
        self.interval = effective_interval(config)
        for i in self._initial_indices(workers):
            self._connect(i)

    def _initial_indices(self, workers: int | None) -> set[int]:
        indices = {0}
        if workers:
            indices.update(range(workers))
        if not self.config.stats_port:
            try:
                names = os.listdir(self.run_path)
            except OSError:
                names = []
            for name in names:
                if name.startswith("w") and name.endswith(".stats") and name[1:-6].isdigit():
                    indices.add(int(name[1:-6]))
        return indices

    def endpoint(self, index: int) -> str:
        if not self.config.stats_port:
            return f"ipc://{self.run_path}/w{index}.stats"
        return router_endpoint(self.config, index, host=self.host)

    def _connect(self, index: int) -> None:
        if index not in self.endpoints:
            endpoint = self.endpoint(index)
            self.endpoints[index] = endpoint
            self.sub.connect(endpoint)

    def expected(self) -> list[int]:
        return list(range(self.routers)) if self.routers else sorted(self.endpoints)

    def wait_bound(self) -> float:
        return 2 * self.interval + WAIT_SLACK_S

    def receive(self, timeout: float) -> list[tuple[bytes, dict[str, Any]]]:
        """What arrives within ``timeout`` seconds (at least one message, unless it times out)."""
        if not self.sub.poll(int(max(0.0, timeout) * 1000)):
            return []
        return self.drain()

    def drain(self) -> list[tuple[bytes, dict[str, Any]]]:
        """What has arrived (without waiting)."""
        out: list[tuple[bytes, dict[str, Any]]] = []
        while True:
            try:
                topic, data = self.sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return out
            try:
                body = msgpack.unpackb(data, raw=False)
            except (ValueError, msgpack.UnpackException):
                continue
            if not isinstance(body, dict) or body.get("v") != SCHEMA_VERSION:
                continue  # a router of another schema version: not ours to guess
            if topic == TOPIC_SNAPSHOT:
                routers = body.get("routers")
                if isinstance(routers, int) and routers > 0:
                    if self.routers is None or routers > self.routers:
                        self.routers = routers
                    for i in range(routers):
                        self._connect(i)
                interval = body.get("interval")
                if isinstance(interval, (int, float)) and interval > self.interval:
                    self.interval = float(interval)
            out.append((topic, body))

    def collect(self, topic: bytes = TOPIC_SNAPSHOT) -> tuple[dict[int, dict[str, Any]], list[int]]:
        """One message of kind ``topic`` from each router: (index → body, indices that stayed silent)."""
        got, missing = Readers([self]).collect(topic)
        return {i: body for (_, i), body in got.items()}, [i for _, i in missing]

    def close(self) -> None:
        self.sub.close(0)
        self.ctx.term()


class Readers:
    """Several nodes' StatsReaders, read together."""

    def __init__(self, readers: list[StatsReader]) -> None:
        self.readers = readers
        self.poller = zmq.Poller()
        for r in readers:
            self.poller.register(r.sub, zmq.POLLIN)

    @property
    def interval(self) -> float:
        return max((r.interval for r in self.readers), default=1.0)

    def wait_bound(self) -> float:
        return max((r.wait_bound() for r in self.readers), default=WAIT_SLACK_S)

    def receive(self, timeout: float) -> list[tuple[tuple[str, int], bytes, dict[str, Any]]]:
        """What arrives within ``timeout`` seconds: ((node label, router index), topic, body)."""
        ready = dict(self.poller.poll(int(max(0.0, timeout) * 1000)))
        out = []
        for r in self.readers:
            if r.sub in ready:
                out += [((r.label, body.get("index", -1)), t, body) for t, body in r.drain()]
        return out

    def expected(self) -> list[tuple[StatsReader, int]]:
        return [(r, i) for r in self.readers for i in r.expected()]

    def complete(self, keys: Iterable[tuple[str, int]]) -> bool:
        """Whether ``keys`` ((label, index) pairs) cover every router of every reader."""
        have = set(keys)
        return all(r.routers is not None for r in self.readers) and \
            all((r.label, i) in have for r, i in self.expected())

    def collect(self, topic: bytes = TOPIC_SNAPSHOT) -> tuple[dict[tuple[str, int], dict[str, Any]],
                                                              list[tuple[str, int]]]:
        """One message of kind ``topic`` from each router of each node: ((label, index) → body, the
        (label, index) pairs that stayed silent)."""
        got: dict[tuple[str, int], dict[str, Any]] = {}
        start = time.monotonic()
        while True:
            left = start + self.wait_bound() - time.monotonic()
            for key, t, body in self.receive(left):
                if t == topic:
                    got[key] = body
            if self.complete(got):
                return got, []
            if left <= 0:
                return got, [(r.label, i) for r, i in self.expected() if (r.label, i) not in got]

    def where(self, missing: Iterable[tuple[str, int]]) -> list[str]:
        by_label = {r.label: r for r in self.readers}
        return [f"{label} w{i} ({by_label[label].endpoints.get(i, '?')})" for label, i in missing]

    def close(self) -> None:
        for r in self.readers:
            r.close()


# -- finding the nodes ------------------------------------------------------------------------------

LOCATING = ("--listen", "--port", "--config", "--stats-port")  # the options that name one local node


def _gives(argv: list[str], flags: Iterable[str]) -> bool:
    return any(a == f or a.startswith(f + "=") for a in argv for f in flags)


def _found_config(base: Config, node: LocalNode) -> tuple[Config, int | None]:
    """A found node's Config (for its endpoints) and its router count, from its ``node.json``."""
    info = read_node_file(node.path) or {}
    listen = info.get("listen")
    config = dataclasses.replace(
        base, node_id=info.get("node") or node.node_id,
        listen=(str(listen[0]), int(listen[1])) if isinstance(listen, list) and len(listen) == 2
        else (base.listen[0], node.port),
        stats_port=info.get("stats_port") if isinstance(info.get("stats_port"), int) else None)
    interval = info.get("stats_interval")
    if isinstance(interval, (int, float)) and interval > 0:
        config = dataclasses.replace(config, stats_interval=float(interval))
    workers = info.get("workers")
    return config, workers if isinstance(workers, int) and workers > 0 else None


def _not_readable(nodes: list[LocalNode]) -> str:
    paths = ", ".join(n.path for n in nodes)
    return (f"cannot read {paths}: another user's run directory (run brokerd stats as that user or as "
            "root, or start the broker with BROKERD_RUN_DIR set to a directory you may read)")


# -- the command ------------------------------------------------------------------------------------

def _own_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--watch", action="store_true", help="redraw live, like top, until Ctrl-C")
    p.add_argument("--json", action="store_true", help="print one JSON object per snapshot (one per line)")
    p.add_argument("--connections", action="store_true",
                   help="list client connections (router, bytes, queued, inflight), most bytes first")
    p.add_argument("--cluster", action="store_true",
                   help="one row per node: every node running on this host and every --node, and the "
                   "mesh's other nodes named")
    p.add_argument("--node", metavar="HOST:PORT", action="append",
                   help="read a remote node: HOST and its --stats-port PORT (router i on PORT+i); repeatable")
    p.add_argument("--run-dir", metavar="DIR",
                   help="where the brokers' run directories are (the broker's BROKERD_RUN_DIR; default "
                   "$BROKERD_RUN_DIR, else $TMPDIR/brokerd-<uid> of every user)")
    p.add_argument("--sort", metavar="KEY",
                   help="sort rows by KEY, largest first: " + ", ".join(ROUTER_SORTS) + " (routers, nodes); "
                   + ", ".join(CONNECTION_SORTS) + ", client, router (--connections; default bytes)")
    p.add_argument("--limit", type=int, default=0, metavar="N", help="with --connections: show the first N")
    return p


def build_stats_parser() -> argparse.ArgumentParser:
    """For --help: our options, then the broker's (which locate the local node)."""
    p = argparse.ArgumentParser(
        prog="brokerd stats", parents=[_own_parser(), build_parser()], add_help=False, conflict_handler="resolve",
        description="Show the routers of the brokerd nodes running on this host (found by themselves): one "
        "table, --watch (live), --json, --connections, --cluster. The broker's own options (--listen/--port, "
        "--stats-port or --config FILE, as the broker was started with) pick one local node, --node-id "
        "keeps one node's; --node HOST:PORT reads a remote one.")
    p.add_argument("-h", "--help", action="help", help="show this help and exit")
    return p


def _parse_node(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--node: invalid value {value!r} (expected HOST:PORT, PORT the node's --stats-port)")
    return host.strip("[]"), int(port)


def _explicit_workers(argv: list[str], config: Config) -> int | None:
    """The router count the user named (``--workers`` or ``BROKERD_WORKERS``), else None: the
    default would be this machine's CPUs, not the broker's workers."""
    if _gives(argv, ["--workers"]) or os.environ.get("BROKERD_WORKERS"):
        return config.workers
    return None


class _Args(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def terminal_width() -> int:
    """COLUMNS if set, else the terminal's width, else (a pipe, a file) wide enough for every column."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return WIDE


def main(argv: list[str]) -> int:
    if "-h" in argv or "--help" in argv:
        build_stats_parser().print_help()
        return 0
    try:
        own, rest = _Args(parents=[_own_parser()], add_help=False, allow_abbrev=False).parse_known_args(argv)
        if own.run_dir:
            os.environ["BROKERD_RUN_DIR"] = own.run_dir  # as the broker's: run_dir() reads it
        config = load(rest)
        nodes = [_parse_node(n) for n in own.node or ()]
        if own.limit < 0:
            raise ConfigError(f"--limit: invalid value {own.limit} (expected 0 or more)")
        sorts = {**CONNECTION_SORTS} if own.connections else {**ROUTER_SORTS}
        if own.sort is not None and own.sort not in sorts and own.sort not in NAME_SORTS:
            raise ConfigError(f"--sort: invalid value {own.sort!r} (choose from "
                              f"{', '.join([*sorts, *NAME_SORTS])})")
        readers, notes = _readers(own, rest, config, nodes)
    except ConfigError as exc:
        print(f"brokerd stats: error: {exc}", file=sys.stderr)
        return 2
    if not readers:
        print(f"brokerd stats: {notes[0] if notes else 'no brokerd found'}", file=sys.stderr)
        return 1
    for note in notes:
        print(f"brokerd stats: note: {note}", file=sys.stderr)
    if own.cluster:
        readers, notes = _this_cluster(readers, own, rest, config)
        for note in notes:
            print(f"brokerd stats: note: {note}", file=sys.stderr)
    group = Readers(readers)
    try:
        if own.watch:
            return _watch(group, own)
        return _once(group, own)
    except KeyboardInterrupt:
        return 0
    finally:
        group.close()


def _readers(own: argparse.Namespace, rest: list[str], config: Config,
             nodes: list[tuple[str, int]]) -> tuple[list[StatsReader], list[str]]:
    """The nodes to read, and notes for stderr (the first one says why, when there is none)."""
    workers = _explicit_workers(rest, config)
    readers = [StatsReader(config, node, connections=own.connections, workers=workers) for node in nodes]
    explicit = _gives(rest, LOCATING)
    if explicit and not own.cluster:
        return [StatsReader(config, connections=own.connections, workers=workers)], []
    if nodes and not own.cluster:
        return readers, []
    found = local_nodes()
    if _gives(rest, ["--node-id"]) and not own.cluster:
        found = [n for n in found if n.node_id == config.node_id]
    readable = [n for n in found if n.readable]
    for n in readable:
        node_config, node_workers = _found_config(config, n)
        readers.append(StatsReader(node_config, connections=own.connections, workers=node_workers,
                                   run_path=n.path if not node_config.stats_port else None))
    if explicit and own.cluster and not any(r.run_path == run_dir(config) for r in readers):
        readers.append(StatsReader(config, connections=own.connections, workers=workers))
    notes = []
    if not readers:
        unreadable = [n for n in found if not n.readable]
        if unreadable:
            notes.append(_not_readable(unreadable))
        else:
            where = run_base() if os.environ.get("BROKERD_RUN_DIR") else f"{run_base()} (nor any other user's)"
            who = f" with --node-id {config.node_id}" if _gives(rest, ["--node-id"]) else ""
            notes.append(f"no brokerd running here{who}: no live run directory in {where}; give --node "
                         "HOST:PORT for a remote node, or --run-dir DIR if the broker has BROKERD_RUN_DIR")
    return readers, notes


def _this_cluster(readers: list[StatsReader], own: argparse.Namespace, rest: list[str],
                  config: Config) -> tuple[list[StatsReader], list[str]]:
    """``--cluster``: the nodes of one cluster, and notes for stderr. Every broker on this host is
    found, but only those that met in one mesh (their snapshots' mesh peers) are one cluster: an
    unrelated broker beside it is left out, and named. The cluster is the one of the nodes named
    (``--node``, ``--node-id``, the broker's own options), else the largest found here."""
    got, _ = Readers(readers).collect(TOPIC_SNAPSHOT)
    links: dict[str, set[str]] = {}
    node_of: dict[str, str] = {}  # reader label → node id
    for (label, _), body in got.items():
        node = str(body.get("node"))
        node_of[label] = node
        mesh = body.get("traffic", {}).get("mesh", {})
        peers = {str(rid).rpartition("/")[0] for rid in [*mesh.get("peers", {}), *(body.get("peer_stats") or {})]}
        peers.discard("")
        peers.discard(node)
        links.setdefault(node, set()).update(peers)
        for peer in peers:
            links.setdefault(peer, set()).add(node)
    clusters: list[set[str]] = []
    for node in sorted({*node_of.values()}):
        if any(node in c for c in clusters):
            continue
        cluster, todo = set(), [node]
        while todo:
            n = todo.pop()
            if n not in cluster:
                cluster.add(n)
                todo.extend(links.get(n, ()))
        clusters.append(cluster)
    located = _gives(rest, LOCATING)
    named = {node_of.get(r.label) for r in readers
             if r.host is not None or (located and r.run_path == run_dir(config))}
    if _gives(rest, ["--node-id"]):
        named.add(config.node_id)
    chosen = [c for c in clusters if c & named] or sorted(clusters, key=lambda c: (-len(c), sorted(c)))[:1]
    members = set().union(*chosen)
    kept = [r for r in readers if r.label not in node_of or node_of[r.label] in members]
    left = sorted((r for r in readers if r not in kept), key=lambda r: r.label)
    for r in left:
        r.close()
    notes = []
    if left:
        notes.append("left out, not in this cluster's mesh: " + ", ".join(
            f"{node_of[r.label]} ({r.label})" for r in left) + " (another cluster on this host, or a broker "
            "alone: --node-id NODE shows the cluster of NODE)")
    chosen_got = {k: b for k, b in got.items() if k[0] in {r.label for r in kept}}
    return kept + _followed(chosen_got, own, config), notes


def _followed(got: dict[tuple[str, int], dict[str, Any]], own: argparse.Namespace,
              config: Config) -> list[StatsReader]:
    """``--cluster``: the mesh's other nodes, read at the stats sockets their routers advertise in
    the mesh (nodes started with ``--stats-port``; their snapshots' ``peer_stats``), so that the
    view from any one node covers the cluster. One round of snapshots (``got``) from the nodes
    found first says where the others are."""
    have = {body.get("node") for body in got.values()}
    where: dict[str, tuple[str, int]] = {}
    for body in got.values():
        for rid, endpoint in (body.get("peer_stats") or {}).items():
            node, _, router = str(rid).rpartition("/")
            if node in have or node in where or not router[1:].isdigit():
                continue
            host, sep, port = str(endpoint).removeprefix("tcp://").rpartition(":")
            if sep and port.isdigit():
                where[node] = (host.strip("[]"), int(port) - int(router[1:]))  # router 0's port
    return [StatsReader(config, node, connections=own.connections) for node in where.values()]


def _shown(got: dict[tuple[str, int], dict[str, Any]]) -> list[dict[str, Any]]:
    """The bodies to draw, sorted; nodes of one id on several ports are told apart by their run
    directory's name (``t-1883``, ``t-1884``)."""
    labels: dict[str, set[str]] = {}
    for (label, _), body in got.items():
        labels.setdefault(body["node"], set()).add(label)
    out = []
    for (label, _), body in sorted(got.items()):
        if len(labels[body["node"]]) > 1:
            body = {**body, "node": label, "router_id": f"{label}/{body.get('router', '?')}", "_node": body["node"]}
        out.append(body)
    return sorted(out, key=lambda b: (b["node"], b.get("index", 0)))


def _mesh_nodes(snaps: Iterable[dict[str, Any]]) -> set[str]:
    """Every node the routers of ``snaps`` know in the mesh (their peers' router ids, node/wN)."""
    nodes = set()
    for s in snaps:
        nodes.add(s.get("_node", s["node"]))
        for peer in s.get("traffic", {}).get("mesh", {}).get("peers", {}):
            nodes.add(str(peer).rpartition("/")[0])
    nodes.discard("")
    return nodes


def _screen(group: Readers, own: argparse.Namespace, bodies: list[dict[str, Any]], missing: list[str],
            width: int) -> Any:
    if own.connections:
        return connections_view(bodies, own.limit, width=width, sort=own.sort)
    if own.cluster:
        unreachable = _mesh_nodes(bodies) - {b.get("_node", b["node"]) for b in bodies}
        return cluster_view(bodies, unreachable, missing, width=width, sort=own.sort)
    return routers_view(bodies, missing, width=width, sort=own.sort)


def _console(width: int, record: bool = False) -> Any:
    from rich.console import Console

    if record:  # plain text, whatever the terminal
        return Console(width=width, highlight=False, emoji=False, markup=False, color_system=None,
                       force_terminal=False, no_color=True)
    return Console(width=width, highlight=False, emoji=False, markup=False)


def _once(group: Readers, own: argparse.Namespace) -> int:
    topic = TOPIC_CONNECTIONS if own.connections else TOPIC_SNAPSHOT
    got, missing = group.collect(topic)
    if own.json:
        for _, body in sorted(got.items()):
            print(json.dumps(body, separators=(",", ":")))
    elif got:
        bodies = _shown(got)
        width = terminal_width()
        _console(width).print(_screen(group, own, bodies, [f"{label} w{i}" for label, i in missing], width))
    sys.stdout.flush()
    if missing:
        print(f"brokerd stats: no {'connection list' if own.connections else 'snapshot'} within "
              f"{group.wait_bound():.1f} s from {', '.join(group.where(missing))} "
              f"(is brokerd running with these options?)", file=sys.stderr)
        return 1
    return 0


def _watch(group: Readers, own: argparse.Namespace) -> int:
    """Redraw once per interval (or as soon as every router has reported) until Ctrl-C.

    The table is redrawn in place on the terminal's alternate screen (rich's Live), line over line:
    no clearing, so no flicker; the terminal gets its screen back at the end, as with top."""
    topic = TOPIC_CONNECTIONS if own.connections else TOPIC_SNAPSHOT
    if own.json:
        while True:
            for _, t, body in group.receive(group.interval):
                if t == topic:
                    print(json.dumps(body, separators=(",", ":")), flush=True)
    if not sys.stdout.isatty():
        return _watch_plain(group, own, topic)
    from rich.live import Live
    from rich.text import Text

    latest: dict[tuple[str, int], dict[str, Any]] = {}
    seen: dict[tuple[str, int], float] = {}
    since_draw: set[tuple[str, int]] = set()
    last_draw = 0.0
    width = terminal_width()
    console = _console(width) if os.environ.get("COLUMNS") else None
    waiting = Text("waiting for stats from " + ", ".join(
        e for r in group.readers for e in r.endpoints.values()))
    with Live(waiting, console=console, screen=True, auto_refresh=False, redirect_stdout=False,
              redirect_stderr=False) as live:
        while True:
            now = time.monotonic()
            for key, t, body in group.receive(max(0.05, min(group.interval, last_draw + group.interval - now))):
                if t != topic:
                    continue
                latest[key] = body
                seen[key] = time.monotonic()
                since_draw.add(key)
            now = time.monotonic()
            everyone = len(since_draw) >= len(group.expected()) and \
                all(r.routers is not None for r in group.readers)
            if latest and (everyone or now - last_draw >= group.interval * 1.5):
                stale = 3 * group.interval + 1.0
                fresh = {k: b for k, b in latest.items() if now - seen[k] <= stale}
                missing = [f"{r.label} w{i}" for r, i in group.expected() if (r.label, i) not in fresh]
                width = console.width if console is not None else live.console.width
                screen = _screen(group, own, _shown(fresh), missing, width)
                from rich.console import Group

                live.update(Group(screen, Text(""), Text("(Ctrl-C to quit)")), refresh=True)
                last_draw = now
                since_draw.clear()


def _watch_plain(group: Readers, own: argparse.Namespace, topic: bytes) -> int:
    """``--watch`` into a pipe or a file: no screen to redraw, so one plain table per interval,
    one after another (each wait for the routers bounded, as without --watch), until Ctrl-C."""
    width = terminal_width()
    while True:
        started = time.monotonic()
        got, missing = group.collect(topic)
        if got:
            screen = _screen(group, own, _shown(got), [f"{label} w{i}" for label, i in missing], width)
            print(to_text(screen, width) + "\n", flush=True)
        else:
            print(f"brokerd stats: no {'connection list' if own.connections else 'snapshot'} within "
                  f"{group.wait_bound():.1f} s from {', '.join(group.where(missing))}", file=sys.stderr, flush=True)
        time.sleep(max(0.0, started + group.interval - time.monotonic()))
