"""One scenario run against one running broker: fork the generator processes, drive the timeline,
sample the broker's CPU and RSS at the window edges, and reduce everything to the figures of a run.

The coordinator itself runs no event loop and no clients, so its own work never competes with the
generators; it sleeps until each instant it must sample.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from . import loadgen
from .brokers import HOST, RunningBroker
from .scenarios import Plan

SATURATED_CPU = 0.90  # a generator process above this share of a core: the run may measure the generator
SETTLE_S = 0.5  # after the last SUBACK: lets a multi-worker broker spread its subscriptions
START_DELAY_S = 0.05


@dataclass
class Timing:
    warmup: float = 1.0
    duration: float = 5.0


@dataclass
class RunResult:
    scenario: str
    payload: int
    broker: str
    workers: int
    rep: int
    ok: bool = True
    error: str = ""
    delivered_per_s: float = 0.0
    published_per_s: float = 0.0
    loss: float = 0.0
    duplicates: float = 0.0  # deliveries beyond published x fan, as a share of published x fan
    broker_cpu_s: float = 0.0
    msgs_per_cpu_s: float | None = 0.0
    broker_cpu_share: float = 0.0  # broker CPU seconds per wall second in the window (cores used)
    lat_p50_ms: float | None = None
    lat_p99_ms: float | None = None
    lat_max_ms: float | None = None
    lat_samples: int = 0
    connections: int = 0
    connects_per_s: float = 0.0
    rss_per_conn_bytes: float | None = None
    idle_cpu_ms_per_s: float | None = None  # conn: broker CPU per wall second while the connections idle
    broker_rss_mb: float = 0.0
    loadgen_cpu: list[float] = field(default_factory=list)  # share of one core, per generator process
    loadgen_saturated: bool = False
    stalls: int = 0
    lost_connections: int = 0
    reconnects: int = 0  # connects the generator tried again (the broker closed them before CONNACK)
    bad_reads: int = 0  # reads that did not begin with a PUBLISH on the subscribed topic
    publisher_balance: float | None = None  # least / most messages sent by one publisher (1.0 = even)
    subscriber_balance: float | None = None  # least / most messages received by one subscriber

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (q in 0..100)."""
    if not sorted_values:
        raise ValueError("no values")
    rank = max(1, min(len(sorted_values), round(q / 100.0 * len(sorted_values) + 0.5 - 1e-9)))
    return sorted_values[int(rank) - 1]


class Generators:
    """The forked generator processes of one run and the pipes to them."""

    def __init__(self, plan: Plan, port: int) -> None:
        ctx = mp.get_context("fork")
        n = max(1, len(plan.groups)) * plan.procs
        self.shared_pub = ctx.RawArray("q", n)
        self.shared_dlv = ctx.RawArray("q", n)
        self.pipes: list[Connection] = []
        self.procs: list[mp.process.BaseProcess] = []
        for k in range(plan.procs):
            parent, child = ctx.Pipe()
            p = ctx.Process(
                target=loadgen.worker_main,
                args=(plan, k, child, self.shared_pub, self.shared_dlv, HOST, port),
                name=f"bench-loadgen-{k}",
                daemon=True,
            )
            p.start()
            child.close()
            self.pipes.append(parent)
            self.procs.append(p)

    def gather(self, kind: str, timeout: float) -> list[Any]:
        """One message of ``kind`` from every generator, or RuntimeError with the first failure."""
        deadline = time.monotonic() + timeout
        out: list[Any] = []
        for k, pipe in enumerate(self.pipes):
            left = deadline - time.monotonic()
            if left <= 0 or not pipe.poll(left):
                raise RuntimeError(f"generator {k}: no {kind!r} within {timeout:.0f} s")
            try:
                msg = pipe.recv()
            except EOFError as exc:
                raise RuntimeError(f"generator {k} exited before {kind!r}") from exc
            if msg[0] == "error":
                raise RuntimeError(msg[1])
            if msg[0] != kind:
                raise RuntimeError(f"generator {k}: expected {kind!r}, got {msg[0]!r}")
            out.append(msg[1])
        return out

    def send(self, *msg: Any) -> None:
        for pipe in self.pipes:
            pipe.send(msg)

    def close(self) -> None:
        for p in self.procs:
            p.join(5.0)
        for p in self.procs:
            if p.is_alive():
                p.kill()
                p.join(2.0)
        for pipe in self.pipes:
            pipe.close()


def _sleep_until(t: float) -> None:
    left = t - time.monotonic()
    if left > 0:
        time.sleep(left)


def run_load(plan: Plan, broker: RunningBroker, timing: Timing, result: RunResult) -> None:
    connect_budget = 30.0 + len(plan.clients) / 50.0
    if plan.placement != "any":
        plan.broker_pids = tuple(p.pid for p in broker.processes())
    gens = Generators(plan, broker.port)
    try:
        gens.gather("ready", connect_budget)
        time.sleep(SETTLE_S)
        t0 = time.monotonic() + START_DELAY_S
        w0 = t0 + timing.warmup
        w1 = w0 + timing.duration
        gens.send("go", t0, w0, w1)
        _sleep_until(w0)
        cpu0, tw0 = broker.cpu_seconds(), time.monotonic()
        _sleep_until(w1)
        cpu1, tw1 = broker.cpu_seconds(), time.monotonic()
        result.broker_rss_mb = broker.rss_bytes() / 2**20
        reports = gens.gather("result", plan.drain_max + 30.0)
    finally:
        gens.close()
    _reduce_load(plan, reports, cpu1 - cpu0, tw1 - tw0, result)


def _reduce_load(plan: Plan, reports: list[dict[str, Any]], cpu: float, wall: float, result: RunResult) -> None:
    delivered_rate = published_rate = 0.0
    delivered_win = 0
    expected_total = delivered_total = 0
    pub_by_group: dict[int, int] = {}
    dlv_by_group: dict[int, int] = {}
    fan: dict[int, int] = {}
    samples: list[int] = []
    sent = [n for r in reports for n in r["publisher_sent"]]
    if sent and max(sent) > 0:
        result.publisher_balance = round(min(sent) / max(sent), 3)
    got = [n for r in reports for n in r.get("subscriber_received", ())]
    if got and max(got) > 0:
        result.subscriber_balance = round(min(got) / max(got), 3)
    for r in reports:
        span = r["w1"]["t"] - r["w0"]["t"]
        dp = sum(r["w1"]["dlv"].values()) - sum(r["w0"]["dlv"].values())
        pp = sum(r["w1"]["pub"].values()) - sum(r["w0"]["pub"].values())
        delivered_rate += dp / span
        published_rate += pp / span
        delivered_win += dp
        cpu_share = (r["w1"]["cpu"] - r["w0"]["cpu"]) / span
        result.loadgen_cpu.append(round(cpu_share, 3))
        for g, n in r["end"]["pub"].items():
            pub_by_group[g] = pub_by_group.get(g, 0) + n
        for g, n in r["end"]["dlv"].items():
            dlv_by_group[g] = dlv_by_group.get(g, 0) + n
        fan.update(r["fan"])
        samples.extend(r["latency_ns"])
        result.stalls += r["stalls"]
        result.lost_connections += r["lost_connections"]
        result.reconnects += r.get("reconnects", 0)
        result.bad_reads += r["bad_reads"]
    for g, pub in pub_by_group.items():
        expected_total += pub * fan[g]
    delivered_total = sum(dlv_by_group.values())
    result.delivered_per_s = delivered_rate
    result.published_per_s = published_rate
    result.loss = max(0.0, 1.0 - delivered_total / expected_total) if expected_total else 0.0
    result.duplicates = max(0.0, delivered_total / expected_total - 1.0) if expected_total else 0.0
    result.broker_cpu_s = cpu
    result.broker_cpu_share = cpu / wall if wall > 0 else 0.0
    result.msgs_per_cpu_s = delivered_win / cpu if cpu >= 0.02 else None  # below that: clock-tick noise
    result.loadgen_saturated = any(c > SATURATED_CPU for c in result.loadgen_cpu)
    result.connections = len(plan.clients)
    problems = []
    if result.bad_reads:
        problems.append(f"{result.bad_reads} reads did not start with a PUBLISH on the subscribed topic")
    if delivered_total > expected_total:
        problems.append(f"{delivered_total - expected_total} deliveries more than published x subscribers (duplicates)")
    result.error = "; ".join(problems)
    if samples:
        samples.sort()
        result.lat_samples = len(samples)
        result.lat_p50_ms = percentile(samples, 50) / 1e6
        result.lat_p99_ms = percentile(samples, 99) / 1e6
        result.lat_max_ms = samples[-1] / 1e6


def run_conn(plan: Plan, broker: RunningBroker, result: RunResult, idle_s: float = 5.0) -> None:
    """C idle connections: connects/s while opening them, the broker's RSS growth per connection,
    and the CPU the broker spends each second while they idle for ``idle_s`` (timers, stats: what
    idle costs; process CPU time comes in 10 ms ticks, so a longer window reads finer)."""
    gens = Generators(plan, broker.port)
    try:
        gens.gather("ready", 30.0)
        time.sleep(SETTLE_S)
        rss0 = broker.rss_bytes()
        cpu0 = broker.cpu_seconds()
        gens.send("go", 0.0, 0.0, 0.0)
        infos = gens.gather("connected", 60.0 + len(plan.clients) / 20.0)
        cpu1 = broker.cpu_seconds()
        time.sleep(SETTLE_S)
        rss1 = broker.rss_bytes()
        idle0 = broker.cpu_seconds()
        time.sleep(idle_s)
        idle_cpu = broker.cpu_seconds() - idle0
        gens.send("release")
        finals = gens.gather("result", 30.0)
    finally:
        gens.close()
    ok = sum(i["ok"] for i in infos)
    span = max(i["t_last"] for i in infos) - min(i["t_first"] for i in infos)
    result.connections = ok
    result.connects_per_s = ok / span if span > 0 else 0.0
    result.broker_cpu_s = cpu1 - cpu0
    result.broker_cpu_share = result.broker_cpu_s / span if span > 0 else 0.0
    # connects per broker-CPU-s; None where the connects took less CPU than the clock tick resolves
    result.msgs_per_cpu_s = ok / result.broker_cpu_s if result.broker_cpu_s >= 0.05 else None
    result.rss_per_conn_bytes = (rss1 - rss0) / ok if ok else None
    result.broker_rss_mb = rss1 / 2**20
    result.idle_cpu_ms_per_s = idle_cpu * 1000.0 / idle_s
    result.loadgen_cpu = [round(i["cpu"] / span, 3) if span > 0 else 0.0 for i in infos]
    result.loadgen_saturated = any(c > SATURATED_CPU for c in result.loadgen_cpu)
    result.lost_connections = sum(f["lost_connections"] for f in finals)
    result.reconnects = sum(i.get("reconnects", 0) for i in infos)
    errors = sum(i["errors"] for i in infos)
    if errors:
        first = next(i["first_error"] for i in infos if i["errors"])
        result.error = f"{errors} of {len(plan.clients)} connections failed: {first}"
        result.ok = ok > 0
