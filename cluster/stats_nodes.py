"""`brokerd stats`: which nodes to read. The brokers running on this host find themselves (their
run directories, ``cluster.paths.local_nodes``), the broker's own options pick one of them,
``--node HOST:PORT`` names a remote one, and ``--cluster`` keeps the nodes of one mesh and follows
it to the nodes whose stats sockets its routers advertise.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Iterable
from typing import Any

from .config import Config
from .paths import LocalNode, local_nodes, read_node_file, run_base, run_dir
from .stats_readers import Readers, StatsReader
from .stats_schema import TOPIC_SNAPSHOT

LOCATING = ("--listen", "--port", "--config", "--stats-port")  # the options that name one local node


def gives(argv: list[str], flags: Iterable[str]) -> bool:
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


def explicit_workers(argv: list[str], config: Config) -> int | None:
    """The router count the user named (``--workers`` or ``BROKERD_WORKERS``), else None: the
    default would be this machine's CPUs, not the broker's workers."""
    if gives(argv, ["--workers"]) or os.environ.get("BROKERD_WORKERS"):
        return config.workers
    return None


def node_readers(own: argparse.Namespace, rest: list[str], config: Config,
                 nodes: list[tuple[str, int]]) -> tuple[list[StatsReader], list[str]]:
    """The nodes to read, and notes for stderr (the first one says why, when there is none)."""
    workers = explicit_workers(rest, config)
    readers = [StatsReader(config, node, connections=own.connections, workers=workers) for node in nodes]
    explicit = gives(rest, LOCATING)
    if explicit and not own.cluster:
        return [StatsReader(config, connections=own.connections, workers=workers)], []
    if nodes and not own.cluster:
        return readers, []
    found = local_nodes()
    if gives(rest, ["--node-id"]) and not own.cluster:
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
            who = f" with --node-id {config.node_id}" if gives(rest, ["--node-id"]) else ""
            notes.append(f"no brokerd running here{who}: no live run directory in {where}; give --node "
                         "HOST:PORT for a remote node, or --run-dir DIR if the broker has BROKERD_RUN_DIR")
    return readers, notes


def this_cluster(readers: list[StatsReader], own: argparse.Namespace, rest: list[str],
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
    located = gives(rest, LOCATING)
    named = {node_of.get(r.label) for r in readers
             if r.host is not None or (located and r.run_path == run_dir(config))}
    if gives(rest, ["--node-id"]):
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
