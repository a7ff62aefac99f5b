"""scripts/measure_idle.py, briefly: it starts a real brokerd with each worker count asked for,
reads the node's threads from /proc over the idle window, and prints one figure per count."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_one_figure_per_worker_count_and_the_busiest_threads_named():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "measure_idle.py"), "--workers", "1,2",
                           "--reps", "1", "--idle", "1", "--settle", "0"], capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for n in (1, 2):
        assert re.search(rf"^{n} worker\(s\): [\d.]+ ms/s of CPU idle \(median; runs [\d.]+\)$", out, re.M), out
    # Each count lists its node's busiest threads by process name (an idle one at 0.0 ms/s too):
    # the node's processes were found and read from /proc.
    assert re.search(r"pid +\d+ brokerd(-w\d+)? +[\d.]+ ms/s", out), out
