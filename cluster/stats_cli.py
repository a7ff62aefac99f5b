"""`brokerd stats`: the routers of a node as a table (once, or live like `top`), JSON, connections.

It reads the routers' own stats sockets (``cluster.stats``), so it needs nothing from the broker but
its address: the same options the broker was started with (``--node-id``, ``--listen``/``--port``,
``--stats-port``, or ``--config FILE``) find a local node; ``--node HOST:PORT`` reads a remote node
whose ``--stats-port`` is PORT (router i on PORT+i). It waits, bounded, for one snapshot from each
router: router 0 (and, locally, every ``w*.stats`` socket in the run directory) first; each
snapshot names the node's router count, so the others are found from it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Iterable
from typing import Any

import msgpack
import zmq

from .config import ConfigError, build_parser, load
from .paths import run_dir
from .stats import SCHEMA_VERSION, TOPIC_CONNECTIONS, TOPIC_SNAPSHOT, effective_interval, router_endpoint

CLEAR = "\x1b[H\x1b[2J"
WAIT_SLACK_S = 2.0


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

def _table(header: list[str], rows: Iterable[list[str]], left: int = 1) -> list[str]:
    """Columns right-aligned (numbers), the first ``left`` left-aligned."""
    rows = [header, *rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    out = []
    for r in rows:
        cells = [c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        out.append("  ".join(cells).rstrip())
    return out


ROUTER_COLUMNS = ["ROUTER", "PID", "UPTIME", "CLIENTS", "SUBS", "MSG IN/s", "MSG OUT/s", "IN/s", "OUT/s",
                  "MESH IN/s", "MESH OUT/s", "INFLIGHT", "QUEUED", "DROPS", "CPU%", "RSS", "LAG"]


def _router_row(name: str, s: dict[str, Any], pid: str = "", uptime: str = "") -> list[str]:
    r = s["rates"].get("1s", {})
    return [name, pid, uptime, human_count(s["clients"]["connected"]), human_count(s["subscriptions"]),
            human_count(r.get("msgs_in", 0.0)), human_count(r.get("msgs_out", 0.0)),
            human_bytes(r.get("bytes_in", 0.0)), human_bytes(r.get("bytes_out", 0.0)),
            human_bytes(r.get("mesh_bytes_in", 0.0)), human_bytes(r.get("mesh_bytes_out", 0.0)),
            human_count(s["inflight"]), human_count(s["queued"]), human_count(sum(s["drops"].values())),
            f"{s['process']['cpu_percent']:.1f}", human_bytes(s["process"]["rss_bytes"]),
            f"{s.get('loop_lag', 0.0) * 1000:.1f}ms"]


def render_routers(snaps: list[dict[str, Any]], missing: Iterable[str] = ()) -> str:
    """One table of a node's routers: rows, a TOTAL line, and the node's counters since start."""
    from .metrics import NodeStats

    snaps = sorted(snaps, key=lambda s: (s["node"], s["index"]))
    node_names = sorted({s["node"] for s in snaps})
    agg = NodeStats(",".join(node_names), max((s["routers"] for s in snaps), default=0), 1.0)
    for s in snaps:
        agg.update(s)
    total = agg.aggregate()
    total["loop_lag"] = max((s.get("loop_lag", 0.0) for s in snaps), default=0.0)
    multi = len(node_names) > 1
    rows = [_router_row(s["router_id"] if multi else s["router"], s, str(s["pid"]), human_duration(s["uptime"]))
            for s in snaps]
    rows.append(_router_row("TOTAL", total))
    t = total["traffic"]
    c, m = t["clients"], t["mesh"]
    load = total["rates"]
    lines = [
        f"brokerd stats  node {agg.node}  routers {len(snaps)}/{agg.routers}  "
        f"clients {total['clients']['connected']}  {time.strftime('%H:%M:%S')}",
        f"since start: msgs in {human_count(c['msgs_in'])} out {human_count(c['msgs_out'])}  "
        f"bytes in {human_bytes(c['bytes_in'])} out {human_bytes(c['bytes_out'])}  "
        f"mesh msgs in {human_count(m['msgs_in'])} out {human_count(m['msgs_out'])}  "
        f"drops {human_count(sum(total['drops'].values()))}",
        "msgs in/s 1/5/15 min: " + " ".join(human_count(load.get(w, {}).get("msgs_in", 0.0))
                                           for w in ("1min", "5min", "15min")),
        "",
        *_table(ROUTER_COLUMNS, rows),
    ]
    missing = list(missing)
    if missing:
        lines.append(f"no snapshot from: {', '.join(missing)}")
    return "\n".join(lines)


CONNECTION_COLUMNS = ["CLIENT", "ROUTER", "PEER", "BYTES IN", "BYTES OUT", "MSGS IN", "MSGS OUT", "QUEUED",
                      "INFLIGHT"]


def connection_rows(lists: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every connection of every router's list, with its router, most bytes (in + out) first."""
    rows = [{"router": cl["router"], "router_id": cl["router_id"], **c}
            for cl in lists for c in cl["connections"]]
    rows.sort(key=lambda r: r["bytes_in"] + r["bytes_out"], reverse=True)
    return rows


def render_connections(lists: list[dict[str, Any]], limit: int = 0) -> str:
    rows = connection_rows(lists)
    total = sum(cl["total"] for cl in lists)
    shown = rows[:limit] if limit else rows
    lines = [f"brokerd connections  {total} connected on {len(lists)} routers  {time.strftime('%H:%M:%S')}", ""]
    lines += _table(CONNECTION_COLUMNS, ([r["client_id"], r["router"], r["peer"], human_bytes(r["bytes_in"]),
                                          human_bytes(r["bytes_out"]), human_count(r["msgs_in"]),
                                          human_count(r["msgs_out"]), human_count(r["queued"]),
                                          human_count(r["inflight"])] for r in shown), left=3)
    if len(shown) < total:
        lines.append(f"({total - len(shown)} more not shown)")
    return "\n".join(lines)


# -- reading the sockets ----------------------------------------------------------------------------

class StatsReader:
    """SUB sockets on a node's routers; finds the routers it was not told about from snapshots."""

    def __init__(self, config: Any, node: tuple[str, int] | None = None, *, connections: bool = False,
                 workers: int | None = None) -> None:
        if node is not None:
            config = dataclasses.replace(config, stats_port=node[1])
        self.config = config
        self.host = node[0] if node is not None else None
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
                names = os.listdir(run_dir(self.config))
            except OSError:
                names = []
            for name in names:
                if name.startswith("w") and name.endswith(".stats") and name[1:-6].isdigit():
                    indices.add(int(name[1:-6]))
        return indices

    def _connect(self, index: int) -> None:
        if index not in self.endpoints:
            endpoint = router_endpoint(self.config, index, host=self.host)
            self.endpoints[index] = endpoint
            self.sub.connect(endpoint)

    def expected(self) -> list[int]:
        return list(range(self.routers)) if self.routers else sorted(self.endpoints)

    def wait_bound(self) -> float:
        return 2 * self.interval + WAIT_SLACK_S

    def receive(self, timeout: float) -> list[tuple[bytes, dict[str, Any]]]:
        """What arrives within ``timeout`` seconds (at least one message, unless it times out)."""
        out: list[tuple[bytes, dict[str, Any]]] = []
        if not self.sub.poll(int(max(0.0, timeout) * 1000)):
            return out
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
        got: dict[int, dict[str, Any]] = {}
        start = time.monotonic()
        while True:
            left = start + self.wait_bound() - time.monotonic()
            for t, body in self.receive(left):
                if t == topic:
                    got[body["index"]] = body
            if self.routers is not None and all(i in got for i in self.expected()):
                return got, []
            if left <= 0:
                return got, [i for i in self.expected() if i not in got]

    def close(self) -> None:
        self.sub.close(0)
        self.ctx.term()


# -- the command ------------------------------------------------------------------------------------

def _own_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--watch", action="store_true", help="redraw live, like top, until Ctrl-C")
    p.add_argument("--json", action="store_true", help="print one JSON object per snapshot (one per line)")
    p.add_argument("--connections", action="store_true",
                   help="list client connections (router, bytes, queued, inflight), most bytes first")
    p.add_argument("--node", metavar="HOST:PORT",
                   help="read a remote node: HOST and its --stats-port PORT (router i on PORT+i)")
    p.add_argument("--limit", type=int, default=0, metavar="N", help="with --connections: show the first N")
    return p


def build_stats_parser() -> argparse.ArgumentParser:
    """For --help: our options, then the broker's (which locate the local node)."""
    p = argparse.ArgumentParser(
        prog="brokerd stats", parents=[_own_parser(), build_parser()], add_help=False, conflict_handler="resolve",
        description="Show the routers of a brokerd node: one table, --watch (live), --json, --connections. "
        "The broker's own options (same values as the broker was started with, or --config FILE) locate a "
        "local node; --node HOST:PORT reads a remote one.")
    p.add_argument("-h", "--help", action="help", help="show this help and exit")
    return p


def _parse_node(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--node: invalid value {value!r} (expected HOST:PORT, PORT the node's --stats-port)")
    return host.strip("[]"), int(port)


def _explicit_workers(argv: list[str], config: Any) -> int | None:
    if any(a == "--workers" or a.startswith("--workers=") for a in argv):
        return config.workers
    return None


def main(argv: list[str]) -> int:
    if "-h" in argv or "--help" in argv:
        build_stats_parser().print_help()
        return 0
    own, rest = _own_parser().parse_known_args(argv)
    try:
        config = load(rest)
        node = _parse_node(own.node) if own.node else None
        if own.limit < 0:
            raise ConfigError(f"--limit: invalid value {own.limit} (expected 0 or more)")
    except ConfigError as exc:
        print(f"brokerd stats: error: {exc}", file=sys.stderr)
        return 2
    reader = StatsReader(config, node, connections=own.connections, workers=_explicit_workers(rest, config))
    try:
        if own.watch:
            return _watch(reader, own)
        return _once(reader, own)
    except KeyboardInterrupt:
        return 0
    finally:
        reader.close()


def _where(reader: StatsReader, indices: Iterable[int]) -> list[str]:
    return [f"w{i} ({reader.endpoints.get(i, '?')})" for i in indices]


def _once(reader: StatsReader, own: argparse.Namespace) -> int:
    topic = TOPIC_CONNECTIONS if own.connections else TOPIC_SNAPSHOT
    got, missing = reader.collect(topic)
    bodies = [got[i] for i in sorted(got)]
    if own.json:
        for body in bodies:
            print(json.dumps(body, separators=(",", ":")))
    elif bodies:
        print(render_connections(bodies, own.limit) if own.connections else render_routers(bodies))
    if missing:
        print(f"brokerd stats: no {'connection list' if own.connections else 'snapshot'} within "
              f"{reader.wait_bound():.1f} s from {', '.join(_where(reader, missing))} "
              f"(is brokerd running with these options?)", file=sys.stderr)
        return 1
    return 0


def _watch(reader: StatsReader, own: argparse.Namespace) -> int:
    """Redraw once per interval (or as soon as every router has reported) until Ctrl-C."""
    topic = TOPIC_CONNECTIONS if own.connections else TOPIC_SNAPSHOT
    latest: dict[str, dict[str, Any]] = {}
    seen: dict[str, float] = {}
    since_draw: set[str] = set()
    last_draw = 0.0
    out = sys.stdout
    if not own.json:
        out.write(CLEAR + "waiting for stats from " + ", ".join(_where(reader, sorted(reader.endpoints))) + "\n")
        out.flush()
    while True:
        now = time.monotonic()
        for t, body in reader.receive(max(0.05, min(reader.interval, last_draw + reader.interval - now))):
            if t != topic:
                continue
            if own.json:
                print(json.dumps(body, separators=(",", ":")), flush=True)
            else:
                latest[body["router_id"]] = body
                seen[body["router_id"]] = time.monotonic()
                since_draw.add(body["router_id"])
        if own.json:
            continue
        now = time.monotonic()
        everyone = reader.routers is not None and len(since_draw) >= len(reader.expected())
        if latest and (everyone or now - last_draw >= reader.interval * 1.5):
            stale = 3 * reader.interval + 1.0
            fresh = [b for r, b in latest.items() if now - seen[r] <= stale]
            names = {b["router"] for b in fresh}
            missing = [f"w{i}" for i in reader.expected() if f"w{i}" not in names]
            screen = render_connections(fresh, own.limit) if own.connections else render_routers(fresh, missing)
            out.write(CLEAR + screen + "\n\n(Ctrl-C to quit)\n")
            out.flush()
            last_draw = now
            since_draw.clear()
