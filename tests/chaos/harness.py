"""The chaos harness: QoS 1 traffic through real brokerd nodes while faults are injected, then the
invariants a user relies on are checked against what the clients themselves saw.

Everything random (the order of the faults, the moments between them, which worker, node or client
each one hits, how long it lasts) comes from one ``random.Random(seed)``; the seed is printed at the
start and in every failure, and ``CHAOS_SEED=<seed>`` replays the same schedule (where the kernel
places each connection, and timing, still vary).

Accounting is done in this process, with one monotonic clock, from the clients' own callbacks:

* A publisher's message counts only once its PUBACK arrived (paho's ``on_publish``); its
  ``t_send`` is taken before the PUBLISH is handed to paho, its ``t_ack`` when the PUBACK came.
* A subscriber records every (publisher, seq) it receives, its SUBACKs, CONNACKs (session present)
  and disconnections, per connection (``Conn.gen``).

What each subscriber must have received (``Scenario.evaluate``), QoS 1, at least once. The README's
section "What the cluster guarantees under faults" is the contract; where it says a fault may lose
something, those messages are *excused* (not owed), counted, and how many of them were lost anyway
is printed too, so the width of every such gap stays visible:

* A clean-session subscriber: every acknowledged message matching its filter sent after the SUBACK
  of its last connection, which stayed up to the end ("connected throughout"). Its earlier
  connections are not checked: a clean session dies with its connection, and what was in flight
  to it then is legitimately lost. A subscriber on a SIGSTOPped worker is not disconnected, so it
  stays connected throughout and is owed everything (README: a router that falls silent is
  parked, and "every message acknowledged meanwhile reaches its subscribers that stayed
  connected").
* A persistent session (clean session 0): every acknowledged matching message sent after its
  first SUBACK, whatever happened to its connections ("A client that reconnects gets
  session-present = 1 and every QoS 1/2 message it missed"; a crashed worker's sessions come back
  from ``state.msgpack`` and the log, "what the other routers kept for it while it was down goes
  to its restored sessions", and what they had sent it but it never confirmed is sent again to
  its next incarnation; a takeover never loses the session; a node lost for good does not lose
  it either: its clients reconnected elsewhere get it from a replica). Every publish is written before its
  PUBACK (the one-node run: the default ``--fsync interval``; three nodes: durable,
  ``--fsync always``). Nothing is excused: moves included (what reaches a session's old
  router after it moved is handed on; README). Until the hand-on, messages whose [t_send,
  t_ack] overlapped a reconnection's [connection attempt, CONNACK] +- 0.3 s were excused.
* The shared group (two clean members): the union of its members gets every acknowledged matching
  message during whose whole life ([t_send, t_ack]) at least one member connection was up; members
  on a SIGSTOPped worker included (their router's copies wait for it). Excused ("member left"):
  messages that overlap [departure - ``GROUP_BEFORE``, departure + ``GROUP_AFTER``] of any member
  (a copy that reaches a router just after its last member left goes on once, and is lost if the
  next router has none left either: docs/mqtt.md, "Shared subscriptions"; a member
  that dies with its worker cannot hand its unacknowledged messages on; the other routers learn
  that its router is gone after the mesh timeout).

Then: every reconnection of a persistent session had session present = 1, and each comes back
with it once more at the end; the interest tables (the routers' stats snapshots: ``interest`` must
be the other routers' ``filters``, every router must know the shared group, subscriptions and
members must be those of the live sessions) equal the live subscriptions; a fresh subscriber on
every router gets a fresh message from every other router (the behavioural side of the same); the
will of every persistent session connected to a node lost for good (each has one, without delay)
was published by a holder of its session (``_check_wills``); and no broker log holds a traceback.
"""

from __future__ import annotations

import functools
import itertools
import os
import random
import re
import shutil
import signal
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import paho.mqtt.client as mqtt
import psutil

from tests.cluster.partition import MeshProxy
from tests.helpers import LEASES, WAIT, Broker, Client, free_port, in_parallel, mesh_key, wait_for

MESH_TIMEOUT = 1.0  # --mesh-timeout of every broker: short, so a SIGSTOP beyond it is short too
# The default --fsync (interval): an acknowledgement waits for its record's write, so no SIGKILL
# of a process loses it. The three-node runs add --fsync always (FSYNC_ALWAYS), the one-node run
# keeps the default, so both policies meet the faults.
BROKER_ARGS = ("--mesh-timeout", f"{MESH_TIMEOUT:g}", "--stats-interval", "0.2", "--sys-interval", "0")
FSYNC_ALWAYS = ("--fsync", "always")
# Session ownership agreed through Raft (--agreement) in clusters of nodes; TEST_AGREEMENT=0:
# the lease rules, as before it.
AGREEMENT = os.environ.get("TEST_AGREEMENT", "1") == "1"
STOP_BEYOND = (0.5, 1.2)  # a SIGSTOP lasts the mesh timeout plus this much (seconds, uniform)
GAP = (0.6, 1.8)  # traffic without a new fault between two faults (seconds, uniform)
OFFLINE = (0.2, 1.5)  # how long a client that dropped its connection stays away
NODE_DOWN = (0.3, 1.2)  # how long a SIGKILLed node stays down before it is restarted
PARTITION = (MESH_TIMEOUT + 0.5, MESH_TIMEOUT + 2.5)  # how long a node stays cut off from the others
QUIET = 2.0  # traffic after the last fault, before the publishers stop
RECONNECT_DELAY = (0.5, 2)  # paho's back-off between reconnection attempts
KEEPALIVE = 30
WINDOW = 10  # unacknowledged publishes per publisher at most (paho queues the rest otherwise)
BUCKETS = 4  # topics per publisher: <base>/<publisher>/<seq % BUCKETS>
# The excused windows of a shared group (see the module docstring), in seconds.
GROUP_BEFORE = 1.5
GROUP_AFTER = MESH_TIMEOUT + 1.5
# A persistent session connected this long before its node is lost has its will at the follower
# (the snapshot is written within a second of a CONNECT, and sent on at once).
WILL_SETTLED_S = 3.0
SETTLE = 20.0  # every client back (connected, subscribed) after a fault
DRAIN = 20.0  # the subscribers get what they are owed, at most this long ...
STAGNANT = 5.0  # ... or until nothing arrived for this long
SAMPLES = 4  # examples per kind of violation in a report

now = time.monotonic


def chaos_seed() -> int:
    """``CHAOS_SEED`` from the environment (to replay a run), else a fresh random seed."""
    value = os.environ.get("CHAOS_SEED")
    return int(value) if value else random.SystemRandom().randrange(1, 2**31)


def matches(topic_filter: str, topic: str) -> bool:
    """MQTT filter matching, written here rather than taken from the broker it checks."""
    levels = topic.split("/")
    parts = topic_filter.split("/")
    for i, part in enumerate(parts):
        if part == "#":
            return True
        if i >= len(levels) or (part != "+" and part != levels[i]):
            return False
    return len(parts) == len(levels)


# -- nodes ----------------------------------------------------------------------------------------


@dataclass
class Node:
    """One brokerd node (a supervisor and its workers) started by the ``start_broker`` fixture."""

    name: str
    broker: Broker
    workers: int
    proxies: list[MeshProxy] = field(default_factory=list)  # in front of its routers' mesh (partitions)

    @property
    def host(self) -> str:
        return self.broker.host

    @property
    def port(self) -> int:
        return self.broker.port

    def router_ids(self) -> list[str]:
        return [f"{self.name}/w{i}" for i in range(self.workers)]

    def worker_pids(self) -> dict[int, int]:
        """Worker index → pid, by the process name the supervisor gives each (``brokerd-w<i>``)."""
        out = {}
        for pid in self.broker.workers():
            try:
                with open(f"/proc/{pid}/comm") as f:
                    comm = f.read().strip()
            except OSError:
                continue
            if comm.startswith("brokerd-w") and comm[9:].isdigit():
                out[int(comm[9:])] = pid
        return out

    def worker_of(self, local_port: int) -> int | None:
        """The index of the worker holding the client connection from ``local_port``."""
        for index, pid in self.worker_pids().items():
            try:
                for c in psutil.Process(pid).net_connections(kind="tcp"):
                    if c.raddr and c.raddr.port == local_port and c.laddr.port == self.port:
                        return index
            except psutil.Error:
                continue
        return None

    def listening(self, pid: int) -> bool:
        """Whether worker ``pid`` accepts MQTT connections (it does once its router started)."""
        try:
            return any(c.status == psutil.CONN_LISTEN and c.laddr.port == self.port
                       for c in psutil.Process(pid).net_connections(kind="tcp"))
        except psutil.Error:
            return False

    def stats_args(self) -> list[str]:
        """The options that find this node's stats sockets (those it was started with)."""
        return ["--node-id", self.name, "--listen", f"{self.host}:{self.port}", "--stats-interval", "0.2",
                "--workers", str(self.workers)]


# -- clients --------------------------------------------------------------------------------------


class Conn(Client):
    """One paho connection of an endpoint (a logical client that may reconnect, be taken over or
    drop its connection several times): it reports every event to its owner. ``gen`` tells the
    connections apart (paho's message ids start again at 1 in each)."""

    _gens = itertools.count(1)

    def __init__(self, owner: Endpoint, node: Node, clean: bool) -> None:
        super().__init__(node.port, owner.client_id, clean=clean, host=node.host, keepalive=KEEPALIVE,
                         will=owner.will)
        self.owner = owner
        self.node = node
        self.gen = next(Conn._gens)
        self.retired = False  # replaced by another connection: its events no longer count
        self.c.reconnect_delay_set(*RECONNECT_DELAY)
        if owner.sc.credentials is not None:
            self.c.username_pw_set(*owner.sc.credentials)
        self.c.on_pre_connect = self._on_pre_connect
        self.c.on_publish = self._on_publish

    def _on_pre_connect(self, c, u) -> None:
        self.owner.attempt(self)

    def _on_message(self, c, u, msg) -> None:  # not kept in self.messages: the owner counts them
        self.owner.message(self, msg)

    def _on_connect(self, c, u, flags, rc, props) -> None:
        super()._on_connect(c, u, flags, rc, props)
        if rc.value == 0:
            self.owner.connected(self, bool(flags.session_present))

    def _on_disconnect(self, c, u, flags, rc, props) -> None:
        super()._on_disconnect(c, u, flags, rc, props)
        self.owner.disconnected(self)

    def _on_subscribe(self, c, u, mid, rcs, props) -> None:
        super()._on_subscribe(c, u, mid, rcs, props)
        self.owner.subscribed(self, mid, [r.value for r in rcs])

    def _on_publish(self, c, u, mid, rc, props) -> None:
        self.owner.published(self, mid, rc.value)

    def retire(self) -> None:
        """Another connection takes this client id over: this one must not reconnect and fight it."""
        self.retired = True
        self.c.reconnect_delay_set(3600, 3600)

    def up(self) -> bool:
        return self.c.is_connected()


class Endpoint:
    """A logical client: a client id on a node, with its current connection."""

    def __init__(self, sc: Scenario, name: str, node: Node, clean: bool) -> None:
        self.sc = sc
        self.name = name
        self.client_id = f"{name}-{sc.uid}"
        self.node = node
        self.clean = clean
        self.lock = threading.Condition()
        self.conn: Conn | None = None
        self.attempts: dict[int, float] = {}  # Conn.gen → when its latest connection attempt began
        self.will: tuple[str, bytes, int, bool] | None = None  # (topic, payload, QoS, retain)

    def open(self, node: Node) -> Conn:
        """A new connection on ``node`` (blocking, bounded); paho reconnects it from then on."""
        conn = Conn(self, node, self.clean)
        with self.lock:
            self.conn, self.node = conn, node
        conn.connect()
        return conn

    def attempt(self, conn: Conn) -> None:
        self.attempts[conn.gen] = now()

    def connected(self, conn: Conn, session_present: bool) -> None:
        pass

    def disconnected(self, conn: Conn) -> None:
        pass

    def subscribed(self, conn: Conn, mid: int, codes: list[int]) -> None:
        pass

    def message(self, conn: Conn, msg: mqtt.MQTTMessage) -> None:
        pass

    def published(self, conn: Conn, mid: int, code: int) -> None:
        pass

    def ready(self) -> bool:
        conn = self.conn
        return conn is not None and conn.up()

    def kind(self) -> str:
        return "client"


class Publisher(Endpoint):
    """Publishes ``<base>/<name>/<seq % BUCKETS>``, payload ``<name>:<seq>``, QoS 1, from a thread
    of its own, at most ``WINDOW`` unacknowledged at a time, one every ``period`` seconds."""

    def __init__(self, sc: Scenario, name: str, node: Node, period: float) -> None:
        super().__init__(sc, name, node, clean=True)
        self.period = period
        self.sent: list[tuple[int, int, float]] = []  # by seq: (Conn.gen, paho mid, t_send)
        self.acked: dict[tuple[int, int], float] = {}  # (Conn.gen, mid) → t_ack
        self.pending: set[tuple[int, int]] = set()  # of the current connection, not acknowledged
        self.swapping = False
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"chaos-{name}", daemon=True)

    def kind(self) -> str:
        return "publisher"

    def topic(self, seq: int) -> str:
        return f"{self.sc.base}/{self.name}/{seq % BUCKETS}"

    def start(self) -> None:
        self.open(self.node)
        self.thread.start()

    def _run(self) -> None:
        seq = 0
        while not self.halt.is_set():
            with self.lock:
                self.lock.wait_for(lambda: self.halt.is_set() or (
                    self.conn is not None and not self.swapping and len(self.pending) < WINDOW), 0.5)
                conn = self.conn
                if self.halt.is_set() or conn is None or self.swapping or len(self.pending) >= WINDOW:
                    continue
            assert seq < 60_000, "paho's message ids would wrap"
            t = now()
            # No lock held here: paho calls on_publish with its own lock held.
            info = conn.c.publish(self.topic(seq), f"{self.name}:{seq}".encode(), qos=1)
            key = (conn.gen, info.mid)
            with self.lock:
                self.sent.append((conn.gen, info.mid, t))
                if key not in self.acked and conn is self.conn:
                    self.pending.add(key)
            seq += 1
            self.halt.wait(self.period)  # the publishing rate, not a wait for an event

    def published(self, conn: Conn, mid: int, code: int) -> None:
        if code >= 0x80:  # MQTT 5 negative acknowledgement: not acknowledged
            return
        with self.lock:
            self.acked[(conn.gen, mid)] = now()
            self.pending.discard((conn.gen, mid))
            self.lock.notify_all()

    def stop(self) -> None:
        self.halt.set()
        with self.lock:
            self.lock.notify_all()
        self.thread.join(WAIT)

    def drop(self, offline: float, node: Node) -> None:
        """Close the socket without DISCONNECT; come back on a new connection (unacknowledged
        publishes of the old one never count)."""
        with self.lock:
            self.swapping = True
            old = self.conn
        assert old is not None
        old.retire()
        old.drop()
        self.sc.pause(offline)
        with self.lock:
            self.pending.clear()
        try:
            self.open(node)
        except AssertionError as exc:
            self.sc.problem(f"{self.name}: no new connection on {node.name}: {exc}")
        finally:
            with self.lock:
                self.swapping = False
                self.lock.notify_all()

    def acked_messages(self) -> list[Msg]:
        with self.lock:
            return [Msg(self.name, seq, self.topic(seq), self.node.name, t_send, self.acked[(gen, mid)])
                    for seq, (gen, mid, t_send) in enumerate(self.sent) if (gen, mid) in self.acked]

    def unacked(self) -> int:
        with self.lock:
            return len(self.pending)


@dataclass
class Epoch:
    """One connection of a clean-session subscriber, from its SUBACK to its end (None: still up)."""

    gen: int
    start: float
    end: float | None = None


class Subscriber(Endpoint):
    """Subscribes to one filter (QoS 1) and records what it receives. A clean-session subscriber
    subscribes again on each new connection (paho reconnects by itself); a persistent one only
    once, and every later CONNACK must say session present."""

    def __init__(self, sc: Scenario, name: str, node: Node, topic_filter: str, persistent: bool,
                 shared: bool = False) -> None:
        super().__init__(sc, name, node, clean=not persistent)
        self.filter = topic_filter
        self.match_filter = topic_filter.split("/", 2)[2] if shared else topic_filter
        self.persistent = persistent
        self.shared = shared
        if persistent:  # outside the scenario's base: no subscriber's filter matches it
            self.will = (f"chaos/will-{sc.uid}/{name}", b"gone", 0, False)
        self.received: Counter[tuple[str, int]] = Counter()
        self.first_suback: float | None = None
        self.epochs: list[Epoch] = []
        self.connacks: list[tuple[float, float, bool, int]] = []  # (attempt, CONNACK, present, gen)
        self.departures: list[float] = []
        self.sub_mids: set[int] = set()
        self.misrouted: list[str] = []
        self.last_msg = 0.0

    def kind(self) -> str:
        if self.shared:
            return "group member"
        return "persistent" if self.persistent else "clean"

    def connected(self, conn: Conn, session_present: bool) -> None:
        t = now()
        with self.lock:
            if conn.retired:
                return
            self.connacks.append((self.attempts.get(conn.gen, t), t, session_present, conn.gen))
            again = self.persistent and (self.first_suback is not None or self.sub_mids)
            if again and not session_present:
                self.sc.problem(f"{self.name} (persistent, {conn.node.name}) reconnected at "
                                f"{self.sc.rel(t):.2f} s with session present = 0")
        if not again or not session_present:  # a lost session is subscribed again, as a client would
            result, mid = conn.c.subscribe(self.filter, 1)
            if result == mqtt.MQTT_ERR_SUCCESS:
                with self.lock:
                    self.sub_mids.add(mid)

    def subscribed(self, conn: Conn, mid: int, codes: list[int]) -> None:
        t = now()
        with self.lock:
            if mid not in self.sub_mids:
                return
            self.sub_mids.discard(mid)
            if codes != [1]:
                self.sc.problem(f"{self.name}: SUBACK {codes} for {self.filter} (want [1])")
                return
            if self.first_suback is None:
                self.first_suback = t
            if not conn.retired:
                self.epochs.append(Epoch(conn.gen, t))
            self.lock.notify_all()

    def disconnected(self, conn: Conn) -> None:
        t = now()
        with self.lock:
            for e in self.epochs:
                if e.gen == conn.gen and e.end is None:
                    e.end = t
            if not conn.retired:
                self.departures.append(t)

    def message(self, conn: Conn, msg: mqtt.MQTTMessage) -> None:
        t = now()
        try:
            pub, seq_text = msg.payload.decode().split(":")
            seq = int(seq_text)
        except ValueError:
            with self.lock:
                self.misrouted.append(f"undecodable payload {msg.payload[:40]!r} on {msg.topic}")
            return
        with self.lock:
            self.received[(pub, seq)] += 1
            self.last_msg = t
            expected = f"{self.sc.base}/{pub}/{seq % BUCKETS}"
            if msg.topic != expected or not matches(self.match_filter, msg.topic):
                self.misrouted.append(f"{pub}:{seq} on {msg.topic} (filter {self.filter})")

    def ready(self) -> bool:
        conn = self.conn
        if conn is None or not conn.up():
            return False
        with self.lock:
            if self.persistent:
                return self.first_suback is not None and not self.sub_mids
            return any(e.gen == conn.gen and e.end is None for e in self.epochs)

    def wait_ready(self) -> None:
        wait_for(self.ready, WAIT, f"{self.name} connected and subscribed")

    def connected_at(self) -> float:
        """When the current connection got its CONNACK (infinity: it has none)."""
        conn = self.conn
        with self.lock:
            return max((t for _, t, _, gen in self.connacks if conn is not None and gen == conn.gen),
                       default=float("inf"))

    def takeover(self, node: Node) -> None:
        """A new connection with this client id, while the old one is up (it may land on another
        worker or node): the session moves, the old connection is closed by the broker."""
        old = self.conn
        assert old is not None
        old.retire()
        refusal = self._open_while_refused(node, old)
        if refusal is not None:
            self.sc.problem(f"{self.name}: takeover on {node.name} got no CONNACK: {refusal}")
        try:
            wait_for(lambda: not old.up(), WAIT, "the old connection closed")
        except AssertionError:
            self.sc.problem(f"{self.name}: the connection taken over on {old.node.name} was not closed "
                            f"within {WAIT:g} s")
        Client.close_all([old])

    def _open_while_refused(self, node: Node, old: Conn) -> AssertionError | None:
        """``open(node)``: None once connected, else why not. A node refuses a persistent session
        with "server unavailable" while it cannot take it in yet: its lease does not hold (a mesh
        timeout after a partition heals, or after a pause), or the session's agreed owner, on a
        node just lost, has not been taken for gone yet ("the client may retry"). The client
        tries again, as paho does, for a bounded time: after a node's loss it did not, and one
        refusal counted as a violation (seed 108829815, nothing lost)."""
        deadline = now() + 2 * MESH_TIMEOUT + 2.0
        while True:
            try:
                self.open(node)
                return None
            except AssertionError as exc:
                refused = self.conn
                if "(136," not in str(exc) or now() > deadline or refused is None or refused is old:
                    return exc
                refused.retire()
                refused.drop()
                self.sc.pause(0.2)

    def leave(self, offline: float) -> Conn:
        """Close the socket without DISCONNECT (an abnormal close: its epoch ends now) and stay away
        ``offline`` seconds; returns the connection left."""
        old = self.conn
        assert old is not None
        old.retire()
        with self.lock:
            self.departures.append(now())
            for e in self.epochs:
                if e.gen == old.gen and e.end is None:
                    e.end = now()
        old.drop()
        self.sc.pause(offline)
        return old

    def drop(self, offline: float, node: Node, fallback: Node | None = None) -> None:
        """Close the socket without DISCONNECT (an abnormal close), stay away ``offline`` seconds,
        come back on a new connection on ``node``; refused there, on ``fallback`` (a client
        with a second server address), if given."""
        old = self.leave(offline)
        if fallback is None:  # (with one: a client with two addresses tries the other at once)
            refusal = self._open_while_refused(node, old)
            if refusal is not None:
                self.sc.problem(f"{self.name}: no new connection on {node.name}: {refusal}")
            return
        try:
            self.open(node)
            return
        except AssertionError:
            pass
        refused = self.conn
        assert refused is not None
        refused.retire()  # (paho would try it again)
        refused.drop()
        try:
            self.open(fallback)
        except AssertionError as exc:
            self.sc.problem(f"{self.name}: refused on {node.name}, and no new connection on {fallback.name}: {exc}")


@dataclass(frozen=True)
class Msg:
    """An acknowledged publish."""

    pub: str
    seq: int
    topic: str
    node: str  # the publisher's node
    t_send: float
    t_ack: float

    @property
    def key(self) -> tuple[str, int]:
        return (self.pub, self.seq)

    def overlaps(self, lo: float, hi: float) -> bool:
        return self.t_send <= hi and self.t_ack >= lo


@dataclass
class Fault:
    t: float  # seconds since the scenario began
    kind: str
    what: str


@dataclass
class Outage:
    """A worker or node SIGKILLed (until it served again) or SIGSTOPped (until SIGCONT), and the
    clients whose connection was on it: persistent subscribers for a kill, group members for a
    stop (what the checks need of each)."""

    node: str
    t_start: float
    t_end: float
    clients: set[str]


@dataclass
class Verdict:
    """What one subscriber (or the group) was owed, and what it got."""

    name: str
    owed: list[Msg]
    excused: list[tuple[Msg, str]]  # matching, but a README clause (named) lets the broker lose them
    got: Counter[tuple[str, int]]
    note: str = ""

    def lost(self) -> list[Msg]:
        return [m for m in self.owed if self.got[m.key] == 0]

    def duplicated(self) -> int:
        return sum(self.got[m.key] - 1 for m in self.owed if self.got[m.key] > 1)

    def excused_lost(self) -> Counter[str]:
        return Counter(why for m, why in self.excused if self.got[m.key] == 0)


@dataclass
class Report:
    """The figures (one line), every broken invariant, and what a reader needs to replay and
    diagnose them (the fault timeline, per-subscriber figures, where each client was)."""

    line: str
    violations: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)

    def message(self) -> str:
        return "\n".join([self.line, "violations:", *(f"  - {v}" for v in self.violations), *self.details])


# -- the scenario ---------------------------------------------------------------------------------


class Scenario:
    """Clients, faults and checks over a set of nodes; see the module docstring."""

    # Hooks for a suite that reuses the scenario with faults of its own (tests/partition): the
    # variable that replays a seed, the fault kinds counted on the report's line, and the kind of
    # subscriber (and group member) it makes.
    seed_env = "CHAOS_SEED"
    subscriber_class: type[Subscriber] = Subscriber
    fault_kinds: tuple[str, ...] = ("stop", "kill", "node-kill", "node-loss", "partition", "one-way", "link-cut",
                                    "takeover", "drop")

    def __init__(self, name: str, seed: int, nodes: list[Node], credentials: tuple[str, str] | None = None) -> None:
        """``credentials``: the user name and password every client connects with (a broker with
        a password file and ACLs: identities and ACLs must survive the faults too)."""
        self.credentials = credentials
        self.name = name
        self.seed = seed
        self.rng = random.Random(seed)
        self.nodes = nodes
        self.uid = uuid.uuid4().hex[:6]  # names only: not part of what the seed replays
        self.base = f"chaos/{self.uid}"
        self.t0 = now()
        self.publishers: list[Publisher] = []
        self.subscribers: list[Subscriber] = []
        self.members: list[Subscriber] = []
        self.faults: list[Fault] = []
        self.crashes: list[Outage] = []  # SIGKILLs of workers and nodes
        self.stops: list[Outage] = []  # SIGSTOPs, with the group members on the stopped worker
        self.problems: list[str] = []
        self.notes: list[str] = []
        self.stopped: set[int] = set()
        self._sleep = threading.Event()
        self._plock = threading.Lock()
        self.placed_at_start: dict[str, str] = {}
        self.wills_owed: list[tuple[str, str]] = []  # (fault, client id): see ``_check_wills``

    # -- small things

    def rel(self, t: float) -> float:
        return t - self.t0

    def pause(self, seconds: float) -> None:
        """A deliberate duration (a fault's length, the gap between faults), not a wait for an event."""
        self._sleep.wait(seconds)

    def problem(self, text: str) -> None:
        with self._plock:
            self.problems.append(text)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def fault(self, kind: str, what: str) -> None:
        self.faults.append(Fault(self.rel(now()), kind, what))

    def endpoints(self) -> list[Endpoint]:
        return [*self.publishers, *self.subscribers, *self.members]

    def routers(self) -> list[str]:
        return [rid for n in self.nodes for rid in n.router_ids()]

    def placement(self) -> dict[str, str]:
        """Endpoint name → the router holding its current connection (``node/w<i>``), from the
        workers' sockets (psutil)."""
        out = {}
        for e in self.endpoints():
            conn = e.conn
            sock = conn.c.socket() if conn is not None else None
            try:
                port = sock.getsockname()[1] if sock is not None else None
            except OSError:
                port = None
            index = conn.node.worker_of(port) if port is not None and conn is not None else None
            out[e.name] = f"{conn.node.name}/w{index}" if conn is not None and index is not None else "?"
        return out

    # -- set-up

    def add_publisher(self, name: str, node: Node, period: float) -> Publisher:
        p = Publisher(self, name, node, period)
        self.publishers.append(p)
        return p

    def add_subscriber(self, name: str, node: Node, topic_filter: str, persistent: bool) -> Subscriber:
        s = self.subscriber_class(self, name, node, topic_filter, persistent)
        self.subscribers.append(s)
        return s

    def add_member(self, name: str, node: Node, group: str) -> Subscriber:
        s = self.subscriber_class(self, name, node, f"$share/{group}/{self.base}/#", persistent=False,
                                  shared=True)
        self.members.append(s)
        return s

    def populate(self, nodes: list, period: float) -> None:
        """The three-node population: on every node two publishers, two persistent and two clean
        subscribers (filters of every kind in turn), and a shared group's two members on two nodes
        the seed picks."""
        for n in nodes:
            for i in range(2):
                self.add_publisher(f"p{n.name}{i}", n, period=period)
        for k, n in enumerate(nodes):
            for i in range(2):
                self.add_subscriber(f"s{n.name}{i}", n, self.filter_for(2 * k + i), persistent=True)
                self.add_subscriber(f"c{n.name}{i}", n, self.filter_for(2 * k + i + 1), persistent=False)
        for i, n in enumerate(self.rng.sample(nodes, 2)):
            self.add_member(f"g{i}", n, f"g{self.uid}")

    def filter_for(self, i: int) -> str:
        """Filters of every kind in turn: ``#``, ``+`` at the publisher level, one publisher's
        ``#``, one exact topic (the publisher chosen by the seed)."""
        pub = self.rng.choice(self.publishers).name
        return [f"{self.base}/#", f"{self.base}/+/{i % BUCKETS}", f"{self.base}/{pub}/#",
                f"{self.base}/{pub}/{i % BUCKETS}"][i % 4]

    def start(self) -> None:
        """Connect every subscriber (and more, until every worker of every node holds one), then
        start the publishers."""
        for s in [*self.subscribers, *self.members]:
            s.open(s.node)
        for s in [*self.subscribers, *self.members]:
            s.wait_ready()
        extra = itertools.count()
        for node in self.nodes:
            for _ in range(16):
                placed = self.placement()
                held = {placed[s.name] for s in self.subscribers}
                if all(rid in held for rid in node.router_ids()):
                    break
                s = self.add_subscriber(f"x{next(extra)}", node, f"{self.base}/#", persistent=False)
                s.open(node)
                s.wait_ready()
            else:
                self.note(f"not every worker of {node.name} holds a subscriber")
        for p in self.publishers:
            p.start()
        self.placed_at_start = self.placement()
        self.t0 = now()

    # -- faults

    def run(self, schedule: list[str], cap_s: float) -> None:
        """Inject the faults of ``schedule`` in an order and at moments the seed decides, each
        followed by a bounded wait until every client is back; stop early at ``cap_s``."""
        kinds = list(schedule)
        self.rng.shuffle(kinds)
        deadline = now() + cap_s
        try:
            for i, kind in enumerate(kinds):
                self.pause(self.rng.uniform(*GAP))
                if now() > deadline:
                    self.note(f"wall-clock cap of {cap_s:g} s: {i} of {len(kinds)} faults injected")
                    break
                getattr(self, "_" + kind.replace("-", "_"))()
                self.settle()
            self.pause(QUIET)
        finally:
            for pid in self.stopped:
                os.kill(pid, signal.SIGCONT)

    def _pick_worker(self) -> tuple[Node, int, int]:
        node = self.rng.choice(self.nodes)
        index = self.rng.randrange(node.workers)
        wait_for(lambda: index in node.worker_pids(), WAIT, f"{node.name}/w{index} running")
        return node, index, node.worker_pids()[index]

    def _stop(self) -> None:
        """SIGSTOP a worker beyond the mesh timeout, then SIGCONT: its clients stay connected."""
        node, index, pid = self._pick_worker()
        length = MESH_TIMEOUT + self.rng.uniform(*STOP_BEYOND)
        placed = self.placement()
        members = {s.name for s in self.members if placed.get(s.name) == f"{node.name}/w{index}"}
        self.fault("stop", f"SIGSTOP {node.name}/w{index} for {length:.2f} s")
        t_stop = now()
        self.stopped.add(pid)
        os.kill(pid, signal.SIGSTOP)
        try:
            self.pause(length)
        finally:
            os.kill(pid, signal.SIGCONT)
            self.stopped.discard(pid)
            self.stops.append(Outage(node.name, t_stop, now(), members))

    def _kill(self) -> None:
        """SIGKILL a worker; the supervisor restarts it; wait until the new one accepts clients.
        (Whether the other routers take it back is not waited for: it is what the checks see.)"""
        node, index, pid = self._pick_worker()
        rid = f"{node.name}/w{index}"
        placed = self.placement()
        on_worker = {s.name for s in self.subscribers if s.persistent and placed.get(s.name) == rid}
        self.fault("kill", f"SIGKILL {rid}")
        crash = Outage(node.name, now(), now(), on_worker)
        self.crashes.append(crash)
        os.kill(pid, signal.SIGKILL)
        try:
            wait_for(lambda: node.worker_pids().get(index, pid) != pid, WAIT, f"{rid} restarted")
            wait_for(lambda: node.listening(node.worker_pids().get(index, pid)), WAIT, f"{rid} serving")
        except AssertionError as exc:
            self.problem(f"{rid} was not restarted: {exc}")
        crash.t_end = now()

    def _node_kill(self) -> None:
        """SIGKILL a whole node (supervisor and workers), restart it after a moment."""
        node = self.rng.choice(self.nodes)
        down = self.rng.uniform(*NODE_DOWN)
        on_node = {s.name for s in self.subscribers if s.persistent and s.conn is not None and s.conn.node is node}
        self.fault("node-kill", f"SIGKILL node {node.name}, down {down:.2f} s")
        t_kill = now()
        node.broker.kill()
        self.pause(down)
        node.broker.start()  # returns once every worker serves ("brokerd ready")
        self.crashes.append(Outage(node.name, t_kill, now(), on_node))

    def _node_loss(self) -> None:
        """SIGKILL a whole node and, while it is down, move the persistent subscribers that were
        on it to the other nodes (a client sent elsewhere by DNS or a load balancer): their
        sessions come from the replicas (``--replication-factor 2``, the default with --mesh)
        with session present. Then the node returns, and drops the copies of those sessions it
        restored from its disk (the checks of the interest tables find one it kept); or, as the
        seed decides, returns on an empty disk (a replaced machine): it continues its logs beyond
        what the others hold and fetches their history back, and the logs it followed are placed
        on it again at their high-water marks and fetch what lies below."""
        node = self.rng.choice(self.nodes)
        others = [n for n in self.nodes if n is not node]
        moved = [s for s in self.subscribers if s.persistent and s.conn is not None and s.conn.node is node]
        wipe = self.rng.random() < 0.5
        self.fault("node-loss", f"SIGKILL node {node.name}; {', '.join(s.name for s in moved) or 'no session'} "
                                "reconnect(s) on another node while it is down"
                                + ("; it returns on an empty disk" if wipe else ""))
        t_kill = now()
        node.broker.kill()
        self.wills_owed += [(self.faults[-1].what, s.client_id) for s in moved
                            if t_kill - s.connected_at() > WILL_SETTLED_S]
        for s in moved:
            s.drop(self.rng.uniform(0.0, 0.3), self.rng.choice(others))
        try:
            wait_for(lambda: all(s.ready() for s in moved), SETTLE, "the moved sessions back")
        except AssertionError:
            self.problem(f"node {node.name} lost: sessions not back elsewhere within {SETTLE:g} s: "
                         f"{', '.join(s.name for s in moved if not s.ready())}")
        if wipe:
            args = node.broker.args
            data = os.path.join(args[args.index("--data-dir") + 1], args[args.index("--node-id") + 1])
            shutil.rmtree(data)
        node.broker.start()
        self.crashes.append(Outage(node.name, t_kill, now(), {s.name for s in moved}))

    def _partition(self) -> None:
        """Cut the mesh traffic (both ways at the proxies, as a network dropping packets; clients
        still reach every node) for a moment beyond the mesh timeout, then heal. At the seed's
        choice, one node from the others: it sees no majority, acknowledges nothing and sends its
        persistent sessions' clients away (they retry it, refused, until it heals: their
        sessions wait there), and the others go on; or the same node cut one way (the others do
        not hear it, it hears them): its lease ends, and it must stop the same way. Or only the link between two nodes, the
        third reaching both: each still hears a majority and goes on, and the persistent
        sessions' clients of one of them come back on the other, which must not serve those
        sessions while their node still does (refused: they go to the third node instead, which
        takes them over from their node). After healing, everything acknowledged on any side
        reaches its subscribers (the usual checks)."""
        node = self.rng.choice(self.nodes)
        cut = self.rng.uniform(*PARTITION)
        others = [n for n in self.nodes if n is not node]
        kind = self.rng.random()
        if kind < 0.6:
            hosts = {n.host for n in others}
            if kind < 0.35:
                self.fault("partition", f"node {node.name} cut off from the others for {cut:.2f} s")
            else:
                # One way: its frames reach nobody, theirs reach it. It hears a majority, but its
                # lease ends (nobody answers its heartbeats): it must stop as a cut-off node does.
                self.fault("one-way", f"node {node.name} not heard by the others for {cut:.2f} s (it hears them)")
                hosts = set()
            for n in self.nodes:
                for proxy in n.proxies:
                    if n is node:
                        proxy.cut(hosts)
                    else:
                        proxy.cut({node.host})
            try:
                self.pause(cut)
            finally:
                self._heal()
            return
        far, third = self.rng.sample(others, 2)
        moved = [s for s in self.subscribers if s.persistent and s.conn is not None and s.conn.node is node]
        self.fault("link-cut", f"nodes {node.name} and {far.name} cut off from each other for {cut:.2f} s "
                                f"({third.name} reaches both); "
                                f"{', '.join(s.name for s in moved) or 'no session'} reconnect(s) on {far.name}, "
                                f"refused there on {third.name}")
        t_end = now() + cut
        for a, b in ((node, far), (far, node)):
            for proxy in a.proxies:
                proxy.cut({b.host})
        try:
            for s in moved:
                s.drop(self.rng.uniform(0.0, 0.3), far, third)
            self.pause(max(0.0, t_end - now()))
        finally:
            self._heal()

    def _heal(self) -> None:
        for n in self.nodes:
            for proxy in n.proxies:
                proxy.heal()

    def _takeover(self) -> None:
        """A persistent subscriber's client id connects again, on a node the seed picks, while its
        session is live and messages stream to it."""
        s = self.rng.choice([s for s in self.subscribers if s.persistent])
        node = self.rng.choice(self.nodes)
        self.fault("takeover", f"{s.name} from {s.node.name} to a new connection on {node.name}")
        s.takeover(node)

    def _drop(self) -> None:
        """A client closes its socket without DISCONNECT and comes back a moment later (a
        persistent subscriber possibly on another node)."""
        e = self.rng.choice(self.endpoints())
        offline = self.rng.uniform(*OFFLINE)
        moves = isinstance(e, Subscriber) and e.persistent
        node = self.rng.choice(self.nodes) if moves else e.node
        self.fault("drop", f"{e.name} ({e.kind()}) drops its connection on {e.node.name}, back on "
                           f"{node.name} after {offline:.2f} s")
        e.drop(offline, node)  # type: ignore[attr-defined]

    def settle(self) -> None:
        """Every client connected (and subscribed) again, bounded."""
        try:
            wait_for(lambda: all(e.ready() for e in self.endpoints()), SETTLE, "every client back")
        except AssertionError:
            late = [e.name for e in self.endpoints() if not e.ready()]
            self.problem(f"at {self.rel(now()):.2f} s, {SETTLE:g} s after the fault, still not connected "
                         f"and subscribed: {', '.join(late)}")

    # -- the end

    def finish(self) -> Report:
        """Stop the traffic, let every subscriber receive what it is owed (bounded), then check
        the invariants. Returns the figures and every violation found."""
        self.settle()
        for p in self.publishers:
            p.stop()
        try:
            wait_for(lambda: all(p.unacked() == 0 for p in self.publishers), WAIT, "the last PUBACKs")
        except AssertionError:
            self.note(f"{sum(p.unacked() for p in self.publishers)} publishes never acknowledged "
                      "(not counted)")
        msgs = [m for p in self.publishers for m in p.acked_messages()]
        verdicts = self._drain(msgs)
        report = self._report(msgs, verdicts)
        placed = self.placement()
        self._sessions_come_back(report)
        self._check_interest(report)
        self._check_probes(report)
        self._check_logs(report)
        self._check_wills(report)
        report.details += [f"placement at start: {self.placed_at_start}", f"placement at the end: {placed}"]
        if self.notes:
            report.details += ["notes:", *(f"  {n}" for n in self.notes)]
        report.violations[:0] = self.problems
        return report

    def evaluate(self, msgs: list[Msg]) -> list[Verdict]:
        """What each subscriber and the group are owed (see the module docstring)."""
        out = [self._owed(s, msgs) for s in self.subscribers]
        if self.members:
            out.append(self._group_owed(msgs))
        return out

    def _owed(self, s: Subscriber, msgs: list[Msg]) -> Verdict:
        with s.lock:
            got = Counter(s.received)
            mine = [m for m in msgs if matches(s.match_filter, m.topic)]
            if s.persistent:  # every acknowledged message since its first SUBACK, moves included
                start = s.first_suback if s.first_suback is not None else float("inf")
                return Verdict(s.name, [m for m in mine if m.t_send >= start], [], got)
            last = s.epochs[-1] if s.epochs else None
            if last is None or last.end is not None or s.conn is None or last.gen != s.conn.gen:
                return Verdict(s.name, [], [], got, "not connected at the end: not checked")
            return Verdict(s.name, [m for m in mine if m.t_send >= last.start], [], got)

    def _group_owed(self, msgs: list[Msg]) -> Verdict:
        got: Counter[tuple[str, int]] = Counter()
        up: list[tuple[str, float, float]] = []  # member connections: (member, SUBACK, end or now)
        departures: list[float] = []
        for s in self.members:
            with s.lock:
                got.update(s.received)
                departures += s.departures
                up += [(s.name, e.start, now() if e.end is None else e.end) for e in s.epochs]
        owed, excused = [], []
        for m in msgs:
            if not matches(self.members[0].match_filter, m.topic):
                continue
            covering = [name for name, lo, hi in up if lo <= m.t_send and m.t_ack <= hi]
            if not covering:
                continue  # no member connected for the message's whole life: the group is owed nothing
            if any(m.overlaps(d - GROUP_BEFORE, d + GROUP_AFTER) for d in departures):
                excused.append((m, "member left"))
            else:
                owed.append(m)
        return Verdict("group " + self.members[0].filter, owed, excused, got)

    def _drain(self, msgs: list[Msg]) -> list[Verdict]:
        """Wait until every subscriber has what it is owed, or nothing arrived for ``STAGNANT``
        seconds, at most ``DRAIN`` seconds."""
        everyone = [*self.subscribers, *self.members]
        start = now()

        def missing() -> int:
            return sum(len(v.lost()) for v in self.evaluate(msgs))

        while missing():
            latest = max([start, *(s.last_msg for s in everyone)])
            if now() - start > DRAIN or now() - latest > STAGNANT:
                break
            self.pause(0.2)  # the poll interval of this bounded wait
        return self.evaluate(msgs)

    def _report(self, msgs: list[Msg], verdicts: list[Verdict]) -> Report:
        counts = Counter(f.kind for f in self.faults)
        kinds = " ".join(f"{k}={counts[k]}" for k in self.fault_kinds if counts[k])
        checked = sum(len(v.owed) for v in verdicts)
        lost = sum(len(v.lost()) for v in verdicts)
        dup = sum(v.duplicated() for v in verdicts)
        excused = sum(len(v.excused) for v in verdicts)
        excused_lost: Counter[str] = sum((v.excused_lost() for v in verdicts), Counter())
        line = (f"chaos {self.name} seed={self.seed} faults={len(self.faults)} ({kinds}) acked={len(msgs)} "
                f"checked={checked} lost={lost} duplicated={dup} excused={excused} "
                f"(lost {sum(excused_lost.values())}{': ' if excused_lost else ''}"
                f"{', '.join(f'{why} {n}' for why, n in sorted(excused_lost.items()))}) "
                f"elapsed={self.rel(now()):.1f}s (replay: {self.seed_env}={self.seed})")
        report = Report(line)
        report.details.append("faults:")
        report.details += [f"  {f.t:7.2f} s  {f.kind:9} {f.what}" for f in self.faults]
        report.details.append("per subscriber (owed / lost / duplicated / excused / excused and lost):")
        for v in verdicts:
            report.details.append(f"  {v.name:12} {len(v.owed):6} {len(v.lost()):6} {v.duplicated():6} "
                                  f"{len(v.excused):6} {sum(v.excused_lost().values()):6}  {v.note}")
            lost_here = v.lost()
            if lost_here:
                by_pub = Counter(m.pub for m in lost_here)
                first, last = lost_here[0], lost_here[-1]
                report.violations.append(
                    f"{v.name}: lost {len(lost_here)} of {len(v.owed)} acknowledged messages (by publisher "
                    f"{dict(by_pub)}; sent between {self.rel(min(m.t_send for m in lost_here)):.2f} s and "
                    f"{self.rel(max(m.t_send for m in lost_here)):.2f} s; e.g. {first.pub}:{first.seq} acked at "
                    f"{self.rel(first.t_ack):.2f} s, {last.pub}:{last.seq} at {self.rel(last.t_ack):.2f} s; "
                    f"after faults: {self._after_faults(lost_here)})")
                report.details += self._warnings_about(f"{v.name}-{self.uid}")
        for s in [*self.subscribers, *self.members]:
            if s.misrouted:
                report.violations.append(f"{s.name}: {len(s.misrouted)} messages it should not have got, "
                                         f"e.g. {s.misrouted[:SAMPLES]}")
        return report

    def _warnings_about(self, client_id: str, most: int = 12) -> list[str]:
        """The brokers' warnings and errors that name ``client_id`` (a subscriber that lost
        messages), oldest first, at most ``most``: where a session was given up, capped or moved
        against a fault, for whoever reads a failed run (the logs themselves stay with xprocess)."""
        lines = sorted(line for n in self.nodes for line in n.broker.log_text().splitlines()
                       if client_id in line and (" WARNING " in line or " ERROR " in line))
        if not lines:
            return []
        return [f"warnings naming {client_id} ({len(lines)}; at most {most} shown):",
                *(f"  {line[:300]}" for line in lines[:most])]

    def _after_faults(self, lost: list[Msg]) -> str:
        """How many lost messages were sent after each fault (before the next)."""
        by: Counter[str] = Counter()
        for m in lost:
            t = self.rel(m.t_send)
            before = [f for f in self.faults if f.t <= t]
            by[f"#{len(before)} {before[-1].kind}" if before else "none yet"] += 1
        return ", ".join(f"{k}: {n}" for k, n in sorted(by.items()))

    def _sessions_come_back(self, report: Report) -> None:
        """Every persistent session once more: DISCONNECT, CONNECT again, session present = 1."""
        for s in self.subscribers:
            if not s.persistent or s.conn is None:
                continue
            old = s.conn
            old.retire()
            old.disconnect()
            try:
                s.open(s.node)  # ``Subscriber.connected`` records a session present = 0
            except AssertionError as exc:
                report.violations.append(f"{s.name}: no CONNACK when it came back at the end: {exc}")

    def _check_interest(self, report: Report) -> None:
        """The routers' own view, from their stats snapshots: each router's ``interest`` (filter,
        peer router) pairs must be the other routers' ``filters`` summed, every router must know the
        one shared group, and the subscriptions and group members held in the cluster must be
        those of the live sessions (one per persistent session, wherever it lives now)."""
        from brokerd.cluster.config import load
        from brokerd.cluster.stats_cli import StatsReader

        subs = sum(1 for s in self.subscribers if s.persistent or s.ready())
        members = sum(1 for s in self.members if s.ready())
        readers = [StatsReader(load(n.stats_args(), environ={}), workers=n.workers) for n in self.nodes]
        routers = set(self.routers())
        since = time.time()
        latest: dict[str, dict] = {}
        wrong: list[str] = []
        deadline = now() + WAIT
        try:
            while now() < deadline:
                for r in readers:
                    for topic, body in r.receive(0.1):
                        if topic == b"snap" and body.get("ts", 0) >= since:
                            latest[body["router_id"]] = body
                if set(latest) >= routers:
                    wrong = self._interest_wrong({k: latest[k] for k in routers}, subs, members)
                    if not wrong:
                        return
        finally:
            for r in readers:
                r.close()
        if not set(latest) >= routers:
            wrong.append(f"no fresh stats snapshot from {sorted(routers - set(latest))}")
        report.violations.append("interest tables do not match the live subscriptions after the faults: "
                                 + "; ".join(wrong))

    @staticmethod
    def _interest_wrong(snaps: dict[str, dict], subs: int, members: int) -> list[str]:
        total_filters = sum(s["filters"] for s in snaps.values())
        wrong = []
        for rid, s in sorted(snaps.items()):
            want = total_filters - s["filters"]
            if s["interest"] != want:
                wrong.append(f"{rid} forwards by {s['interest']} (filter, router) pairs, the other routers "
                             f"hold {want} filters")
            if s["shared"]["routes"] != 1:
                wrong.append(f"{rid} knows {s['shared']['routes']} shared groups, not 1")
        held = sum(s["subscriptions"] for s in snaps.values())
        if held != subs:
            by_router = {rid: s["subscriptions"] for rid, s in sorted(snaps.items())}
            wrong.append(f"{held} subscriptions held in the cluster, {subs} live (by router: {by_router})")
        held_members = sum(s["shared"]["members"] for s in snaps.values())
        if held_members != members:
            wrong.append(f"{held_members} shared group members held, {members} live")
        return wrong

    def _check_probes(self, report: Report) -> None:
        """The behavioural side of the interest tables: a fresh subscriber on every router gets a
        fresh message published from every other router."""
        pairs = probe_mesh(self.nodes, f"end{self.uid}", WAIT, self.credentials)
        if pairs:
            report.violations.append(f"after the faults, {len(pairs)} router pairs do not deliver: "
                                     + ", ".join(pairs))

    def _check_wills(self, report: Report) -> None:
        """A node lost for good closes its clients' connections without a DISCONNECT: the will of
        each persistent session connected to it (for ``WILL_SETTLED_S`` or more: its state had
        reached the follower) goes out from a holder of its session (docs/guarantees.md, "What the cluster
        guarantees under faults"). Read from the nodes' logs: the line the holder writes."""
        texts = [n.broker.log_text() for n in self.nodes]
        missing = [f"{cid} ({fault})" for fault, cid in self.wills_owed
                   if not any(re.search(rf"the will of session {re.escape(cid)} of silent router \S+ published here",
                                        t) for t in texts)]
        if missing:
            report.violations.append(f"{len(missing)} will(s) of clients connected to a lost node never "
                                     f"published: {', '.join(missing)}")
        if self.wills_owed:  # on the figures' line: how many were owed, and published
            report.line += f" wills={len(self.wills_owed) - len(missing)}/{len(self.wills_owed)}"

    def _check_logs(self, report: Report) -> None:
        for n in self.nodes:
            text = n.broker.log_text()
            count = text.count("Traceback")
            if count:
                at = text.index("Traceback")
                excerpt = text[max(0, at - 300):at + 1500]
                report.violations.append(f"node {n.name}: {count} traceback(s) in its log, the first:\n{excerpt}")


def start_nodes(start_broker: Callable[..., Broker], names: str = "abc", workers: int = 2,
                partitionable: bool = False, agreement: bool = AGREEMENT) -> list[Node]:
    """Nodes on 127.0.0.1, .2, .3, each with ``workers`` workers and a mesh port; each peers with
    the previous one (the first with the second): the rest is learned by gossip. Returns once
    every router delivers to every other (``probe_mesh``), bounded. ``partitionable``: every
    router's mesh behind a proxy the node advertises (``--mesh-advertise``), which the partition
    fault cuts (tests/cluster/partition.py); the caller closes them (``close_proxies``).
    ``agreement``: each node has a Raft member (``--agreement``), every other as a peer; the
    proxies cut the mesh only (tests/partition cuts every link)."""
    hosts = [f"127.0.0.{i + 1}" for i in range(len(names))]
    ports = [_mesh_port(h, workers) for h in hosts]
    advertised = [_mesh_port(h, workers) for h in hosts] if partitionable else ports
    agree = [_mesh_port(h, 1) for h in hosts]
    starts, proxies_of = [], []
    for i, (host, name) in enumerate(zip(hosts, names, strict=True)):
        peer = 1 if i == 0 else i - 1
        args = [*BROKER_ARGS, *FSYNC_ALWAYS, "--mesh", f"{host}:{ports[i]}", *mesh_key(),
                "--peer", f"{hosts[peer]}:{advertised[peer]}"]
        if agreement and len(names) > 1:
            args += ["--agreement", f"{host}:{agree[i]}"]
            args += [a for j in range(len(names)) if j != i for a in ("--agreement-peer", f"{hosts[j]}:{agree[j]}")]
        else:
            args += LEASES
        proxies = []
        if partitionable:
            proxies = [MeshProxy(host, ports[i] + w, advertised[i] + w) for w in range(workers)]
            args += ["--mesh-advertise", f"{host}:{advertised[i]}"]
        proxies_of.append(proxies)
        starts.append(functools.partial(start_broker, *args, workers=workers, host=host, node_id=name))
    nodes = [Node(name, broker, workers, proxies)
             for name, broker, proxies in zip(names, in_parallel(*starts), proxies_of, strict=True)]
    rounds = itertools.count()
    missing: list[str] = []

    def complete() -> bool:
        missing[:] = probe_mesh(nodes, f"start{next(rounds)}-{uuid.uuid4().hex[:6]}", 2.0)
        return not missing

    try:
        wait_for(complete, 30, "a full mesh")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {len(missing)} router pairs do not deliver: {', '.join(missing)}") from None
    if agreement and len(names) > 1:
        serving_sessions(nodes)
    return nodes


def close_proxies(nodes: list[Node]) -> None:
    for node in nodes:
        for proxy in node.proxies:
            proxy.heal()
            proxy.close()


def serving_sessions(nodes: list[Node], credentials: tuple[str, str] | None = None, timeout: float = 30.0) -> None:
    """With agreement, a node takes persistent sessions in once its member can commit (a second
    or two after the start) and each worker has heard so: wait until every node accepts them (a
    probe's, each ended at once by a clean start with its id), bounded."""
    def accepts(node: Node) -> bool:
        # Several connections, so that every worker is likely tried (the kernel picks one per
        # connection): each worker learns of its member's majority on its own. Raw sockets, not
        # paho: many clients a probe round, none left to a later test.
        for _ in range(4 * node.workers):
            cid = f"probe-agreed-{node.name}-{uuid.uuid4().hex[:6]}"
            if any(_connack(node.host, node.port, cid, clean, credentials) != 0 for clean in (False, True)):
                return False
        # And each worker took one in, as its log says: the kernel may give every probe of a round
        # to one worker while another still refuses (partition seed 338: a/w1 refused the first
        # persistent client 0.2 s after eight probes all landed on a/w0).
        text = node.broker.log_text()
        if " connected from " not in text:  # (a --log-level that writes no connect lines: the rounds alone)
            return True
        return all(re.search(rf"\[{re.escape(rid)}\] .* client probe-agreed-{re.escape(node.name)}-\w+ connected .*"
                             r"new persistent session", text) for rid in node.router_ids())

    for node in nodes:
        wait_for(lambda node=node: accepts(node), timeout, f"node {node.name} taking persistent sessions in")


def _connack(host: str, port: int, client_id: str, clean: bool, credentials: tuple[str, str] | None) -> int:
    """An MQTT 3.1.1 CONNECT on a plain socket: the CONNACK's return code (-1: none came), then
    DISCONNECT."""
    def utf8(v: str) -> bytes:
        return len(v.encode()).to_bytes(2, "big") + v.encode()

    flags = 0x02 if clean else 0
    payload = utf8(client_id)
    if credentials is not None:
        flags |= 0xC0
        payload += utf8(credentials[0]) + utf8(credentials[1])
    body = utf8("MQTT") + bytes([4, flags]) + (30).to_bytes(2, "big") + payload
    try:
        with socket.create_connection((host, port), timeout=5.0) as sock:
            sock.sendall(bytes([0x10, len(body)]) + body)
            ack = b""
            while len(ack) < 4:
                data = sock.recv(4 - len(ack))
                if not data:
                    return -1
                ack += data
            sock.sendall(b"\xe0\x00")
            return ack[3]
    except OSError:
        return -1


def probe_mesh(nodes: list[Node], tag: str, wait: float, credentials: tuple[str, str] | None = None) -> list[str]:
    """Connect clients until one lands on every router (the kernel picks the worker; bounded), let
    each subscribe to ``chaosprobe/<tag>/#`` and publish one message there; returns the
    ``source -> destination`` router pairs whose message did not arrive within ``wait`` seconds
    (a router no connection landed on counts as not delivering). Read from outside, by clients:
    it depends on nothing the broker logs or reports about itself."""
    base = f"chaosprobe/{tag}"
    routers = [rid for n in nodes for rid in n.router_ids()]
    probes: dict[str, Client] = {}
    try:
        for node in nodes:
            for i in range(8 * node.workers):
                c = Client(node.port, f"probe-{tag}-{node.name}{i}", host=node.host)
                if credentials is not None:
                    c.c.username_pw_set(*credentials)
                c.connect()
                index = node.worker_of(c.c.socket().getsockname()[1])
                rid = f"{node.name}/w{index}"
                if index is None or rid in probes:
                    c.disconnect()
                else:
                    probes[rid] = c
                if all(r in probes for r in node.router_ids()):
                    break
        for c in probes.values():
            c.subscribe(f"{base}/#", 1)
        for rid, c in probes.items():
            c.c.publish(f"{base}/{rid}", rid.encode(), qos=1)

        def heard(c: Client) -> set[str]:
            with c.cond:
                return {m.payload.decode() for m in c.messages}

        try:
            wait_for(lambda: all(heard(c) >= set(probes) for c in probes.values()), wait,
                     "every probe message at every probe")
        except AssertionError:
            pass
        return [f"{src} -> {dst}" for dst in routers for src in routers if src != dst
                and (dst not in probes or src not in heard(probes[dst]))]
    finally:
        for c in probes.values():
            c.disconnect()


def _mesh_port(host: str, count: int) -> int:
    """A port P with P .. P+count-1 free on ``host`` (router i of a node binds P+i), below the
    kernel's ephemeral range (``free_port``): a port bound to 0 comes from that range, where a
    client connection of this or another test may take it before the node binds it."""
    for _ in range(50):
        p = free_port(host)
        try:
            for i in range(1, count):
                with socket.socket() as s2:
                    s2.bind((host, p + i))
            return p
        except OSError:
            continue
    raise AssertionError("no free mesh ports")
