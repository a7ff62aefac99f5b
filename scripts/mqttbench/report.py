"""Turning runs into the figures people read: medians over repetitions, markdown tables, machine facts.

Tables are markdown so the README can carry them verbatim, together with the machine they ran on
and the exact command. Medians (not means) because a shared machine has outliers.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
from collections.abc import Iterable
from typing import Any

import psutil

from .brokers import LOG_OFF_ROW, mosquitto_version
from .runner import RunResult
from .scenarios import FIXED_RATE_SCENARIOS

MEDIAN_FIELDS = (
    "delivered_per_s", "published_per_s", "loss", "duplicates", "subscriber_balance", "msgs_per_cpu_s", "broker_cpu_share", "lat_p50_ms",
    "lat_p99_ms", "lat_max_ms", "connects_per_s", "rss_per_conn_bytes", "broker_rss_mb",
    "idle_cpu_ms_per_s",
)


def machine_info() -> dict[str, Any]:
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import uvloop

        uv = uvloop.__version__
    except ImportError:
        uv = "absent"
    return {
        "cpu": model,
        "logical_cpus": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "uvloop": uv,
        "mosquitto": mosquitto_version(),
    }


def machine_line(info: dict[str, Any]) -> str:
    return (
        f"{info['cpu']}, {info['logical_cpus']} logical CPUs, {info['memory_gib']} GiB, Linux {info['kernel']}, "
        f"Python {info['python']}, uvloop {info['uvloop']}, Mosquitto {info['mosquitto']}"
    )


def _median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def summarize(results: list[RunResult]) -> list[dict[str, Any]]:
    """One row per (scenario, payload, broker, workers): medians over the repetitions that worked."""
    keyed: dict[tuple[str, int, str, int], list[RunResult]] = {}
    for r in results:
        keyed.setdefault((r.scenario, r.payload, r.broker, r.workers), []).append(r)
    rows = []
    for (scenario, payload, broker, workers), runs in keyed.items():
        good = [r for r in runs if r.ok]
        row: dict[str, Any] = {
            "scenario": scenario, "payload": payload, "broker": broker, "workers": workers,
            "reps": len(good), "failed": len(runs) - len(good),
            "errors": sorted({r.error for r in runs if r.error}),
            "loadgen_cpu_max": max((max(r.loadgen_cpu, default=0.0) for r in good), default=0.0),
            "loadgen_saturated": any(r.loadgen_saturated for r in good),
            "stalls": sum(r.stalls for r in good),
            "lost_connections": sum(r.lost_connections for r in good),
            "reconnects": sum(r.reconnects for r in good),
        }
        for name in MEDIAN_FIELDS:
            row[name] = _median(getattr(r, name) for r in good)
        rows.append(row)
    return rows


def rate(v: float | None) -> str:
    if v is None:
        return "n/a"
    if v >= 1_000_000:
        return f"{v / 1e6:.3g}M"
    if v >= 1000:
        return f"{v / 1000:.3g}k"
    return f"{v:.3g}"


def ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}" if v < 10 else f"{v:.0f}"


def kib(v: float | None) -> str:
    return "-" if v is None else f"{v / 1024:.1f} KiB"


def ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "n/a"
    return f"{a / b:.2f}"


def payload_label(row: dict[str, Any]) -> str:
    return "-" if row["scenario"] == "conn" else f"{row['payload']} B"


def notes(row: dict[str, Any]) -> str:
    out = []
    if row["loadgen_saturated"]:
        out.append(f"loadgen saturated ({row['loadgen_cpu_max']:.0%} of a core)")
    if row["scenario"] == "sharedsub":  # exactly-once per group is the point: always say it
        balance = row["subscriber_balance"]
        out.append(f"loss {row['loss'] or 0:.2%}, duplicates {row['duplicates'] or 0:.2%}"
                   + (f", least/most per member {balance:.2f}" if balance is not None else ""))
    else:
        if row["loss"]:
            out.append(f"loss {row['loss']:.2%}")
        if row["duplicates"]:
            out.append(f"duplicates {row['duplicates']:.2%}")
    if row["stalls"]:
        out.append(f"{row['stalls']} window stalls")
    if row["lost_connections"]:
        out.append(f"{row['lost_connections']} connections dropped")
    if row.get("reconnects"):
        out.append(f"{row['reconnects']} connects tried again (closed before CONNACK: a connection-rate limit)")
    if row["failed"]:
        out.append(f"{row['failed']} failed: {'; '.join(row['errors'])[:120]}")
    elif row["errors"]:
        out.append("; ".join(row["errors"])[:120])
    return ", ".join(out)


def _primary(row: dict[str, Any] | None) -> float | None:
    if row is None:
        return None
    return row["connects_per_s"] if row["scenario"] == "conn" else row["delivered_per_s"]


def _table(header: list[str], lines: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(line) + " |" for line in lines]
    return "\n".join(out)


def single_table(rows: list[dict[str, Any]]) -> str:
    """Every figure of every (scenario, payload, broker, workers), medians over repetitions."""
    header = [
        "scenario", "payload", "broker", "workers", "delivered msg/s", "published msg/s", "msg per broker-CPU-s",
        "broker cores", "p50 / p99 / max ms", "RSS/conn", "loadgen CPU", "notes",
    ]
    lines = []
    for r in rows:
        conn = r["scenario"] == "conn"
        lines.append([
            r["scenario"], payload_label(r), r["broker"], str(r["workers"]),
            f"{rate(r['connects_per_s'])} conn/s" if conn else rate(r["delivered_per_s"]),
            "-" if conn else rate(r["published_per_s"]),
            f"{rate(r['msgs_per_cpu_s'])} conn" if conn and r["msgs_per_cpu_s"] else rate(r["msgs_per_cpu_s"]),
            f"{r['broker_cpu_share']:.2f}" if r["broker_cpu_share"] is not None else "n/a",
            "-" if conn else f"{ms(r['lat_p50_ms'])} / {ms(r['lat_p99_ms'])} / {ms(r['lat_max_ms'])}",
            kib(r["rss_per_conn_bytes"]) if conn else "-",
            f"{r['loadgen_cpu_max']:.0%}",
            notes(r) + (f"; idle CPU {_idle(r)} ms/s" if conn else ""),
        ])
    return _table(header, lines)


def _idle(row: dict[str, Any] | None) -> str:
    value = row.get("idle_cpu_ms_per_s") if row is not None else None
    return "n/a" if value is None else f"{value:.1f}"


def _lat(row: dict[str, Any] | None, conn: bool) -> str:
    return "-" if row is None or conn else f"{ms(row['lat_p50_ms'])} / {ms(row['lat_p99_ms'])}"


def _cases(rows: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """The (scenario, payload) pairs of ``rows``, in their first order."""
    return list(dict.fromkeys((r["scenario"], r["payload"]) for r in rows))


def comparison_table(rows: list[dict[str, Any]], workers: list[int], brokerd: str = "brokerd") -> str:
    """brokerd (each worker count; ``brokerd`` names its rows) against Mosquitto: medians and the
    ratio brokerd/Mosquitto."""
    by_key = {(r["scenario"], r["payload"], r["broker"], r["workers"]): r for r in rows}
    header = [
        "scenario", "payload", "workers", "brokerd msg/s", "mosquitto msg/s", "ratio",
        "brokerd msg/CPU-s", "mosquitto msg/CPU-s", "CPU-eff. ratio", "brokerd p50/p99 ms",
        "mosquitto p50/p99 ms", "notes",
    ]
    lines = []
    for scenario, payload in _cases(rows):
        mq = by_key.get((scenario, payload, "mosquitto", 1))
        for w in workers:
            bd = by_key.get((scenario, payload, brokerd, w))
            any_row = bd or mq
            assert any_row is not None
            conn = scenario == "conn"
            note = []
            if bd is not None and notes(bd):
                note.append("brokerd: " + notes(bd))
            if mq is not None and notes(mq):
                note.append("mosquitto: " + notes(mq))
            if conn:
                note.append(
                    f"RSS/conn {kib(bd['rss_per_conn_bytes']) if bd else 'n/a'} vs "
                    f"{kib(mq['rss_per_conn_bytes']) if mq else 'n/a'}; idle CPU "
                    f"{_idle(bd)} vs {_idle(mq)} ms/s"
                )
            lines.append([
                scenario, payload_label(any_row), str(w),
                rate(_primary(bd)) + (" conn/s" if conn and bd else ""),
                rate(_primary(mq)) + (" conn/s" if conn and mq else ""),
                "(fixed load)" if scenario in FIXED_RATE_SCENARIOS else ratio(_primary(bd), _primary(mq)),
                rate(bd["msgs_per_cpu_s"] if bd else None), rate(mq["msgs_per_cpu_s"] if mq else None),
                ratio(bd["msgs_per_cpu_s"] if bd else None, mq["msgs_per_cpu_s"] if mq else None),
                _lat(bd, conn), _lat(mq, conn), "; ".join(note),
            ])
    return _table(header, lines)


def _cost(on: dict[str, Any] | None, off: dict[str, Any] | None) -> str:
    """What the commit log costs: the share of --log off's messages per CPU-second it gives up."""
    a, b = (on or {}).get("msgs_per_cpu_s"), (off or {}).get("msgs_per_cpu_s")
    return "n/a" if not a or not b else f"{1 - a / b:.0%}"


def log_table(rows: list[dict[str, Any]], workers: list[int]) -> str:
    """brokerd as shipped (the commit log on) and with ``--log off`` against Mosquitto, all from
    one run: messages per broker-CPU-second, each ratio to Mosquitto, what the log costs, and the
    latency side channel of each."""
    by_key = {(r["scenario"], r["payload"], r["broker"], r["workers"]): r for r in rows}
    header = [
        "scenario", "payload", "workers", "brokerd msg/CPU-s, log on (default)", "brokerd, --log off",
        "Mosquitto msg/CPU-s", "ratio, log on", "ratio, log off", "what the log costs",
        "p50 / p99 ms, log on", "p50 / p99 ms, log off", "Mosquitto p50 / p99 ms", "notes",
    ]
    lines = []
    for scenario, payload in _cases(rows):
        mq = by_key.get((scenario, payload, "mosquitto", 1))
        for w in workers:
            on = by_key.get((scenario, payload, "brokerd", w))
            off = by_key.get((scenario, payload, LOG_OFF_ROW, w))
            any_row = on or off or mq
            assert any_row is not None
            conn = scenario == "conn"
            note = [f"{name}: {notes(r)}" for name, r in (("log on", on), ("log off", off), ("mosquitto", mq))
                    if r is not None and notes(r)]
            if conn:
                note.append("RSS/conn " + " / ".join(kib(r["rss_per_conn_bytes"]) if r else "n/a" for r in (on, off, mq))
                            + "; idle CPU " + " / ".join(_idle(r) for r in (on, off, mq)) + " ms/s (on / off / Mosquitto)")
            cpu = [r["msgs_per_cpu_s"] if r else None for r in (on, off, mq)]
            unit = " conn" if conn else ""
            lines.append([
                scenario, payload_label(any_row), str(w), *(rate(c) + (unit if c else "") for c in cpu),
                ratio(cpu[0], cpu[2]), ratio(cpu[1], cpu[2]), _cost(on, off),
                _lat(on, conn), _lat(off, conn), _lat(mq, conn), "; ".join(note),
            ])
    return _table(header, lines)


def replication_table(rows: list[dict[str, Any]], factors: list[int]) -> str:
    """A three-node cluster at each --replication-factor, side by side against the lowest: what
    replication costs in throughput, CPU per message (all three nodes) and latency."""
    by_key = {(r["scenario"], r["payload"], r["broker"]): r for r in rows}
    base_r = min(factors)
    header = ["scenario", "payload", "R", "delivered msg/s", f"vs R{base_r}", "msg per broker-CPU-s",
              f"vs R{base_r}", "p50 / p99 ms", "RSS (3 nodes)", "notes"]
    lines = []
    for scenario, payload in _cases([r for r in rows if r["broker"].startswith("brokerd R")]):
        base = by_key.get((scenario, payload, f"brokerd R{base_r}"))
        for f in factors:
            row = by_key.get((scenario, payload, f"brokerd R{f}"))
            if row is None:
                continue
            lines.append([
                scenario, payload_label(row), str(f), rate(_primary(row)),
                ratio(_primary(row), _primary(base) if base else None),
                rate(row["msgs_per_cpu_s"]), ratio(row["msgs_per_cpu_s"], base["msgs_per_cpu_s"] if base else None),
                _lat(row, False), f"{row['broker_rss_mb']:.0f} MB" if row.get("broker_rss_mb") else "n/a",
                notes(row),
            ])
    return _table(header, lines)


def scaling_table(rows: list[dict[str, Any]], workers: list[int]) -> str:
    """brokerd at each worker count against the fewest: throughput, and CPU per message.

    Throughput scales only as far as cores are free for the workers; messages per broker-CPU-second
    says whether a worker got dearer per message (the mesh, contention) whatever the cores.
    """
    base_w = min(workers)
    by_key = {(r["scenario"], r["payload"], r["workers"]): r for r in rows if r["broker"] == "brokerd"}
    header = [
        "scenario", "payload", "workers", "delivered msg/s", f"x {base_w} worker(s)", "broker cores",
        "msg per broker-CPU-s", f"x {base_w} worker(s)", "loadgen CPU", "notes",
    ]
    lines = []
    for scenario, payload in _cases([r for r in rows if r["scenario"] not in ("conn", "latency")]):
        base = by_key.get((scenario, payload, base_w))
        for w in sorted(workers):
            row = by_key.get((scenario, payload, w))
            if row is None:
                continue
            lines.append([
                scenario, payload_label(row), str(w), rate(row["delivered_per_s"]),
                ratio(row["delivered_per_s"], base["delivered_per_s"] if base else None),
                f"{row['broker_cpu_share']:.2f}" if row["broker_cpu_share"] is not None else "n/a",
                rate(row["msgs_per_cpu_s"]),
                ratio(row["msgs_per_cpu_s"], base["msgs_per_cpu_s"] if base else None),
                f"{row['loadgen_cpu_max']:.0%}", notes(row),
            ])
    return _table(header, lines)


def scaling_caveat(workers: list[int], gen_procs: int, logical_cpus: int | None) -> str | None:
    """A scaling run is clean only if the generator's processes (the probe's included) have cores
    of their own."""
    need = max(workers) + gen_procs
    if logical_cpus is None or logical_cpus >= need:
        return None
    return (
        f"This machine has {logical_cpus} logical CPUs; {max(workers)} workers and {gen_procs} generator processes "
        f"need {need} for the generator not to take the workers' cores: throughput ratios here are bounded by "
        "the cores left to the broker (see 'broker cores'), messages per broker-CPU-second are not."
    )


def command_line() -> str:
    return "./scripts/bench" + "".join(f" {a}" for a in sys.argv[1:])
