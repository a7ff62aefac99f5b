"""Interoperability with Mosquitto's command-line clients."""

from __future__ import annotations

import shutil
import subprocess

import pytest

pytestmark = pytest.mark.skipif(shutil.which("mosquitto_pub") is None,
                                reason="mosquitto-clients not installed (./scripts/test installs it as root)")


def test_mosquitto_pub_and_sub(start_broker):
    # One worker until the broker bug that test_retained_will's
    # test_a_retained_message_published_while_the_suback_waits_arrives_once pins is fixed: with
    # two, the retained probe published while mosquitto_sub's SUBACK waits for the other worker
    # reaches it twice, and -C 3 then ends it before the QoS 2 message.
    broker = start_broker(workers=1)
    sub = subprocess.Popen(["mosquitto_sub", "-h", "127.0.0.1", "-p", str(broker.port), "-t", "mq/#", "-v",
                            "-q", "2", "-C", "3", "-W", "20"], stdout=subprocess.PIPE, text=True)
    # Wait until the subscription exists: a retained probe is delivered on subscribe (or live, if
    # it subscribed first), and the probe's line is read before anything else is published
    # (mosquitto_sub's -W 20 bounds the wait).
    subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(broker.port), "-t", "mq/probe", "-m", "p",
                    "-r", "-q", "1"], check=True, timeout=20)
    first = sub.stdout.readline()  # type: ignore[union-attr]
    assert first == "mq/probe p\n", first
    for qos in (1, 2):
        subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(broker.port), "-t", f"mq/q{qos}",
                        "-m", f"hello{qos}", "-q", str(qos)], check=True, timeout=20)
    out, _ = sub.communicate(timeout=30)
    lines = out.strip().splitlines()
    assert "mq/q1 hello1" in lines and "mq/q2 hello2" in lines
