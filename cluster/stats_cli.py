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
import os
import sys
from typing import NoReturn

from .config import ConfigError, build_parser, load
from .stats_nodes import node_readers, this_cluster
from .stats_readers import Readers, StatsReader
from .stats_screen import show_once, watch
from .stats_tables import (
    CONNECTION_SORTS,
    NAME_SORTS,
    ROUTER_SORTS,
    human_bytes,
    human_count,
    human_duration,
    render_connections,
    render_routers,
    replication_lines,
)

# The command's parts, each in its module: ``stats_tables`` (the views), ``stats_readers`` (the
# sockets), ``stats_nodes`` (which nodes), ``stats_screen`` (once, or --watch). What tests and
# tools import from here stays importable from here.
__all__ = ["StatsReader", "build_stats_parser", "human_bytes", "human_count", "human_duration", "main",
           "render_connections", "render_routers", "replication_lines"]


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


class _Args(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


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
        readers, notes = node_readers(own, rest, config, nodes)
    except ConfigError as exc:
        print(f"brokerd stats: error: {exc}", file=sys.stderr)
        return 2
    if not readers:
        print(f"brokerd stats: {notes[0] if notes else 'no brokerd found'}", file=sys.stderr)
        return 1
    for note in notes:
        print(f"brokerd stats: note: {note}", file=sys.stderr)
    if own.cluster:
        readers, notes = this_cluster(readers, own, rest, config)
        for note in notes:
            print(f"brokerd stats: note: {note}", file=sys.stderr)
    group = Readers(readers)
    try:
        if own.watch:
            return watch(group, own)
        return show_once(group, own)
    except KeyboardInterrupt:
        return 0
    finally:
        group.close()
