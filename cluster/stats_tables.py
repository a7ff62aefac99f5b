"""`brokerd stats`'s tables: the human units, the columns, and the views of routers, nodes and
connections, drawn with ``rich`` to fit a width (columns of least use go first).

Each view takes the routers' snapshots (or connection lists) as they came from their stats sockets
(``cluster.stats``) and returns a renderable; ``to_text`` makes it plain text (tests, pipes).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from typing import Any

from .metrics import NodeStats, sum_trees

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
    Column("DROPPED", lambda r: human_count(r.get("dropped", 0)), 3),
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
    "dropped": lambda r: r.get("dropped", 0),
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
    console = make_console(width, record=True)
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
    notes += dropper_lines(snaps, multi)
    notes += replication_lines(sorted(snaps, key=lambda s: (s["node"], s["index"])))
    return _render(_summary(snaps, total, routers, what), make_table(ROUTER_COLUMNS, rows, width), notes)


def dropper_lines(snaps: Iterable[dict[str, Any]], multi: bool = False, most: int = 5) -> list[str]:
    """The sessions with the most messages dropped for them (the routers' ``droppers``), ``most``
    of them on one line: which client the drops are about."""
    rows = [(d["dropped"], d["client_id"], s["router_id"] if multi else s["router"], d)
            for s in snaps for d in s.get("droppers") or ()]
    rows.sort(key=lambda r: (-r[0], r[1]))
    if not rows:
        return []
    return ["dropped most for: " + ", ".join(
        f"{cid} {human_count(n)} ({router}, {'connected' if d['connected'] else 'offline'}, queued "
        f"{human_count(d['queued'])})" for n, cid, router, d in rows[:most])]


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


def make_console(width: int, record: bool = False) -> Any:
    """A rich Console ``width`` columns wide; ``record``: plain text, for ``to_text``."""
    from rich.console import Console

    if record:  # plain text, whatever the terminal
        return Console(width=width, highlight=False, emoji=False, markup=False, color_system=None,
                       force_terminal=False, no_color=True)
    return Console(width=width, highlight=False, emoji=False, markup=False)
