"""What `brokerd stats` prints: the views once (or JSON), or redrawn each interval (``--watch``)
in place on the terminal's alternate screen like ``top``, one plain table after another into a pipe.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Iterable
from typing import Any

from .stats_readers import Readers
from .stats_schema import TOPIC_CONNECTIONS, TOPIC_SNAPSHOT
from .stats_tables import WIDE, cluster_view, connections_view, make_console, routers_view, to_text


def terminal_width() -> int:
    """COLUMNS if set, else the terminal's width, else (a pipe, a file) wide enough for every column."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return WIDE


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


def show_once(group: Readers, own: argparse.Namespace) -> int:
    """One view (or one JSON line per router), each router waited for within a bound."""
    topic = TOPIC_CONNECTIONS if own.connections else TOPIC_SNAPSHOT
    got, missing = group.collect(topic)
    if own.json:
        for _, body in sorted(got.items()):
            print(json.dumps(body, separators=(",", ":")))
    elif got:
        bodies = _shown(got)
        width = terminal_width()
        make_console(width).print(_screen(group, own, bodies, [f"{label} w{i}" for label, i in missing], width))
    sys.stdout.flush()
    if missing:
        print(f"brokerd stats: no {'connection list' if own.connections else 'snapshot'} within "
              f"{group.wait_bound():.1f} s from {', '.join(group.where(missing))} "
              f"(is brokerd running with these options?)", file=sys.stderr)
        return 1
    return 0


def watch(group: Readers, own: argparse.Namespace) -> int:
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
    console = make_console(width) if os.environ.get("COLUMNS") else None
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
