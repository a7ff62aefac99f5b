"""Two builds of brokerd side by side: ``./scripts/bench`` of each, alternating, round after round.

On a shared machine one run's spread is wider than most changes (docs/benchmarks.md): only the
medians of runs interleaved in time show a change, and the spread says whether it is measurable.
Each side is a checkout (its own compiled build: ``setup.py build_ext --inplace`` there), optionally
with BROKERD_PURE=1 (``DIR:pure``). Prints, per scenario and side, the median messages per
broker-CPU-second, the range, and the ratio of the medians to the first side.

    .venv/bin/python scripts/bench_ab.py --rounds 5 ../base . -- --scenarios p2p,qos1 --payload 16 --duration 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict


def _run(side: str, bench_args: list[str]) -> list[dict]:
    """One ``./scripts/bench --reps 1`` of ``side`` (``DIR`` or ``DIR:pure``): its runs."""
    folder, _, how = side.partition(":")
    env = dict(os.environ, BROKERD_PURE="1" if how == "pure" else "0")
    env.pop("PYTHONPATH", None)  # the side's own scripts/bench says which checkout its broker imports
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([os.path.join(folder, "scripts", "bench"), *bench_args, "--reps", "1", "--json", out.name],
                       env=env, check=True, stdout=subprocess.DEVNULL, timeout=600)
        with open(out.name, encoding="utf-8") as f:
            return [r for r in json.load(f)["runs"] if r["ok"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="runs of each side, alternating")
    parser.add_argument("sides", nargs=2, help="checkouts (DIR or DIR:pure); the first is the reference")
    parser.add_argument("bench", nargs=argparse.REMAINDER, help="after --: ./scripts/bench's options")
    args = parser.parse_args()
    bench_args = [a for a in args.bench if a != "--"]
    rates: dict[tuple[str, str], list[float]] = defaultdict(list)
    for n in range(args.rounds):
        order = args.sides if n % 2 == 0 else args.sides[::-1]  # neither side always goes first
        for side in order:
            for r in _run(side, bench_args):
                key = (f"{r['scenario']} {r['payload']} B", side)
                rates[key].append(r["msgs_per_cpu_s"])
                print(f"round {n + 1} {key[0]:>12} {side}: {r['msgs_per_cpu_s']:,.0f} msg/CPU-s", file=sys.stderr)
    print(f"| scenario | side | median msg per broker-CPU-s | range | runs | vs {args.sides[0]} |")
    print("|---|---|---:|---:|---:|---:|")
    for scenario in sorted({s for s, _ in rates}):
        reference = statistics.median(rates[(scenario, args.sides[0])] or [float("nan")])
        for side in args.sides:
            got = rates[(scenario, side)]
            if not got:
                continue
            median = statistics.median(got)
            print(f"| {scenario} | {side} | {median:,.0f} | {min(got):,.0f}-{max(got):,.0f} | {len(got)} "
                  f"| {median / reference:.2f}x |")


if __name__ == "__main__":
    main()
