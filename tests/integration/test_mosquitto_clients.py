"""Interoperability with Mosquitto's command-line clients."""

from __future__ import annotations

import shutil
import subprocess

import pytest

pytestmark = pytest.mark.skipif(shutil.which("mosquitto_pub") is None,
                                reason="mosquitto-clients not installed (./scripts/test installs it as root)")


def test_mosquitto_pub_and_sub(broker):
    sub = subprocess.Popen(["mosquitto_sub", "-h", "127.0.0.1", "-p", str(broker.port), "-t", "mq/#", "-v",
                            "-q", "2", "-C", "3", "-W", "20"], stdout=subprocess.PIPE, text=True)
    # Wait until the subscription exists: a retained probe is delivered on subscribe.
    subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(broker.port), "-t", "mq/probe", "-m", "p",
                    "-r", "-q", "1"], check=True, timeout=20)
    for qos in (1, 2):
        subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(broker.port), "-t", f"mq/q{qos}",
                        "-m", f"hello{qos}", "-q", str(qos)], check=True, timeout=20)
    out, _ = sub.communicate(timeout=30)
    lines = out.strip().splitlines()
    assert lines[0] == "mq/probe p"
    assert "mq/q1 hello1" in lines and "mq/q2 hello2" in lines
