"""The chaos scenario (tests/chaos/harness.py: clients, accounting, invariants) on nodes that run
in network namespaces of their own, with the faults an operator's network makes: iptables rules on
real links, a link set down, a node SIGKILLed and restarted, a node SIGSTOPped past the mesh
timeout. A persistent subscriber whose connection ends comes back on the node a seeded "load
balancer" picks, as a client behind one does, not on the node it left.

The invariants are the harness's, unchanged: nothing acknowledged is lost for a persistent
subscriber (subscribed before the publish), every reconnection of a persistent session gets
session present = 1 or a refusal (never an empty session), and the routers' interest tables
converge without new traffic. ``PARTITION_SEED=<seed>`` replays a run's fault schedule.
"""

from __future__ import annotations

import functools
import itertools
import os
import random
import signal
import subprocess
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from tests.chaos.harness import (
    BROKER_ARGS,
    FSYNC_ALWAYS,
    MESH_TIMEOUT,
    OFFLINE,
    PARTITION,
    SETTLE,
    STOP_BEYOND,
    Conn,
    Endpoint,
    Node,
    Outage,
    Publisher,
    Scenario,
    Subscriber,
    now,
    probe_mesh,
    serving_sessions,
)
from tests.helpers import LEASES, Broker, in_parallel, mesh_key, wait_for
from tests.partition.netns import Lab, Namespace, tcp_sockets

MQTT_PORT = 1883  # every node on its own address: the same ports everywhere, as on separate hosts
MESH_PORT = 7000  # router i of a node binds MESH_PORT + i
AGREEMENT_PORT = 7100  # a node's Raft member (--agreement), beside its routers' mesh ports
HEAL_LATE_S = 0.5  # a heal later than this after its cut's end is noted in the report
FAULTS = ["isolate", "isolate", "pair-cut", "pair-cut", "one-way", "link-down", "node-kill", "node-stop"]


def partition_seed() -> int:
    """``PARTITION_SEED`` from the environment (to replay a run), else a fresh random seed."""
    value = os.environ.get("PARTITION_SEED")
    return int(value) if value else random.SystemRandom().randrange(1, 2**31)


@dataclass
class NsNode(Node):
    """A node in a namespace of its own: its sockets are read there (psutil reads this one's)."""

    ns: Namespace | None = None

    def worker_of(self, local_port: int) -> int | None:
        for index, pid in self.worker_pids().items():
            if any(remote == local_port and local == self.port for local, remote, _ in tcp_sockets(pid)):
                return index
        return None

    def listening(self, pid: int) -> bool:
        return any(local == self.port and state == "0A" for local, _, state in tcp_sockets(pid))

    @property
    def net(self) -> Namespace:
        assert self.ns is not None
        return self.ns


def start_nodes(start_broker: Callable[..., Broker], lab: Lab, args: list[str],
                credentials: tuple[str, str] | None, names: str = "abc", workers: int = 2,
                agreement: bool = False) -> list[NsNode]:
    """One node per namespace of ``lab`` (``ip netns exec``), each with every other as a peer and
    the default replication (factor 2, min in-sync 2); returns once every router delivers to every
    other, bounded. ``agreement``: the nodes also agree through Raft (``--agreement`` on its own
    port, every other node's as ``--agreement-peer``)."""
    starts = []
    for ns, name in zip(lab.namespaces, names, strict=True):
        others = [other for other in lab.namespaces if other is not ns]
        peers = [a for other in others for a in ("--peer", f"{other.address}:{MESH_PORT}")]
        if agreement:
            peers += ["--agreement", f"{ns.address}:{AGREEMENT_PORT}",
                      *(a for other in others for a in ("--agreement-peer", f"{other.address}:{AGREEMENT_PORT}"))]
        else:
            peers += LEASES
        argv = [*BROKER_ARGS, *FSYNC_ALWAYS, *args, "--mesh", f"{ns.address}:{MESH_PORT}", *mesh_key(), *peers]
        starts.append(functools.partial(start_broker, *argv, workers=workers, host=ns.address, port=MQTT_PORT,
                                        node_id=name, prefix=ns.exec_prefix()))
    nodes = [NsNode(name, broker, workers, ns=ns)
             for name, broker, ns in zip(names, in_parallel(*starts), lab.namespaces, strict=True)]
    rounds = itertools.count()
    missing: list[str] = []

    def complete() -> bool:
        missing[:] = probe_mesh(nodes, f"start{next(rounds)}-{uuid.uuid4().hex[:6]}", 2.0, credentials)
        return not missing

    try:
        wait_for(complete, 30, "a full mesh")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {len(missing)} router pairs do not deliver: {', '.join(missing)}") from None
    if agreement:
        serving_sessions(nodes, credentials)
    return nodes


class Roaming(Subscriber):
    """A subscriber behind a load balancer: when paho connects a persistent session again (its
    connection ended), the balancer picks the node; ``roam`` sends any subscriber there (the
    clients a fault moves)."""

    sc: PartitionScenario

    def attempt(self, conn: Conn) -> None:
        if self.persistent and not conn.retired and conn.gen in self.attempts:
            node = self.sc.balance()
            # paho's ``host`` setter refuses while it is (re)connecting; this is the moment
            # between its on_pre_connect and the new socket, where the address is read.
            conn.c._host = node.host
            conn.host = node.host
            with self.lock:
                conn.node = node
                self.node = node
        super().attempt(conn)

    def roam(self, offline: float) -> None:
        """Close the socket without DISCONNECT, stay away ``offline`` seconds, come back where the
        balancer sends it; refused there ("server unavailable": a node without its lease, or one
        that must not serve the session now), try the balancer's next pick, for a bounded time."""
        old = self.leave(offline)
        deadline = now() + SETTLE
        while True:
            node = self.sc.balance()
            try:
                self.open(node)
                return
            except (AssertionError, OSError) as exc:
                refused = self.conn
                if now() > deadline or refused is None or refused is old:
                    self.sc.problem(f"{self.name}: no connection through the balancer within {SETTLE:g} s "
                                    f"(the last on {node.name}: {exc})")
                    return
                refused.retire()
                refused.drop()
                self.sc.pause(0.3)  # a client's pause before it tries again


class PartitionScenario(Scenario):
    """The harness's scenario with faults on real links (see the module docstring)."""

    seed_env = "PARTITION_SEED"
    subscriber_class = Roaming
    fault_kinds = ("isolate", "pair-cut", "one-way", "link-down", "node-kill", "node-stop")
    nodes: list[NsNode]

    def __init__(self, name: str, seed: int, nodes: list[NsNode], credentials: tuple[str, str]) -> None:
        super().__init__(name, seed, nodes, credentials)  # type: ignore[arg-type]
        # The balancer and each client's time away draw from their own generator: how many draws
        # they take depends on timing, and the fault schedule (``rng``) must not.
        self.lb = random.Random(f"balancer-{seed}")
        self._lb_lock = threading.Lock()
        self.down: set[str] = set()  # nodes whose link is down: the balancer's health check skips them

    def balance(self) -> NsNode:
        """The node the load balancer sends a new connection to (one whose link is up)."""
        with self._lb_lock:
            return self.lb.choice([n for n in self.nodes if n.name not in self.down])

    def away(self) -> float:
        with self._lb_lock:
            return self.lb.uniform(*OFFLINE)

    def _others(self, node: NsNode) -> list[NsNode]:
        return [n for n in self.nodes if n is not node]

    def _heal(self) -> None:
        """Every rule flushed, every link up: the links set down first, so that one comes up at the
        fault's end and not after the other nodes' flushes (tenths of a second each, loaded)."""
        for n in self.nodes:
            if n.name in self.down:
                n.net.link(True)
        for n in self.nodes:
            n.net.heal()
        self.down.clear()

    def _cut_for(self, seconds: float, move: list[Callable[[], None]] | None = None) -> None:
        """Hold the cut made for ``seconds``, then heal; the clients in ``move`` go elsewhere
        meanwhile, in threads that may outlast the cut (joined after the heal). A client's move is
        not part of the fault: when the heal waited for the moves, a move slowed by the cut node
        itself (a persistent session it owns, refused elsewhere while it is silent; a publisher's
        old connection to it) held the cut until the move was done or gave up, up to 20 s on: the
        link-down outage of issue 41 (docs/partition.md)."""
        t_end = now() + seconds
        errors: list[BaseException] = []

        def moves() -> None:
            try:
                in_parallel(*(move or []))
            except BaseException as exc:  # noqa: BLE001 - re-raised in the fault's thread
                errors.append(exc)

        mover = threading.Thread(target=moves, daemon=True)
        try:
            if move:
                mover.start()
            self.pause(max(0.0, t_end - now()))
        finally:
            late = now() - t_end
            self._heal()
            if late > HEAL_LATE_S:
                self.note(f"{self.faults[-1].kind if self.faults else 'a cut'} healed {late:.1f} s after its end")
        if move:
            mover.join()
        if errors:
            raise errors[0]

    def _isolate(self) -> None:
        """One node cut off from the other two (DROP both ways, in its namespace); clients reach it."""
        node = self.rng.choice(self.nodes)
        cut = self.rng.uniform(*PARTITION)
        self.fault("isolate", f"node {node.name} cut off from the others both ways for {cut:.2f} s")
        others = [n.host for n in self._others(node)]
        try:
            node.net.drop_from(others)
            node.net.drop_to(others)
        finally:
            self._cut_for(cut)

    def _pair_cut(self) -> None:
        """Two nodes cut off from each other, both reaching the third; the persistent subscribers
        of one of them reconnect through the balancer (refused, on its next pick)."""
        node = self.rng.choice(self.nodes)
        far, third = self.rng.sample(self._others(node), 2)
        cut = self.rng.uniform(*PARTITION)
        moved = [s for s in self.subscribers if s.persistent and s.conn is not None and s.conn.node is node]
        self.fault("pair-cut", f"nodes {node.name} and {far.name} cut off from each other for {cut:.2f} s "
                               f"({third.name} reaches both); {', '.join(s.name for s in moved) or 'no session'} "
                               "reconnect(s) through the balancer")
        try:
            for a, b in ((node, far), (far, node)):
                a.net.drop_from([b.host])
                a.net.drop_to([b.host])
        finally:
            self._cut_for(cut, [functools.partial(self._move, s) for s in moved])

    def _one_way(self) -> None:
        """DROP INPUT only: at the seed's choice, a node hears nobody (its frames still leave), or
        nobody hears it (it hears them)."""
        node = self.rng.choice(self.nodes)
        cut = self.rng.uniform(*PARTITION)
        deaf = self.rng.random() < 0.5
        others = self._others(node)
        if deaf:
            self.fault("one-way", f"node {node.name} hears neither other node for {cut:.2f} s (they hear it)")
        else:
            self.fault("one-way", f"neither other node hears node {node.name} for {cut:.2f} s (it hears them)")
        try:
            if deaf:
                node.net.drop_from([n.host for n in others])
            else:
                for n in others:
                    n.net.drop_from([node.host])
        finally:
            self._cut_for(cut)

    def _link_down(self) -> None:
        """A node's link down (``ip link set DEV down``): nothing reaches it, clients included.
        Its clients notice (as their keepalive would, sooner) and reconnect through the balancer,
        which sends nobody to it until it is up again."""
        node = self.rng.choice(self.nodes)
        down = self.rng.uniform(*PARTITION)
        on_node = [e for e in self.endpoints() if e.conn is not None and e.conn.node is node]
        self.fault("link-down", f"node {node.name}'s link down for {down:.2f} s; "
                                f"{', '.join(e.name for e in on_node) or 'no client'} reconnect(s) elsewhere")
        self.down.add(node.name)
        try:
            node.net.link(False)
        finally:
            self._cut_for(down, [functools.partial(self._move, e) for e in on_node])

    def _move(self, e: Endpoint) -> None:
        """``e`` drops its connection and comes back where the balancer sends it."""
        if isinstance(e, Publisher):
            e.drop(self.away(), self.balance())
        else:
            assert isinstance(e, Roaming)
            e.roam(self.away())

    def _node_stop(self) -> None:
        """SIGSTOP a whole node (supervisor, workers, stats) past the mesh timeout, then SIGCONT:
        its clients stay connected."""
        node = self.rng.choice(self.nodes)
        length = MESH_TIMEOUT + self.rng.uniform(*STOP_BEYOND)
        out = subprocess.run(["pgrep", "-P", str(node.broker.pid)], capture_output=True, text=True, timeout=10)
        pids = [node.broker.pid, *(int(p) for p in out.stdout.split())]
        members = {s.name for s in self.members if s.conn is not None and s.conn.node is node}
        self.fault("node-stop", f"SIGSTOP node {node.name} ({len(pids)} processes) for {length:.2f} s")
        t_stop = now()
        try:
            for pid in pids:
                self.stopped.add(pid)
                os.kill(pid, signal.SIGSTOP)
            self.pause(length)
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
                self.stopped.discard(pid)
            self.stops.append(Outage(node.name, t_stop, now(), members))
