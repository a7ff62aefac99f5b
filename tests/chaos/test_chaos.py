"""Chaos: seeded, bounded QoS 1 traffic through brokerd while workers are stopped and killed, a
node is killed and restarted, sessions are taken over and clients vanish without DISCONNECT; then
the invariants a user relies on (harness.py's docstring says exactly which, and what the README
lets us exclude). ``CHAOS_SEED=<seed>`` replays a run's fault schedule; every failure names it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from tests.chaos.harness import BROKER_ARGS, Node, Scenario, chaos_seed, close_proxies, start_nodes
from tests.helpers import Broker, add_user


def _run(scenario: Scenario, schedule: list[str], cap_s: float, record_property: Callable) -> None:
    scenario.start()
    scenario.run(schedule, cap_s)
    report = scenario.finish()
    print(report.message() if report.violations else report.line)
    record_property("chaos", report.line)
    assert not report.violations, report.message()


def test_chaos_one_node_two_workers(start_broker: Callable[..., Broker], record_property: Callable,
                                    tmp_path: Path) -> None:
    """One node, two workers: publishers and subscribers (persistent and clean; #, +, one
    publisher's #, exact; a shared group of two) spread over both by the kernel, while workers are
    SIGSTOPped beyond the mesh timeout and SIGKILLed, sessions taken over and connections dropped.
    A subscriber on a stopped worker stays connected, so it is owed every message. Every client
    authenticates, and the ACL lets its user read and write only the chaos (and probe) topics: a session whose
    identity were lost in a takeover or a crash would be refused what it is owed."""
    seed = chaos_seed()
    print(f"chaos one-node seed={seed}")
    password = "chaos-pw-" + str(seed)
    add_user(tmp_path / "passwd", "chaos", password)
    (tmp_path / "acl").write_text("user chaos\ntopic readwrite chaos/#\ntopic readwrite chaosprobe/#\n")
    secured = ("--password-file", str(tmp_path / "passwd"), "--acl-file", str(tmp_path / "acl"))
    node = Node("t", start_broker(*BROKER_ARGS, *secured, workers=2, node_id="t"), 2)
    sc = Scenario("one-node", seed, [node], credentials=("chaos", password))
    for i in range(4):
        sc.add_publisher(f"p{i}", node, period=0.04)
    for i in range(3):
        sc.add_subscriber(f"s{i}", node, sc.filter_for(i), persistent=True)
    for i in range(4):
        sc.add_subscriber(f"c{i}", node, sc.filter_for(i), persistent=False)
    for i in range(2):
        sc.add_member(f"g{i}", node, f"g{sc.uid}")
    schedule = ["stop", "stop", "kill", "kill", "takeover", "takeover", "drop", "drop", "drop"]
    _run(sc, schedule, 35.0, record_property)


def test_chaos_three_nodes(start_broker: Callable[..., Broker], record_property: Callable) -> None:
    """Nodes a, b, c on 127.0.0.1/.2/.3 with two workers each: every node publishes and
    subscribes, takeovers and reconnections may move a session to another node, one whole node
    is SIGKILLed and restarted besides the worker faults, one is SIGKILLed while the persistent
    sessions that were on it reconnect elsewhere (from the replicas), and one is cut off from the
    others by a partition for a moment (every mesh behind a proxy the fault cuts;
    ``CHAOS_PARTITION=0`` runs without the proxies and the partition)."""
    seed = chaos_seed()
    partitions = os.environ.get("CHAOS_PARTITION", "1") != "0"
    print(f"chaos three-nodes seed={seed}{' with partitions' if partitions else ''}")
    nodes = start_nodes(start_broker, partitionable=partitions)
    try:
        _three_nodes(nodes, seed, record_property, partitions)
    finally:
        close_proxies(nodes)


def _three_nodes(nodes: list, seed: int, record_property: Callable, partitions: bool) -> None:
    sc = Scenario("three-nodes", seed, nodes)
    sc.populate(nodes, period=0.06)
    schedule = ["stop", "stop", "kill", "kill", "node-kill", "node-loss", "takeover", "takeover", "drop", "drop"]
    if partitions:
        schedule.append("partition")
    _run(sc, schedule, 55.0 if partitions else 45.0, record_property)
