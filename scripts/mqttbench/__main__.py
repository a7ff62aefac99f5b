"""``./scripts/bench``: run the scenarios against brokerd and/or Mosquitto and print one table.

Every run starts a fresh broker on a free 127.0.0.1 port, runs one scenario with a bounded duration,
and stops the broker. With ``--against mosquitto`` the brokers alternate run by run (and the order
flips every repetition), so drift on a shared machine hits both alike; the table shows medians.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from . import report, runner
from .brokers import (
    LOG_OFF_ROW,
    TLS_ENV,
    BrokerKind,
    BrokerUnavailable,
    check_brokerd,
    make_certificates,
    mosquitto_executable,
    start_broker,
)
from .loadgen import raise_fd_limit
from .runner import RunResult, Timing
from .scenarios import PAYLOAD_SCENARIOS, PLACED_SCENARIOS, PLACEMENTS, SCENARIOS, Sizes, build


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from exc
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _scenarios(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown scenario(s) {unknown}; known: {','.join(SCENARIOS)}")
    return names


def _log_modes(text: str) -> list[str]:
    modes = list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    if not modes or any(m not in ("on", "off") for m in modes):
        raise argparse.ArgumentTypeError(f"expected on, off or on,off, got {text!r}")
    return modes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    d = Sizes()
    ap = argparse.ArgumentParser(
        prog="./scripts/bench",
        description="MQTT broker benchmark (Open MQTT Benchmark Suite scenarios) for brokerd and Mosquitto. "
        "Loopback only; every run is bounded in time.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument("--scenarios", type=_scenarios, default=list(SCENARIOS), help="comma-separated subset of " + ",".join(SCENARIOS))
    ap.add_argument("--payload", type=_ints, default=[16, 1024], help="payload sizes in bytes (conn ignores it)")
    ap.add_argument("--duration", type=float, default=5.0, help="measuring window per run, seconds")
    ap.add_argument("--warmup", type=float, default=1.0, help="load before the window opens, seconds")
    ap.add_argument("--reps", type=int, default=3, help="repetitions; tables show medians")
    ap.add_argument("--broker", choices=("brokerd", "mosquitto"), default="brokerd", help="broker to measure")
    ap.add_argument("--against", choices=("mosquitto",), help="also run Mosquitto, alternating, and print ratios")
    ap.add_argument("--workers", type=_ints, default=[1], help="brokerd worker counts (scaling runs)")
    ap.add_argument("--log", type=_log_modes, default=["on"],
                    help="brokerd's commit log: on (as shipped), off, or on,off for both side by side in one run")
    ap.add_argument("--replication-factor", type=_ints, default=[],
                    help="brokerd as three nodes on 127.0.0.1-3 (log on) with each of these --replication-factor "
                         "values, e.g. 1,2,3; clients on the first node, CPU and RSS of all three")
    ap.add_argument("--procs", type=int, default=1, help="load-generator processes")
    ap.add_argument("--placement", choices=PLACEMENTS, default="any",
                    help="brokerd --workers >= 2, p2p/qos1/latency: publisher on its subscriber's worker (same) "
                    "or another (cross); Mosquitto runs ignore it, and so do runs with one worker under 'same'")
    ap.add_argument("--json", type=Path, help="write every run and the summary to this file")
    ap.add_argument("--tls", action="store_true",
                    help="MQTT over TLS (both brokers, certificates made for the run with openssl)")
    g = ap.add_argument_group("sizes")
    g.add_argument("--pairs", type=int, default=d.pairs, help="p2p/qos1/latency: publisher-subscriber pairs")
    g.add_argument("--subscribers", type=int, default=d.subscribers, help="fanout: subscribers of one publisher")
    g.add_argument("--publishers", type=int, default=d.publishers,
                   help="fanin: publishers to one wildcard subscriber; sharedsub: publishers to the group")
    g.add_argument("--members", type=int, default=d.members, help="sharedsub: members of the one shared subscription group")
    g.add_argument("--connections", type=int, default=d.connections, help="conn: idle connections")
    g.add_argument("--persistent", action="store_true",
                   help="conn: the idle connections keep persistent sessions (clean session 0), as fleets often do")
    g.add_argument("--window", type=int, default=d.window, help="flow control: messages per subscriber in flight")
    g.add_argument("--inflight", type=int, default=d.inflight, help="qos1: unacknowledged PUBLISHes per publisher")
    g.add_argument("--per-write", type=int, default=d.per_write,
                   help="PUBLISH packets a publisher writes per write() at most: 0 pipelines what its window "
                   "allows; 1 writes each on its own, as paho or a microcontroller client does (with "
                   "--inflight 1..10, a device's QoS 1 window)")
    g.add_argument("--devices", type=int, default=d.devices,
                   help="fleet: connected devices, each publishing QoS 1 to its own topic as a device does "
                   "(one PUBLISH per write, the next after its PUBACK), read by 2 wildcard subscribers")
    g.add_argument("--device-rate", type=float, default=d.device_rate, help="fleet: messages a second per device")
    g.add_argument("--latency-rate", type=float, default=d.latency_rate, help="side-channel messages per second")
    g.add_argument("--latency-load", type=float, default=d.latency_load, help="latency: p2p msg/s offered meanwhile")
    g.add_argument("--drain-quiet", type=float, default=d.drain_quiet,
                   help="after the window, what has not arrived once deliveries stopped this long counts as "
                   "lost (the tests give 5 s: a busy machine may hold a broker that long)")
    g.add_argument("--probe-with-load", action="store_true",
                   help="time the side channel in generator process 0, among the load's clients, instead of "
                   "in a process of its own (its arrivals then also wait for that process's event loop)")
    args = ap.parse_args(argv)
    if args.replication_factor and args.log != ["on"]:
        ap.error("--replication-factor runs the cluster with its log on: leave out --log")
    if args.reps < 1 or args.procs < 1 or args.duration <= 0 or args.duration > 600 or args.warmup < 0:
        ap.error("need --reps >= 1, --procs >= 1, 0 < --duration <= 600, --warmup >= 0")
    # One worker holds every connection: that is "same" (a scaling run's baseline), never "cross".
    if args.placement == "cross" and min(args.workers) < 2 or args.placement == "same" and max(args.workers) < 2:
        ap.error(f"--placement {args.placement} needs --workers 2 or more (one worker holds every connection)")
    if min(args.pairs, args.subscribers, args.publishers, args.members, args.connections, args.window,
           args.inflight, args.devices) < 1 or args.per_write < 0 or args.drain_quiet <= 0 or not 0 < args.device_rate <= 1000:
        ap.error("sizes must be positive (--per-write 0 or more, 0 < --device-rate <= 1000, --drain-quiet > 0)")
    return args


def _kinds(args: argparse.Namespace) -> list[BrokerKind]:
    brokerd = ([BrokerKind("brokerd", w, r) for r in args.replication_factor for w in args.workers]
               if args.replication_factor
               else [BrokerKind("brokerd", w, log=mode) for mode in args.log for w in args.workers])
    if args.against:
        return [*brokerd, BrokerKind("mosquitto")]
    if args.broker == "mosquitto":
        return [BrokerKind("mosquitto")]
    return brokerd


def _progress(r: RunResult, rep: int, reps: int) -> str:
    head = f"[rep {rep + 1}/{reps}] {r.scenario:8s} {('-' if r.scenario == 'conn' else f'{r.payload}B'):>6s} {r.broker}/{r.workers}w"
    if not r.ok:
        return f"{head}: FAILED {r.error}"
    cpu = "/".join(f"{c:.0%}" for c in r.loadgen_cpu)
    if r.scenario == "conn":
        return (
            f"{head}: {r.connections} conns, {r.connects_per_s:,.0f} conn/s, "
            f"{(r.rss_per_conn_bytes or 0) / 1024:.1f} KiB RSS/conn, broker {r.broker_cpu_share:.2f} cores, loadgen {cpu}"
            + (f"  ({r.error})" if r.error else "")
        )
    lat = f"p50 {r.lat_p50_ms:.2f} p99 {r.lat_p99_ms:.2f} ms" if r.lat_p50_ms is not None else "no latency samples"
    flags = " LOADGEN SATURATED" if r.loadgen_saturated else ""
    return (
        f"{head}: {r.delivered_per_s:,.0f} dlv/s {r.published_per_s:,.0f} pub/s loss {r.loss:.2%} dup {r.duplicates:.2%} "
        f"{r.msgs_per_cpu_s or 0:,.0f} msg/CPU-s broker {r.broker_cpu_share:.2f} cores {lat} loadgen {cpu}"
        f"{' stalls ' + str(r.stalls) if r.stalls else ''}{flags}"
    )


def run_one(kind: BrokerKind, scenario: str, payload: int, rep: int, args: argparse.Namespace, sizes: Sizes) -> RunResult:
    result = RunResult(scenario, payload, kind.row_name, kind.workers, rep)
    plan = build(scenario, payload, args.procs, sizes)
    if kind.name == "brokerd" and kind.workers > 1 and scenario in PLACED_SCENARIOS:
        plan.placement = args.placement
    try:
        with start_broker(kind) as broker:
            if plan.is_conn:
                runner.run_conn(plan, broker, result, idle_s=args.duration)
            else:
                runner.run_load(plan, broker, Timing(args.warmup, args.duration), result)
            if not broker.alive():
                result.ok = False
                result.error = f"broker exited during the run: {broker.log_tail()}"
    except (BrokerUnavailable, RuntimeError, OSError) as exc:
        result.ok = False
        result.error = str(exc)
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = Sizes(
        pairs=args.pairs, subscribers=args.subscribers, publishers=args.publishers, members=args.members,
        connections=args.connections, persistent=args.persistent,
        window=args.window, inflight=args.inflight, per_write=args.per_write,
        devices=args.devices, device_rate=args.device_rate,
        latency_rate=args.latency_rate, latency_load=args.latency_load,
        probe_alone=not args.probe_with_load, drain_quiet=args.drain_quiet,
    )
    fd_limit = raise_fd_limit()
    if "conn" in args.scenarios and fd_limit < sizes.connections + 256:
        print(f"warning: open-file limit {fd_limit} is low for {sizes.connections} connections", file=sys.stderr)
    kinds = _kinds(args)
    if any(k.name == "brokerd" for k in kinds):
        reason = check_brokerd()
        if reason:
            print(reason, file=sys.stderr)
            kinds = [k for k in kinds if k.name != "brokerd"]
            if not kinds:
                return 2
    if any(k.name == "mosquitto" for k in kinds):
        try:
            mosquitto_executable()
        except BrokerUnavailable as exc:
            print(exc, file=sys.stderr)
            return 2

    if args.tls:
        import tempfile

        os.environ[TLS_ENV] = str(make_certificates(Path(tempfile.mkdtemp(prefix="bench-tls-"))))
        print("MQTT over TLS (both brokers; certificates made for this run)", file=sys.stderr)
    info = report.machine_info()
    print(f"machine: {report.machine_line(info)}", file=sys.stderr)
    results: list[RunResult] = []
    started = time.monotonic()
    interrupted = False
    try:
        for rep in range(args.reps):
            order = kinds if rep % 2 == 0 else list(reversed(kinds))
            for scenario in args.scenarios:
                payloads = args.payload if scenario in PAYLOAD_SCENARIOS else [0]
                for payload in payloads:
                    for kind in order:
                        r = run_one(kind, scenario, payload, rep, args, sizes)
                        results.append(r)
                        print(_progress(r, rep, args.reps), file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        interrupted = True  # the broker of the current run was stopped on the way out
        print("interrupted: the table below holds the runs that finished", file=sys.stderr)

    rows = report.summarize(results)
    scenario_order = {s: i for i, s in enumerate(args.scenarios)}
    rows.sort(key=lambda r: (scenario_order[r["scenario"]], r["payload"], r["broker"] != "brokerd", r["workers"]))
    print()
    print(f"Machine: {report.machine_line(info)}")
    print(f"Command: `{report.command_line()}` ({time.monotonic() - started:.0f} s; medians of {args.reps} reps, "
          f"{args.duration:g} s windows, {args.procs} generator process(es)"
          f"{'' if args.probe_with_load else ' + one for the latency side channel'})")
    print()
    if args.against and len(args.log) > 1:
        print(report.log_table(rows, args.workers))
        print()
    elif args.against:
        print(report.comparison_table(rows, args.workers, LOG_OFF_ROW if args.log == ["off"] else "brokerd"))
        print()
    if args.replication_factor:
        print(report.replication_table(rows, args.replication_factor))
        print()
    if len(args.workers) > 1 and not args.replication_factor:
        print(report.scaling_table(rows, args.workers))
        gen_procs = args.procs + (0 if args.probe_with_load else 1)  # the side channel's process
        caveat = report.scaling_caveat(args.workers, gen_procs, info["logical_cpus"])
        if caveat:
            print(f"\n{caveat}")
        print()
    print(report.single_table(rows))
    if any(r["loadgen_saturated"] for r in rows):
        print("\nA generator process used > 90% of a core in some runs: those figures may measure the generator; "
              "retry with --procs 2 or more.")
    if args.json:
        args.json.write_text(json.dumps({
            "command": report.command_line(), "machine": info, "args": {k: str(v) for k, v in vars(args).items()},
            "summary": rows, "runs": [r.to_dict() for r in results],
        }, indent=2))
    if interrupted:
        return 130
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
