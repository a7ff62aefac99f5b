"""The cross-check end to end, briefly: Mosquitto's own clients (``mosquitto_pub -l``,
``mosquitto_sub -C``) against brokerd, with and without its log, and against Mosquitto, every
message delivered. Not alone (tests/conftest.py), unlike test_bench.py: its publishers are paced
and its runs end at a deadline of a minute, not when deliveries go quiet, so a busy neighbour
slows them without making a loss."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("mosquitto_pub") is None, reason="needs mosquitto-clients")


def test_crosscheck_with_mosquittos_clients_delivers_everything_to_both_brokers():
    """The second generator (mosquitto_pub -l / mosquitto_sub -C) against brokerd, with and without
    its log, and Mosquitto, the publishers paced (``--rate``)."""
    proc = subprocess.run([str(ROOT / "scripts" / "crosscheck"), "--pairs", "2", "--messages", "300",
                           "--qos", "1", "--reps", "1", "--timeout", "60", "--rate", "1000", "--log", "on,off"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "qos1 brokerd/1w: 600/600 delivered" in proc.stdout
    assert "qos1 brokerd/1w --log off: 600/600 delivered" in proc.stdout
    assert "qos1 mosquitto: 600/600 delivered" in proc.stdout
    assert "| p2p x2 QoS 1, 1000 msg/s each | 16 B |" in proc.stdout and "| 0 / 0 / 0 |" in proc.stdout


def test_crosscheck_runs_brokerd_with_the_workers_asked_for():
    """``--workers`` cross-checks a scaling run: brokerd with that many workers, Mosquitto as it is."""
    proc = subprocess.run([str(ROOT / "scripts" / "crosscheck"), "--pairs", "4", "--messages", "200",
                           "--qos", "1", "--reps", "1", "--timeout", "60", "--workers", "2"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "qos1 brokerd/2w: 800/800 delivered" in proc.stdout
    assert "qos1 mosquitto: 800/800 delivered" in proc.stdout
