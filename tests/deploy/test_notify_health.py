"""What systemd and the container probes see of a real brokerd: sd_notify READY=1 once it serves and
STOPPING=1 when it stops (NOTIFY_SOCKET bound by the test), and `brokerd health`'s exit status."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile

from tests.helpers import BROKERD, WAIT, RawClient, connect_packet, free_port

HEALTH_S = 15  # bound of one `brokerd health` run (Python's start-up included)


def health(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([BROKERD, "health", *args], capture_output=True, text=True, timeout=HEALTH_S)


def test_sd_notify_ready_and_stopping_and_health(tmp_path):
    port = free_port()
    with tempfile.TemporaryDirectory(dir="/tmp") as d, \
            socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        path = os.path.join(d, "notify")  # short: a unix socket path must fit 107 bytes
        notify.bind(path)
        notify.settimeout(30)
        env = {**os.environ, "NOTIFY_SOCKET": path, "PYTHONUNBUFFERED": "1"}
        with open(tmp_path / "brokerd.log", "wb") as log:
            proc = subprocess.Popen(
                [BROKERD, "--workers", "1", "--listen", f"127.0.0.1:{port}", "--node-id", "notify", "--log", "off",
                 "--sys-interval", "0", "--max-connections", "2"],
                env=env, stdout=subprocess.DEVNULL, stderr=log)
        try:
            ready = notify.recv(4096).decode()
            assert ready.startswith("READY=1\n") and f"127.0.0.1:{port}" in ready, ready
            # Ready means ready: a client connects at once.
            ok = health("--listen", f"127.0.0.1:{port}")
            assert ok.returncode == 0 and "ok" in ok.stdout, ok.stderr

            # At --max-connections the CONNECT is refused: unhealthy for a readiness probe.
            held = [RawClient(port) for _ in range(2)]
            for i, raw in enumerate(held):
                raw.send(connect_packet(f"held-{i}"))
                assert raw.recv_exact(4) == b"\x20\x02\x00\x00"
            full = health("--port", str(port))  # --port P: 0.0.0.0:P, probed on loopback
            assert full.returncode == 1 and "server unavailable" in full.stderr, full.stderr
            for raw in held:
                raw.close()

            proc.send_signal(signal.SIGTERM)
            assert notify.recv(4096) == b"STOPPING=1"
            assert proc.wait(WAIT + 5) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def test_health_fails_on_a_closed_port_and_on_a_port_that_does_not_answer():
    closed = health("--listen", f"127.0.0.1:{free_port()}", "--timeout", "1")
    assert closed.returncode == 1 and "refused" in closed.stderr.lower(), closed.stderr
    with socket.socket() as mute:  # accepts (the kernel's backlog), never answers: a hung broker
        mute.bind(("127.0.0.1", 0))
        mute.listen(4)
        hung = health("--listen", f"127.0.0.1:{mute.getsockname()[1]}", "--timeout", "0.5")
    assert hung.returncode == 1 and "no CONNACK within 0.5 s" in hung.stderr, hung.stderr
    bad = health("--listen", "nonsense")
    assert bad.returncode == 2 and "--listen" in bad.stderr


def test_health_counts_a_refused_anonymous_probe_as_up(start_broker):
    """On a listener that is not on loopback anonymous clients are refused (CONNACK 0x05): the
    probe is anonymous, and that answer still means the broker reads and answers CONNECTs."""
    broker = start_broker(host="0.0.0.0")
    r = health("--listen", f"0.0.0.0:{broker.port}")
    assert r.returncode == 0, r.stderr
    broker.wait_log("anonymous clients not allowed on mqtt://0.0.0.0:")
