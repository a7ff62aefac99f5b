"""The scenarios, named after the Open MQTT Benchmark Suite, as plans the load generator executes.

A plan is plain data (picklable, handed to forked generator processes): groups of publishers and
subscribers that share a flow-control window, and the clients with the process each runs in.
Keeping the shape here and the mechanics in ``loadgen`` lets a scenario be read in a few lines.

Flow control: a group may have at most ``window`` messages per subscriber published but not yet
delivered. That keeps the broker in steady state (no unbounded queues, no drops from queue limits)
while still letting publishers write in large pipelined batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PLACEMENTS = ("any", "same", "cross")
PLACED_SCENARIOS = frozenset({"p2p", "qos1", "latency"})
SCENARIOS = ("p2p", "fanout", "fanin", "qos1", "conn", "latency", "sharedsub", "fleet")
PAYLOAD_SCENARIOS = frozenset({"p2p", "fanout", "fanin", "qos1", "latency", "sharedsub", "fleet"})
FIXED_RATE_SCENARIOS = frozenset({"latency", "fleet"})  # offered load, not saturation
FLEET_SUBSCRIBERS = 2  # the backend's wildcard subscribers of a fleet
SHARED_GROUP = "bench"  # sharedsub: members subscribe $share/bench/bench/shared/# (MQTT 3.1.1 is enough)

LATENCY_GROUP_TOPIC = "bench/lat/side"


@dataclass(frozen=True)
class Sizes:
    """How big each scenario is; defaults fit a 2-core machine and a run of a few minutes."""

    pairs: int = 10
    subscribers: int = 50
    publishers: int = 20
    members: int = 5
    connections: int = 2000
    persistent: bool = False  # conn: persistent sessions (clean session 0) instead of clean ones
    window: int = 500
    inflight: int = 100
    per_write: int = 0  # PUBLISH packets per write at most (0: what the window allows; 1: a device)
    devices: int = 5000  # fleet: connected devices ...
    device_rate: float = 1.0  # ... each publishing this many QoS 1 messages a second
    latency_rate: float = 100.0
    latency_load: float = 10_000.0
    probe_alone: bool = True  # the side channel in a generator process of its own
    drain_quiet: float = 0.3  # after the window, a run ends once deliveries stop this long


@dataclass(frozen=True)
class GroupSpec:
    """Publishers and subscribers that share one flow-control window.

    ``fan`` is the number of deliveries one publish should cause (subscribers matching it);
    ``rate`` (msg/s for the whole group, 0 = as fast as the window allows) makes an open-loop load.
    ``side`` marks the latency side channel, which is timed, not counted in throughput.
    """

    gid: int
    fan: int
    qos: int
    window: int
    rate: float = 0.0
    side: bool = False


@dataclass(frozen=True)
class ClientSpec:
    """One connection: ``role`` is pub, sub, lat_pub, lat_sub, idle or kept (idle, with a persistent
    session); ``topic`` is the topic it publishes to or the filter it subscribes to."""

    role: str
    gid: int
    topic: str
    proc: int


@dataclass
class Plan:
    scenario: str
    payload: int
    procs: int
    groups: list[GroupSpec] = field(default_factory=list)
    clients: list[ClientSpec] = field(default_factory=list)
    inflight: int = 100
    per_write: int = 0
    connect_concurrency: int = 100
    # p2p/qos1/latency on a multi-worker brokerd: "same" puts each publisher on its subscriber's
    # worker, "cross" on another one (what cross-worker delivery costs); "any": where the kernel puts it.
    placement: str = "any"
    broker_pids: tuple[int, ...] = ()
    # After the window, what has not arrived once deliveries stopped this long counts as lost.
    drain_quiet: float = 0.3

    @property
    def drain_max(self) -> float:
        """The drain's bound: ten quiet spells, at least 3 s."""
        return max(3.0, 10 * self.drain_quiet)

    @property
    def is_conn(self) -> bool:
        return self.scenario == "conn"

    def clients_of(self, proc: int) -> list[ClientSpec]:
        return [c for c in self.clients if c.proc == proc]


def _add_side_channel(plan: Plan, sizes: Sizes) -> None:
    """A low-rate publisher/subscriber pair whose payloads carry send timestamps, in a generator
    process of its own (``probe_alone``, one more than ``--procs``) or in process 0.

    Alone, an arrival is timed as soon as it arrives: in process 0 it waits for that process's
    event loop to finish reading the load first, which adds the generator's own delay to the
    broker's - the more traffic a broker carries, the more - so the faster broker looked slower
    at saturation."""
    if sizes.latency_rate <= 0:
        return
    gid = len(plan.groups)
    proc = 0
    if sizes.probe_alone:
        proc = plan.procs
        plan.procs += 1
    plan.groups.append(GroupSpec(gid, fan=1, qos=0, window=0, rate=sizes.latency_rate, side=True))
    plan.clients.append(ClientSpec("lat_sub", gid, LATENCY_GROUP_TOPIC, proc))
    plan.clients.append(ClientSpec("lat_pub", gid, LATENCY_GROUP_TOPIC, proc))


def _p2p(plan: Plan, sizes: Sizes, qos: int, total_rate: float) -> None:
    per_pair = total_rate / sizes.pairs if total_rate else 0.0
    for i in range(sizes.pairs):
        gid = len(plan.groups)
        proc = i % plan.procs
        topic = f"bench/p2p/{i}"
        plan.groups.append(GroupSpec(gid, fan=1, qos=qos, window=sizes.window, rate=per_pair))
        plan.clients.append(ClientSpec("sub", gid, topic, proc))
        plan.clients.append(ClientSpec("pub", gid, topic, proc))


def _sharedsub(plan: Plan, sizes: Sizes) -> None:
    """P publishers on their own topics, one shared subscription group of S members: each message
    should reach exactly one member (fan 1), so the window counts messages, not deliveries x S."""
    plan.groups.append(GroupSpec(0, fan=1, qos=0, window=sizes.window))
    for i in range(sizes.members):
        plan.clients.append(ClientSpec("sub", 0, f"$share/{SHARED_GROUP}/bench/shared/#", i % plan.procs))
    for i in range(sizes.publishers):
        plan.clients.append(ClientSpec("pub", 0, f"bench/shared/{i}", i % plan.procs))


def _fleet(plan: Plan, sizes: Sizes) -> None:
    """A device fleet: ``devices`` connections, each publishing QoS 1 to its own topic
    ``device_rate`` times a second as a device does (one PUBLISH per write, the next only after its
    PUBACK), and the backend's two wildcard subscribers (QoS 1) of all of them. A fixed load: what
    it measures is the CPU per message of a broker that is mostly waiting."""
    plan.inflight = 1
    plan.per_write = 1
    total = sizes.devices * sizes.device_rate
    plan.groups.append(GroupSpec(0, fan=FLEET_SUBSCRIBERS, qos=1, window=max(sizes.window, sizes.devices), rate=total))
    for i in range(FLEET_SUBSCRIBERS):
        plan.clients.append(ClientSpec("sub", 0, "bench/fleet/#", i % plan.procs))
    for i in range(sizes.devices):
        plan.clients.append(ClientSpec("pub", 0, f"bench/fleet/{i}", i % plan.procs))


def build(scenario: str, payload: int, procs: int, sizes: Sizes) -> Plan:
    """The plan for one scenario run. Subscribers are listed before publishers so they subscribe first."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
    plan = Plan(scenario, payload if scenario in PAYLOAD_SCENARIOS else 0, max(1, procs), inflight=sizes.inflight,
                per_write=sizes.per_write, drain_quiet=sizes.drain_quiet)
    if scenario == "p2p":
        _p2p(plan, sizes, qos=0, total_rate=0.0)
    elif scenario == "qos1":
        _p2p(plan, sizes, qos=1, total_rate=0.0)
    elif scenario == "latency":
        _p2p(plan, sizes, qos=0, total_rate=sizes.latency_load)
    elif scenario == "fanout":
        plan.groups.append(GroupSpec(0, fan=sizes.subscribers, qos=0, window=sizes.window))
        for i in range(sizes.subscribers):
            plan.clients.append(ClientSpec("sub", 0, "bench/fanout", i % plan.procs))
        plan.clients.append(ClientSpec("pub", 0, "bench/fanout", 0))
    elif scenario == "fanin":
        plan.groups.append(GroupSpec(0, fan=1, qos=0, window=sizes.window))
        plan.clients.append(ClientSpec("sub", 0, "bench/fanin/#", 0))
        for i in range(sizes.publishers):
            plan.clients.append(ClientSpec("pub", 0, f"bench/fanin/{i}", i % plan.procs))
    elif scenario == "sharedsub":
        _sharedsub(plan, sizes)
    elif scenario == "fleet":
        _fleet(plan, sizes)
    elif scenario == "conn":
        for i in range(sizes.connections):
            plan.clients.append(ClientSpec("kept" if sizes.persistent else "idle", -1, "", i % plan.procs))
        return plan
    _add_side_channel(plan, sizes)
    return plan
