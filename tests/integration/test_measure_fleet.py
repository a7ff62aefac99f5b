"""scripts/measure_fleet.py, briefly: its figures are believed only if it counts a real brokerd's
clients right (every device connected and found on a worker; a refusal counted as one, and a
device never let in counted as failed)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _fleet(*args: str) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "measure_fleet.py"), "--idle", "0.5", *args],
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


def test_two_generators_two_workers_every_device_connected_and_found_on_a_worker():
    code, out = _fleet("--count", "300", "--workers", "2", "--generators", "2")
    assert code == 0, out
    assert re.search(r"300 connected in", out), out
    per_worker = re.search(r"clients per worker: ([\d,]+), ([\d,]+)", out)
    assert per_worker is not None, out
    counts = [int(n.replace(",", "")) for n in per_worker.groups()]
    assert sum(counts) == 300 and min(counts) > 0, out  # both workers took some (SO_REUSEPORT)
    assert "failed 0; lost while idle 0" in out and "refused none" in out, out


def test_devices_beyond_the_nodes_limit_are_counted_refused_then_failed():
    code, out = _fleet("--count", "60", "--workers", "1", "--timeout", "1.5", "--", "--max-connections", "50")
    assert code == 1, out  # not all connected: the run says so in its exit status
    assert re.search(r"50 connected in", out), out
    refused = re.search(r"refused code 3: ([\d,]+)", out)
    assert refused is not None and int(refused.group(1).replace(",", "")) >= 10, out  # each tried again
    assert "failed 10;" in out, out
